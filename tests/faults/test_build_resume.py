"""Resumable builds (issue 25, item 4): a build killed at a named crash point, or stopped by Ctrl-C or SIGTERM,
keeps the embeddings of its finished batches in the staging area (``indexer.resume``) and never a half-written
index; the next run of the build embeds only the rest, and the index it publishes equals a build that was never
stopped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from indexer.resume import RESUME_DIR, BuildStaging
from regis.indexes.layout import read_current
from regis.indexes.snapshot import IndexSnapshot
from tests.conftest import build

NAMES = ["skimage-astronaut.png", "skimage-chelsea.png", "skimage-coffee.png", "skimage-rocket.jpg",
         "sklearn-china.jpg", "sklearn-flower.jpg", "matplotlib-grace_hopper.jpg", "skimage-camera.png",
         "skimage-moon.png"]
TINY = ["--backbone", "vit-tiny-reg4-test", "--random-init", "--batch-size", "4", "--workers", "0", "--no-progress"]


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **extra}


def _build_args(folder: Path, index: Path) -> list[str]:
    return [sys.executable, "-m", "regis", "index", "build", str(folder), "--index", str(index), *TINY]


def _folder(photos_dir: Path, tmp_path: Path, names=NAMES) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir(exist_ok=True)
    for name in names:
        if not (folder / name).exists():
            shutil.copy(photos_dir / name, folder / name)
    return folder


def _tokens_by_path(index: Path) -> dict[str, np.ndarray]:
    snap = IndexSnapshot.open(index)
    try:
        return {r.path: np.asarray(snap.store.get(np.array([r.id]))[0]) for r in snap.table.iter_all()}
    finally:
        snap.close()


def _staged_paths(index: Path) -> list[str]:
    out = []
    for batch in sorted((index / RESUME_DIR).glob("batch-*.npz")):
        with np.load(batch) as z:
            out += [m["path"] for m in json.loads(bytes(z["meta"]).decode())]
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory, photos_dir, tiny_encoder):
    """The tokens of a build that was never stopped."""
    tmp = tmp_path_factory.mktemp("reference")
    index = tmp / "index"
    build(_folder(photos_dir, tmp), index, tiny_encoder, batch_size=4)
    return _tokens_by_path(index)


@pytest.mark.slow
def test_a_build_killed_after_a_staged_batch_resumes_from_it(tmp_path, photos_dir, tiny_encoder, reference):
    folder, index = _folder(photos_dir, tmp_path), tmp_path / "index"
    out = subprocess.run(_build_args(folder, index), env=_env(REGIS_CRASH_AT="build.batch-staged"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert read_current(index) is None and not list((index / "versions").glob("v*"))  # nothing published
    staged = _staged_paths(index)
    assert len(staged) == 4
    changed = folder / staged[0]  # a file changed since: embedded again, not taken from the staging area
    os.utime(changed, (time.time() + 5, time.time() + 5))
    report = build(folder, index, tiny_encoder, batch_size=4)
    assert (report.added, report.resumed, report.version) == (9, 3, 1)
    assert not (index / RESUME_DIR).exists()  # committed: the staging area is gone
    got = _tokens_by_path(index)
    assert sorted(got) == sorted(reference)
    for path, tokens in reference.items():
        np.testing.assert_array_equal(got[path], tokens)


@pytest.mark.slow
def test_a_build_killed_before_its_batch_file_is_renamed_stages_nothing(tmp_path, photos_dir, tiny_encoder,
                                                                         reference):
    folder, index = _folder(photos_dir, tmp_path), tmp_path / "index"
    out = subprocess.run(_build_args(folder, index), env=_env(REGIS_CRASH_AT="build.staging-unnamed"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert _staged_paths(index) == [] and len(list((index / RESUME_DIR).iterdir())) == 2  # encoder.json, temp
    report = build(folder, index, tiny_encoder, batch_size=4)
    assert (report.added, report.resumed) == (9, 0)
    got = _tokens_by_path(index)
    for path, tokens in reference.items():
        np.testing.assert_array_equal(got[path], tokens)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_says_how_far_the_build_got_and_the_next_run_resumes(tmp_path, photos_dir, tiny_encoder,
                                                                               reference, signum):
    folder, index = _folder(photos_dir, tmp_path, NAMES[:3]), tmp_path / "index"
    build(folder, index, tiny_encoder, batch_size=4)  # version 1: three photos
    _folder(photos_dir, tmp_path)  # six more
    release = tmp_path / "release"
    # SIGINT as in a terminal: a test run in the background (a non-interactive shell's "&") has it ignored, and a
    # child would inherit that (Python then installs no KeyboardInterrupt handler)
    proc = subprocess.Popen(_build_args(folder, index), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(REGIS_PAUSE_AT="build.batch-reported", REGIS_PAUSE_RELEASE=str(release)),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while not Path(f"{release}.reached").exists():  # the first batch of the six is embedded and staged
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.05)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["interrupted: 4 of 6 embedded, run again to resume"]
    assert read_current(index) == "v000001" and len(_tokens_by_path(index)) == 3  # the live version as it was
    report = build(folder, index, tiny_encoder, batch_size=4)
    assert (report.added, report.resumed, report.unchanged, report.version) == (6, 4, 3, 2)
    got = _tokens_by_path(index)
    for path, tokens in reference.items():
        np.testing.assert_array_equal(got[path], tokens)


def test_staged_embeddings_of_another_encoder_are_discarded(tmp_path):
    staging = BuildStaging(tmp_path, {"config": {"backbone": "a"}, "weights_sha256": "1"})

    class Entry:
        path, bytes, mtime = "x.png", 10, 1.5

    item = {"sha256": "0" * 64, "width": 4, "height": 3, "bytes": 10, "exif": {}}
    staging.save([Entry()], [item], np.ones((1, 10, 8)), np.zeros((1, 5)), (4, 4))
    assert set(staging.load({"x.png": (10, 1.5)})) == {"x.png"}
    assert staging.load({"x.png": (11, 1.5)}) == {}  # another size: another file
    other = BuildStaging(tmp_path, {"config": {"backbone": "b"}, "weights_sha256": "1"})
    assert other.load({"x.png": (10, 1.5)}) == {} and not (tmp_path / RESUME_DIR).exists()
