"""Model card section of a ``--video`` bundle: graphs, slot layout, per-frame latency split, fidelity over frames.

Read from card.json ``extra.video`` (graphs and their tensors, slot layout) and fidelity.json ``video`` (the
export's clip measurement; ``verify.video`` when `sam2edge verify` re-measured it). Nothing typed by hand.
"""

from __future__ import annotations

from sam2edge.cards.sections import _num, _table


def _graphs(video: dict) -> list[str]:
    rows = []
    for role, g in video.get("graphs", {}).items():
        ins = ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s in g.get("inputs", {}).items())
        outs = ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s in g.get("outputs", {}).items())
        rows.append([f"`{g.get('file', role)}`", role, ins, outs])
    return _table(["file", "role", "inputs", "outputs"], rows)


def _slots(video: dict) -> list[str]:
    s = video.get("slot_layout", {})
    lines = [
        f"- {s.get('memory_slots', '?')} spatial memory slots and {s.get('pointer_slots', '?')} object-pointer "
        f"slots ({s.get('tokens_per_pointer', '?')} tokens each): {s.get('key_tokens', '?')} key tokens per "
        f"memory-attention call; {video.get('num_tokens', '?')} prompt-token slots in the video decoder.",
    ]
    lines += [f"- {k}: {s[k]}" for k in ("spatial", "pointers", "empty") if k in s]
    return lines


def _over_frames(meas: dict) -> list[str]:
    passes = meas.get("per_frame_iou", {})
    frames = sorted({int(f) for p in passes.values() for f in p})
    rows = [[name] + [_num(p.get(str(f)), 4) for f in frames] for name, p in passes.items()]
    return _table(["pass \\ frame"] + [str(f) for f in frames], rows)


def video_section(card: dict, fid: dict) -> list[str]:
    """The card's "Video (tracking)" section; empty for an image-only bundle."""
    video = card.get("extra", {}).get("video")
    if not isinstance(video, dict):
        return []
    out = ["## Video (tracking)", "", "`Sam2VideoPredictor.from_export(DIR)` tracks from this bundle.", ""]
    out += ["### Graphs", ""] + _graphs(video) + ["", "### Slot layout", ""] + _slots(video) + [""]
    for label, meas in (("export", fid.get("video")), ("verify", (fid.get("verify") or {}).get("video"))):
        if not isinstance(meas, dict):
            continue
        bars = ", ".join(f"{k} {v}" for k, v in meas.get("bars", {}).items()) or "none"
        clip = meas.get("clip", {})
        out += [
            f"### Fidelity over frames ({label})",
            "",
            f"Mask IoU vs eager fp32 per frame index (worst over {clip.get('objects', '?')} objects), clip of "
            f"{clip.get('frames', '?')} frames: worst {_num(meas.get('iou_worst'), 4)}, median "
            f"{_num(meas.get('iou_median'), 4)}"
            f"{_ties(meas.get('threshold_ties'))}; bars: {bars}; "
            f"{'passed' if not meas.get('failures') else 'FAILED: ' + '; '.join(meas['failures'])}.",
            "",
        ]
        out += _over_frames(meas) + [""]
        lat = meas.get("latency_ms_per_frame", {})
        if lat:
            out += [
                f"Per-frame latency split at {label} (ms, all objects; measured on the exporting machine, "
                "not a benchmark):",
                "",
            ]
            out += _table(list(lat), [[_num(v, 1) for v in lat.values()]]) + [""]
    return out


def _ties(n) -> str:
    """The clause on reference logits left out as ties (``checks.fidelity.video.TIE``); none for older reports."""
    if not n:
        return ""
    return f" ({n} pixel(s) whose reference logit sits on the threshold to fp32 rounding left out)"
