"""Shared helpers of the benchmark scripts: the machine description, data paths, timing and recall.

Nothing heavy at import time: torch and faiss are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import os
import platform
import stat
import time
from pathlib import Path

import numpy as np

DATA_DIR = Path(os.environ.get("REGIS_BENCH_DATA", "/work/perf-data"))
CORPUS_DIR = DATA_DIR / "corpus"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_id() -> str | None:
    """Family / model / stepping and the widest SIMD of the CPU (Linux ``/proc/cpuinfo``): VMs that print the
    same model name ("AMD EPYC") can be different generations (e.g. 2x apart on the query encoder)."""
    try:
        fields = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("cpu family", "model", "stepping", "flags") and key not in fields:
                fields[key] = value.strip()
    except OSError:
        return None
    if "model" not in fields:
        return None
    flags = set(fields.get("flags", "").split())
    simd = next((f for f in ("avx512f", "avx2", "avx") if f in flags), "none")
    family, stepping = fields.get("cpu family", "?"), fields.get("stepping", "?")
    return f"family {family} model {fields['model']} stepping {stepping}, {simd}"


def _ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def machine_info() -> dict:
    """CPU model, cores, RAM, load average, GPU (if any) and library versions, for every printed figure."""
    info = {
        "cpu": _cpu_model(),
        "cpu_id": _cpu_id(),
        "cores": os.cpu_count(),
        "ram_gib": round(_ram_gib(), 1),
        "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        info["torch"] = None
    try:
        import faiss

        info["faiss"] = faiss.__version__
        info["faiss_threads"] = faiss.omp_get_max_threads()
    except ImportError:
        info["faiss"] = None
    return info


def print_machine(extra: dict | None = None) -> dict:
    """Print ``machine_info()`` (plus ``extra``) as one JSON line prefixed ``machine:``; returns it."""
    info = {**machine_info(), **(extra or {})}
    print("machine:", json.dumps(info), flush=True)
    return info


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int = 10) -> float:
    """Mean over queries of |found[:k] & truth[:k]| / k.

    Args:
        found: (Q, >=k) int64 ids returned by the system under test (-1 = nothing).
        truth: (Q, >=k) int64 ids of the exact MaxSim ranking.
    """
    hits = 0
    for f, t in zip(found, truth, strict=True):
        hits += len(np.intersect1d(f[:k][f[:k] >= 0], t[:k]))
    return hits / (k * len(truth))


def gt_path(tag: str, n: int, n_queries: int) -> Path:
    """Where the exact top-k of ``n_queries`` queries over ``n`` images of the corpus named ``tag`` is cached
    (``bench.data.ground_truth`` writes it; ``bench.peers`` reads it)."""
    return DATA_DIR / f"gt-{tag}-{n}x{n_queries}.npz"


def warm_up(searcher, queries: np.ndarray, n: int, k: int, **params) -> int:
    """``n`` untimed ``searcher.search(query, k=k, **params)`` calls, results discarded, cycling through
    ``queries`` ((Q, m, D) float32) from the first: the lazy first-call work (FAISS, torch, page cache) out of the
    timed queries. Returns ``n``.

    Raises:
        ValueError: ``n`` < 0, or ``n`` > 0 with no queries.
    """
    if n < 0:
        raise ValueError(f"warm-up of {n} queries: it must be >= 0")
    if n and not len(queries):
        raise ValueError(f"warm-up of {n} queries with no queries to draw them from")
    for i in range(n):
        searcher.search(queries[i % len(queries)], k=k, **params)
    return n


def timed_searches(searcher, queries: np.ndarray, k: int, warmup: int = 0,
                   **params) -> tuple[list[float], np.ndarray, list[int]]:
    """One ``searcher.search(query, k=k, **params)`` per query of ``queries`` ((Q, m, D) float32), timed, after
    ``warmup`` untimed ones (``warm_up``; 0: none, so a cold measure stays cold): (Q latencies in seconds, (Q, k)
    int64 ids with -1 where fewer than k came back, candidates scored per query), the warm-up in none of them.

    Raises:
        ValueError: ``warm_up``'s.
    """
    warm_up(searcher, queries, warmup, k, **params)
    lat, found, cands = [], np.full((len(queries), k), -1, np.int64), []
    for i in range(len(queries)):
        t0 = time.perf_counter()
        r = searcher.search(queries[i], k=k, **params)
        lat.append(time.perf_counter() - t0)
        found[i, : len(r.ids)] = r.ids
        cands.append(r.num_candidates)
    return lat, found, cands


def latency_stats(seconds: list[float]) -> dict:
    """p50 / p99 / mean in milliseconds of per-query latencies given in seconds."""
    ms = np.asarray(seconds) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean())}


class Timer:
    """``with Timer() as t: ...; t.s`` elapsed seconds (perf_counter)."""

    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.s = time.perf_counter() - self.t0


def proc_memory() -> dict:
    """VmRSS, RssAnon, RssFile, VmHWM of this process in bytes (Linux ``/proc/self/status``)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def rss_growth(base: dict, now: dict, n: int) -> dict:
    """Resident memory gained between two ``proc_memory`` snapshots, in bytes per image over ``n`` images
    (``rss_bytes_per_image``, and its anonymous and file-backed parts), plus ``now``'s whole VmRSS in MiB."""
    return {"rss_bytes_per_image": (now["VmRSS"] - base["VmRSS"]) / n,
            "rss_anon_bytes_per_image": (now["RssAnon"] - base["RssAnon"]) / n,
            "rss_file_bytes_per_image": (now["RssFile"] - base["RssFile"]) / n,
            "rss_total_mib": now["VmRSS"] / 2**20}


def dir_bytes(path: Path) -> int:
    """Disk size of ``path``, bytes: a file's size, or the sizes of the regular files below a folder, each file
    counted once (hard links to one file: once, as ``du``; symbolic links not followed)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    seen, total = set(), 0
    for root, _, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(root, f))
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def print_json(out: dict, path: str | Path | None = None) -> str:
    """Print a benchmark's result ``out`` as indented JSON (numpy numbers as floats) and, with ``path``, write
    the same text there too (its folder created). Returns the text."""
    text = json.dumps(out, indent=1, default=float)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    print(text)
    return text
