"""sam2edge eager vs upstream eager (Meta ``sam2``), same weights, one process, interleaved.

Reports encoder and per-click decoder latency (median / min / max of --runs after --warmup) for:
  upstream        sam2's SAM2Base image path (forward_image + prompt encoder + mask decoder)
  sam2edge        the predictor's eager model (upstream ops: UPSTREAM rewrites)
  sam2edge-export the export-form model (default Rewrites: math attention, zero-stuff convs, safe LN)
and the ratio of each to upstream. Usage: .venv/bin/python benchmarks/bench_eager.py [--runs 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from oracles import meta_sam2base  # noqa: E402

from sam2edge.checks.fidelity import photo  # noqa: E402
from sam2edge.config import HIERA_TINY  # noqa: E402
from sam2edge.model import UPSTREAM, Rewrites, build_sam2  # noqa: E402
from sam2edge.runtime.preprocess import preprocess  # noqa: E402
from sam2edge.weights.load import expected_shapes, to_sam2edge  # noqa: E402


def upstream_runner(m):
    def encode(x):
        out = m.forward_image(x)
        _, feats, _, sizes = m._prepare_backbone_features(out)
        feats[-1] = feats[-1] + m.no_mem_embed
        return [f.permute(1, 2, 0).reshape(1, -1, *s) for f, s in zip(feats, sizes)]

    def decode(f, coords, labels):
        sparse, dense = m.sam_prompt_encoder(points=(coords, labels), boxes=None, masks=None)
        return m.sam_mask_decoder(f[2], m.sam_prompt_encoder.get_dense_pe(), sparse, dense, True, False, f[:2])

    return encode, decode


def ours_runner(model):
    def encode(x):
        return model.encode_image(x)

    def decode(f, coords, labels):
        pe = model.sam_prompt_encoder
        pad_c = torch.cat([coords, torch.zeros(1, 1, 2)], 1)
        pad_l = torch.cat([labels.float(), -torch.ones(1, 1)], 1)
        masks, iou, obj = model.decode(*f, pe.embed_points(pad_c, pad_l), pe.no_mask_dense)
        return model.sam_mask_decoder.multimask(masks, iou)

    return encode, decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clicks", type=int, default=20, help="decoder calls per timed run")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)

    meta = meta_sam2base(seed=0)
    sd = to_sam2edge(meta.state_dict(), "meta", expected_shapes(HIERA_TINY), "bench")
    runners = {"upstream": upstream_runner(meta)}
    for name, rw in (("sam2edge", UPSTREAM), ("sam2edge-export", Rewrites())):
        model = build_sam2(HIERA_TINY, rw)
        model.load_state_dict(sd)
        runners[name] = ours_runner(model)

    x = preprocess(photo("astronaut.png"), 1024)
    coords, labels = torch.tensor([[[520.0, 380.0]]]), torch.tensor([[1]], dtype=torch.int32)
    enc = {k: [] for k in runners}
    dec = {k: [] for k in runners}
    feats = {}
    for i in range(args.warmup + args.runs):
        for name, (encode, decode) in runners.items():  # interleaved: same machine state for all
            t = time.perf_counter()
            feats[name] = encode(x)
            te = time.perf_counter() - t
            t = time.perf_counter()
            for _ in range(args.clicks):
                decode(feats[name], coords, labels)
            td = (time.perf_counter() - t) / args.clicks
            if i >= args.warmup:
                enc[name].append(te)
                dec[name].append(td)
        print(f"run {i + 1}/{args.warmup + args.runs} done", file=sys.stderr, flush=True)

    print(f"\nHiera-Tiny 1024, {args.threads} threads, median of {args.runs} runs", end="")
    print(f" (decoder: mean of {args.clicks} clicks per run); ratio = time / upstream's time")
    head = f"{'model':<16} {'encoder ms':>11} {'min':>8} {'max':>8} {'ratio':>6} | "
    print(head + f"{'decoder ms':>10} {'min':>7} {'max':>7} {'ratio':>6}")
    base_e, base_d = statistics.median(enc["upstream"]), statistics.median(dec["upstream"])
    for name in runners:
        e, d = enc[name], dec[name]
        me, md = statistics.median(e), statistics.median(d)
        print(
            f"{name:<16} {me * 1e3:11.1f} {min(e) * 1e3:8.1f} {max(e) * 1e3:8.1f} {me / base_e:6.2f} | "
            f"{md * 1e3:10.2f} {min(d) * 1e3:7.2f} {max(d) * 1e3:7.2f} {md / base_d:6.2f}"
        )


if __name__ == "__main__":
    main()
