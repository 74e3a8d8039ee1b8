"""``sam2edge embed --ray``: the same job on Ray Data.

Pipeline: ``read_binary_files`` (image bytes + path, read in Ray read tasks) -> ``map_batches`` over an
actor pool (``EmbedActor``: each actor loads the model once, then runs ``EmbedWorker.process``, the
local job's per-image step, and writes ``<name>.safetensors`` into the store itself) -> index rows back
to the driver, which writes ``index.parquet``. Only the rows travel back, never the embeddings.
On several nodes STORE must be a folder every node can write (shared file system) and IMAGES readable
from every node.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path, PurePath

from sam2edge.embed.job import EmbedWorker, RowCallback, load_predictor
from sam2edge.embed.store import open_store, prepare_index, write_index
from sam2edge.errors import UserError


class EmbedActor:
    """One Ray actor: loads the model once (pinned to ``threads`` torch threads), embeds batches."""

    def __init__(self, model, checkpoint, config, store: str, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.worker = EmbedWorker(load_predictor(model, checkpoint, config), store)

    def __call__(self, batch: dict) -> dict:
        rows = []
        for path, data in zip(batch["path"], batch["bytes"]):
            # the name is the file stem, as in ``list_images``; the driver restores its own path spelling
            rows.append(self.worker.process(PurePath(str(path)).stem, str(path), bytes(data)))
        return {k: [r[k] for r in rows] for k in rows[0]} if rows else {}


def _connect(address: str | None, num_cpus: int | None) -> bool:
    """Join the cluster at ``address`` or start a local one (reused when this process already has one).
    -> True when this call connected (the caller then disconnects)."""
    import ray
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # ours (tqdm, images/s) is the one progress display
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    if ray.is_initialized():
        return False
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as e:
        where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
        raise UserError(f"cannot start or reach {where} ({str(e).splitlines()[0][:120]}); check --ray") from None
    return True


def run_ray(
    images: list[tuple[str, Path]],
    store: str | Path,
    model: str | None = None,
    checkpoint: str | None = None,
    config: str | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    actors: int = 1,
    cpus_per_actor: int = 1,
    on_row: RowCallback | None = None,
    progress: bool = True,
) -> list[dict]:
    """Embed ``images`` into ``store`` on Ray (``address`` None: a local cluster of ``num_cpus`` CPUs,
    default all). -> index rows in input order. Byte-identical files to ``run_local`` for the same
    model and torch thread count (``cpus_per_actor`` threads per actor)."""
    import ray
    import ray.data
    from tqdm import tqdm

    if actors < 1 or cpus_per_actor < 1:
        raise UserError("--actors and --cpus-per-actor must be at least 1")
    identity = load_predictor(model, checkpoint, config).model_identity()
    store = open_store(store, identity)
    note = prepare_index(store)  # before any actor reads it
    if note:
        print(f"note: {note}", file=sys.stderr)
    connected = _connect(address, num_cpus)
    paths = {n: str(p) for n, p in images}
    # reading is I/O: 0 CPUs, so the read tasks never wait behind actors that hold every CPU
    ds = ray.data.read_binary_files(list(paths.values()), include_paths=True, ignore_missing_paths=True, num_cpus=0)
    kwargs = dict(model=model, checkpoint=checkpoint, config=config, store=str(store.absolute()))
    out = ds.map_batches(
        EmbedActor,
        fn_constructor_kwargs={**kwargs, "threads": cpus_per_actor},
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=cpus_per_actor,
    )
    got: dict[str, dict] = {}
    finished = False
    try:
        with tqdm(total=len(images), desc="embed (ray)", unit="img", disable=not progress) as bar:
            for row in out.iter_rows():
                row = {**_plain(row), "image": paths[row["name"]]}
                got[row["name"]] = row
                bar.update(1)
                if on_row is not None:
                    on_row(row)
        finished = True
    finally:
        rows = [got.get(n) or _unread(n, p) for n, p in images] if finished else list(got.values())
        write_index(store, rows)
        if connected:
            ray.shutdown()
    return rows


def _plain(row: dict) -> dict:
    """Ray row (numpy scalars) -> plain Python values."""
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}


def _unread(name: str, path: Path) -> dict:
    """Row of an image Ray's reader skipped (vanished or unreadable file)."""
    row = {"name": name, "image": str(path), "sha256": "", "status": "error", "height": 0, "width": 0}
    return {**row, "error": "cannot read file (skipped by the Ray reader)", "seconds": 0.0}
