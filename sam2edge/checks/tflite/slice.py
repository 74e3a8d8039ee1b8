"""Cut a .tflite graph into standalone pieces of consecutive operators, so each can run on its own.

Used by the GPU check when a whole graph is too slow for the GPU delegate's fixed 2-minute wait on a
software GPU: every piece runs whole on the GPU, fed by the previous pieces' GPU outputs, and the last
outputs are compared with the CPU run of the whole graph. Nothing about the operators changes: a piece
keeps their options, tensors and constant buffers byte for byte (constants stored after the flatbuffer
move inside it); only the graph's inputs, outputs and signature are new.

A piece over operators [start, end) of subgraph 0 (in execution order, as TFLite stores them) has
  inputs:  every non-constant tensor its operators read that none of them writes (graph inputs or
           earlier pieces' results), named ``t<index>`` after the tensor's index in the full graph;
  outputs: every tensor its operators write that a later operator or the graph's output list reads,
           named the same way (the full graph's own outputs keep their signature names);
  signature ``serving_default``. Unused tensors and buffers are dropped. Operators that read only
  constants (DEQUANTIZE of fp16 weights) are not cut off from their readers: each piece that reads
  one carries its own copy, so a piece never hands a weight to the next.
Reads and writes the flatbuffer through ``schema_py_generated`` (LiteRT's generated object API).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sam2edge.errors import UserError

SIGNATURE = "serving_default"


@dataclass(frozen=True)
class Piece:
    """One standalone piece: operators [start, end); input / output names map to full-graph tensor indices."""

    start: int
    end: int
    inputs: dict[str, int]  # signature input name -> tensor index in the full graph
    outputs: dict[str, int]  # signature output name -> tensor index in the full graph
    ops: int  # operators in the piece (its own, plus copies of the constant-only ones it reads)
    data: bytes  # the .tflite flatbuffer


def _schema():
    from ai_edge_litert import schema_py_generated as schema

    return schema


def load_model(path: str | Path):
    """The flatbuffer's object tree (``ModelT``); UserError when it is not a single-subgraph TFLite file."""
    schema = _schema()
    buf = Path(path).read_bytes()
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise UserError(f"{path} is not a TFLite flatbuffer; pass a .tflite file")
    model = schema.ModelT.InitFromPackedBuf(buf, 0)
    for b in model.buffers or []:
        if b.offset > 1:  # stored after the flatbuffer (litert-torch does this): pull it in, pieces are small
            b.data = np.frombuffer(buf, np.uint8, b.size, b.offset)
            b.offset = b.size = 0
    return model


def signature_tensors(model) -> tuple[dict[str, int], dict[str, int]]:
    """(input name -> tensor index, output name -> tensor index) of the first signature; UserError if none."""
    if not model.signatureDefs:
        raise UserError("the .tflite file has no signature; export it with litert-torch (sam2edge export)")
    sig = model.signatureDefs[0]
    return (
        {m.name.decode(): int(m.tensorIndex) for m in sig.inputs},
        {m.name.decode(): int(m.tensorIndex) for m in sig.outputs},
    )


def _names(model) -> dict[int, str]:
    """Full-graph output tensor index -> its signature output name."""
    return {t: name for name, t in signature_tensors(model)[1].items()} if model.signatureDefs else {}


def piece(model, start: int, end: int) -> Piece:
    """The standalone graph of operators [start, end) of ``model``'s subgraph 0 (see the module doc).

    ``model`` (from ``load_model``) is left as it is, so one parsed file serves every piece."""
    schema = _schema()
    sg = model.subgraphs[0]
    if not 0 <= start < end <= len(sg.operators):
        raise ValueError(f"piece [{start}, {end}) is not inside a graph of {len(sg.operators)} operators")
    const = _constants(model)
    folded = constant_ops(model)  # e.g. DEQUANTIZE of fp16 weights: travels with each reader
    const |= {int(t) for i in folded for t in sg.operators[i].outputs}
    own = [i for i in range(start, end) if i not in folded]
    needed = {int(t) for i in own for t in sg.operators[i].inputs if t >= 0}
    pulled = [i for i in sorted(folded) if any(int(t) in needed for t in sg.operators[i].outputs)]
    ops = [copy.copy(sg.operators[i]) for i in sorted(own + pulled)]  # execution order kept; re-indexed below
    written = {int(t) for op in ops for t in op.outputs if t >= 0}
    read = [int(t) for op in ops for t in op.inputs if t >= 0]
    later = {int(t) for i in range(end, len(sg.operators)) if i not in folded for t in sg.operators[i].inputs}
    later |= {int(t) for t in sg.outputs}
    inputs = list(dict.fromkeys(t for t in read if t not in written and t not in const))
    outputs = sorted(t for t in written if t in later and t not in const)
    used = sorted(set(read) | written)  # every tensor an operator of the piece touches
    remap = {old: new for new, old in enumerate(used)}
    buffers, tensors = [schema.BufferT()], []  # buffer 0 stays the empty sentinel
    for old in used:
        t = copy.copy(sg.tensors[old])  # re-indexed and maybe renamed below
        if t.buffer and model.buffers[t.buffer].data is not None:
            buffers.append(model.buffers[t.buffer])
            t.buffer = len(buffers) - 1
        else:
            t.buffer = 0
        tensors.append(t)
    for op in ops:
        op.inputs = np.array([remap[int(t)] if t >= 0 else -1 for t in op.inputs], dtype=np.int32)
        op.outputs = np.array([remap[int(t)] for t in op.outputs], dtype=np.int32)
    names = _names(model)
    in_names = {f"t{t}": t for t in inputs}
    out_names = {names.get(t, f"t{t}"): t for t in outputs}
    sub = schema.SubGraphT()
    sub.tensors, sub.operators, sub.name = tensors, ops, b"piece"
    sub.inputs = np.array([remap[t] for t in in_names.values()], dtype=np.int32)
    sub.outputs = np.array([remap[t] for t in out_names.values()], dtype=np.int32)
    for name, t in {**in_names, **out_names}.items():
        tensors[remap[t]].name = name.encode()
    sig = schema.SignatureDefT()
    sig.signatureKey, sig.subgraphIndex = SIGNATURE.encode(), 0
    sig.inputs = [_tensor_map(schema, n, remap[t]) for n, t in in_names.items()]
    sig.outputs = [_tensor_map(schema, n, remap[t]) for n, t in out_names.items()]
    out = schema.ModelT()
    out.version, out.operatorCodes, out.description = model.version, model.operatorCodes, b"sam2edge piece"
    out.subgraphs, out.buffers, out.signatureDefs = [sub], buffers, [sig]
    return Piece(start, end, in_names, out_names, len(ops), _pack(schema, out))


def _constants(model) -> set[int]:
    """Indices of subgraph 0's tensors that hold constant data."""
    sg = model.subgraphs[0]
    return {i for i, t in enumerate(sg.tensors) if t.buffer and model.buffers[t.buffer].data is not None}


def _folded(model) -> tuple[set[int], set[int]]:
    """(operators that read only constants, directly or through other such operators; the tensors known
    before the graph runs: constants and those operators' outputs)."""
    known, folded = _constants(model), set()
    for i, op in enumerate(model.subgraphs[0].operators):
        if all(t < 0 or int(t) in known for t in op.inputs):
            folded.add(i)
            known |= {int(t) for t in op.outputs}
    return folded, known


def constant_ops(model) -> set[int]:
    """Indices of operators that read only constants (directly or through other such operators)."""
    return _folded(model)[0]


def dynamic_weight_products(model) -> list[int]:
    """Indices of FULLY_CONNECTED operators whose weights are computed in the graph, not constants.

    litert-torch lowers ``q @ k^T`` with a transposed right operand as a FULLY_CONNECTED with ``k`` as its
    weights. XNNPACK takes only constant weights, so the builtin kernel runs such a node several times slower
    than a BATCH_MATMUL (full-size memory attention: 1.4 s against 0.18 s per score product)."""
    known, ops = _folded(model)[1], model.subgraphs[0].operators
    return [i for i in sorted(_fc_ops(model)) if int(ops[i].inputs[1]) not in known]


def _tensor_map(schema, name: str, index: int):
    m = schema.TensorMapT()
    m.name, m.tensorIndex = name.encode(), index
    return m


def _pack(schema, model) -> bytes:
    import flatbuffers

    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _readers(model) -> tuple[dict[int, int], dict[int, list[int]]]:
    """(tensor -> index of the operator writing it, tensor -> indices of the operators reading it, ascending)."""
    writer, readers = {}, {}
    for i, op in enumerate(model.subgraphs[0].operators):
        for t in op.outputs:
            writer[int(t)] = i
        for t in op.inputs:
            if t >= 0:
                readers.setdefault(int(t), []).append(i)
    return writer, readers


def _fc_ops(model) -> set[int]:
    """Indices of subgraph 0's FULLY_CONNECTED operators."""
    schema = _schema()
    fc = {
        i
        for i, c in enumerate(model.operatorCodes)
        if schema.BuiltinOperator.FULLY_CONNECTED in (c.builtinCode, c.deprecatedBuiltinCode)
    }
    return {i for i, op in enumerate(model.subgraphs[0].operators) if op.opcodeIndex in fc}


def _merge_risk(model) -> tuple[set[int], set[int]]:
    """(FULLY_CONNECTED operators, operators that read a constant: a LayerNorm's closing ADD of its bias)."""
    const = _constants(model)
    ops = model.subgraphs[0].operators
    return _fc_ops(model), {i for i, op in enumerate(ops) if any(int(t) in const for t in op.inputs if t >= 0)}


def _risky_outputs(
    writer: dict[int, int],
    readers: dict[int, list[int]],
    outs: set[int],
    start: int,
    end: int,
    risk: tuple[set[int], set[int]],
) -> tuple[int, int]:
    """(how many outputs of piece [start, end) are read by exactly one of its own operators, how many of those
    are written by an operator reading a constant and read by a FULLY_CONNECTED). ``_readers`` gives
    ``writer`` / ``readers``; ``outs`` = the graph's outputs; ``risk`` = ``_merge_risk``.

    Measured on LiteRT 2.3's GPU delegate (SwiftShader): a LayerNorm's closing ADD, read by one
    FULLY_CONNECTED inside the piece and by operators after it, is merged into that reader and never written
    out: its value comes back wrong (a decoder: cosine 0.07 vs the CPU; the full-size memory attention cut
    after node 191: cosine 0.0, which made the chained check report a false mismatch,
    docs/design/gpu.md). Outputs with no reader or several readers inside the piece came back exact, and so did those
    whose one reader there is an ADD, MUL, CONCATENATION or RESHAPE, or a FULLY_CONNECTED reading the sum of
    two computed tensors (the memory plus its positions: memory attention).
    """
    fc, reads_const = risk
    count = fused = 0
    for t, w in writer.items():
        if start <= w < end and (t in outs or readers.get(t, [-1])[-1] >= end):
            inside = [r for r in readers.get(t, []) if start <= r < end]
            count += len(inside) == 1
            fused += len(inside) == 1 and inside[0] in fc and w in reads_const
    return count, fused


def best_cut(model, start: int, target: int, end: int) -> int:
    """The cut in (start, end) nearest ``target`` whose piece [start, cut) has no risky output (see
    ``_risky_outputs``), looked for within 10 % of the range either side. Where none is clean (the memory
    attention's memory, positions and key bias are read once per layer, so every cut past its first layer
    hands some of them on), the nearest without the form measured to come back wrong (a constant's ADD read by
    one FULLY_CONNECTED inside the piece); failing that, the nearest."""
    writer, readers = _readers(model)
    outs, risk = {int(t) for t in model.subgraphs[0].outputs}, _merge_risk(model)
    span = max(1, (end - start) // 10)
    options = range(max(start + 1, target - span), min(end - 1, target + span) + 1)

    def key(c: int) -> tuple[bool, bool, int]:
        count, fused = _risky_outputs(writer, readers, outs, start, c, risk)
        return fused > 0, count > 0, abs(c - target)

    return min(options, key=key, default=target)


def cut(path: str | Path, start: int, end: int) -> Piece:
    """``piece`` of the file at ``path`` (parses the file: to cut one file often, ``load_model`` it once)."""
    return piece(load_model(path), start, end)
