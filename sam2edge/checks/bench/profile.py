"""Where a bundle's time goes: time per operator type and the slowest nodes, from each runtime's profiler.

``profile_bundle(folder)`` opens the bundle's backend, swaps its graphs for profiled ones and runs the
bench's inputs (astronaut photo, its clicks): one encode + ``clicks`` decodes per run, the first run
untimed. Per target (``PROFILERS``):

  onnx        onnxruntime's own profiler (``SessionOptions.enable_profiling``): every node's kernel time.
  executorch  ETDump (``_load_for_executorch(..., enable_etdump=True)``) read by ``devtools.Inspector``:
              each delegate call and each operator left outside the delegate (XNNPACK in the pip wheel
              records no per-operator events inside its delegate).
  litert      ai-edge-litert 2.3.0's Python API exposes no op profiler (no profiler option on
              ``Interpreter`` or ``CompiledModel``, no benchmark binary in the wheel), so each operator is
              cut out as a standalone one-operator graph (``checks.tflite.slice.piece``) and timed alone on
              the same CPU runtime (XNNPACK) with zero inputs; the whole graph is timed beside it, so the
              sum over operators shows what fusion and scheduling save.

A node time is milliseconds per call, averaged over the timed runs. The eager per-module profile
(``checks.bench.eager_profile``) runs upstream's modules with the bundle's weights.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sam2edge.bundle import load_card


@dataclass(frozen=True)
class NodeTime:
    """One node of one graph: its name, operator type and milliseconds per call."""

    name: str
    op: str
    ms: float


def summarise(nodes: list[NodeTime], top: int = 15) -> dict:
    """-> {total_ms, by_type: [{op, ms, share, count}] slowest first, top_nodes: [{name, op, ms}]}."""
    total = sum(n.ms for n in nodes)
    by: dict[str, list[float]] = {}
    for n in nodes:
        by.setdefault(n.op, []).append(n.ms)
    types = [
        {"op": op, "ms": sum(v), "share": sum(v) / total if total else 0.0, "count": len(v)} for op, v in by.items()
    ]
    types.sort(key=lambda t: -t["ms"])
    slow = sorted(nodes, key=lambda n: -n.ms)[:top]
    return {
        "total_ms": total,
        "by_type": types,
        "top_nodes": [{"name": n.name, "op": n.op, "ms": n.ms} for n in slow],
    }


def _artifact(folder: Path, role: str) -> Path | None:
    card = load_card(folder)
    return next((folder / a["file"] for a in card["artifacts"] if a.get("role") == role), None)


def _drive(backend, inputs: tuple, runs: int, clicks: int) -> None:
    """``runs`` rounds of one encode + ``clicks`` decodes through the backend's normal calls."""
    x, prompts = inputs
    for _ in range(runs):
        feats = backend.encode(x)
        for coords, labels in prompts[:clicks]:
            backend.decode(feats, coords, labels, None)


# ---- onnxruntime -------------------------------------------------------------------------------------


def _ort_session(path: Path, threads: int, prefix: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.enable_profiling = True
    so.profile_file_prefix = str(prefix)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_node_times(trace: list[dict], skip_runs: int = 1) -> tuple[list[NodeTime], int]:
    """Node kernel times (ms per timed run) from an onnxruntime profile trace; the first ``skip_runs``
    ``model_run`` events are warm-up. -> (nodes, timed runs)."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace if e.get("name") == "model_run")
    timed = runs[skip_runs:]
    acc: dict[tuple[str, str], float] = {}
    for e in trace:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if not any(a <= e["ts"] <= b for a, b in timed):
            continue
        key = (e["name"][: -len("_kernel_time")], e.get("args", {}).get("op_name", "?"))
        acc[key] = acc.get(key, 0.0) + e["dur"] / 1e3
    n = max(1, len(timed))
    return [NodeTime(name, op, ms / n) for (name, op), ms in acc.items()], len(timed)


def profile_onnx(folder: Path, backend, inputs: tuple, threads: int, runs: int) -> dict:
    clicks = len(inputs[1])
    with tempfile.TemporaryDirectory() as tmp:
        backend.encoder = _ort_session(_artifact(folder, "encoder"), threads, Path(tmp) / "enc")
        backend.decoder = _ort_session(_artifact(folder, "decoder"), threads, Path(tmp) / "dec")
        _drive(backend, inputs, runs + 1, clicks)
        out = {}
        for graph, sess, skip in (("encoder", backend.encoder, 1), ("decoder", backend.decoder, clicks)):
            trace = json.loads(Path(sess.end_profiling()).read_text())
            nodes, n = ort_node_times(trace, skip)
            out[graph] = summarise(nodes) | {"calls": n, "source": "onnxruntime profiler (kernel time)"}
    return out


# ---- ExecuTorch ----------------------------------------------------------------------------------------


class _EtdumpMethod:
    """``forward`` of a .pte loaded with ETDump on; ``execute`` as ``executorch.runtime.Method``."""

    def __init__(self, path: Path) -> None:
        from executorch.extension.pybindings.portable_lib import _load_for_executorch

        self.module = _load_for_executorch(str(path), enable_etdump=True, debug_buffer_size=0)

    def execute(self, inputs: list):
        return self.module.forward(inputs)

    def etdump(self, path: Path) -> Path:
        self.module.write_etdump_result_to_file(str(path))
        return path


WRAPPERS = ("OPERATOR_CALL", "DELEGATE_CALL", "Method::execute")  # ETDump events that contain others


def etdump_node_times(etdump: Path, skip_runs: int) -> tuple[list[NodeTime], int, dict[str, float]]:
    """Event times (ms per timed run) from an ETDump, skipping the first ``skip_runs`` executions.

    -> (nodes, timed runs, wrapper totals). Nodes: XNNPACK's own per-operator events inside its delegate
    (``xnnpack:Fully Connected (NC, F32) GEMM``) and the portable operators outside it
    (``portable:native_layer_norm``); the wrappers (every delegate call, every operator call, the whole
    method) are summed apart so nothing is counted twice."""
    from executorch.devtools import Inspector

    insp = Inspector(etdump_path=str(etdump))
    nodes, wrappers, runs = [], {}, 0
    for block in insp.event_blocks:
        if block.name != "Execute":
            continue
        for i, ev in enumerate(block.events):
            raw = list(ev.perf_data.raw)[skip_runs:] if ev.perf_data is not None else []
            runs = max(runs, len(raw))
            ms = sum(raw) / max(1, len(raw))
            if ev.name in WRAPPERS:
                wrappers[ev.name] = wrappers.get(ev.name, 0.0) + ms
                continue
            kind = "xnnpack" if ev.is_delegated_op else "portable"
            nodes.append(NodeTime(f"{ev.name} [{i}]", f"{kind}:{_etdump_type(ev.name)}", ms))
    return nodes, runs, wrappers


def etdump_kinds(path: Path, inputs: list, runs: int) -> dict[str, float]:
    """ms per run by operator type of the .pte at ``path`` on ``inputs`` (ETDump, one warm-up run left out),
    slowest first."""
    method = _EtdumpMethod(path)
    for _ in range(runs + 1):
        method.execute(inputs)
    nodes, _, _ = etdump_node_times(method.etdump(path.with_suffix(".etdp")), 1)
    kinds: dict[str, float] = {}
    for n in nodes:
        kinds[n.op] = kinds.get(n.op, 0.0) + n.ms
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def interleaved_ms(calls: dict[str, Callable[[], object]], runs: int) -> dict[str, list[float]]:
    """``runs`` rounds, each call once per round, order reversed every other round -> ms per call."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(runs):
        for name in list(calls)[:: 1 if r % 2 else -1]:
            t0 = time.perf_counter()
            calls[name]()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def _etdump_type(name: str) -> str:
    """Operator type of an ETDump event name: 'native_call_native_layer_norm.out' -> 'native_layer_norm',
    'Fully Connected (NC, F32) GEMM #3' -> 'Fully Connected (NC, F32) GEMM'."""
    name = name.split(" #")[0].removeprefix("native_call_")
    return name.split(".")[0] or name


def profile_executorch(folder: Path, backend, inputs: tuple, threads: int, runs: int) -> dict:
    """The encoder and the decoder the runtime runs per click (``decoder_cpu.pte`` where the bundle has its
    prep, which is profiled too: once per image), each from its ETDump."""
    clicks = len(inputs[1])
    graphs = {"encoder": ("encoder", 1), "decoder": ("decoder", clicks)}  # attribute -> (card role, calls per run)
    if backend.prep is not None:
        graphs.update(decoder=("decoder-cpu", clicks), prep=("decoder-prep", 1))
    for attr, (role, _) in graphs.items():
        setattr(backend, attr, _EtdumpMethod(_artifact(folder, role)))
    _drive(backend, inputs, runs + 1, clicks)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for attr, (role, skip) in graphs.items():
            path = getattr(backend, attr).etdump(Path(tmp) / f"{attr}.etdp")
            nodes, n, wrappers = etdump_node_times(path, skip)
            out[role] = summarise(nodes) | {
                "calls": n,
                "whole_graph_ms": wrappers.get("Method::execute", 0.0),
                "delegate_calls_ms": wrappers.get("DELEGATE_CALL", 0.0),
                "source": "ExecuTorch ETDump (XNNPACK's per-operator events + portable operators)",
            }
    return out


# ---- LiteRT --------------------------------------------------------------------------------------------


def _op_names() -> dict[int, str]:
    from ai_edge_litert import schema_py_generated as schema

    return {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}


# operators whose input 1 is a weight; their type reads "<OP> int8" where that weight is int8 (dynamic-range or
# full-integer int8), so a profile tells a quantised product from one kept fp32
WEIGHT_OPS = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV")


def _op_kind(model, sg, op, names: dict[int, str]) -> str:
    """The operator's type name, "<OP> int8" for a product of ``WEIGHT_OPS`` with an int8 weight."""
    from ai_edge_litert import schema_py_generated as schema

    code = model.operatorCodes[op.opcodeIndex]
    kind = names.get(max(code.builtinCode, code.deprecatedBuiltinCode), "CUSTOM")
    weight = int(op.inputs[1]) if len(op.inputs) > 1 else -1  # TRANSPOSE_CONV's too (its input 0: the output shape)
    if kind in WEIGHT_OPS and weight >= 0 and sg.tensors[weight].type == schema.TensorType.INT8:
        return f"{kind} int8"
    return kind


def _time_interpreter(content: bytes | None, path: Path | None, threads: int, runs: int) -> float:
    """Median ms of ``invoke`` with zero inputs (one untimed call first)."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=content, model_path=None if path is None else str(path), num_threads=threads)
    it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    it.invoke()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        it.invoke()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def tflite_node_times(path: Path, threads: int, runs: int) -> tuple[list[NodeTime], float]:
    """Each operator of ``path`` timed as a one-operator graph -> (nodes, whole graph ms)."""
    from sam2edge.checks.tflite.slice import constant_ops, load_model, piece

    model = load_model(path)
    names, sg = _op_names(), model.subgraphs[0]
    folded = constant_ops(model)
    nodes = []
    for i, op in enumerate(sg.operators):
        if i in folded:
            continue
        kind = _op_kind(model, sg, op, names)
        out = sg.tensors[int(op.outputs[0])].name.decode(errors="replace") if len(op.outputs) else ""
        ms = _time_interpreter(piece(model, i, i + 1).data, None, threads, runs)
        nodes.append(NodeTime(f"#{i} {out.split(';')[0][-80:]}", kind, ms))  # the module path's tail
    return nodes, _time_interpreter(None, path, threads, runs)


def profile_litert(folder: Path, backend, inputs: tuple, threads: int, runs: int) -> dict:
    """Encoder, GPU decoder and (where the bundle has it) the CPU decoder that the CPU runtime runs."""
    out = {}
    for graph in ("encoder", "decoder", "decoder-cpu", "decoder-prep"):
        path = _artifact(folder, graph)
        if path is None:
            continue
        nodes, whole = tflite_node_times(path, threads, runs)
        out[graph] = summarise(nodes) | {
            "calls": runs,
            "whole_graph_ms": whole,
            "source": "one-operator graphs timed alone (ai-edge-litert has no op profiler in Python), zero inputs",
        }
    return out


PROFILERS: dict[str, Callable[..., dict]] = {
    "onnx": profile_onnx,
    "executorch": profile_executorch,
    "litert": profile_litert,
}
