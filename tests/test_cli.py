"""`sam2edge segment` on a real photo, and its bad inputs (one-line errors, exit 2, no partial files)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from sam2edge.checks.fidelity import photo_path
from sam2edge.cli.main import main


def test_segment_real_photo_writes_mask_and_overlay(tmp_path, capsys):
    out, ovl = tmp_path / "m.png", tmp_path / "o.png"
    rc = main(
        [
            "segment",
            str(photo_path("coffee.png")),
            "--point",
            "300,200",
            "--point",
            "100,50,0",
            "--box",
            "150,100,450,350",
            "--out",
            str(out),
            "--overlay",
            str(ovl),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr()
    assert str(out) in printed.out and str(ovl) in printed.out and "score:" in printed.out
    assert "SYNTHETIC" in printed.err
    mask = np.asarray(Image.open(out))
    assert mask.shape == (400, 600) and set(np.unique(mask)) <= {0, 255}
    overlay = Image.open(ovl)
    assert overlay.size == (600, 400) and overlay.mode == "RGB"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.png", "o.png"]  # no temp files left


def test_segment_multimask_keeps_best(tmp_path, capsys):
    rc = main(
        [
            "segment",
            "sample:chelsea.png",
            "--point",
            "200,150",
            "--multimask",
            "--out",
            str(tmp_path / "m.png"),
            "--overlay",
            str(tmp_path / "o.png"),
        ]
    )
    assert rc == 0
    assert "of [" in capsys.readouterr().out


def _bad(tmp_path, capsys, args) -> str:
    out, ovl = tmp_path / "m.png", tmp_path / "o.png"
    rc = main(["segment", *args, "--out", str(out), "--overlay", str(ovl)])
    err = capsys.readouterr().err.strip().splitlines()
    errors = [e for e in err if e.startswith("error:")]
    assert rc == 2 and len(errors) == 1, err
    assert not out.exists() and not ovl.exists() and not any(tmp_path.glob(".*tmp"))
    return errors[0]


def test_unreadable_image(tmp_path, capsys):
    bad = tmp_path / "photo.jpg"
    bad.write_bytes(b"not an image at all")
    assert "cannot read image" in _bad(tmp_path, capsys, [str(bad), "--point", "1,1"])


def test_missing_image(tmp_path, capsys):
    assert "does not exist" in _bad(tmp_path, capsys, [str(tmp_path / "nope.png"), "--point", "1,1"])


def test_point_outside_image(tmp_path, capsys):
    msg = _bad(tmp_path, capsys, ["sample:coffee.png", "--point", "700,10"])
    assert "outside the 600x400 image" in msg


def test_inverted_box(tmp_path, capsys):
    assert "inverted" in _bad(tmp_path, capsys, ["sample:coffee.png", "--box", "300,100,100,200"])


def test_no_prompt(tmp_path, capsys):
    assert "no prompt" in _bad(tmp_path, capsys, ["sample:coffee.png"])


def test_a_second_run_replaces_its_results_but_never_a_users_file(tmp_path, capsys):
    """mask / overlay PNGs carry Software = sam2edge: a rerun replaces them; any other existing file (a photo, a
    PNG another program wrote, a text file) is refused in one line, untouched, and nothing else is written."""
    out, ovl = tmp_path / "m.png", tmp_path / "o.png"
    args = ["segment", "sample:coffee.png", "--point", "300,200", "--config", "test-small"]
    assert main([*args, "--out", str(out), "--overlay", str(ovl)]) == 0
    assert Image.open(out).text.get("Software") == "sam2edge"
    assert main([*args, "--point", "100,50", "--out", str(out), "--overlay", str(ovl)]) == 0
    capsys.readouterr()
    user_png, user_txt, fresh = tmp_path / "photo.png", tmp_path / "notes.txt", tmp_path / "new.png"
    Image.new("RGB", (4, 4)).save(user_png)
    user_txt.write_text("mine")
    for flag, path, other in (("--out", user_png, "--overlay"), ("--overlay", user_txt, "--out")):
        before = path.read_bytes()
        assert main([*args, flag, str(path), other, str(fresh)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == f"error: {flag} {path} already exists and sam2edge did not write it; pass a new file name"
        assert path.read_bytes() == before and not fresh.exists()


@pytest.mark.parametrize("point", ["1", "a,b", "1,2,7"])
def test_malformed_point_is_a_usage_error(point, capsys):
    with pytest.raises(SystemExit) as e:
        main(["segment", "sample:coffee.png", "--point", point])
    assert e.value.code == 2


def test_console_entry_point_has_no_traceback(tmp_path):
    """The installed command, as a user runs it: one error line, exit 2."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    r = subprocess.run(
        [sys.executable, "-m", "sam2edge", "segment", "sample:coffee.png", "--point", "9999,1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: point 9999,1 is outside") and "Traceback" not in r.stderr
