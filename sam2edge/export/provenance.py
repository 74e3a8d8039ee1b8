"""torch.fx provenance records shared, not deep-copied, while a graph is converted (LiteRT, ExecuTorch).

Every pass that re-creates a node stores ``node.meta["from_node"]``: a record of the node it came from, holding a
deep copy of that node's own chain of records. Over a conversion of ~85 passes the copies grow quadratically with
the pass count, for debug metadata no converted program carries. Inside ``shared_provenance()`` a record is shared
(none is changed after it is made) and the converted files are byte-identical. Test-small on 2 cores, each export
in a fresh process, the same run (2026-12-05): the ExecuTorch export 80.3 -> 64.5 s (0.80x), the LiteRT export (no
GPU check) 36.6 -> 34.9 s (0.95x), every file the same sha256. Reproduce: ``python benchmarks/bench_provenance.py
--work DIR --target executorch`` (``--target litert``); the programs are compared byte for byte in
``tests/test_executorch.py::test_lowering_with_shared_provenance_is_byte_identical``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def shared_provenance() -> Iterator[None]:
    """Within the block, ``copy.deepcopy`` of a torch.fx ``NodeSource`` returns the record itself; restored after
    (nesting is fine)."""
    from torch.fx.traceback import NodeSource

    before = NodeSource.__dict__.get("__deepcopy__")
    NodeSource.__deepcopy__ = lambda self, memo: self  # a record is immutable once made: share it
    try:
        yield
    finally:
        if before is None:
            del NodeSource.__deepcopy__
        else:
            NodeSource.__deepcopy__ = before
