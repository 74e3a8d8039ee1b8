"""GPU-readiness lint of a ``.tflite`` flatbuffer, without TensorFlow.

The file is read with the TFLite schema module that ships in ``ai_edge_litert``
(``schema_py_generated``, generated flatbuffers accessors; only the ``flatbuffers`` package runs).
The report holds the op census over every subgraph, the node count, the highest tensor rank and
every tensor above rank 4, the banned ops present (``BANNED`` with the reason a mobile GPU
delegate rejects each), the signature I/O (names, shapes, dtypes in signature order) and the
verdict line ``banned ops = NONE, >4-D tensors = 0`` for a clean graph.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sam2edge.errors import UserError

# op -> why a mobile GPU delegate (ML Drift / TFLite GPU) rejects it
BANNED: dict[str, str] = {
    "GATHER": "indexing op: GPU delegates reject it; use static slices or a one-hot matmul",
    "GATHER_ND": "indexing op: GPU delegates reject it; use static slices or a one-hot matmul",
    "TOPK_V2": "data-dependent selection: GPU delegates reject it; use comparisons and arithmetic",
    "ERF": "exact GELU's erf: GPU delegates reject it; use the tanh form or an exact erf rewrite",
    "BROADCAST_TO": "GPU delegates reject it; let elementwise ops broadcast or multiply by ones",
    "TRANSPOSE_CONV": "rejected or wrong on mobile GPUs; use zero-stuffing + CONV_2D",
    "CUSTOM": "custom op: runs on the CPU only (no GPU kernel)",
}
STABLEHLO_REASON = "StableHLO op left unlowered: not a TFLite builtin, no GPU kernel"
FLEX_REASON = "Flex (TensorFlow) op: needs the TF runtime, no GPU kernel"
MAX_RANK = 4
TFLITE_IDENTIFIER = b"TFL3"


@dataclass
class TensorInfo:
    name: str
    shape: list[int]
    dtype: str
    position: int | None = None  # place in the subgraph's input / output list (signature tensors only)


@dataclass
class LintReport:
    path: str
    bytes: int
    subgraphs: int
    nodes: int
    ops: dict[str, int]  # op name -> count, most frequent first
    max_rank: int
    high_rank: list[TensorInfo]  # tensors above rank MAX_RANK
    banned: dict[str, str]  # op name present -> reason
    signatures: dict[str, dict[str, list[TensorInfo]]] = field(default_factory=dict)  # key -> inputs / outputs
    weight_dtypes: dict[str, int] = field(default_factory=dict)  # dtype of constant tensors -> count

    @property
    def clean(self) -> bool:
        return not self.banned and not self.high_rank

    @property
    def verdict(self) -> str:
        banned = ", ".join(f"{op} x{self.ops[op]}" for op in self.banned) or "NONE"
        return f"banned ops = {banned}, >4-D tensors = {len(self.high_rank)}"

    def problems(self) -> list[str]:
        """One line per reason the graph is not GPU-clean (empty when clean)."""
        out = [f"{op} x{self.ops[op]}: {why}" for op, why in self.banned.items()]
        if self.high_rank:
            t = self.high_rank[0]
            out.append(
                f"{len(self.high_rank)} tensor(s) above rank {MAX_RANK} (e.g. {t.name} {t.shape}): GPU delegates "
                f"reject RESHAPE/SLICE/... on rank > {MAX_RANK}; fold the extra axis into a neighbour"
            )
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verdict"], d["clean"] = self.verdict, self.clean
        return d


def _enum_names(enum_cls) -> dict[int, str]:
    return {v: k for k, v in vars(enum_cls).items() if not k.startswith("_") and isinstance(v, int)}


def _schema():
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError:  # pragma: no cover - ai-edge-litert is a declared export dependency
        raise UserError("the lint needs the ai-edge-litert package; pip install 'sam2edge[export]'") from None
    return schema


def _tensor(t, dtype_names: dict[int, str]) -> TensorInfo:
    if t.ShapeSignatureLength():
        shape = [int(t.ShapeSignature(i)) for i in range(t.ShapeSignatureLength())]
    else:
        shape = [int(t.Shape(i)) for i in range(t.ShapeLength())]
    return TensorInfo((t.Name() or b"").decode("utf-8", "replace"), shape, dtype_names.get(t.Type(), str(t.Type())))


def _op_name(code, op_names: dict[int, str]) -> str:
    builtin = max(int(code.BuiltinCode()), int(code.DeprecatedBuiltinCode()))
    name = op_names.get(builtin, f"BUILTIN_{builtin}")
    if name == "CUSTOM":
        custom = (code.CustomCode() or b"").decode("utf-8", "replace")
        return f"CUSTOM:{custom}" if custom else "CUSTOM"
    return name


def _ban_reason(op: str) -> str | None:
    if op.startswith("CUSTOM:Flex"):
        return FLEX_REASON
    if op.startswith("CUSTOM"):
        return BANNED["CUSTOM"]
    if op.startswith("STABLEHLO_"):
        return STABLEHLO_REASON
    return BANNED.get(op)


def lint_bytes(buf: bytes, path: str = "<bytes>") -> LintReport:
    """Parse a TFLite flatbuffer; a buffer that is not one raises a one-line ``UserError``."""
    if len(buf) < 8 or buf[4:8] != TFLITE_IDENTIFIER:
        raise UserError(f"{path} is not a .tflite flatbuffer (no 'TFL3' identifier); pass a LiteRT model file")
    schema = _schema()
    op_names = _enum_names(schema.BuiltinOperator)
    dtype_names = _enum_names(schema.TensorType)
    try:
        model = schema.Model.GetRootAs(buf, 0)
        codes = [_op_name(model.OperatorCodes(i), op_names) for i in range(model.OperatorCodesLength())]
        ops: Counter[str] = Counter()
        high: list[TensorInfo] = []
        weights: Counter[str] = Counter()
        max_rank, nodes = 0, 0
        subgraphs = [model.Subgraphs(i) for i in range(model.SubgraphsLength())]
        for sg in subgraphs:
            for j in range(sg.OperatorsLength()):
                ops[codes[sg.Operators(j).OpcodeIndex()]] += 1
                nodes += 1
            for j in range(sg.TensorsLength()):
                t = sg.Tensors(j)
                info = _tensor(t, dtype_names)
                max_rank = max(max_rank, len(info.shape))
                if len(info.shape) > MAX_RANK:
                    high.append(info)
                b = t.Buffer()
                if b and b < model.BuffersLength() and (model.Buffers(b).DataLength() or model.Buffers(b).Size()):
                    weights[info.dtype] += 1
        sigs = {}
        for i in range(model.SignatureDefsLength()):
            sd = model.SignatureDefs(i)
            sg = subgraphs[sd.SubgraphIndex()]

            def io(n, get, order, sg=sg):
                out = []
                for j in range(n):
                    m = get(j)
                    info = _tensor(sg.Tensors(m.TensorIndex()), dtype_names)
                    info.name = m.Name().decode()
                    info.position = order.index(m.TensorIndex()) if m.TensorIndex() in order else None
                    out.append(info)
                return out

            key = (sd.SignatureKey() or b"").decode()
            ins = [int(sg.Inputs(j)) for j in range(sg.InputsLength())]
            outs = [int(sg.Outputs(j)) for j in range(sg.OutputsLength())]
            sigs[key] = {
                "inputs": io(sd.InputsLength(), sd.Inputs, ins),
                "outputs": io(sd.OutputsLength(), sd.Outputs, outs),
            }
    except Exception as e:  # noqa: BLE001 - any parse failure means a corrupt file to the user
        why = f"truncated or malformed: {type(e).__name__}"
        raise UserError(f"{path} is a corrupt .tflite flatbuffer ({why}); re-export it") from None
    census = dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
    banned = {op: why for op in census if (why := _ban_reason(op))}
    return LintReport(path, len(buf), len(subgraphs), nodes, census, max_rank, high, banned, sigs, dict(weights))


def lint_file(path: str | Path) -> LintReport:
    """Lint a .tflite file; a missing, unreadable or non-TFLite file raises a one-line ``UserError``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist; pass a .tflite file")
    try:
        buf = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}; check the path and permissions") from None
    return lint_bytes(buf, str(path))


def format_report(r: LintReport) -> str:
    """Human-readable report: header, op census, high-rank tensors, banned ops, verdict (last line)."""
    head = f"{r.path}: {r.bytes / 1e6:.2f} MB, {r.subgraphs} subgraph(s), {r.nodes} nodes"
    lines = [f"{head}, highest tensor rank {r.max_rank}"]
    if r.weight_dtypes:
        lines.append("constant tensors: " + ", ".join(f"{k} x{v}" for k, v in sorted(r.weight_dtypes.items())))
    for key, sig in r.signatures.items():
        for kind in ("inputs", "outputs"):
            desc = ", ".join(f"{t.name} {t.shape} {t.dtype}" for t in sig[kind])
            lines.append(f"signature {key!r} {kind}: {desc}")
    lines.append("op census:")
    lines += [f"  {op:<28} {n:>5}" for op, n in r.ops.items()]
    for t in r.high_rank:
        lines.append(f"rank {len(t.shape)} tensor: {t.name} {t.shape}")
    for p in r.problems():
        lines.append(f"GPU problem: {p}")
    lines.append(r.verdict)
    return "\n".join(lines)
