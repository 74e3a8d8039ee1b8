"""Writes: nothing half-written or left behind on any exit path (exception, SIGTERM), normal permissions,
one-line errors for paths that cannot be written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import tree_state

from sam2edge.errors import UserError
from sam2edge.io import atomic_dir, atomic_path

REPO = Path(__file__).resolve().parents[2]


def _umask() -> int:
    m = os.umask(0o022)
    os.umask(m)
    return m


@pytest.mark.parametrize("kind", ["atomic_dir", "atomic_path"])
def test_sigterm_mid_write_leaves_nothing(tmp_path, kind):
    """A process killed (SIGTERM) while writing leaves neither the destination nor a hidden temp beside it."""
    (tmp_path / "keep.txt").write_text("x")
    script = textwrap.dedent(f"""
        import signal, sys, time
        # a fresh process's SIGTERM: the test runner's worker may pass on an ignored or blocked one
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})
        from sam2edge.io import {kind}
        with {kind}(sys.argv[1]) as tmp:
            if "{kind}" == "atomic_dir":
                (tmp / "model.tflite").write_bytes(b"0" * 1000)
            else:
                tmp.write_bytes(b"0" * 1000)
            print("ready", flush=True)
            time.sleep(60)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout.readline().strip() == b"ready"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:  # once in a CI run: say what the process did with the signal
        status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        proc.kill()
        proc.communicate()
        pytest.fail(f"still running 60 s after SIGTERM: {[ln for ln in status if ln.startswith(('Sig', 'Threads'))]}")
    proc.communicate()
    assert proc.returncode != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_sigterm_handler_is_restored(tmp_path):
    with atomic_path(tmp_path / "a.txt") as tmp:
        assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
        tmp.write_text("a")
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_bundle_folder_has_normal_permissions(tmp_path):
    with atomic_dir(tmp_path / "bundle") as tmp:
        (tmp / "card.json").write_text("{}")
    assert (tmp_path / "bundle").stat().st_mode & 0o777 == 0o777 & ~_umask()


def test_written_file_has_normal_permissions(tmp_path):
    with atomic_path(tmp_path / "mask.png") as tmp:
        tmp.write_bytes(b"png")
    assert (tmp_path / "mask.png").stat().st_mode & 0o777 == 0o666 & ~_umask()


@pytest.mark.parametrize("kind", ["atomic_dir", "atomic_path"])
def test_exception_keeps_the_old_destination(tmp_path, kind):
    dest = tmp_path / "out"
    if kind == "atomic_dir":
        dest.mkdir()
        (dest / "old.txt").write_text("old")
    else:
        dest.write_text("old")
    before = tree_state(tmp_path)
    with pytest.raises(RuntimeError), (atomic_dir if kind == "atomic_dir" else atomic_path)(dest):
        raise RuntimeError("conversion failed")
    assert tree_state(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_two_files_written_together_or_not_at_all(tmp_path):
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "m.png") as a, atomic_path(tmp_path / "o.png") as b:
        a.write_bytes(b"mask")
        b.write_bytes(b"overlay")
        raise RuntimeError("overlay failed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("dest", "words"),
    [("/sys/sam2edge.png", "cannot write /sys/sam2edge.png (Permission denied)"), ("{d}/f.txt/x.png", "cannot write")],
)
def test_unwritable_destination_is_one_line(tmp_path, dest, words):
    (tmp_path / "f.txt").write_text("a file, not a folder")
    with pytest.raises(UserError) as e, atomic_path(dest.format(d=tmp_path)):
        pass
    assert words in str(e.value) and "\n" not in str(e.value)


def test_atomic_path_refuses_a_folder(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(UserError, match="is a folder"), atomic_path(tmp_path / "d"):
        pass
    assert (tmp_path / "d").is_dir()
