"""Shared fixtures: the bundled real photos, a tiny random encoder, the offline EfficientNet-Lite0 encoder,
and indexes built from the photos."""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach a model hub


def pytest_configure(config) -> None:
    """SIGTERM (``kill``, a CI job's timeout) stops the run as Ctrl-C does: Python's default action ends the process
    at once, so no ``finally`` or fixture teardown runs and the servers, workers and redis-servers that tests start
    as subprocesses outlive the run; raised as ``KeyboardInterrupt`` in the test that is running, pytest unwinds it
    and stops (tests/test_conftest_sigterm.py)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)


@pytest.fixture(scope="session", autouse=True)
def query_bundles(tmp_path_factory) -> Path:
    """Torch-free query encoders (``regis.models.query_bundle``) that searches write go to a folder of this test
    session (``REGIS_QUERY_BUNDLES``, inherited by subprocesses), not to the user's cache."""
    folder = Path(os.environ.get("REGIS_QUERY_BUNDLES") or tmp_path_factory.mktemp("query-bundles"))
    os.environ["REGIS_QUERY_BUNDLES"] = str(folder)
    return folder


@pytest.fixture()
def one_thread():
    """Small models on a shared 2-core machine run far faster (and steadier) on one torch thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass
class CliRun:
    """What ``regis ARGS`` did: exit status and output."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run ``regis ARGS`` in this process (``cli.main.main``, what the console script runs: no interpreter start
    or torch import per call); returns a ``CliRun``. ``env`` sets variables ("" unsets one; REGIS_INDEX_DIR,
    REGIS_COLLECTIONS_ROOT and REGIS_DEBUG start unset), ``stdin`` answers prompts. Tests of the real entry point
    (``python -m regis``) run it in a subprocess (tests/test_cli.py)."""
    import io
    import sys

    from cli.main import main

    threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else os.cpu_count() or 1

    def run(*args, env: dict | None = None, stdin: str = "") -> CliRun:
        base = {"REGIS_INDEX_DIR": "", "REGIS_COLLECTIONS_ROOT": "", "REGIS_DEBUG": ""}
        for name, value in {**base, **(env or {})}.items():
            if value:
                monkeypatch.setenv(name, value)
            else:
                monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            main([str(a) for a in args])
        out = capsys.readouterr()
        return CliRun(exit_.value.code, out.out, out.err)

    yield run
    if "torch" in sys.modules:  # regis search sets one torch thread for its query: the process's default again
        sys.modules["torch"].set_num_threads(threads)


@pytest.fixture(scope="session")
def photos_dir(tmp_path_factory) -> Path:
    """The real photos bundled in scikit-image, scikit-learn and matplotlib (21 files)."""
    from regis.data.sample_photos import collect_sample_photos

    out = tmp_path_factory.mktemp("photos")
    collect_sample_photos(out)
    return out


@pytest.fixture(scope="session")
def tiny_encoder():
    """A 2-block random ViT with 4 registers at 64 px (D = 32): fast, for the mechanics."""
    from regis.models.encoder import build_encoder

    return build_encoder("vit-tiny-reg4-test", random_init=True, seed=0)


@pytest.fixture(scope="session")
def lite0_encoder():
    """The offline backbone with its real ImageNet weights: for results on real photos."""
    from regis.models.encoder import build_encoder

    return build_encoder("efficientnet-lite0")


def assert_same_json(got, want, where: str = "", atol: float = 1e-4) -> None:
    """Equal JSON answers, floats to ``atol`` (scores, cosines), timings and index versions aside."""
    if isinstance(want, dict):
        skip = {"timings_ms", "index_version"}
        assert set(got) - skip == set(want) - skip, where
        for key in set(want) - skip:
            assert_same_json(got[key], want[key], f"{where}.{key}", atol)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_json(g, w, f"{where}[{i}]", atol)
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=atol), where
    else:
        assert got == want, where


def build(images: Path, index: Path, encoder, **kwargs):
    """Build or update an index quietly (no progress bar, decoding in-process)."""
    from indexer.build import BuildOptions, build_index

    options = BuildOptions(progress=False, num_workers=kwargs.pop("num_workers", 0), **kwargs)
    return build_index(images, index, encoder, options)


def unit_tokens(n: int, seed: int, t: int, d: int) -> np.ndarray:
    """Random unit token vectors: (n, t, d) float32, standard normal draws of ``default_rng(seed)`` scaled to
    norm 1 along the last axis."""
    x = np.random.default_rng(seed).standard_normal((n, t, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def token_writer(path: Path, backbone: str, dim: int, **kwargs):
    """An ``IndexWriter`` on ``path`` for a made-up CNN encoder named ``backbone`` with ``dim``-d tokens (4
    registers, grid cues), so that tests can write token arrays without a model; ``kwargs`` go to
    ``IndexWriter`` (token_store, faiss_spec, faiss_codec, k_factor, ...), whose ``ConfigError`` they may raise."""
    from regis.indexes.writer import IndexWriter
    from regis.models.encoder import EncoderConfig, WeightsInfo

    config = EncoderConfig(backbone=backbone, kind="cnn", num_registers=4, dim=dim, cue_method="grid",
                           mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    return IndexWriter(path, config, WeightsInfo(source="test", sha256="0" * 64), **kwargs)


def add_tokens(path: Path, tokens: np.ndarray, backbone: str, **kwargs):
    """Add ``tokens`` ((n, T, D) float32, unit rows) to the index at ``path`` as n new images named ``{id}.png``
    (``token_writer(path, backbone, D, **kwargs)``; the index is created when missing) and commit; returns the
    new version's manifest."""
    from regis.indexes.table import ImageRecord

    with token_writer(path, backbone, tokens.shape[-1], **kwargs) as w:
        ids = w.allocate_ids(len(tokens))
        w.put([ImageRecord(int(i), f"{i}.png", "0" * 64, 1, 1, 1, 0.0) for i in ids], tokens)
        return w.commit()


@pytest.fixture(scope="session")
def lite0_index(tmp_path_factory, photos_dir, lite0_encoder) -> Path:
    """An index of the bundled photos made with EfficientNet-Lite0 (built once per session)."""
    index = tmp_path_factory.mktemp("lite0-index")
    build(photos_dir, index, lite0_encoder)
    return index


CHROMIUM = os.environ.get("REGIS_CHROMIUM", "/usr/bin/chromium")
# Flags for headless Chromium on a machine without a display or outside network (no sandbox as root; no
# background connections, which a closed network refuses many at a time).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@pytest.fixture(scope="module")
def browser():
    """A headless Debian Chromium driven by Playwright (sync API), for the browser tests.

    Module-scoped: Playwright's sync API keeps an asyncio loop running in the main thread while it is open, so
    a session-wide browser would make every later test's ``asyncio.run`` fail ("cannot be called from a running
    event loop"); it is closed when its module's tests are done.

    Skips, saying why, when Chromium or Playwright is missing outside CI; in CI (``CI`` set) a missing browser
    is an error, since ``.ci/run`` installs it.
    """
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing in CI: .ci/run should have installed Debian's chromium")
        pytest.skip(f"browser tests need Debian's chromium at {CHROMIUM} (make system-deps installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("browser tests need the playwright package (pip install -e '.[dev]')")
    with sync_playwright() as pw:
        instance = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height (8-bit grey) with one tiny IDAT: a bomb by its header."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + \
        chunk(b"IEND", b"")
