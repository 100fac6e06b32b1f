"""An index built from fine-tuned weights keeps a copy of them by content hash: moving the training run
directory no longer breaks it (issue 14, fault 14); without a copy the error names the missing file and
``--weights``, not another backbone."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from conftest import build
from regis.errors import WeightsError
from regis.indexes.snapshot import IndexSnapshot
from regis.indexes.weights_copy import WEIGHTS_DIR
from regis.models.encoder import build_encoder
from regis.retrieve.query import QueryEngine
from training.engine.checkpoint import save_encoder


def test_an_index_survives_moving_the_run_directory_of_its_weights(tmp_path, photos_dir, one_thread):
    run = tmp_path / "run"
    run.mkdir()
    save_encoder(build_encoder("vit-tiny-reg4-test", random_init=True, seed=7), run)  # "fine-tuned" weights
    encoder = build_encoder("vit-tiny-reg4-test", weights=str(run))
    images = tmp_path / "images"
    images.mkdir()
    for p in sorted(photos_dir.iterdir())[:4]:
        shutil.copy(p, images / p.name)
    index = tmp_path / "index"
    build(images, index, encoder)
    sha = IndexSnapshot.open(index).manifest.weights.sha256
    assert [p.name for p in (index / WEIGHTS_DIR).iterdir()] == [f"{sha}.safetensors"]

    query = images / sorted(p.name for p in images.iterdir())[0]
    before = QueryEngine.open(index).search_file(query, k=4)
    shutil.move(run, tmp_path / "moved-run")  # the run directory the manifest names is gone
    after = QueryEngine.open(index).search_file(query, k=4)
    assert [h["id"] for h in after["results"]] == [h["id"] for h in before["results"]]
    assert np.allclose([h["score"] for h in after["results"]], [h["score"] for h in before["results"]], atol=1e-4)
    build(images, index, build_encoder("vit-tiny-reg4-test", weights=str(tmp_path / "moved-run")))  # same hash: ok

    shutil.rmtree(index / WEIGHTS_DIR)  # an index written before copies were kept
    with pytest.raises(WeightsError) as err:
        QueryEngine.open(index)
    assert "--weights" in str(err.value) and str(run) in str(err.value)
    assert "efficientnet" not in str(err.value)
    assert QueryEngine.open(index, weights=str(tmp_path / "moved-run")).snapshot.version >= 1
