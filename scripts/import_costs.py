"""What importing the query path's libraries costs: each import statement in a fresh interpreter, its wall time
and CPU time (user + sys of the child, seconds), median of ``--runs`` runs. This is the floor under ``regis
search``'s ``load`` (README, "regis search"): a command that imports torch cannot start faster than this.

    PYTHONPATH=$PWD python scripts/import_costs.py [--runs 3] [--json OUT]

Prints one line per import and ``uptime`` (the machine's load is part of the figure).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

IMPORTS = (
    "pass",
    "import numpy",
    "import faiss",
    "import torch",
    "import torch, torchvision",
    "import timm",
    "import onnxruntime",
    "import regis.retrieve.query",
    "import cli.main",
)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_import(statement: str) -> tuple[float, float]:
    """(wall s, CPU s) of ``python -c statement`` in a fresh interpreter.

    Raises:
        RuntimeError: the statement failed (a module not installed), with its last stderr line.
    """
    cpu0, t0 = _children_cpu(), time.perf_counter()
    out = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True, timeout=300)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"{statement!r} failed: {last}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the medians here")
    args = parser.parse_args()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(uptime)
    rows = {}
    for statement in IMPORTS:
        try:
            runs = [time_import(statement) for _ in range(args.runs)]
        except RuntimeError as exc:
            print(f"{statement:32s} skipped: {exc}")
            continue
        wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        rows[statement] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}
        print(f"{statement:32s} wall {wall:6.2f} s   CPU {cpu:6.2f} s")
    if args.json:
        args.json.write_text(json.dumps({"uptime": uptime, "runs": args.runs, "imports": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
