"""Per-test wall and CPU time of a pytest run, to decide what ``make test`` leaves to ``make test-heavy`` on a busy
machine: wall time there grows with the load, CPU time (the test process's and its waited children's user + sys
seconds) much less, so it is the figure that carries over to an idle machine.

As a pytest plugin (each test's setup, call and teardown, appended as JSON lines to $CPU_TIMES_OUT):

    PYTHONPATH=$PWD:scripts CPU_TIMES_OUT=/tmp/times.jsonl python -m pytest -p pytest_cpu_times

then the summary (totals, by file, the slowest tests, what the heavy marker takes out):

    python scripts/pytest_cpu_times.py /tmp/times.jsonl [--top 25]

CPU time misses processes the test does not wait for (a Ray cluster's workers), and counts two busy threads twice.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


try:
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        """Time one test (setup + call + teardown) and append it to $CPU_TIMES_OUT."""
        t0, (own0, kids0) = time.perf_counter(), _cpu()
        yield
        t1, (own1, kids1) = time.perf_counter(), _cpu()
        with open(os.environ["CPU_TIMES_OUT"], "a") as f:
            f.write(json.dumps({"id": item.nodeid, "wall": round(t1 - t0, 2), "cpu_self": round(own1 - own0, 2),
                                "cpu_children": round(kids1 - kids0, 2),
                                "heavy": item.get_closest_marker("heavy") is not None}) + "\n")
except ImportError:  # summarising needs no pytest
    pass


def summarize(path: str, top: int = 25) -> None:
    """Print the totals, the files and the slowest tests of a times file (CPU seconds first)."""
    rows = [json.loads(line) for line in open(path)]

    def cpu(r):
        return r["cpu_self"] + r["cpu_children"]

    for label, part in (("all", rows), ("make test (not heavy)", [r for r in rows if not r["heavy"]]),
                        ("make test-heavy", [r for r in rows if r["heavy"]])):
        print(f"{label:22s} {len(part):4d} tests  {sum(cpu(r) for r in part):7.1f} s CPU  "
              f"{sum(r['wall'] for r in part):7.1f} s wall")
    files: dict = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        if not r["heavy"]:
            entry = files[r["id"].split("::")[0]]
            entry[0] += cpu(r)
            entry[1] += r["wall"]
            entry[2] += 1
    print("\nnot heavy, by file: CPU s, wall s, tests")
    for name, (c, w, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{c:7.1f} {w:7.1f} {n:4d}  {name}")
    print("\nslowest tests (H: marked heavy): CPU s, wall s")
    for r in sorted(rows, key=lambda r: -cpu(r))[:top]:
        print(f"{cpu(r):7.1f} {r['wall']:7.1f} {'H' if r['heavy'] else ' '} {r['id']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("times", help="the JSON lines file the plugin wrote")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    summarize(args.times, args.top)
