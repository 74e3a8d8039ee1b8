"""GPU check: LiteRT's real GPU delegate (ML Drift over WebGPU/Vulkan) on a software Vulkan device.

For each .tflite file, two subprocesses (``gpu_worker``) run the same feeds (``gpu_feeds``):
``CompiledModel`` with accelerator GPU (CPU fallback for rejected ops) and with CPU (XNNPACK). The
GPU process gets an environment that points Vulkan at SwiftShader (``VK_ICD_FILENAMES``, from the
Debian ``chromium`` package) and its stderr, the delegate's own log, is parsed for residency:

  "Selected adapter: <device>, arch=..."                       -> the Vulkan device in use
  "Following operations are not supported by GPU delegate:"    -> then one "OP: reason" line each
  "N operations will run on the GPU, and the remaining M ..."  -> partial delegation (absent when all)
  "Initializing WebGPU-based API from graph."                  -> one per GPU partition (delegate kernel)
  "Validation error: ..."                                      -> Dawn refused a GPU object (e.g. a texture
                                                                  above the device's 8192 limit): the delegate
                                                                  still "runs" and returns zeros -> mismatch

``is_fully_accelerated()`` is recorded but never trusted (it says True for partial graphs).
Numerics GPU vs CPU per output (``fidelity.compare`` over all feeds stacked) and, for a decoder,
mask IoU per click (candidate = CPU's argmax IoU for multimask clicks, else the single-mask output;
low-res 4e x 4e logits thresholded at 0). A graph too slow for the delegate's 2-minute wait runs on the
GPU as chained standalone pieces (``_in_pieces``, ``tflite_slice``).

Verdicts: ``failed`` (the GPU run crashed; the CPU run did not), ``mismatch`` (numerics outside BARS
or a WebGPU validation error; takes precedence over placement), ``partial`` (an op on the CPU or more
than one GPU partition), ``resident`` (all ops in one GPU partition, numerics within BARS), and
``device-limit`` (all ops in one GPU partition, but the software device refused a texture above its
size limit, or the graph misses the deadline even in pieces, so the GPU numerics cannot be measured
here). A
``device-limit`` file is recorded and reported, not refused: it says nothing against the graph, and
nothing for it either.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from sam2edge.checks.fidelity import compare, iou_summary, mask_iou
from sam2edge.checks.gpu.delegate_log import Residency, parse_delegate_log  # noqa: F401
from sam2edge.checks.gpu.feeds import Feeds, build_feeds
from sam2edge.errors import UserError
from sam2edge.progress import stage

ICD_CANDIDATES = ("/usr/lib/chromium/vk_swiftshader_icd.json", "/usr/lib/chromium-browser/vk_swiftshader_icd.json")
ICD_ENV = "SAM2EDGE_VK_ICD"  # override: path of a Vulkan ICD json to use instead
INSTALL_HINT = (
    "install the Debian packages libvulkan1 and chromium (apt-get install -y libvulkan1 chromium; chromium ships "
    "SwiftShader's Vulkan ICD at /usr/lib/chromium/vk_swiftshader_icd.json), or run scripts/setup.sh as root"
)
BARS = {"cosine_min": 0.9999, "mask_iou_worst_min": 0.99}
DEFAULT_CLICKS = 20
DEFAULT_TIMEOUT_S = 1800.0
WORKER = Path(__file__).with_name("worker.py")
WORKER_THREADS = 2  # XNNPACK threads (CPU reference and the GPU run's CPU fallback)

_TEXTURE_LIMIT = "exceeded maximum texture size"  # the device's limit, not the graph's fault
MASK_OUTPUTS = ("masks", "iou_scores", "single_mask")  # decoder outputs the mask IoU reads
_NO_ADAPTER = ("No adapters found", "Found no drivers", "Failed to initialize WebGPU environment")
# The delegate waits at most 2 minutes for a GPU run ("Timed out waiting for future: 2m"); a graph that takes
# longer on a software GPU (the full-size encoder on SwiftShader, 2 cores) is then run on the GPU in pieces.
_DEADLINE = ("Timed out waiting for future", "Failed to lock custom tensor buffer")
FIRST_SEGMENTS = 4  # equal node ranges to start with; one that misses the deadline is halved and retried
# SwiftShader on 2 cores runs these graphs 34-67x slower than XNNPACK (full-size Hiera-Tiny, measured: memory
# encoder 7.16 s vs 0.11 s, video decoder 5.17 s vs 0.077 s, memory attention ~325 s vs 9.5 s). A graph whose CPU
# run predicts a GPU run past PIECE_BUDGET_S skips the whole-graph GPU run (it would wait out the 2-min deadline
# for nothing): residency from loading the whole graph, numerics from pieces sized to the budget.
SOFTWARE_SLOWDOWN = 67.0
PIECE_BUDGET_S = 60.0  # half the delegate's 2-min wait: room for pieces heavier than their share of nodes


@dataclass
class FileReport:
    path: str
    kind: str  # gpu_feeds.KINDS key
    verdict: str  # "resident" | "partial" | "mismatch" | "failed" | "device-limit" (texture or deadline)
    residency: Residency
    outputs: dict[str, dict[str, float]]  # output name -> compare() of GPU vs CPU over all feeds
    runs: int  # feeds run on each accelerator
    inputs_source: str
    mask_iou: dict | None = None  # decoder: {clicks, median, worst, selection_agreement, photos}
    failures: list[str] = field(default_factory=list)  # why the verdict is not "resident"
    seconds: dict[str, float] = field(default_factory=dict)  # gpu/cpu load and mean run time
    # whole graph too slow for the delegate's deadline: GPU run in pieces, chained (``_in_pieces``); one entry
    # per piece {nodes: [first, end), ops, ops_gpu, cosine_min of its outputs vs the CPU's same piece chain}
    segments: list[dict] = field(default_factory=list)
    pieces_why: str = ""  # why the GPU ran in pieces: the missed deadline, or the CPU run's prediction

    def to_dict(self) -> dict:
        return asdict(self)


class WorkerFailed(UserError):
    """A worker process died or printed no result; ``log`` holds its stderr."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


# ---- environment ---------------------------------------------------------------------------------


def vulkan_icd() -> Path:
    """Path of a software Vulkan ICD (SwiftShader) with a loadable Vulkan loader, else UserError."""
    try:
        ctypes.CDLL("libvulkan.so.1")
    except OSError:
        raise UserError(f"no Vulkan loader (libvulkan.so.1) for the GPU check: {INSTALL_HINT}") from None
    override = os.environ.get(ICD_ENV)
    if override:
        if not Path(override).is_file():
            raise UserError(f"{ICD_ENV}={override} is not a file; unset it to use SwiftShader, or {INSTALL_HINT}")
        return Path(override)
    for cand in ICD_CANDIDATES:
        if Path(cand).is_file():
            return Path(cand)
    raise UserError(f"no software Vulkan device (SwiftShader ICD not found) for the GPU check: {INSTALL_HINT}")


def worker_env(icd: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(VK_ICD_FILENAMES=str(icd), XDG_RUNTIME_DIR=env.get("XDG_RUNTIME_DIR") or "/tmp")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
    return env


def environment(device: str = "") -> dict[str, str]:
    return {
        "vulkan_device": device,
        "vulkan_icd": str(vulkan_icd()),
        "ai_edge_litert": importlib.metadata.version("ai-edge-litert"),
    }


# ---- running -------------------------------------------------------------------------------------


def _run_worker(
    path: Path, accel: str, feeds_file: Path, out_file: Path, env: dict, timeout: float
) -> tuple[dict, str]:
    # run by file path, not ``-m``: importing the sam2edge package would pull torch into every worker
    cmd = [sys.executable, str(WORKER), str(path), accel, str(feeds_file), str(out_file), str(WORKER_THREADS)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UserError(
            f"the {accel.upper()} run of {path} took over {timeout:.0f} s; pass a larger --timeout"
        ) from None
    log = proc.stderr
    if accel == "gpu" and any(s in log for s in _NO_ADAPTER):
        raise UserError(
            f"LiteRT's GPU delegate found no Vulkan adapter through {env['VK_ICD_FILENAMES']}: {INSTALL_HINT}"
        )
    if proc.returncode != 0 or not proc.stdout.strip():
        lines = [ln.strip() for ln in log.strip().splitlines()]
        errors = [ln for ln in lines if ln.startswith(("ERROR:", "E0000", "RuntimeError", "└"))]
        tail = " | ".join(errors[-3:] or lines[-3:])[:300]  # the delegate's own error lines when it printed any
        raise WorkerFailed(f"LiteRT {accel.upper()} run of {path} failed (exit {proc.returncode}): {tail}", log)
    return json.loads(proc.stdout.strip().splitlines()[-1]), log


def _ops_total(path: Path) -> int:
    from sam2edge.checks.tflite.lint import lint_file

    return lint_file(path).nodes


def _signature_inputs(path: Path) -> dict[str, list[int]]:
    from sam2edge.checks.tflite.lint import lint_file

    sigs = lint_file(path).signatures
    if not sigs:
        raise UserError(f"{path} has no signature; export it with litert-torch (sam2edge export --target litert)")
    return {t.name: list(t.shape) for t in next(iter(sigs.values()))["inputs"]}


def _decoder_masks(prompts, gpu: dict, cpu: dict) -> dict:
    ious, fg, agree = [], [], 0
    for i, p in enumerate(prompts):
        if p.multimask:
            k = int(np.argmax(cpu[f"{i}/iou_scores"]))
            agree += int(np.argmax(gpu[f"{i}/iou_scores"]) == k)
            g, c = gpu[f"{i}/masks"][0, k], cpu[f"{i}/masks"][0, k]
        else:
            agree += 1
            g, c = gpu[f"{i}/single_mask"][0, 0], cpu[f"{i}/single_mask"][0, 0]
        ious.append(mask_iou(g > 0, c > 0))
        fg.append(float((c > 0).mean()))
    # foreground_median: the CPU masks' area fraction, so that an IoU of 1 is shown not to be trivial
    return {**iou_summary(ious, prompts, agree), "foreground_median": float(np.median(fg))}


def verdict_of(res: Residency, outputs: dict[str, dict], masks: dict | None) -> tuple[str, list[str]]:
    """(verdict, failures): mismatch if numerics are off, else partial if not resident, else resident."""
    numeric = [
        f"{name}: GPU-vs-CPU cosine {m['cosine']:.6f} < {BARS['cosine_min']}"
        for name, m in outputs.items()
        if not m["cosine"] >= BARS["cosine_min"]
    ]
    numeric += [f"WebGPU validation error (GPU results void): {e}" for e in res.gpu_errors]
    if masks is not None and not masks["iou_worst"] >= BARS["mask_iou_worst_min"]:
        numeric.append(f"decoder mask IoU worst {masks['iou_worst']:.4f} < {BARS['mask_iou_worst_min']}")
    placement = []
    if res.ops_gpu < res.ops_total:
        placement.append(f"{res.ops_total - res.ops_gpu} of {res.ops_total} ops run on the CPU")
    if res.partitions != 1:
        placement.append(f"{res.partitions} GPU partitions (want 1)")
    placement += [f"rejected {r['op']}: {r['reason']}" for r in res.rejected]
    texture_limit = res.gpu_errors and all(_TEXTURE_LIMIT in e for e in res.gpu_errors)
    if texture_limit and not placement:
        return "device-limit", numeric
    if numeric:
        return "mismatch", numeric + placement
    return ("partial" if placement else "resident"), placement


def run_on(
    path: str | Path, accel: str, feeds: Feeds, timeout: float = DEFAULT_TIMEOUT_S, extra_env: dict | None = None
) -> tuple[dict, dict, str]:
    """Run ``feeds`` through ``path`` on "gpu" or "cpu" in a worker process with the Vulkan environment.

    Returns (outputs "{run}/{output name}" -> array, worker summary, the process's stderr log).
    """
    env = {**worker_env(vulkan_icd()), **(extra_env or {})}
    with tempfile.TemporaryDirectory(prefix="sam2edge-gpu-") as tmp:
        feeds_file, out_file = Path(tmp) / "feeds.npz", Path(tmp) / f"{accel}.npz"
        np.savez(feeds_file, __feeds__=np.array(json.dumps(feeds.runs)), **feeds.arrays)
        summary, log = _run_worker(Path(path), accel, feeds_file, out_file, env, timeout)
        with np.load(out_file) as f:
            return dict(f), summary, log


def _compare_runs(gpu: dict, cpu: dict, names: list[str], n: int) -> dict[str, dict]:
    """GPU vs CPU per output name over all ``n`` runs stacked."""
    return {
        o: compare(np.stack([gpu[f"{i}/{o}"] for i in range(n)]), np.stack([cpu[f"{i}/{o}"] for i in range(n)]))
        for o in names
    }


def piece_feeds(inputs: dict[str, int], runs: list[dict[int, np.ndarray]]) -> Feeds:
    """Feeds for a piece with ``inputs`` (input name -> full-graph tensor index), one run per dict of
    full-graph tensor values in ``runs``."""
    arrays = {f"{i}/{k}": values[t] for i, values in enumerate(runs) for k, t in inputs.items()}
    return Feeds(arrays, [{k: f"{i}/{k}" for k in inputs} for i in range(len(runs))])


def _in_pieces(path: Path, feeds: Feeds, cpu: dict, names: list[str], timeout: float, masks: bool, first: int):
    """Whole-graph GPU numerics for a graph too slow for the delegate's 2-minute wait: the graph is cut into
    pieces of consecutive operators (``tflite_slice``); each piece runs whole on the GPU, fed by the earlier
    pieces' GPU outputs, so every operator runs on the GPU exactly once and the last pieces give the graph's
    GPU outputs, compared with the CPU run of the whole graph. The same pieces run on the CPU too, so each
    piece records how far its GPU outputs (with the GPU error so far) are from the CPU's. Starts from
    ``first`` about equal ranges; a piece that misses the deadline is halved and retried. Cuts avoid
    outputs that the delegate may merge away (``tflite_slice.best_cut``).

    Returns (segments, outputs, mask IoU) or None when a single operator misses the deadline.
    """
    from sam2edge.checks.tflite import slice as tflite_slice

    graph = tflite_slice.load_model(path)  # parsed once; every piece is cut from it
    model_in, model_out = tflite_slice.signature_tensors(graph)
    ops_total, n = len(graph.subgraphs[0].operators), len(feeds.runs)
    # per run and side: full-graph tensor index -> value, starting from the graph's inputs
    values = {
        side: [{t: feeds.arrays[run[name]] for name, t in model_in.items()} for run in feeds.runs]
        for side in ("gpu", "cpu")
    }
    bounds = [0]
    for k in range(1, min(first, ops_total)):
        bounds.append(tflite_slice.best_cut(graph, bounds[-1], round(k * ops_total / first), ops_total))
    bounds.append(ops_total)
    pending, segments = list(zip(bounds[:-1], bounds[1:])), []
    with tempfile.TemporaryDirectory(prefix="sam2edge-piece-") as tmp:
        while pending:
            a, b = pending.pop(0)
            stage(f"GPU piece: nodes {a}-{b - 1} of {ops_total}")
            piece = tflite_slice.piece(graph, a, b)
            file = Path(tmp) / f"nodes_{a}_{b}.tflite"
            file.write_bytes(piece.data)
            runs = {}
            try:
                for side in ("gpu", "cpu"):
                    runs[side] = run_on(file, side, piece_feeds(piece.inputs, values[side]), timeout)
            except WorkerFailed as e:
                if not any(x in e.log for x in _DEADLINE):
                    raise
                if b - a == 1:
                    return None
                mid = tflite_slice.best_cut(graph, a, (a + b) // 2, b)
                pending[:0] = [(a, mid), (mid, b)]
                continue
            for side, (out, _, _) in runs.items():
                for i in range(n):
                    values[side][i].update({t: out[f"{i}/{k}"] for k, t in piece.outputs.items()})
            local = _compare_runs(runs["gpu"][0], runs["cpu"][0], list(piece.outputs), n)
            segments.append(
                {
                    "nodes": [a, b],
                    "ops": piece.ops,
                    "ops_gpu": parse_delegate_log(runs["gpu"][2], piece.ops).ops_gpu,
                    "cosine_min": min(v["cosine"] for v in local.values()),
                }
            )
    gpu = {f"{i}/{o}": values["gpu"][i][model_out[o]] for i in range(n) for o in names}
    outputs = _compare_runs(gpu, cpu, names, n)
    return segments, outputs, (_decoder_masks(feeds.prompts, gpu, cpu) if masks else None)


def check_file(path: str | Path, clicks: int = DEFAULT_CLICKS, timeout: float = DEFAULT_TIMEOUT_S) -> FileReport:
    """GPU-check one .tflite file (inputs chosen by its signature; see ``gpu_feeds``).

    Residency always comes from loading the whole graph. The CPU runs first. On the software GPU, a graph
    whose CPU run predicts a GPU run past ``PIECE_BUDGET_S`` is only loaded whole and its GPU numerics are
    taken in pieces sized to the budget; a whole-graph GPU run that misses the delegate's fixed 2-minute
    deadline is taken piece by piece too (``_in_pieces``).
    """
    path = Path(path)
    software = str(vulkan_icd()) in ICD_CANDIDATES
    kind, feeds = build_feeds(_signature_inputs(path), path.parent, clicks)
    n, ops_total = len(feeds.runs), _ops_total(path)
    cpu, cpu_sum, _ = run_on(path, "cpu", feeds, timeout)
    names = list(cpu_sum["outputs"])
    seconds = {"cpu_load": cpu_sum["load_s"], "cpu_run_mean": float(np.mean(cpu_sum["run_s"]))}
    predicted = SOFTWARE_SLOWDOWN * seconds["cpu_run_mean"] if software else 0.0
    failed = FileReport(str(path), kind, "failed", Residency(ops_total, 0, 0, [], ""), {}, n, feeds.source)
    if predicted > PIECE_BUDGET_S:
        why = (
            f"a whole-graph GPU run predicted at {predicted:.0f} s from the CPU run ({SOFTWARE_SLOWDOWN:.0f}x on "
            f"the software GPU), past the {PIECE_BUDGET_S:.0f} s budget per piece"
        )
        try:
            _, _, log = run_on(path, "gpu", Feeds({}, []), timeout)  # load only: the whole graph's placement
        except WorkerFailed as e:
            return replace(failed, residency=parse_delegate_log(e.log, ops_total), failures=[why, str(e)])
        base = replace(failed, residency=parse_delegate_log(log, ops_total), seconds=seconds)
        return _pieces_report(base, feeds, cpu, names, timeout, math.ceil(predicted / PIECE_BUDGET_S), why)
    try:
        gpu, gpu_sum, log = run_on(path, "gpu", feeds, timeout)
    except WorkerFailed as e:  # the GPU path crashed: a verdict, not an abort
        res = parse_delegate_log(e.log, ops_total)
        if not any(x in e.log for x in _DEADLINE) or res.gpu_errors:
            why = [str(e)] + [f"WebGPU validation error (GPU results void): {x}" for x in res.gpu_errors]
            return replace(failed, residency=res, failures=why)
        why = "the whole-graph GPU run missed the delegate's 2-min deadline"
        return _pieces_report(
            replace(failed, residency=res, seconds=seconds), feeds, cpu, names, timeout, FIRST_SEGMENTS, why
        )
    res = parse_delegate_log(log, ops_total)
    res.fully_accelerated_claim = gpu_sum["fully_accelerated_claim"]
    outputs = _compare_runs(gpu, cpu, names, n)
    masks = _decoder_masks(feeds.prompts, gpu, cpu) if _has_masks(kind, names) else None
    seconds.update(gpu_load=gpu_sum["load_s"], gpu_run_mean=float(np.mean(gpu_sum["run_s"])))
    verdict, failures = verdict_of(res, outputs, masks)
    return FileReport(str(path), kind, verdict, res, outputs, n, feeds.source, masks, failures, seconds)


def _pieces_report(
    base: FileReport, feeds: Feeds, cpu: dict, names: list[str], timeout: float, first: int, why: str
) -> FileReport:
    """``base`` (the whole graph's residency) completed by the GPU numerics of ``_in_pieces``. When even the
    pieces cannot run, a resident graph is a device limit (nothing against the graph), else a failure."""
    masks = _has_masks(base.kind, names)
    verdict = "device-limit" if base.residency.resident else "failed"
    try:
        seg = _in_pieces(Path(base.path), feeds, cpu, names, timeout, masks, first)
    except WorkerFailed as e:
        return replace(base, verdict=verdict, failures=[why, f"GPU run in pieces impossible: {e}"])
    if seg is None:  # a single operator misses the deadline
        return replace(base, verdict=verdict, failures=[why, "a single operator misses the deadline"])
    segments, outputs, mask_iou = seg
    verdict, failures = verdict_of(base.residency, outputs, mask_iou)
    return replace(
        base, verdict=verdict, outputs=outputs, mask_iou=mask_iou, failures=failures, segments=segments, pieces_why=why
    )


def _has_masks(kind: str, names: list[str]) -> bool:
    """A decoder whose outputs include the ones the mask IoU reads."""
    return kind == "decoder" and set(MASK_OUTPUTS) <= set(names)
