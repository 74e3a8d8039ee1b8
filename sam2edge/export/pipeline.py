"""THE export pipeline: every target runs the same steps; a target module keeps only what is specific to
its runtime (a ``TargetSpec``).

  1. out-folder guard   ``guard_out``: refuse a file, a non-empty folder that is not a bundle, ``.`` or any
                        folder that is or holds an input (exit 2, nothing touched) - before any work
  2. load weights       ``sam2edge.weights.load_weights`` (checkpoint file, hub id or the synthetic one)
  3. build              the model with the target's ``Rewrites`` (``spec.model``)
  4. for each graph of the model's graph set (``GRAPH_SET``; ``spec.graphs`` says which the target ships):
                        convert (``spec.convert``) into the staged bundle folder
  5. tables             host-side files the runtime reads (``spec.tables``, optional)
  6. lint               the target's graph lint (``spec.lint``, optional; ``--allow-dirty`` records instead
                        of refusing, for every target)
  7. target checks      ``spec.checks``: name -> fn(job) -> dict (in fidelity.json "checks"), or None where it
                        does not apply; a check may add "failures" (one line each), which fail the bundle like a bar
  8. fidelity           ONE measurement, ``checks.fidelity.measure.measure_backend`` (what `sam2edge verify`
                        runs) on the staged files, with the ONE bar table ``checks.fidelity.bars.BARS``
                        (``spec.measure`` replaces it only for a target whose graphs cannot run here)
  9. write              fidelity.json (schema ``bundle.fidelity``), card.json, manifest.json; the staged
                        folder replaces ``--out`` atomically, only when everything above succeeded

A failing bar refuses the export unless ``force`` (then written with status "rejected").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from sam2edge.bundle import CARD, finalize_bundle, validate_fidelity
from sam2edge.checks.bench.records import machine
from sam2edge.checks.fidelity.bars import bars_for, check_bars
from sam2edge.checks.fidelity.measure import MIN_CLICKS, CachedEncoder, CachedReference, measure_backend
from sam2edge.config import Sam2Config, Sam2VideoConfig, get_config, get_video_config
from sam2edge.errors import UserError
from sam2edge.export import video as vid
from sam2edge.export.kept import fp32_kept
from sam2edge.export.mixed import fp16_storage_only, unheld_note, widened
from sam2edge.export.provenance import shared_provenance
from sam2edge.export.smooth import CARD_NOTE as SMOOTHING_NOTE
from sam2edge.export.smooth import ROUNDING_NOTE, export_weights, prepared_weights
from sam2edge.io import atomic_dir
from sam2edge.model import UPSTREAM, Rewrites, Sam2ImageModel, build_sam2
from sam2edge.progress import Stages, stage
from sam2edge.runtime.backends import EagerBackend
from sam2edge.targets import Target, get_target, resolve

# the model's graph set: role -> what the graph computes. Data: video graphs (memory attention, memory
# encoder) and a batched decoder (automatic masks) are new entries here, then one graph in each target.
GRAPH_SET: dict[str, str] = {
    "encoder": "image 1x3xSxS -> image_embeddings 1xCxexe, feat_s0, feat_s1",
    "decoder": "features + prompt -> masks 1x3, iou 1x3, single_mask, single_iou, object_score",
    "decoder-cpu": "the decoder a CPU runtime runs per click (CPU-friendly Rewrites, given decoder-prep's "
    "projections), same outputs",
    "decoder-prep": "image_embeddings + the dense prompt (or the mask input it comes from) -> the decoder's "
    "first-layer image projections (per image and mask input)",
    "mask-encoder": "mask_input 1x1x4ex4e logits -> dense_prompt 1xCxexe",
    "decoder-batched": "features + B prompts (B fixed, options batch) -> the decoder's outputs with B rows",
    **vid.GRAPH_SET_VIDEO,  # --video: memory attention, memory encoder, video decoder
}


@dataclass
class Job:
    """One export in progress, as the target's steps see it."""

    target: Target
    cfg: Sam2Config
    config_name: str
    precision: str
    sd: dict  # sam2edge state dict (fp32)
    source: dict  # provenance of the weights (card.json "source")
    model: Sam2ImageModel  # built with the target's rewrites, weights loaded
    folder: Path  # the staged bundle folder (becomes --out at the end)
    allow_dirty: bool = False  # --allow-dirty: a dirty graph is recorded instead of refused
    clicks: int = MIN_CLICKS  # end-to-end prompts of the fidelity measurement
    files: dict[str, str] = field(default_factory=dict)  # file -> role, written so far
    lint: dict = field(default_factory=dict)  # what spec.lint returned (target-specific)
    checks: dict[str, dict] = field(default_factory=dict)  # check name -> result
    state: dict = field(default_factory=dict)  # anything a target keeps between its steps
    vcfg: Sam2VideoConfig | None = None  # --video: the memory path's config (None: image graphs only)
    measured: dict = field(default_factory=dict)  # shared by the job's measurements (reference, tested)
    bars: dict[str, float] | None = None  # run_export's bar overrides (checks that measure a file apply them)

    def reference(self) -> CachedReference:
        """THE eager fp32 reference (upstream's operations) of this export: every measurement of the job
        (target checks and the fidelity stage) shares its encodes and decodes, computed once."""
        if "reference" not in self.measured:
            self.measured["reference"] = CachedReference(EagerBackend.from_state_dict(self.sd, self.cfg, UPSTREAM))
        return self.measured["reference"]

    def tested(self, backend) -> CachedEncoder:
        """``backend`` over this job's staged encoder graph, with the job's one cache of its encoder outputs
        (a bundle measured with two decoders encodes each photo once)."""
        return CachedEncoder(backend, self.measured.setdefault("encodes", {}))

    def measure_decoder(self, backend, file: str, label: str) -> dict:
        """A second decoder program of the staged bundle (``backend`` runs ``file``) measured like the bundle:
        same measurement, same bars, on the job's reference and encodes (so it costs ``file``'s decodes only).
        A target check's result: its failures, named ``file (label)``, fail the bundle."""
        m = measure_backend(self.reference(), self.tested(backend), self.precision, clicks=self.clicks)
        fails = [f"{file} ({label}): {f}" for f in m["failures"]]
        return {"decoder": file, "outputs": m["outputs"], "end_to_end": m["end_to_end"], "failures": fails}

    @property
    def precision_label(self) -> str:
        return f"{self.precision}, {self.cfg.image_size}px"


# file -> (role in GRAPH_SET, module, sample inputs: a tuple of positional tensors or a dict of named ones)
Graphs = dict[str, tuple[str, nn.Module, object]]


def _default_model(sd: dict, cfg: Sam2Config, precision: str, rewrites: Rewrites) -> Sam2ImageModel:
    model = build_sam2(cfg, rewrites)
    model.load_state_dict(sd, strict=True)
    return model


def export_model(sd: dict, cfg: Sam2Config, precision: str, rewrites: Rewrites) -> Sam2ImageModel:
    """The model a default-built export at ``precision`` converts: ``rewrites`` on the weights it quantises
    (``export_weights``: int8 smoothed). For benchmarks that convert graphs outside ``run_export``."""
    return _default_model(export_weights(sd, cfg, precision), cfg, precision, rewrites)


def _default_config(cfg: Sam2Config, resolution: int | None) -> Sam2Config:
    return cfg if resolution is None else cfg.at_resolution(resolution)


@dataclass(frozen=True)
class TargetSpec:
    """What a target contributes to the pipeline (the rest is shared)."""

    name: str  # registry key (sam2edge.targets)
    rewrites: Rewrites  # model rewrites for this runtime's converter
    graphs: Callable[[Job], Graphs]  # the graphs of GRAPH_SET it ships, with sample inputs
    convert: Callable[[Job, str, nn.Module, object], None]  # write job.folder / file
    open_backend: Callable[[Job], object] | None  # a Backend over the staged files (None: spec.measure)
    extra: Callable[[Job], dict]  # card.json "extra" (I/O names, census, prompt layout, ...)
    summary: Callable[[dict, Path], str]  # what the CLI prints
    model: Callable[[dict, Sam2Config, str, Rewrites], Sam2ImageModel] = _default_model
    config: Callable[[Sam2Config, int | None], Sam2Config] = _default_config  # --resolution rule
    tables: Callable[[Job], dict[str, str]] | None = None  # host tables written -> role
    lint: Callable[[Job], dict] | None = None  # graph lint; raise UserError unless job.allow_dirty
    checks: dict[str, Callable[[Job], dict | None]] = field(default_factory=dict)  # None: does not apply
    measure: Callable[[Job, EagerBackend], dict] | None = None  # only where the graphs cannot run here
    video: Callable[[Job], Graphs] | None = None  # --video: the target's wrapping of export.video's graphs


def guard_out(out: str | Path, inputs: tuple[str | Path | None, ...] = ()) -> Path:
    """``--out`` must be a new path, an empty folder, or an existing bundle (card.json) to replace; never a
    file, ``.``, a folder that is not a bundle, or a folder that is or holds one of ``inputs``. One line,
    nothing touched."""
    out = Path(out)
    hint = "choose a new or empty --out folder"
    if out.resolve() == Path.cwd().resolve():
        raise UserError(f"--out {out} is the current folder; {hint}")
    for src in (Path(i) for i in inputs if i):
        if src.exists() and (src.resolve() == out.resolve() or out.resolve() in src.resolve().parents):
            raise UserError(f"--out {out} holds the input {src}; {hint}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is an existing file, not a bundle folder; {hint}")
    if out.is_dir() and any(out.iterdir()) and not (out / CARD).is_file():
        raise UserError(f"--out {out} exists and is not an export bundle; {hint}")
    return out


def check_request(target: str, precision: str) -> Target:
    """The registry entry of ``target`` if it offers ``precision``; else one line naming what it offers."""
    entry = get_target(target)
    if precision not in entry.precisions:
        *head, last = entry.precisions
        offers = f"{', '.join(head)} or {last}" if head else last
        raise UserError(f"{entry.title} export offers --precision {offers}, not {precision!r}")
    return entry


def check_int8_reaches(entry: Target, cfg: Sam2Config, config_name: str, precision: str) -> None:
    """Refuse int8 where the target's recipe would quantise none of the encoder's arithmetic (EdgeTAM's RepViT
    is convolutional; ONNX's and ExecuTorch's int8 quantise linear layers): the bundle would be fp32 under an
    int8 name."""
    kind = "conv" if cfg.trunk == "repvit" else "linear"  # the layers that carry the encoder's arithmetic
    if precision == "int8" and kind not in entry.int8_layers:
        raise UserError(
            f"{entry.title} int8 quantises linear layers only and {config_name}'s image encoder is convolutional,"
            " so nothing would be int8; export --precision fp16, or --target litert --precision int8"
        )


def _fidelity(spec: TargetSpec, job: Job, bars: dict | None) -> dict:
    if spec.measure is not None:
        fidelity = spec.measure(job, job.reference().backend)
    else:
        test = job.tested(spec.open_backend(job))
        fidelity = measure_backend(job.reference(), test, job.precision, clicks=job.clicks, bars=bars)
    if job.vcfg is not None:
        stage(f"video fidelity: a {vid.CLIP_NOTE} vs eager fp32")
        fidelity["video"] = vid.measure(job, spec.open_backend(job), bars)
        fidelity["failures"] += fidelity["video"]["failures"]
    fidelity["checks"] = job.checks
    fidelity["failures"] += [f for c in job.checks.values() for f in c.get("failures", [])]
    fidelity["passed"] = not fidelity["failures"]
    fidelity["machine"] = machine()  # what ran the programs: fp16 arithmetic differs by CPU
    return validate_fidelity(fidelity, "the measured fidelity.json")


def _build_files(spec: TargetSpec, job: Job, stages: Stages) -> None:
    graphs = spec.graphs(job)
    if job.vcfg is not None:
        graphs.update(spec.video(job))
    for file, (role, module, sample) in graphs.items():
        if role not in GRAPH_SET:
            raise ValueError(f"{spec.name}: graph {file} has role {role!r}, not one of {sorted(GRAPH_SET)}")
        if role == "decoder-batched" and job.state.get("batch") == 0:  # options batch=0: no batched decoder
            continue
        stages.next(f"convert {file}")
        stage(f"convert {file} ({job.precision_label}) for {spec.name}")
        job.files[file] = role
        with shared_provenance():  # byte-identical files, less time copying torch.fx debug records
            spec.convert(job, file, module.eval(), sample)
    if spec.tables is not None:
        job.files.update(spec.tables(job))
    if job.vcfg is not None:
        job.files.update(vid.write_video_tables(job))
    if spec.lint is not None:
        stages.next("lint")
        job.lint = spec.lint(job)
    for name, check in spec.checks.items():
        stages.next(f"check {name}")
        stage(f"check: {name}")
        result = check(job)
        if result is not None:  # None: the check does not apply to this export
            job.checks[name] = result


def _build_and_measure(spec: TargetSpec, job: Job, stages: Stages, bars: dict | None) -> dict:
    """Every file built, then the bundle measured; where a measured mixed-precision bundle misses an
    end-to-end bar its emulation met, built again with more of the ranking kept fp32 (``export.mixed.widened``)."""
    start = dict(job.state)  # options and prepared state, before any conversion
    while True:
        first = stages.started
        _build_files(spec, job, stages)
        stages.next("fidelity")
        fidelity = _fidelity(spec, job, bars)
        sel, e2e = job.state.get("mixed_precision"), fidelity["end_to_end"]
        missed = [] if fidelity["passed"] or not sel else check_bars({}, e2e, _iou_bars(job.precision, bars))
        more = widened(sel, e2e["iou_worst"], e2e["iou_median"]) if missed else None
        if more is None:
            unheld = unheld_note(sel) if fidelity["passed"] else ""
            if unheld:
                stage(f"{job.precision}: the bundle passed its check, but {unheld}")
            return fidelity
        again = (
            "in fp32 arithmetic on fp16 weights"
            if more.get("pending")
            else f"with {len(more['kept_fp32'])} layers kept fp32"
        )
        stage(f"{job.precision}: the bundle missed a bar its emulation met ({missed[0]}); converting again {again}")
        job.state = {**start, "mixed_precision": more}
        job.files, job.checks, job.lint = {}, {}, {}
        job.measured.pop("encodes", None)  # the encoder changes; the reference's outputs stay
        stages.extend(stages.started - first)  # the same stages once more


def _iou_bars(precision: str, overrides: dict | None) -> dict[str, float]:
    """The end-to-end mask IoU bars of ``precision`` (what a wider mixed-precision selection can lift)."""
    return {k: v for k, v in bars_for(precision, overrides).items() if k in ("min_iou_worst", "min_iou_median")}


def _load(checkpoint: str | None, cfg: Sam2Config, vcfg: Sam2VideoConfig | None) -> tuple[dict, dict]:
    from sam2edge.weights import load_weights
    from sam2edge.weights.video import load_video_weights

    return load_weights(checkpoint, cfg) if vcfg is None else load_video_weights(checkpoint, cfg, vcfg)


def _refusal_hint(job: Job) -> str:
    """What to try after a refused reduced-precision export: the ``diagnose`` command that names the layers and
    clicks (``--int8``: the sensitivity sweep), then ``--force``."""
    if job.precision not in ("fp16", "int8") or job.target.name not in ("litert", "onnx", "executorch"):
        return "pass --force to write it as 'rejected'"
    ckpt = job.source.get("checkpoint") or "CHECKPOINT"
    mode = " --int8 --clicks 10" if job.precision == "int8" else ""
    return mixed_note(job.state.get("mixed_precision")) + (
        f"`sam2edge diagnose {job.target.name}{mode} --config {job.config_name} --checkpoint {ckpt}` lists the "
        "failing clicks and the layers to keep in fp32; pass --force to write it as 'rejected'"
    )


def mixed_note(sel: dict | None) -> str:
    """One sentence on what the measured mixed-precision selection (``export.mixed``) kept fp32 and reached."""
    if not sel or not sel["trials"]:
        return ""
    kept = ", ".join(sel["kept_fp32"]) or "nothing"
    verdict = "met the bars" if sel["holds"] else "still missed the bars"
    if sel.get("aimed_at"):  # the goal was out of reach with every candidate kept: the shipping bar instead
        verdict = "met the shipping bar" if sel["holds"] else "still missed the shipping bar"
        verdict += " (the median goal was out of reach with every candidate kept fp32)"
    ranked = ", ".join(r["part"] for r in sel.get("ranking", [])[:3])
    emulated = f"worst {sel['iou_worst']:.4f}, median {sel['iou_median']:.4f}"
    emulated += f", the lowest of {sel['draws']} draws" if sel.get("draws", 1) > 1 else ""
    missed = "".join(
        f"; the bundle with {c['kept']} kept missed (worst {c['iou_worst']:.4f}, median {c['iou_median']:.4f})"
        for c in sel.get("bundle_checks", [])
    )
    first = sel.get("fp16_arithmetic")  # ExecuTorch's fallback: fp16 storage after fp16 arithmetic missed
    storage = (
        f"fp16 arithmetic with {len(first['kept_fp32'])} parts kept fp32 missed the bars in the eager emulation "
        f"(worst {first['iou_worst']:.4f}, median {first['iou_median']:.4f}), so fp16 weights with fp32 "
        "arithmetic: "
        if first
        else ""
    )
    if missed:
        chosen = sel["bundle_checks"][0]["kept"]  # the emulation's choice: the first bundle's kept layers
        return f"{storage}the eager emulation met the bars with {chosen} layers kept ({emulated}){missed}; "
    return (
        f"{storage}keeping {kept} in fp32 {verdict} in the eager emulation ({emulated})"
        + (f"; the most sensitive parts: {ranked}" if ranked else "")
        + "; "
    )


def _card_extra(spec: TargetSpec, job: Job, target: str, video: bool) -> dict:
    """The card's ``extra``: the target's facts, the video graphs, what stays fp32 and why, the measured
    mixed-precision choice."""
    kept = fp32_kept(target, job.precision, video, fp16_storage_only(job))
    return {
        **spec.extra(job),
        **({"video": vid.extra(job)} if video else {}),
        **({"fp32_kept": kept} if kept else {}),
        **({"mixed_precision": job.state["mixed_precision"]} if "mixed_precision" in job.state else {}),
        **({"int8_smoothing": SMOOTHING_NOTE, "int8_rounding": ROUNDING_NOTE} if job.precision == "int8" else {}),
        **job.state.get("weights_report", {}),  # int8: pairs smoothed, the rounding's output error
    }


def run_export(
    target: str,
    config_name: str,
    precision: str,
    out: str | Path,
    *,
    resolution: int | None = None,
    checkpoint: str | None = None,
    weights: tuple[dict, dict] | None = None,
    allow_dirty: bool = False,
    force: bool = False,
    command: str = "",
    clicks: int = MIN_CLICKS,
    bars: dict[str, float] | None = None,
    options: dict | None = None,
    video: bool = False,
) -> dict:
    """Export ``target`` (a registry key) at ``precision`` into the bundle folder ``out``; returns the card.

    ``weights`` = (state dict, source) skips loading ``checkpoint`` (tests, benchmarks); ``bars`` override
    the precision's bars key by key (never used by the CLI); ``options`` go to ``job.state`` (target knobs
    such as LiteRT's ``num_tokens``). ``video``: also the video graphs (``export.video``); ``weights`` is
    then the whole video model's state dict."""
    entry = check_request(target, precision)
    out = guard_out(out, (checkpoint,))
    spec: TargetSpec = resolve(entry.converter)
    cfg = spec.config(get_config(config_name), resolution)
    vcfg = vid.check_request(spec, get_video_config(config_name, cfg.image_size), precision) if video else None
    check_int8_reaches(entry, cfg, config_name, precision)
    sd_all, source = weights if weights is not None else _load(checkpoint, cfg, vcfg)
    sd = vid.image_part(sd_all, cfg) if video else sd_all
    prepared, weights_report = prepared_weights(sd, cfg, precision)  # int8: smoothed and GPTQ-rounded
    model = spec.model(prepared, cfg, precision, spec.rewrites)
    stages = Stages(f"export {target} {precision}", len(GRAPH_SET) + 2 + len(spec.checks) + (spec.lint is not None))
    try:
        with atomic_dir(out) as tmp:
            job = Job(entry, cfg, config_name, precision, sd, source, model, tmp, allow_dirty, clicks)
            job.vcfg, job.bars = vcfg, bars
            job.state.update({**(options or {}), "weights_report": weights_report})
            if video:
                vid.prepare(job, sd_all, spec.rewrites)
            fidelity = _build_and_measure(spec, job, stages, bars)
            if not fidelity["passed"] and not force:
                raise UserError(f"export refused: {fidelity['failures'][0]}; {_refusal_hint(job)}")
            stages.finish_stage()  # every stage before the write, timed (card.json extra.stage_seconds)
            stages.next("write")
            return finalize_bundle(
                tmp,
                target=target,
                precision=precision,
                resolution=cfg.image_size,
                config=config_name,
                source=source,
                command=command,
                artifacts=dict(job.files),
                fidelity=fidelity,
                status="shippable" if fidelity["passed"] else "rejected",
                extra={**_card_extra(spec, job, target, video), "stage_seconds": dict(stages.seconds)},
            )
    finally:
        stages.close()
