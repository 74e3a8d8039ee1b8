"""Damaged bundles whose card and manifest were re-signed to match: every shipped graph is parsed when the
bundle opens (the GPU program the CPU runtime never runs included), and ``card render`` on a card.json /
fidelity.json field of the wrong type is one line with nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import tree_state

from sam2edge.bundle import rewrite_metadata
from sam2edge.bundle.card import sha256_bytes
from sam2edge.cli.main import main
from sam2edge.errors import UserError


def _resigned_copy(small_bundle, tmp_path: Path, edit) -> Path:
    """A copy of the test-small LiteRT bundle, ``edit(folder, card)`` applied, card + manifest re-signed."""
    folder = tmp_path / "bundle"
    shutil.copytree(small_bundle("litert"), folder)
    card = json.loads((folder / "card.json").read_text())
    edit(folder, card)
    for art in card["artifacts"]:
        path = folder / art["file"]
        art["sha256"], art["bytes"] = sha256_bytes(path), path.stat().st_size
    rewrite_metadata(folder, card, checked=True)
    return folder


GPU_DAMAGE = {
    "garbage after the header": lambda p: p.write_bytes(p.read_bytes()[:8] + b"\x00garbage" * 64),
    "cut in half": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("damage", list(GPU_DAMAGE))
def test_damaged_gpu_decoder_refused_at_open(small_bundle, tmp_path, damage):
    from sam2edge.runtime.backends.litert import DECODER_CPU_FILE, DECODER_FILE, LiteRTBackend

    def edit(folder: Path, card: dict) -> None:
        assert (folder / DECODER_CPU_FILE).is_file()  # the CPU runtime never opens decoder.tflite
        GPU_DAMAGE[damage](folder / DECODER_FILE)

    folder = _resigned_copy(small_bundle, tmp_path, edit)
    with pytest.raises(UserError) as e:
        LiteRTBackend.from_bundle(folder)
    assert DECODER_FILE in str(e.value) and "\n" not in str(e.value), str(e.value)


CARD_FIELDS = {
    "artifacts bytes a string": lambda c: c["artifacts"][0].update(bytes="many"),
    "extra a list": lambda c: c.update(extra=[1, 2]),
    "source a string": lambda c: c.update(source="meta"),
    "fidelity a list": lambda c: c.update(fidelity=[1]),
    "tools a number": lambda c: c.update(tools=3),
}


@pytest.mark.parametrize("field", list(CARD_FIELDS))
def test_card_render_wrong_type_is_one_line(small_bundle, tmp_path, capsys, field):
    def edit(folder: Path, card: dict) -> None:
        (folder / "fidelity.json").unlink(missing_ok=True) if field == "fidelity a list" else None
        CARD_FIELDS[field](card)

    folder = _resigned_copy(small_bundle, tmp_path, lambda f, c: None)
    card = json.loads((folder / "card.json").read_text())
    edit(folder, card)
    (folder / "card.json").write_text(json.dumps(card))
    rewrite_metadata(folder, card, checked=True)
    before = tree_state(folder)
    rc = main(["card", "render", str(folder)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert tree_state(folder) == before
