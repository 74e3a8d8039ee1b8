"""What bounds an int8 encoder's speed-up over its fp32: the two runtime profiles, split by kind of operator.

    python benchmarks/int8_bound.py INT8_PROFILE FP32_PROFILE [INT8_PROFILE FP32_PROFILE ...]
        [--goal 1.6] [--record FILE --id ID --title TITLE]

Each PROFILE is a ``sam2edge bench BUNDLE --profile --no-eager --records DIR`` record (DIR/DATE/profile-*.json);
a pair is one checkpoint's encoder at int8 and at fp32, same target, same machine. Each operator type of the
encoder falls into one kind (``KINDS``, by target):

  weight products      products with a constant operand (LiteRT FULLY_CONNECTED / CONV_2D, XNNPACK's Fully
                       Connected / Convolution in ExecuTorch): what dynamic-range int8 quantises
  activation products  products of two activations (BATCH_MATMUL, Batch Matrix Multiply: the attention's
                       q k^T and p v), which these runtimes run in fp32 only
  the rest             layout, softmax, normalisation, element-wise

Printed per pair (milliseconds summed over the profile's operators, per encoder call): each kind's time at fp32
and at int8, the measured speed-up, the quantised products' own speed-up, and the **ceiling**: the fp32 time over
the int8 time with every weight product int8 at that speed-up (the layers kept fp32 too) and everything else as
measured. A goal above the ceiling needs faster int8 products or int8 activation products; ``needed`` is the
weight products' speed-up that would reach ``--goal``. The profiles' own summed times are used throughout
(LiteRT's profile times each operator as a one-operator graph, so its sum exceeds the whole graph's time).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from sam2edge.checks.bench.script import new_file

# target -> (operator type prefix, kind), the first match wins; a type no prefix names is "rest". "int8": a product
# quantised to int8, "weight": one with a constant operand left fp32 (kept by the export, or not quantisable)
KINDS: dict[str, tuple[tuple[str, str], ...]] = {
    "litert": (  # the profile names a product with int8 weights "<OP> int8" (``checks.bench.profile``)
        ("FULLY_CONNECTED int8", "int8"),
        ("CONV_2D int8", "int8"),
        ("FULLY_CONNECTED", "weight"),
        ("CONV_2D", "weight"),
        ("BATCH_MATMUL", "activation"),
    ),
    "executorch": (  # XNNPACK's operator names: QD8 / QDU8 dynamically quantised, QS8 static
        ("xnnpack:Fully Connected (NC, QD", "int8"),
        ("xnnpack:Fully Connected (NC, QS8", "int8"),
        ("xnnpack:Convolution (NHWC, QD", "int8"),
        ("xnnpack:Fully Connected", "weight"),
        ("xnnpack:Convolution", "weight"),
        ("xnnpack:Batch Matrix Multiply", "activation"),
    ),
}
COLUMNS = [
    ["target", "target"],
    ["fp32_ms", "fp32 (ms)"],
    ["int8_ms", "int8 (ms)"],
    ["speedup", "int8 vs fp32"],
    ["weight_ms", "weight products fp32 -> int8 (ms)"],
    ["weight_speedup", "int8 products' speed-up"],
    ["activation_ms", "activation products fp32 -> int8 (ms)"],
    ["rest_ms", "the rest fp32 -> int8 (ms)"],
    ["ceiling", "ceiling"],
    ["needed", "weight speed-up for the goal"],
]


def kinds(profile: dict) -> dict[str, float]:
    """An encoder profile's milliseconds per call by kind: {"int8", "weight", "activation", "rest", "total"}."""
    table = KINDS[profile["target"]]
    out = {"int8": 0.0, "weight": 0.0, "activation": 0.0, "rest": 0.0}
    for t in profile["runtime"]["encoder"]["by_type"]:
        kind = next((k for prefix, k in table if t["op"].startswith(prefix)), "rest")
        out[kind] += t["ms"]
    return out | {"total": sum(out.values())}


def bound(int8: dict, fp32: dict, goal: float) -> dict:
    """One pair's row: each kind at both precisions, the ceiling and the weight speed-up ``goal`` needs. The
    products the int8 graph keeps fp32 are taken to cost there what they cost in the fp32 graph, so the quantised
    products' own speed-up is ``(fp32 weight products - kept) / int8 products``."""
    q, f = kinds(int8), kinds(fp32)
    s = (f["weight"] - q["weight"]) / q["int8"]  # the quantised products' speed-up
    fixed = q["activation"] + q["rest"]  # what int8 leaves as it is
    ceiling = f["total"] / (fixed + f["weight"] / s)
    need = f["total"] / goal - fixed  # the weight products' time that would reach the goal
    return {
        "target": int8["target"],
        "fp32_ms": round(f["total"]),
        "int8_ms": round(q["total"]),
        "speedup": f"{f['total'] / q['total']:.2f}x",
        "weight_ms": f"{f['weight']:.0f} -> {q['int8']:.0f} + {q['weight']:.0f} kept fp32",
        "weight_speedup": f"{s:.2f}x",
        "activation_ms": f"{f['activation']:.0f} -> {q['activation']:.0f}",
        "rest_ms": f"{f['rest']:.0f} -> {q['rest']:.0f}",
        "ceiling": f"{ceiling:.2f}x",
        "needed": f"{f['weight'] / need:.2f}x" if need > 0 else "unreachable",
    }


def _problem(paths: list[Path], profiles: list[dict | None], record: Path | None, goal: float) -> str | None:
    """What makes the input unusable, in one line (None: nothing)."""
    if not math.isfinite(goal) or goal <= 0:
        return f"--goal {goal}: give a finite speed-up above 0, such as 1.6"
    if len(paths) % 2:
        return f"{len(paths)} profiles; give them in pairs: INT8_PROFILE FP32_PROFILE"
    for path, p in zip(paths, profiles, strict=True):
        if p is None:
            return f"{path}: not an encoder profile; make one with `sam2edge bench BUNDLE --profile --records DIR`"
        if p["target"] not in KINDS:
            return f"{path}: target {p.get('target')!r} has no operator kinds; profiles of {sorted(KINDS)} only"
    for i in range(0, len(profiles), 2):
        a, b = profiles[i], profiles[i + 1]
        if (a["precision"], b["precision"]) != ("int8", "fp32") or a["target"] != b["target"]:
            return f"{paths[i]}, {paths[i + 1]}: not an int8 and an fp32 profile of one target, in that order"
        if not kinds(a)["int8"]:
            return f"{paths[i]}: no int8 product in its encoder's profile; profile the bundle again with this version"
        if kinds(b)["weight"] <= kinds(a)["weight"]:
            return (
                f"{paths[i]}, {paths[i + 1]}: the int8 profile keeps more fp32 products than the fp32 one has; "
                "give two profiles of one encoder"
            )
    return new_file(record, "--record")


def _ms(v: object) -> bool:
    """Whether ``v`` is a time a profile can hold: a finite number of milliseconds, 0 or more."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _load(path: Path) -> dict | None:
    """The profile record at ``path``, or None where it is not one with an encoder's time by operator type."""
    try:
        p = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    encoder = (p.get("runtime") or {}).get("encoder") if isinstance(p, dict) and p.get("kind") == "profile" else None
    types = encoder.get("by_type") if isinstance(encoder, dict) else None
    ok = isinstance(types, list) and all(
        isinstance(t, dict) and isinstance(t.get("op"), str) and _ms(t.get("ms")) for t in types
    )
    return p if ok and all(isinstance(p.get(k), str) for k in ("target", "precision")) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", type=Path, help="INT8_PROFILE FP32_PROFILE pairs")
    ap.add_argument("--goal", type=float, default=1.6, help="int8 speed-up over fp32 to test (default 1.6)")
    ap.add_argument("--record", type=Path, help="also write a table record (docs/benchmarks.md) to this new file")
    ap.add_argument("--id", default="int8-bound")
    ap.add_argument("--title", default="What bounds int8's speed-up over fp32")
    ap.add_argument("--note", action="append", default=[], help="a note under the table (repeatable)")
    a = ap.parse_args(argv)
    profiles = [_load(p) for p in a.profiles]
    problem = _problem(a.profiles, profiles, a.record, a.goal)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    rows = [bound(profiles[i], profiles[i + 1], a.goal) for i in range(0, len(profiles), 2)]
    for r in rows:
        print("  ".join(f"{k} {v}" for k, v in r.items()))
    if a.record is not None:
        import sam2edge
        from sam2edge.cards.report import SCHEMA
        from sam2edge.checks.bench.records import table_machine

        first = profiles[0]
        rec = {
            "schema": SCHEMA,
            "id": a.id,
            "title": f"{a.title} (Hiera-Tiny, {first['resolution']} px, {first['threads']} threads)",
            "date": first["time"][:10],
            "command": f"sam2edge bench BUNDLE --profile --no-eager --runs {first['runs']} --clicks 1 --records DIR"
            f" (an int8 and an fp32 bundle of one checkpoint) && python benchmarks/int8_bound.py INT8_PROFILE "
            f"FP32_PROFILE ... --goal {a.goal} --record FILE",
            "machine": table_machine(first["machine"]),
            "sam2edge": {"version": sam2edge.__version__},
            "columns": COLUMNS,
            "rows": rows,
            "notes": [
                "Milliseconds per encoder call summed over the runtime profile's operators. Weight products: "
                "products with a constant operand, which dynamic-range int8 quantises; activation products: the "
                "attention's q k^T and p v, fp32 in both bundles (XNNPACK's batch matrix multiply is fp32 only).",
                "ceiling: the fp32 time over the int8 time with every weight product at the int8 products' measured "
                "speed-up and the rest as measured; weight speed-up for the goal: what those products would need "
                f"for {a.goal}x.",
                *a.note,
            ],
        }
        a.record.write_text(json.dumps(rec, indent=2) + "\n")
        print(f"{len(rows)} rows -> {a.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
