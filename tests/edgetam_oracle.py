"""The original EdgeTAM code (``edgetam-dimos==1.0.1``) as an oracle, run in a subprocess.

The original installs a top-level package ``sam2`` that clashes with Meta's ``sam2`` in the test environment, so it
lives in its own folder (``.venv/edgetam-original``, ``pip install --no-deps --target``; scripts/setup.sh) and is
imported only in a child process whose ``sys.path`` starts with that folder, never in the pytest process.

``run_original(script, inputs)`` runs any script there: the script sees ``IN`` (the inputs dict, through a temporary
.pt file) and leaves its results in the dict ``OUT``; the helpers below are already imported into it:

* ``build_original(config, seed, video=False)``: the original ``SAM2Base`` (or ``SAM2VideoPredictor``) from
  ``configs/edgetam.yaml``, for a sam2edge config name (``edgetam`` or a reduced one: hydra overrides for every
  width, a narrow RepViT through timm's own ``embed_dim`` / ``depth`` arguments, and the prompt encoder and mask
  decoder rebuilt at the config's widths), with seeded perturbed random weights (``perturb``); ``video=True`` also
  lifts the object-score bias by 10 so that tracked objects stay present.
* ``perturb(module, seed)``: + 0.02 * randn on every floating parameter; batch norms' running statistics moved too
  (mean + 0.1 * randn, variance * U(0.5, 1.5)) so that folding them is tested on non-trivial statistics.

Patches applied in the child (tests only): an import stand-in for ``torchvision`` (no build pairs with the CPU
torch; timm imports it at import time), timm's ``create_model`` forced to ``pretrained=False`` (no download), and the
one-word ``.view`` -> ``.reshape`` fix of ``PerceiverResampler.forward_2d`` (the original raises with two or more
objects otherwise).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import subprocess
import sys
import tempfile
import textwrap
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ORIGINAL = Path(os.environ.get("SAM2EDGE_EDGETAM_ORIGINAL", ROOT / ".venv" / "edgetam-original"))
YAML = "configs/edgetam.yaml"


class OriginalMissing(RuntimeError):
    """The original EdgeTAM code is not installed where the tests look for it."""


def run_original(script: str, inputs: dict | None = None, workdir: str | Path | None = None, timeout: float = 1800):
    """Run ``script`` in a child process with the original EdgeTAM first on ``sys.path`` -> its ``OUT`` dict.

    ``inputs``: tensors, numbers, strings (``torch.save``-able) the script reads as ``IN``. ``workdir``: where the
    temporary files go (a fresh temporary folder when None). A failing script raises RuntimeError with its stderr.
    """
    import torch

    if not (ORIGINAL / "sam2" / "modeling" / "perceiver.py").is_file():
        raise OriginalMissing(f"the original EdgeTAM code is not at {ORIGINAL}; run scripts/setup.sh")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        src, dst = Path(tmp) / "in.pt", Path(tmp) / "out.pt"
        torch.save(inputs or {}, src)
        code = (
            f"import sys; sys.path[:0] = [{str(ORIGINAL)!r}, {str(ROOT)!r}, {str(TESTS)!r}]\n"
            "import torch\n"
            "torch.set_num_threads(int(__import__('os').environ.get('SAM2EDGE_TEST_THREADS', '1')))\n"
            "from edgetam_oracle import *  # noqa\n"
            "prepare_child()\n"
            f"IN = torch.load({str(src)!r}, weights_only=False)\nOUT = {{}}\n"
            f"{textwrap.dedent(script)}\n"
            f"torch.save(OUT, {str(dst)!r})\n"
        )
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp, timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"the original EdgeTAM script failed:\n{res.stderr[-4000:]}")
        return torch.load(dst, weights_only=False)


# ---- everything below runs in the child process --------------------------------------------------------------


class _StubMeta(type):
    def __getattr__(cls, name: str):  # class attributes (e.g. ``InterpolationMode.NEAREST``): more stubs
        if name.startswith("__"):
            raise AttributeError(name)
        stub = _StubMeta(name, (_Stub,), {})
        setattr(cls, name, stub)
        return stub


class _Stub(metaclass=_StubMeta):
    """Any attribute of a stand-in torchvision module: a class that cannot be used (nothing here calls it)."""

    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError("torchvision is a test stand-in here")


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        stub = _StubMeta(name, (_Stub,), {})
        setattr(self, name, stub)
        return stub


class _TorchvisionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Meta-path finder answering every ``torchvision[.x.y]`` import with a stub package."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        if module.__name__ == "torchvision.ops.misc":
            module.FrozenBatchNorm2d = _frozen_batch_norm()
        if module.__name__ == "torchvision.transforms":
            module.ToTensor, module.Resize, module.Normalize = _transforms()


def _frozen_batch_norm():
    import torch
    from torch import nn

    class FrozenBatchNorm2d(nn.Module):  # torchvision.ops.misc's, as timm.layers imports it
        def __init__(self, num_features: int, eps: float = 1e-5) -> None:
            super().__init__()
            self.eps = eps
            for name, init in (("weight", torch.ones), ("bias", torch.zeros)):
                self.register_buffer(name, init(num_features))
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))

        def forward(self, x):
            scale = self.weight * (self.running_var + self.eps).rsqrt()
            bias = self.bias - self.running_mean * scale
            return x * scale.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1)

    return FrozenBatchNorm2d


def _transforms():
    """``ToTensor``, ``Resize``, ``Normalize`` as the original predictors call them (Resize exact only at the
    target size: parity tests feed images of the model's input side)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    class ToTensor:
        def __call__(self, pic):
            return torch.from_numpy(np.array(pic, dtype=np.uint8)).permute(2, 0, 1).float().div(255.0)

    class Resize(nn.Module):
        def __init__(self, size) -> None:
            super().__init__()
            self.size = (int(size[0]), int(size[1]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[-2] == self.size[0] and x.shape[-1] == self.size[1]:
                return x
            y = F.interpolate(x.unsqueeze(0), size=self.size, mode="bilinear", align_corners=False, antialias=True)
            return y.squeeze(0)

    class Normalize(nn.Module):
        def __init__(self, mean, std) -> None:
            super().__init__()
            self.register_buffer("mean", torch.tensor(mean).view(-1, 1, 1))
            self.register_buffer("std", torch.tensor(std).view(-1, 1, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x - self.mean) / self.std

    return ToTensor, Resize, Normalize


_TIMM_OVERRIDES: dict = {}  # extra create_model arguments (a narrow RepViT for reduced configs)


def install_torchvision_stand_in() -> None:
    if not any(isinstance(f, _TorchvisionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionFinder())


def patch_timm() -> None:
    """timm's create_model with ``pretrained=False`` (offline) and ``_TIMM_OVERRIDES`` applied, everywhere the
    original looks it up."""
    import timm.models

    original = getattr(timm.models.create_model, "__wrapped__", timm.models.create_model)

    def create_model(name, pretrained=False, **kwargs):
        return original(name, pretrained=False, **{**kwargs, **_TIMM_OVERRIDES})

    create_model.__wrapped__ = original
    timm.models.create_model = create_model
    import sam2.modeling.backbones.timm as backbone

    backbone.create_model = create_model


def patch_perceiver() -> None:
    """The one-word fix of ``PerceiverResampler.forward_2d``: ``.view`` -> ``.reshape`` on the expanded latents."""
    import inspect

    import sam2.modeling.perceiver as pm

    if getattr(pm.PerceiverResampler.forward_2d, "_reshape_fix", False):
        return
    src = textwrap.dedent(inspect.getsource(pm.PerceiverResampler.forward_2d))
    fixed = src.replace("expand(B, -1, -1).view(-1, 1, C)", "expand(B, -1, -1).reshape(-1, 1, C)")
    assert fixed != src, "the original perceiver changed: the .view fix no longer applies"
    ns: dict = {}
    exec(fixed, pm.__dict__, ns)
    ns["forward_2d"]._reshape_fix = True
    pm.PerceiverResampler.forward_2d = ns["forward_2d"]


def prepare_child() -> None:
    """Every patch of the child: torchvision stand-in, offline timm, the perceiver fix; checks the ``sam2`` found
    is the original EdgeTAM's."""
    # transformers decides once, at import, whether torchvision exists: before the stand-in (as tests/conftest.py)
    import transformers.utils.import_utils  # noqa: F401

    install_torchvision_stand_in()
    import sam2

    if not str(sam2.__file__).startswith(str(ORIGINAL)):
        raise RuntimeError(f"`sam2` resolved to {sam2.__file__}, not the original EdgeTAM under {ORIGINAL}")
    patch_timm()
    patch_perceiver()


def hf_config_kwargs(config) -> dict:
    """(vision, prompt encoder, mask decoder, video) keyword arguments of transformers' EdgeTAM configs for a
    sam2edge config name or (Sam2Config, Sam2VideoConfig) pair (``edgetam``: transformers' defaults; a reduced one:
    its widths, a narrow RepViT through timm's ``embed_dim`` / ``depth``, its latents and RoPE grids; transformers
    fixes the memory attention's key-value width at 64, so a reduced config for it keeps mem_dim 64)."""
    from sam2edge.config import get_config, get_video_config

    if config == "edgetam":
        return dict(vision={}, prompt={}, decoder={}, video={}, timm={})
    cfg, v = (get_config(config), get_video_config(config)) if isinstance(config, str) else config
    s, d, e, m = cfg.image_size, cfg.d_model, cfg.image_embedding_size, v.mem_dim
    return dict(
        timm=dict(embed_dim=list(cfg.repvit_dims), depth=list(cfg.repvit_depths)),
        vision=dict(
            backbone_channel_list=list(reversed(cfg.repvit_dims)),
            backbone_feature_sizes=[[4 * e, 4 * e], [2 * e, 2 * e], [e, e]],
            fpn_hidden_size=d,
        ),
        prompt=dict(hidden_size=d, image_size=s, mask_input_channels=cfg.mask_in_chans),
        decoder=dict(
            hidden_size=d,
            mlp_dim=cfg.decoder_mlp_dim,
            num_attention_heads=cfg.decoder_heads,
            iou_head_hidden_dim=cfg.iou_head_hidden_dim,
        ),
        video=dict(
            image_size=s,
            memory_attention_hidden_size=d,
            memory_attention_num_layers=v.attn_layers,
            memory_attention_mlp_hidden_size=v.attn_mlp_dim,
            memory_attention_rope_feat_sizes=[e, e],
            memory_attention_rope_k_sizes=[v.cross_rope_k_grid] * 2,
            perceiver_resampler_num_latents=v.perceiver_latents,
            perceiver_resampler_num_latents_2d=v.perceiver_latents_2d,
            perceiver_resampler_hidden_size=m,
            perceiver_resampler_mlp_intermediate_size=m * v.perceiver_ff_mult,
            perceiver_resampler_attention_head_dim=v.perceiver_dim_head,
            perceiver_resampler_num_layers=v.perceiver_layers,
            memory_encoder_hidden_size=d,
            memory_encoder_output_channels=m,
            mask_downsampler_embed_dim=d,
            memory_fuser_embed_dim=d,
            memory_fuser_intermediate_dim=4 * d,
        ),
    )


def hf_edgetam_model(seed: int = 0, video: bool = False, config="edgetam", **video_options):
    """transformers' ``EdgeTamModel`` / ``EdgeTamVideoModel`` with EdgeTAM's vision config (RepViT-M1 through
    ``TimmWrapperConfig``; a reduced sam2edge ``config``: ``hf_config_kwargs``), seeded random init + ``perturb``
    (child process only: timm runs on the stand-in). ``video_options``: more ``EdgeTamVideoConfig`` arguments."""
    import torch
    import transformers
    import transformers.utils.import_utils as iu

    # transformers asks for torchvision before timm; timm itself runs here on the stand-in
    iu.BACKENDS_MAPPING["timm"] = (lambda: True, iu.BACKENDS_MAPPING["timm"][1])
    import timm
    import transformers.models.timm_wrapper.modeling_timm_wrapper as wrapper

    wrapper.timm = timm  # imported there only when transformers saw torchvision
    kw = hf_config_kwargs(config)
    backbone = transformers.TimmWrapperConfig(
        architecture="repvit_m1",
        model_args={"in_chans": 3, "features_only": True, "out_indices": [0, 1, 2, 3], **kw["timm"]},
    )
    vision = transformers.EdgeTamVisionConfig(backbone_config=backbone, **kw["vision"])
    torch.manual_seed(seed)
    if video:
        model = transformers.EdgeTamVideoModel(
            transformers.EdgeTamVideoConfig(
                vision_config=vision,
                prompt_encoder_config=transformers.EdgeTamVideoPromptEncoderConfig(**kw["prompt"]),
                mask_decoder_config=transformers.EdgeTamVideoMaskDecoderConfig(**kw["decoder"]),
                **kw["video"],
                **video_options,
            )
        )
    else:
        model = transformers.EdgeTamModel(
            transformers.EdgeTamConfig(
                vision_config=vision,
                prompt_encoder_config=transformers.EdgeTamPromptEncoderConfig(**kw["prompt"]),
                mask_decoder_config=transformers.EdgeTamMaskDecoderConfig(**kw["decoder"]),
            )
        )
    perturb(model, seed + 5000)
    with torch.no_grad():  # the prompt encoder's Gaussian matrix is tied to shared_image_embedding's; keep the tie
        model.prompt_encoder.shared_embedding.positional_embedding.copy_(
            model.shared_image_embedding.positional_embedding
        )
    return model


def perturb(module, seed: int):
    """+ 0.02 * randn on every floating parameter; batch-norm statistics moved (see module docstring). Eval mode."""
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.add_(0.02 * torch.randn(p.shape, generator=g))
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.add_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.mul_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return module.eval()


def reduced_overrides(config: str, image_size: int | None = None) -> list[str]:
    """Hydra overrides of configs/edgetam.yaml for a sam2edge config at ``image_size`` px (None: the config's own;
    none for ``edgetam`` at 1024; at another size its ``image_size`` and the cross-attention's query RoPE grid
    ``q_sizes``, the frame's e x e grid); sets the narrow RepViT in ``_TIMM_OVERRIDES``."""
    from sam2edge.config import get_config, get_video_config

    cfg = get_config(config)
    cfg = cfg if image_size is None else cfg.at_resolution(image_size)
    e = cfg.image_embedding_size
    _TIMM_OVERRIDES.clear()
    if config == "edgetam":
        q_sizes = f"++model.memory_attention.layer.cross_attention.q_sizes=[{e},{e}]"
        sized = [f"++model.image_size={cfg.image_size}", q_sizes]
        return [] if cfg.image_size == 1024 else sized
    _TIMM_OVERRIDES.update(embed_dim=tuple(cfg.repvit_dims), depth=tuple(cfg.repvit_depths))
    v = get_video_config(config, cfg.image_size)
    d, m, g = cfg.d_model, v.mem_dim, v.cross_rope_k_grid
    enc, att, mem, per = (
        "++model.image_encoder.",
        "++model.memory_attention.",
        "++model.memory_encoder.",
        ("++model.spatial_perceiver."),
    )
    return [
        f"++model.image_size={cfg.image_size}",
        f"{enc}neck.d_model={d}",
        f"{enc}neck.backbone_channel_list={list(reversed(cfg.stage_dims))}",
        f"{enc}neck.position_encoding.num_pos_feats={d}",
        f"{att}d_model={d}",
        f"{att}num_layers={v.attn_layers}",
        f"{att}layer.d_model={d}",
        f"{att}layer.dim_feedforward={v.attn_mlp_dim}",
        f"{att}layer.self_attention.embedding_dim={d}",
        f"{att}layer.self_attention.feat_sizes=[{e},{e}]",
        f"{att}layer.cross_attention.embedding_dim={d}",
        f"{att}layer.cross_attention.q_sizes=[{e},{e}]",
        f"{att}layer.cross_attention.k_sizes=[{g},{g}]",
        f"{att}layer.cross_attention.kv_in_dim={m}",
        f"{mem}out_dim={m}",
        f"{mem}position_encoding.num_pos_feats={m}",
        f"++model.memory_encoder.mask_downsampler.embed_dim={d}",
        f"{mem}fuser.layer.dim={d}",
        f"{mem}in_dim={d}",
        f"{per}dim={m}",
        f"{per}depth={v.perceiver_layers}",
        f"{per}dim_head={v.perceiver_dim_head}",
        f"{per}num_latents={v.perceiver_latents}",
        f"{per}num_latents_2d={v.perceiver_latents_2d}",
        f"{per}position_encoding.num_pos_feats={m}",
    ]


def _rebuild_heads(model, config: str, image_size: int | None = None) -> None:
    """The prompt encoder and mask decoder at the config's widths (SAM2Base fixes mask_in_chans 16, 8 heads, MLP
    2048 and IoU hidden 256; reduced configs shrink them), with SAM2Base._build_sam_heads' flags."""
    from sam2.modeling.sam.mask_decoder import MaskDecoder
    from sam2.modeling.sam.prompt_encoder import PromptEncoder
    from sam2.modeling.sam.transformer import TwoWayTransformer

    from sam2edge.config import get_config

    cfg = get_config(config)
    cfg = cfg if image_size is None else cfg.at_resolution(image_size)
    e = cfg.image_embedding_size
    model.sam_prompt_encoder = PromptEncoder(
        embed_dim=cfg.d_model,
        image_embedding_size=(e, e),
        input_image_size=(cfg.image_size, cfg.image_size),
        mask_in_chans=cfg.mask_in_chans,
    )
    model.sam_mask_decoder = MaskDecoder(
        num_multimask_outputs=cfg.num_multimask_outputs,
        transformer=TwoWayTransformer(
            depth=cfg.decoder_depth, embedding_dim=cfg.d_model, mlp_dim=cfg.decoder_mlp_dim, num_heads=cfg.decoder_heads
        ),
        transformer_dim=cfg.d_model,
        iou_head_depth=cfg.iou_head_depth,
        iou_head_hidden_dim=cfg.iou_head_hidden_dim,
        use_high_res_features=model.use_high_res_features_in_sam,
        iou_prediction_use_sigmoid=model.iou_prediction_use_sigmoid,
        pred_obj_scores=model.pred_obj_scores,
        pred_obj_scores_mlp=model.pred_obj_scores_mlp,
        use_multimask_token_for_obj_ptr=model.use_multimask_token_for_obj_ptr,
        **(model.sam_mask_decoder_extra_args or {}),
    )


def build_original(config: str = "edgetam", seed: int = 0, video: bool = False, image_size: int | None = None):
    """The original EdgeTAM (``SAM2Base``, or ``SAM2VideoPredictor`` when ``video``) for a sam2edge config name at
    ``image_size`` px (None: the config's), seeded random init + ``perturb``, eval mode, on the CPU (child process
    only)."""
    import torch
    from sam2.build_sam import build_sam2, build_sam2_video_predictor

    overrides = reduced_overrides(config, image_size)
    torch.manual_seed(seed)
    build = build_sam2_video_predictor if video else build_sam2
    model = build(YAML, None, device="cpu", mode="eval", hydra_overrides_extra=overrides)
    if config != "edgetam":
        _rebuild_heads(model, config, image_size)
    model = perturb(model, seed + 4000)
    if video:
        with torch.no_grad():
            model.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.add_(10.0)
    return model.eval()
