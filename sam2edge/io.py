"""Atomic file and folder writes: nothing half-written is ever left at the destination.

The temporary file or folder lies beside the destination (hidden: ``.NAME.*``) and is removed on every
exit path: success (renamed onto the destination), an exception, Ctrl+C, and SIGTERM (while one is open
in the main thread, SIGTERM raises ``Terminated`` so the cleanup runs). A folder or file that cannot be
created raises ``UserError`` with one line, not an OSError traceback. What lands at the destination has
the permissions of a normal file or folder (umask applied), not the 0600/0700 of a temporary one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from sam2edge.errors import UserError


class Terminated(BaseException):
    """SIGTERM arrived while a temporary file or folder was open (a BaseException, like KeyboardInterrupt)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated(f"terminated by signal {signum}")


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While open (main thread, default SIGTERM handler only): SIGTERM raises ``Terminated`` instead of
    killing the process unwound, so ``finally`` blocks remove temporary files."""
    installed = False
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _raise_terminated)
                installed = True
    try:
        yield
    finally:
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _cannot_write(dest: Path, e: OSError) -> UserError:
    return UserError(f"cannot write {dest} ({e.strerror or type(e).__name__}); pass a path in a writable folder")


@contextlib.contextmanager
def atomic_path(dest: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; on success it is renamed onto ``dest``, else removed."""
    dest = Path(dest)
    if dest.is_dir():
        raise UserError(f"{dest} is a folder; give a file name inside it")
    with sigterm_raises():
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        except OSError as e:
            raise _cannot_write(dest, e) from None
        os.close(fd)
        try:
            yield Path(tmp)
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(dest: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``dest``; on success it replaces ``dest`` whole, else is removed."""
    dest = Path(dest)
    with sigterm_raises():
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
        except OSError as e:
            raise _cannot_write(dest, e) from None
        try:
            yield tmp
            os.chmod(tmp, 0o777 & ~_umask())
            if dest.exists():
                old = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old."))
                os.replace(dest, old / "x")
                os.replace(tmp, dest)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


# ---- result files a later run may replace ---------------------------------------------------------
SOFTWARE = "sam2edge"  # stamped into each PNG / JSON result a command writes: a later run may replace that file


def png_stamp():
    """PNG text chunks for ``Image.save(..., pnginfo=png_stamp())``: Software = sam2edge."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("Software", SOFTWARE)
    return info


def written_here(path: str | Path) -> bool:
    """Whether the file ``path`` is a result a sam2edge command wrote: a PNG whose Software text is sam2edge, or
    a JSON object whose "software" is. Anything else (unreadable included) is the user's."""
    import json

    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        if path.suffix.lower() == ".json":
            doc = json.loads(path.read_text())
            return isinstance(doc, dict) and doc.get("software") == SOFTWARE
        with Image.open(path) as im:
            return im.format == "PNG" and getattr(im, "text", {}).get("Software") == SOFTWARE
    except (OSError, ValueError, UnidentifiedImageError):
        return False


def check_replaceable(outputs: dict[str, str | Path]) -> None:
    """Refuse an output path (option name -> path) that holds a file no sam2edge command wrote (``written_here``):
    a user's file is never written over; an earlier run's result is replaced."""
    for opt, raw in outputs.items():
        if Path(raw).is_file() and not written_here(raw):
            raise UserError(f"{opt} {raw} already exists and sam2edge did not write it; pass a new file name")
