"""scripts/hard_cases_readouts.py's ``run`` tabulates the hard set's own kinds (``regis.data.hard_cases.QUERY_KINDS``,
not a copy that drifts) and skips a kind without queries with a line that says which and why, instead of a
KeyError. On a tiny fake set (no photos, no backbone, no cache): ``load_hard_set`` and ``variants`` replaced."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from regis.data.hard_cases import ASPECT_KINDS, QUERY_KINDS, HardSet, Item

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "hard_cases_readouts.py"


@pytest.fixture(scope="module")
def readouts():
    spec = importlib.util.spec_from_file_location("hard_cases_readouts_under_test", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def fake_set(kinds: list[str], gallery: int = 3) -> HardSet:
    """One query per kind in ``kinds`` and ``gallery`` items; query i is answered by gallery item i % gallery."""
    blank = Image.new("RGB", (8, 8))
    items = [Item(blank, "a.png", "photo", (0, 0, 8, 8)) for _ in range(gallery)]
    queries = [Item(blank, "a.png", k, (0, 0, 8, 8)) for k in kinds]
    relevance = np.zeros((len(queries), gallery), bool)
    relevance[np.arange(len(queries)), np.arange(len(queries)) % gallery] = True
    return HardSet(items, queries, relevance)


def run_on(readouts, monkeypatch, tmp_path, capsys, hard: HardSet) -> tuple[list[str], str, dict]:
    """``run`` on ``hard`` with one variant of random tokens: (the table's kind columns, stdout, the JSON)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(len(hard.queries), 10, 8, generator=gen), dim=-1)
    g = torch.nn.functional.normalize(torch.randn(len(hard.gallery), 10, 8, generator=gen), dim=-1)
    monkeypatch.setattr(readouts, "load_hard_set", lambda repeats, seed: (hard, 1))
    monkeypatch.setattr(readouts, "variants", lambda cache, seed, repeats: iter([("fake", {"maxsim-10": (q, g)})]))
    out = tmp_path / "rows.json"
    args = argparse.Namespace(repeats=1, seed=0, cache=tmp_path, only=None, json=out)
    assert readouts.run(args) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("variant"))
    return header.split()[3:], text, json.loads(out.read_text())


def test_every_kind_of_the_set_is_tabulated(readouts, monkeypatch, tmp_path, capsys):
    columns, text, data = run_on(readouts, monkeypatch, tmp_path, capsys, fake_set(list(QUERY_KINDS)))
    assert columns == ["all", *QUERY_KINDS] and "color-jpeg" in columns
    assert set(data["rows"][0]["metrics"]) == {"all", *QUERY_KINDS}
    assert data["kinds_skipped"] == {} and "skipped" not in text


def test_a_kind_without_its_source_photos_is_skipped_with_why(readouts, monkeypatch, tmp_path, capsys):
    """The bundled photos without scikit-image's right stereo image (and no aspect photos, as this script builds
    the set): no stereo query, which used to raise KeyError('stereo')."""
    kinds = [k for k in QUERY_KINDS if k not in ("stereo", *ASPECT_KINDS)]
    columns, text, data = run_on(readouts, monkeypatch, tmp_path, capsys, fake_set(kinds))
    assert columns == ["all", *kinds]
    assert "kind stereo skipped: its source photos are missing" in text and "motorcycle_right.png" in text
    for kind in ASPECT_KINDS:
        assert f"kind {kind} skipped: its source photos are missing (no portrait or panoramic photos" in text
    assert list(data["kinds_skipped"]) == ["stereo", *ASPECT_KINDS]
    assert set(data["rows"][0]["metrics"]) == {"all", *kinds}
