"""Subprocess side of the GPU check: run one .tflite on one LiteRT accelerator over a list of feeds.

``python path/to/gpu_worker.py MODEL ACCEL FEEDS.npz OUT.npz THREADS`` (run as a script: no sam2edge import)

  ACCEL     "gpu" (GPU with CPU fallback for the ops the delegate rejects) or "cpu" (XNNPACK only)
  FEEDS.npz ``__feeds__``: a JSON list (as a 0-d str array), one dict per run mapping the signature's input
            name -> key of an array in the same file (feeds share arrays, e.g. one photo's features);
  OUT.npz   written here: ``{run}/{output name}`` -> array in the signature's output shape and dtype.

The parent (``gpu_check``) sets the process environment (Vulkan ICD) and reads the delegate's log
from this process's stderr; stdout carries one JSON line (signature, load and run seconds). Only
numpy and ai_edge_litert are imported here, so a run starts fast.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np


def _options(accel: str, threads: int):
    from ai_edge_litert.cpu_options import CpuOptions
    from ai_edge_litert.gpu_options import GpuOptions
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator as HA
    from ai_edge_litert.options import Options

    hw = HA.GPU | HA.CPU if accel == "gpu" else HA.CPU
    # Without the completion hint, reading an output after a long GPU run (> ~1 min on SwiftShader: the
    # full-size encoder, or 8 Hiera stage-1 blocks) fails with "Failed to lock custom tensor buffer".
    gpu = GpuOptions(hint_waiting_for_completion=True)
    return Options(hardware_accelerators=hw, cpu_options=CpuOptions(num_threads=threads), gpu_options=gpu)


def run(model_path: str, accel: str, feeds_path: str, out_path: str, threads: int) -> dict:
    """Load once, run every feed, save the outputs; returns the JSON summary printed on stdout."""
    from ai_edge_litert.compiled_model import CompiledModel

    data = np.load(feeds_path, allow_pickle=False)
    feeds = json.loads(str(data["__feeds__"]))
    t0 = time.perf_counter()
    model = CompiledModel.from_file(model_path, options=_options(accel, threads))
    load_s = time.perf_counter() - t0
    key = next(iter(model.get_signature_list()))
    sig = model.get_signature_list()[key]
    in_details, out_details = model.get_input_tensor_details(key), model.get_output_tensor_details(key)
    ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)
    results: dict[str, np.ndarray] = {}
    run_s = []
    for i, feed in enumerate(feeds):
        for name, buf in zip(sig["inputs"], ins):
            shape = in_details[name]["shape"]
            buf.write(np.ascontiguousarray(data[feed[name]], dtype=in_details[name]["dtype"]).reshape(shape))
        t = time.perf_counter()
        model.run_by_index(0, ins, outs)
        for name, buf in zip(sig["outputs"], outs):
            shape = [int(d) for d in out_details[name]["shape"]]
            dtype = np.dtype(out_details[name]["dtype"])
            results[f"{i}/{name}"] = buf.read(int(np.prod(shape)), dtype).reshape(shape)
        run_s.append(time.perf_counter() - t)
    np.savez(out_path, **results)
    for buf in (*ins, *outs):
        buf.destroy()
    return {
        "signature": key,
        "inputs": {n: list(map(int, d["shape"])) for n, d in in_details.items()},
        "outputs": {n: list(map(int, d["shape"])) for n, d in out_details.items()},
        "load_s": load_s,
        "run_s": run_s,
        "fully_accelerated_claim": bool(model.is_fully_accelerated()),
    }


def main(argv: list[str]) -> None:
    model_path, accel, feeds_path, out_path, threads = argv
    summary = run(model_path, accel, feeds_path, out_path, int(threads))
    sys.stdout.write(json.dumps(summary) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    # LiteRT 2.3's teardown of the WebGPU environment can segfault after a successful run; the outputs
    # are on disk and flushed, so leave without running destructors.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
