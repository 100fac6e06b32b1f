"""Helpers shared by the experiment drivers (``fashion_mnist_experiments.py``, ``dmcac_experiments.py``)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def sh(cmd: list[str], env: dict, dry_run: bool) -> float:
    """Print and run one command with extra environment variables; returns its wall time in seconds."""
    line = " ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") + shlex.join(cmd)
    print(f"$ {line}", flush=True)
    if dry_run:
        return 0.0
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, **env})
    return time.perf_counter() - t0


def pct(x) -> str:
    """A fraction as a percentage with one decimal, "-" for None."""
    return "-" if x is None else f"{100 * x:.1f}"


def write_results(out: Path, results: dict, markdown: Callable[[dict], str]) -> None:
    """Write ``results.json`` and ``results.md`` into ``out`` and print the markdown tables."""
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))
