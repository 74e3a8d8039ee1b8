"""Video: ``Sam2VideoPredictor`` (upstream ``SAM2VideoPredictor``'s API), the memory bank, the per-frame backends
(eager and bundles), PyAV frame I/O, mask answers, and the ``track`` job."""
