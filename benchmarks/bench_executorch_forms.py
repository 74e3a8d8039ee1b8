"""ExecuTorch XNNPACK: the decoder and encoder programs in their earlier and current forms, side by side at full size.

    python benchmarks/bench_executorch_forms.py [--graph decoder|encoder] [--int8] [--runs 40] [--profile]
        [--forms NAME ...]

Decoder forms (Hiera-Tiny at 1024 px, random weights, 16 prompt slots, no mask input):
  one program, before   ``decoder.pte`` in its earlier form: Rewrites(transposed_conv="matmul"), the
                        upscaling NCHW, channel-sum mask head, the positional encoding made NCHW and turned
                        back into rows by the transformer
  one program, now      ``decoder.pte`` now: the upscaling channels-last, the mask head one matmul, the
                        positional encoding kept as rows (``executorch.REWRITES``)
  given, before-form    ``decoder_cpu.pte``'s inputs (the first layer's image projections given), old Rewrites
  given, now            ``decoder_cpu.pte`` as shipped: what the runtime runs per click
Encoder forms: Hiera's query / shortcut pooling as max_pool2d between NCHW permutes (the earlier form) or as
elementwise maxima in place (``Rewrites.q_pool = "maxima"``); the q / k / v projection fused and sliced (until
the maxima form) or as three products (``Rewrites.qkv = "split"``, shipped); the global attention whole (shipped)
or in 512 / 1024-query slices (``Rewrites.image_query_chunk``, as ONNX runs it); the keys permuted once (shipped)
or split into heads and multiplied as q @ k^T (``Rewrites.score_keys = "rows"``, as ONNX runs them). ``--int8``:
each encoder form quantised as the int8 export quantises it (``executorch._quantize_int8``); ``--forms`` picks forms
by name.

Each is lowered as the exporter lowers it (``executorch_lower.lower``, XNNPACK partitioner); every output is
compared with the first form's (largest difference relative to its scale), then all are timed in interleaved
rounds (ExecuTorch's own thread pool). ``decoder_prep.pte`` (once per image) is timed apart. ``--profile``
adds each form's ETDump time per operator type. Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import tempfile
import time
from pathlib import Path

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.runtime import Runtime

from sam2edge.checks.bench.profile import etdump_kinds, interleaved_ms
from sam2edge.config import get_config
from sam2edge.export.executorch import MAX_POINTS, REWRITES, _quantize_int8
from sam2edge.export.executorch_graphs import (
    XnnDecoderGraph,
    XnnEncoderGraph,
    XnnGivenDecoderGraph,
    XnnImageProjectionsGraph,
    decoder_inputs,
    encoder_inputs,
    given_decoder_inputs,
)
from sam2edge.export.executorch_lower import lower
from sam2edge.model import Rewrites, build_sam2

BEFORE = Rewrites(transposed_conv="matmul", texture_limit=0)  # executorch.REWRITES before the layout rewrites


class _PeNchw:
    """The positional encoding as the earlier graphs made it: (1, C, e, e), turned back into rows inside."""

    def image_pe(self) -> torch.Tensor:
        e = self.model.cfg.image_embedding_size
        return super().image_pe().transpose(1, 2).reshape(1, -1, e, e)  # (1, C, e, e)


class DecoderBefore(_PeNchw, XnnDecoderGraph):
    pass


class GivenBefore(_PeNchw, XnnGivenDecoderGraph):
    pass


def load(graph: torch.nn.Module, args: tuple, file: Path):
    """Lower ``graph`` (in eval mode) on ``args`` to ``file`` -> (loaded forward, delegate count)."""
    prog, census = lower(graph, args, [XnnpackPartitioner()])
    file.write_bytes(prog.buffer)
    return Runtime.get().load_program(file).load_method("forward"), census.delegates


def decoder_forms(cfg, sd: dict) -> dict[str, tuple[torch.nn.Module, tuple]]:
    """The four decoder forms (module doc) with their sample inputs, on weights ``sd``."""
    models = {rw: build_sam2(cfg, rw).eval() for rw in (BEFORE, REWRITES)}
    for m in models.values():
        m.load_state_dict(sd)
    old, new = models[BEFORE], models[REWRITES]
    click = decoder_inputs(cfg, MAX_POINTS)
    given = given_decoder_inputs(new, click)
    return {
        "one program, before": (DecoderBefore(old).eval(), click),
        "one program, now": (XnnDecoderGraph(new).eval(), click),
        "given, before-form": (GivenBefore(old).eval(), given),
        "given, now": (XnnGivenDecoderGraph(new).eval(), given),
    }


ENCODER_FORMS = {  # name: Rewrites fields that differ from executorch.REWRITES
    "max_pool2d, fused": {"q_pool": "max_pool", "qkv": "fused"},  # the earlier form
    "maxima, fused": {"qkv": "fused"},  # pooling rewritten only
    "maxima, split": {},  # now
    "maxima, split, 512-query slices": {"image_query_chunk": 512},  # global attention as ONNX runs it
    "maxima, split, 1024-query slices": {"image_query_chunk": 1024},
    "maxima, split, key rows": {"score_keys": "rows"},
}


def encoder_forms(cfg, sd: dict, int8: bool = False, names=None) -> dict[str, tuple[torch.nn.Module, tuple]]:
    """The encoder in each form of ``ENCODER_FORMS`` (or those ``names``) on weights ``sd`` (``int8``: quantised as
    exported)."""
    forms, image = {}, encoder_inputs(cfg)  # one image for all
    for name, fields in ENCODER_FORMS.items():
        if names and name not in names:
            continue
        model = build_sam2(cfg, dataclasses.replace(REWRITES, **fields)).eval()
        model.load_state_dict(sd)
        graph = XnnEncoderGraph(model).eval()
        forms[name] = (_quantize_int8(graph, image) if int8 else graph, image)
    return forms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", choices=("decoder", "encoder"), default="decoder")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--int8", action="store_true", help="encoder forms quantised as the int8 export does")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--forms", nargs="+", choices=list(ENCODER_FORMS), help="encoder forms to lower (default: all)")
    args = ap.parse_args()
    cfg = get_config("sam2.1-hiera-tiny")
    torch.manual_seed(0)
    sd = {k: torch.randn_like(v) * 0.05 for k, v in build_sam2(cfg, REWRITES).state_dict().items()}
    forms = decoder_forms(cfg, sd) if args.graph == "decoder" else encoder_forms(cfg, sd, args.int8, args.forms)
    with tempfile.TemporaryDirectory() as tmp:
        methods, files = {}, {}
        for i, (form, (graph, sample)) in enumerate(forms.items()):
            files[form] = Path(tmp) / f"form{i}.pte"
            methods[form], delegates = load(graph, sample, files[form])
            print(f"lowered {form}: {delegates} delegate(s)", flush=True)
        first_form = next(iter(forms))
        first = methods[first_form].execute(list(forms[first_form][1]))
        for form, method in methods.items():
            got = method.execute(list(forms[form][1]))
            err = max(float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, first))
            print(f"  {form:20s} largest output difference from the first form: {err:.1e} of the scale")
        calls = {form: functools.partial(m.execute, list(forms[form][1])) for form, m in methods.items()}
        times = interleaved_ms(calls, args.runs)
        print(f"\n{args.graph}, {args.runs} interleaved runs | p50 ms | p10 - p90")
        for form, ts in times.items():
            q = statistics.quantiles(ts, n=10)
            print(f"  {form:20s} | {statistics.median(ts):7.1f} | {q[0]:.1f} - {q[-1]:.1f}")
        if args.graph == "decoder":
            time_prep(forms["given, now"][0].model, decoder_inputs(cfg, MAX_POINTS), Path(tmp) / "prep.pte")
        if args.profile:
            for form, (_, sample) in forms.items():
                kinds = etdump_kinds(files[form], list(sample), 5 if args.graph == "decoder" else 2)
                print(f"  ETDump, {form}: " + ", ".join(f"{k} {ms:.1f}" for k, ms in list(kinds.items())[:7]))


def time_prep(model, click: tuple, file: Path) -> None:
    """``decoder_prep.pte`` (once per image), mean of 10 calls."""
    prep, _ = load(XnnImageProjectionsGraph(model).eval(), (click[0], *click[5:]), file)
    t0 = time.perf_counter()
    for _ in range(10):
        prep.execute([click[0], *click[5:]])
    print(f"  decoder_prep.pte (once per image): {(time.perf_counter() - t0) * 100:.1f} ms mean of 10")


if __name__ == "__main__":
    main()
