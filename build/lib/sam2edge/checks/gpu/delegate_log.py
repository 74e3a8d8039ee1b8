"""The GPU delegate's log: which operators it took, its partitions, device and validation errors."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ADAPTER = re.compile(r"Selected adapter: (?P<name>.+?), arch=(?P<arch>[^,]*),.*backend=(?P<backend>[^,]*)")
_SPLIT = re.compile(r"(?P<gpu>\d+) operations will run on the GPU, and the remaining (?P<cpu>\d+) operations")
_NONE = re.compile(r"No operations will run on the GPU, and all (?P<cpu>\d+) operations")
_REJECT_HEAD = "Following operations are not supported by GPU delegate:"
_REJECT = re.compile(r"^(?P<op>[A-Z][A-Z0-9_]*): (?P<reason>.+)$")
_PARTITION = "Initializing WebGPU-based API from graph."
_VALIDATION = re.compile(r"Validation error: (?P<msg>.+)$")  # Dawn refused a GPU object: outputs undefined


@dataclass
class Residency:
    """What the delegate reported for one file."""

    ops_total: int
    ops_gpu: int
    partitions: int
    rejected: list[dict[str, str]] = field(default_factory=list)  # [{op, reason}] as the delegate words it
    device: str = ""  # Vulkan device as the delegate's adapter line names it
    fully_accelerated_claim: bool | None = None  # CompiledModel.is_fully_accelerated(): recorded, not trusted
    gpu_errors: list[str] = field(default_factory=list)  # WebGPU validation errors (unique): the run is void

    @property
    def resident(self) -> bool:
        return self.ops_gpu == self.ops_total and self.partitions == 1


# ---- the delegate's log --------------------------------------------------------------------------


def parse_delegate_log(log: str, ops_total: int) -> Residency:
    """Residency from the GPU delegate's stderr; ``ops_total`` = operators in the graph (flatbuffer)."""
    lines = log.splitlines()
    rejected, in_list = [], False
    for line in lines:
        if _REJECT_HEAD in line:
            in_list = True
            continue
        m = _REJECT.match(line.strip())
        if in_list and m:
            rejected.append({"op": m["op"], "reason": m["reason"]})
        elif in_list:
            in_list = False
    split = next((m for m in map(_SPLIT.search, lines) if m), None)
    none = next((m for m in map(_NONE.search, lines) if m), None)
    partitions = sum(_PARTITION in line for line in lines)
    if split:
        gpu, total = int(split["gpu"]), int(split["gpu"]) + int(split["cpu"])
    elif none:
        gpu, total = 0, int(none["cpu"])
    else:  # no split line: the delegate took every op, if it built a partition
        gpu, total = (ops_total if partitions else 0), ops_total
    adapter = next((m for m in map(_ADAPTER.search, lines) if m), None)
    device = f"{adapter['name']} ({adapter['backend']}, arch {adapter['arch']})" if adapter else ""
    errors = list(dict.fromkeys(m["msg"].strip() for m in map(_VALIDATION.search, lines) if m))
    return Residency(total, gpu, partitions, rejected, device, gpu_errors=errors)
