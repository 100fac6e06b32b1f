"""How long one ``regis search`` takes from the command line, each run a fresh process, split as the command
reports it (load: imports, index and query encoder; decode; encode; search = candidates + rerank), with each
run's wall time and CPU time (user + sys of the process: about what the run costs on an idle core, since the
search runs on one thread). Optionally alternated with the same command at another git ref (``--compare REF``: a
temporary ``git worktree``), so that both see the same load.

Before the timed runs: one search that is not counted (it writes the encoder's torch-free query bundle if there
is none, ``regis.models.query_bundle``, as the first search after a build does), and one in a fresh process that
reports whether torch and timm were imported. ``--first`` also times one search with an empty bundle folder: the
first search of an encoder (torch, then the bundle's export).

    PYTHONPATH=$PWD python scripts/bench_search_cli.py INDEX QUERY [--runs 5] [--first] [--compare e1aedfc]
        [--json OUT]

Prints one line per run and the medians; ``uptime`` before and after (the machine's load is part of the figure).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(code_dir: Path, index: Path, query: Path, env_extra: dict | None = None) -> dict:
    """One ``python -m regis search INDEX QUERY --json`` with ``code_dir`` first on the path: wall s, CPU s, the
    command's own timings (ms) and search = candidates + rerank (ms)."""
    env = {**os.environ, "PYTHONPATH": str(code_dir), **(env_extra or {})}
    cpu0, t0 = _children_cpu(), time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "regis", "search", str(index), str(query), "-k", "5", "--json"],
                         capture_output=True, text=True, env=env, cwd=code_dir, timeout=600)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if out.returncode != 0:
        raise SystemExit(f"regis search failed in {code_dir}:\n{out.stderr[-2000:]}")
    timings = json.loads(out.stdout)["timings_ms"]
    timings["search"] = timings["candidates"] + timings["rerank"]
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), **{k: round(v, 1) for k, v in timings.items()}}


MODULES_CHECK = """import json, sys
from cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps({m: m in sys.modules for m in ("torch", "timm", "torchvision", "onnxruntime")}))
"""


def imported(code_dir: Path, index: Path, query: Path) -> dict:
    """Which of torch, timm, torchvision and onnxruntime a ``regis search`` (the console script's entry point,
    ``cli.main.main``) imported, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(code_dir)}
    out = subprocess.run([sys.executable, "-c", MODULES_CHECK, "search", str(index), str(query), "-k", "5"],
                         capture_output=True, text=True, env=env, cwd=code_dir, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=Path)
    parser.add_argument("query", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compare", metavar="REF", help="also run the command at this git ref, alternately")
    parser.add_argument("--first", action="store_true", help="also time one search without a query bundle")
    parser.add_argument("--json", type=Path, help="write every run and the medians here")
    args = parser.parse_args()
    index, query = args.index.resolve(), args.query.resolve()
    variants = {"now": REPO}
    tmp = None
    if args.compare:
        tmp = Path(tempfile.mkdtemp(prefix="regis-bench-ref-")) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tmp), args.compare], check=True,
                       capture_output=True)
        variants[args.compare] = tmp
    before = _uptime()
    print(f"before: {before}")
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    extra: dict = {}
    try:
        if args.first:
            with tempfile.TemporaryDirectory(prefix="regis-bundles-") as empty:
                extra["first"] = run_once(REPO, index, query, {"REGIS_QUERY_BUNDLES": empty})
            print("     first: " + "  ".join(f"{k} {v}" for k, v in extra["first"].items()), flush=True)
        run_once(REPO, index, query)  # writes the bundle if there is none; not counted
        extra["imported"] = imported(REPO, index, query)
        print(f"imported by regis search: {extra['imported']}", flush=True)
        for _ in range(args.runs):
            for name, code in variants.items():
                r = run_once(code, index, query)
                runs[name].append(r)
                print(f"{name:>10}: " + "  ".join(f"{k} {v}" for k, v in r.items()), flush=True)
    finally:
        if tmp is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tmp)], capture_output=True)
    after = _uptime()
    print(f"after: {after}")
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    for name, m in medians.items():
        print(f"median {name:>10}: " + "  ".join(f"{k} {v:g}" for k, v in m.items()))
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "uptime_before": before,
                                         "uptime_after": after, **extra, "runs": runs, "medians": medians},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
