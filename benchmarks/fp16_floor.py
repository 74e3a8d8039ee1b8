"""What fp16 activations alone cost an fp16 encoder: the fp32 encoder with its tensors rounded to fp16 at chosen
boundaries, through the check an fp16 export runs.

    .venv/bin/python benchmarks/fp16_floor.py CHECKPOINT... [--config sam2.1-hiera-tiny] [--clicks 40]
        [--record FILE --id ID --title TITLE]

An fp16 program that computes in fp16 hands fp16 tensors on: ``export.half.HalfGraph`` casts the encoder graph's
input and outputs, and every part the measured selection keeps fp32 (``export.half.Fp32Island``, ExecuTorch's fp16
encoder) takes and gives fp16. Each row rounds the fp32 encoder graph's tensors (``x.half().float()``) at:

  input / outputs / input and outputs   the graph's image, its three outputs (image embedding, feat_s0, feat_s1)
  + every part's output                 and the output of each part the fp16 selection may keep
                                        (``precision.fp16_parts``: the patch embedding, each trunk block, the neck,
                                        conv_s0 / conv_s1): an fp16 program with every part kept fp32

then the ExecuTorch fp16 emulation itself with every part kept (``precision.EMULATIONS["executorch"]``), which the
last rounding row should match. Each row is the export's end-to-end check: mask IoU worst / median against eager
fp32 with upstream's operations over ``click_set(clicks)``, fp32 decoder, bars 0.99 / 0.999. A row under the bars
with nothing but fp16 rounding says no choice of parts kept fp32 lets that program pass. Full size, 2 cores: about
25 s a rounding row, 30 s the emulation, per checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

from sam2edge.checks.bench.script import add_checkpoints, at_least, first, missing_files, new_file, parsed, refusing

BARS = (0.99, 0.999)  # the fp16 bars, worst and median mask IoU
# row -> where the fp32 encoder's tensors are rounded: (its input, its outputs, every part's output)
ROWS: dict[str, tuple[bool, bool, bool]] = {
    "nothing rounded": (False, False, False),
    "input": (True, False, False),
    "outputs": (False, True, False),
    "input and outputs": (True, True, False),
    "input, outputs and every part's output": (True, True, True),
}
COLUMNS = [
    ["checkpoint", "checkpoint"],
    ["rounded", "rounded to fp16"],
    ["worst", "mask IoU worst"],
    ["median", "mask IoU median"],
    ["bars", "bars"],
]


def rounded(x):
    """``x`` (an fp32 tensor or a tuple / list of them) with its floating tensors rounded to fp16 and back."""
    import torch

    from sam2edge.export.half import cast_floats

    return cast_floats(cast_floats(x, torch.float16), torch.float32)


class RoundedGraph:
    """``graph`` (an encoder graph: image -> outputs) with its input and / or outputs rounded to fp16."""

    def __init__(self, graph, inputs: bool, outputs: bool) -> None:
        self.graph, self.inputs, self.outputs = graph, inputs, outputs

    def __call__(self, x):
        y = self.graph(rounded(x) if self.inputs else x)
        return rounded(y) if self.outputs else y

    def eval(self):
        return self


def _rows(name: str, sd: dict, cfg, emu, prompts) -> list[dict]:
    """One checkpoint's rows: each rounding of ``ROWS``, then the ExecuTorch fp16 emulation, every part kept."""
    import numpy as np

    from sam2edge.export.precision import GraphBackend, _ious, fp16_parts
    from sam2edge.model import UPSTREAM, build_sam2
    from sam2edge.runtime.backends import EagerBackend
    from sam2edge.runtime.predictor import Sam2Predictor

    ref = Sam2Predictor(EagerBackend.from_state_dict(sd, cfg, UPSTREAM))
    rows = []

    def fp32_model():
        model = build_sam2(cfg, emu.rewrites)
        model.load_state_dict(sd)
        return model.eval()

    def measure(rounded_where: str, backend) -> None:
        ious = _ious(ref, Sam2Predictor(backend), prompts)
        worst, median = float(min(ious)), float(np.median(ious))
        ok = "pass" if worst >= BARS[0] and median >= BARS[1] else "miss"
        row = {"checkpoint": name, "rounded": rounded_where, "worst": round(worst, 5), "median": round(median, 5)}
        rows.append(row | {"bars": ok})
        print(f"{name}, {rounded_where}: worst {worst:.4f} median {median:.4f} ({ok})", flush=True)

    for where, (inputs, outputs, parts) in ROWS.items():
        model = fp32_model()
        for part in fp16_parts(model, whole_modules=True) if parts else ():
            model.get_submodule(part).register_forward_hook(lambda module, args, out: rounded(out))
        backend = GraphBackend(model, cfg)
        backend.encoder_graph = RoundedGraph(backend.encoder_graph, inputs, outputs)
        measure(where, backend)
    model = fp32_model()
    reduced = emu.reduce(model, tuple(fp16_parts(model, whole_modules=True))).eval()
    measure("ExecuTorch fp16 emulation, every part kept fp32", GraphBackend(reduced, cfg, decoder_model=model))
    return rows


def _problem(args) -> str | None:
    """What makes the arguments unusable, in one line (None: nothing)."""
    return first(
        missing_files(args.checkpoints, "give SAM 2.1 checkpoints' paths"),
        at_least("--clicks", args.clicks),
        new_file(args.record, "--record"),
    )


@refusing
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoints(p)
    p.add_argument("--clicks", type=int, default=40)
    p.add_argument("--record", help="also write a table record (docs/benchmarks.md) to this new file")
    p.add_argument("--id", default="fp16-floor")
    p.add_argument("--title", default="What fp16 activations alone cost an fp16 encoder")
    args = parsed(p, argv, _problem)
    if args is None:
        return 2
    import torch

    from sam2edge.checks.fidelity import click_set
    from sam2edge.config import get_config
    from sam2edge.export.precision import EMULATIONS
    from sam2edge.weights import load_weights

    torch.set_num_threads(2)
    cfg = get_config(args.config)
    emu = EMULATIONS["executorch"]
    prompts = click_set(args.clicks)
    rows = []
    for path in args.checkpoints:
        sd, _ = load_weights(path, cfg)
        rows += _rows(Path(path).stem, sd, cfg, emu, prompts)
    if args.record:
        import sam2edge
        from sam2edge.cards.report import SCHEMA
        from sam2edge.checks.bench.records import table_machine

        rec = {
            "schema": SCHEMA,
            "id": args.id,
            "title": f"{args.title} ({args.config}, {cfg.image_size} px)",
            "date": date.today().isoformat(),
            "command": f"python benchmarks/fp16_floor.py CHECKPOINT... --config {args.config} --clicks {args.clicks} "
            "--record FILE",
            "machine": table_machine(),
            "sam2edge": {"version": sam2edge.__version__},
            "columns": COLUMNS,
            "rows": rows,
            "notes": [
                f"The fp32 encoder graph with its tensors rounded to fp16 where each row says, fp32 decoder; mask "
                f"IoU against eager fp32 with upstream's operations over {args.clicks} clicks on 5 photos (the "
                f"fp16 export's own check; bars worst >= {BARS[0]}, median >= {BARS[1]}).",
                "every part: the patch embedding, each trunk block, the neck and conv_s0 / conv_s1, the parts an "
                "fp16 selection may keep fp32; an ExecuTorch fp16 program hands fp16 tensors between them.",
            ],
        }
        Path(args.record).write_text(json.dumps(rec, indent=2) + "\n")
        print(f"{len(rows)} rows -> {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
