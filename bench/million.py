"""Cost against collection size, up to a million images: regis at its defaults beside exact MaxSim (issue 24).

For each size N (the first N images of a ``bench.corpus1m`` corpus; the same queries at every size) this script

1. computes the exact MaxSim top-100 of every query over the N images (float32 torch GEMMs over chunks of the
   memory-mapped float16 tokens, all cores; cached as ``gt-*.npz``, with its wall time);
2. builds a regis index of the N images with the real ``IndexWriter`` (``bench.data.build_index``; regis's
   defaults unless ``--spec`` / ``--token-store`` say otherwise; cached, with its build time);
3. in a fresh process (so that its memory is the index's alone), opens the index and measures:
   - resident memory: ``VmRSS`` of the process after the queries, and its split into anonymous memory
     (``RssAnon``: the FAISS index, locations, Python) and file pages (``RssFile``: the memory-mapped codes and
     whatever float16 rows the re-scoring touched), minus the same figures of an empty process with the same
     imports (the baseline); the index's own arrays by size (FAISS index, codes, locations);
   - single-query latency on one thread (torch and FAISS): p50, p99, QPS = 1 / mean, first with the float16
     segments evicted from the page cache (``posix_fadvise DONTNEED`` on the segment files only: every re-scored
     row is read from disk), then again warm;
   - batched QPS on every core (``Searcher.search_batch``, batches of 100);
   - recall@10 against the exact top-10, and the candidates scored per query;
   - exact MaxSim of single queries on one thread (torch, chunked over the memory-mapped tokens: what a search
     without an index costs; ``--exact-queries`` of them), so that the ratio regis / exact of the same run is
     printed beside the absolute times;
   - disk bytes per image (every file of the index directory).

Rows are printed as ``row:`` JSON lines and a markdown table; ``--plot`` writes the PNG of latency and memory
against N (log scales) with the exact line for reference.

Usage::

    python -m bench.million --source $REGIS_BENCH_DATA/tok1m-256 --sizes 10000,100000,300000,1000000 \
        --queries 300 --plot docs/img/cost_growth.png
    python -m bench.million --source ... --sizes 100000 --slice generated   # the generated slice (check)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import (
    DATA_DIR,
    dir_bytes,
    gt_path,
    latency_stats,
    print_machine,
    proc_memory,
    recall_at_k,
    rss_growth,
    timed_searches,
)


def evict(paths: list[Path]) -> None:
    """Drop these files' clean pages from the page cache (``POSIX_FADV_DONTNEED``); nothing else is touched."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def corpus_framings(source: Path) -> int:
    """Framings the corpus's images are scored by apart (``bench.corpus1m``'s ``score_framings``; 1 when absent)."""
    return int(json.loads((source / "info.json").read_text()).get("score_framings", 1))


def corpus_slice(source: Path, n: int, which: str):
    """(db (n, T, D) float16 memory map, queries (Q, m, D) float32, tag) for the first n images of ``source``,
    or of its generated part (``which`` = "generated": rows ``real .. real + n``)."""
    from bench.data import load_corpus

    db, q = load_corpus(source=str(source))
    info = json.loads((source / "info.json").read_text())
    start = info["real"] if which == "generated" else 0
    if start + n > len(db):
        raise SystemExit(f"{source} holds {len(db)} images; {which} slice of {n} does not fit")
    tag = f"{source.name}{'-gen' if which == 'generated' else ''}"
    return db[start : start + n], q, tag


def index_path(tag: str, n: int, spec: str | None, store: str | None, record: str = "bench",
               k_factor: int | None = None) -> Path:
    name = f"{tag}-{n}-{(spec or 'auto').replace(',', '_')}-{store or 'default'}"
    name += f"-kf{k_factor}" if k_factor else ""
    name += "" if record == "bench" else f"-{record}"
    return DATA_DIR / "idx" / name


def exact_single(db: np.ndarray, q: np.ndarray, k: int, chunk: int = 8192, framings: int = 1) -> float:
    """Seconds of one query's exact MaxSim over ``db`` (torch float32 GEMM per chunk, top-k; ``framings`` scored
    apart as ``maxsim_gemm`` does)."""
    import torch

    from regis.scores.maxsim import maxsim_gemm

    t0 = time.perf_counter()
    qt = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32))
    best = []
    for s in range(0, len(db), chunk):
        docs = torch.from_numpy(np.ascontiguousarray(db[s : s + chunk]))
        best.append(maxsim_gemm(qt, docs, framings=framings).float())
    torch.topk(torch.cat(best), k)
    return time.perf_counter() - t0


def sweep(snap, q: np.ndarray, gt: np.ndarray, k: int, spec: str) -> list[dict]:
    """``--sweep "nprobe:depth[:refine[:share[:k_factor]]],..."``: recall@10 and warm one-thread p50 / p99 (ms) of
    the same queries with each search setting (nprobe and depth passed per call; refine and share: a ``Searcher``
    re-scoring max(refine x k, share x candidates) on float16; k_factor: FAISS neighbours re-ranked on the codes
    (``FaissInfo.k_factor``); each default the manifest's); the index's manifest is not changed."""
    from regis.retrieve.searcher import Searcher

    out = []
    for item in spec.split(","):
        nprobe, depth, *rest = item.split(":")
        searcher = Searcher(snap, refine=int(rest[0]) if rest else None,
                            refine_share=float(rest[1]) if len(rest) > 1 else None,
                            k_factor=int(rest[2]) if len(rest) > 2 else None)
        lat, found, cands = timed_searches(searcher, q, k, nprobe=int(nprobe), depth=int(depth))
        st = latency_stats(lat)
        out.append({"nprobe": int(nprobe), "depth": int(depth), "k_factor": searcher.k_factor,
                    "refine": searcher.refine, "refine_share": searcher.refine_share,
                    "recall@10": recall_at_k(found, gt, k),
                    "candidates": float(np.mean(cands)), "p50_ms": st["p50_ms"], "p99_ms": st["p99_ms"]})
        print("sweep:", json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def measure(args) -> dict:
    """The child process: one size, one index (see module docstring, step 3)."""
    import faiss
    import torch

    from regis.indexes.snapshot import IndexSnapshot
    from regis.retrieve.searcher import Searcher

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    db, q, tag = corpus_slice(args.source, args.one, args.slice)
    q = q[: args.queries]
    gt = np.load(args.gt)["ids"][: len(q)]
    base = proc_memory()
    path = Path(args.index)
    t0 = time.perf_counter()
    snap = IndexSnapshot.open(path)
    searcher = Searcher(snap)
    open_s = time.perf_counter() - t0
    after_open = proc_memory()
    m = snap.manifest
    seg_files = [path / "segments" / s.file for s in m.segments]
    k = args.k
    row = {"images": len(db), "tokens": db.shape[1], "query_tokens": q.shape[1], "spec": m.faiss.spec,
           "token_store": m.token_store.spec, "nprobe": m.faiss.nprobe,
           "depth": m.faiss.depth, "k_factor": m.faiss.k_factor, "dim": m.dim, "open_s": open_s,
           "refine": searcher.refine, "refine_share": searcher.refine_share}
    for phase in ("cold", "warm"):
        if phase == "cold":
            evict(seg_files)
        lat, found, cands = timed_searches(searcher, q, k)
        st = latency_stats(lat)
        row[f"p50_ms_{phase}"], row[f"p99_ms_{phase}"] = st["p50_ms"], st["p99_ms"]
        row[f"qps_1thread_{phase}"] = len(q) / sum(lat)
        row["recall@10"] = recall_at_k(found, gt, k)
        row["candidates"] = float(np.mean(cands))
    after_q = proc_memory()
    if args.sweep:
        row["sweep"] = sweep(snap, q, gt, k, args.sweep)
    cores = os.cpu_count() or 1
    searcher_all = Searcher(snap, batch_threads=cores)
    torch.set_num_threads(cores)
    t1 = time.perf_counter()
    bfound = np.full((len(q), k), -1, np.int64)
    for s in range(0, len(q), 100):
        for j, r in enumerate(searcher_all.search_batch(q[s : s + 100], k=k)):
            bfound[s + j, : len(r.ids)] = r.ids
    row["qps_all_cores"] = len(q) / (time.perf_counter() - t1)
    row["recall@10_batched"] = recall_at_k(bfound, gt, k)
    torch.set_num_threads(1)
    framings = m.encoder.score_framings
    ex = [exact_single(db, q[i], k, framings=framings) for i in range(min(args.exact_queries, len(q)))]
    est = latency_stats(ex)
    row["exact_p50_ms"], row["exact_qps_1thread"] = est["p50_ms"], len(ex) / sum(ex)
    row["ratio_exact_over_regis_p50"] = row["exact_p50_ms"] / row["p50_ms_warm"]
    vdir = path / "versions" / snap.name
    faiss_b = (vdir / "tokens.faiss").stat().st_size
    codes_b = (vdir / "codes.npy").stat().st_size if (vdir / "codes.npy").exists() else 0
    n = len(db)
    row.update({
        **rss_growth(base, after_q, n),
        "rss_after_open_bytes_per_image": (after_open["VmRSS"] - base["VmRSS"]) / n,
        "faiss_bytes_per_image": faiss_b / n, "codes_bytes_per_image": codes_b / n,
        "locations_bytes_per_image": (vdir / "locations.npy").stat().st_size / n,
        "disk_bytes_per_image": dir_bytes(path) / n,
    })
    snap.close()
    return row


def parent(args) -> list[dict]:
    """Per size: ground truth, index build (cached), then the child process's measures."""
    from bench.data import build_index, ground_truth

    rows = []
    for n in [int(x) for x in args.sizes.split(",")]:
        db, q, tag = corpus_slice(args.source, n, args.slice)
        q = q[: args.queries]
        t0 = time.perf_counter()
        _, gt_s = ground_truth(db, q, tag, framings=corpus_framings(args.source))
        gt_file = gt_path(tag, len(db), len(q))
        print(f"ground truth {n}: {gt_s:.1f} s for {len(q)} queries (cached: {time.perf_counter() - t0:.1f} s)",
              flush=True)
        path = index_path(tag, n, args.spec, args.token_store, args.encoder_record, args.k_factor)
        built_file = path.with_suffix(".built.json")
        if args.rebuild or not (path / "CURRENT").exists() or not built_file.exists():
            built = build_index(path, db, args.spec, token_store=args.token_store, encoder_record=args.encoder_record,
                                k_factor=args.k_factor)
            built_file.write_text(json.dumps(built))
            print("built:", json.dumps({"index": path.name, **built}), flush=True)
        built = json.loads(built_file.read_text())
        if args.build_only:
            continue
        cmd = [sys.executable, "-m", "bench.million", "--source", str(args.source), "--one", str(n),
               "--slice", args.slice, "--queries", str(args.queries), "--k", str(args.k), "--index", str(path),
               "--gt", str(gt_file), "--exact-queries", str(args.exact_queries),
               *(["--sweep", args.sweep] if args.sweep else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], flush=True)
            raise SystemExit(f"measuring {n} images failed")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row.update({"build_s": built["build_s"], "exact_gt_s": gt_s, "queries": len(q), "slice": args.slice,
                    "corpus": tag, "encoder_record": args.encoder_record})
        rows.append(row)
        print("row:", json.dumps(row), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| images | FAISS spec / token store | recall@10 | candidates | p50 ms 1 thread, cold / warm | p99 ms warm "
           "| QPS 1 thread / all cores | exact MaxSim p50 ms (1 thread) | exact / regis p50 "
           "| RSS B/image (anon + file) | FAISS + codes B/image | disk B/image | build s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['images']:,} | {r['spec']} / {r['token_store']} | {r['recall@10']:.4f} | {r['candidates']:.0f} | "
            f"{r['p50_ms_cold']:.2f} / {r['p50_ms_warm']:.2f} | {r['p99_ms_warm']:.2f} | "
            f"{r['qps_1thread_warm']:.0f} / {r['qps_all_cores']:.0f} | {r['exact_p50_ms']:.0f} | "
            f"{r['ratio_exact_over_regis_p50']:.0f}x | {r['rss_bytes_per_image']:.0f} "
            f"({r['rss_anon_bytes_per_image']:.0f} + {r['rss_file_bytes_per_image']:.0f}) | "
            f"{r['faiss_bytes_per_image'] + r['codes_bytes_per_image']:.0f} | {r['disk_bytes_per_image']:.0f} | "
            f"{r['build_s']:.0f} |")
    return "\n".join(out)


def plot(rows: list[dict], path: Path, compare: list[dict] | None = None, label: str | None = None,
         compare_label: str | None = None) -> None:
    """Latency and resident memory against images, log-log, with exact MaxSim's latency for reference.

    A size measured in several runs (``--rows`` of several files, or ``--sizes 10000,100000,10000,100000``) is
    drawn as one dot per run and lines through the per-size medians. ``compare`` rows (``--compare``: another
    spec on the same sizes, e.g. the previous default) are drawn as crosses labelled with their FAISS spec; with a
    ``compare_label`` (``--compare-label``: another layout over the same sizes, e.g. two framings against one) as
    a line of crosses, its p50, exact p50 and RSS, under that name. ``label`` names the main rows' layout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["images"] for r in rows})
    runs = {m: [r for r in rows if r["images"] == m] for m in sizes}
    rows = [{**runs[m][0], **{key: float(np.median([r[key] for r in runs[m]]))  # a size measured twice: medians
                              for key, v in runs[m][0].items() if isinstance(v, float)}} for m in sizes]
    n = sizes
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 5))
    tag = f", {label}" if label else ""
    a.loglog(n, [r["p50_ms_warm"] for r in rows], "o-", label=f"regis p50 (1 thread){tag}")
    a.loglog(n, [r["p99_ms_warm"] for r in rows], "s--", label=f"regis p99 (1 thread){tag}")
    a.loglog(n, [r["exact_p50_ms"] for r in rows], "^-", color="grey", label=f"exact MaxSim p50 (torch, 1 thread){tag}")
    if any(len(v) > 1 for v in runs.values()):  # every run as a dot, the lines through the medians
        for key, colour in (("p50_ms_warm", "C0"), ("exact_p50_ms", "grey")):
            a.scatter([m for m in sizes for _ in runs[m]], [r[key] for m in sizes for r in runs[m]], s=10,
                      color=colour, alpha=0.5)
    other = sorted(compare or [], key=lambda r: r["images"])
    if compare_label and other:
        cn = [r["images"] for r in other]
        a.loglog(cn, [r["p50_ms_warm"] for r in other], "x-", color="C3", label=f"regis p50, {compare_label}")
        a.loglog(cn, [r["exact_p50_ms"] for r in other], "x:", color="grey", label=f"exact MaxSim p50, {compare_label}")
    for r in other if not compare_label else []:
        a.scatter([r["images"]], [r["p50_ms_warm"]], marker="x", s=40, color="C3",
                  label=f"p50, {r['spec']} (previous default)")
    a.axhline(30, color="red", lw=0.8, ls=":", label="target p50 at 1M: 30 ms")
    a.set_xlabel("images")
    a.set_ylabel("ms per query (no encoding)")
    a.set_title("Search latency")
    a.legend(fontsize=7, loc="upper left")
    a.grid(True, which="both", alpha=0.3)
    b.loglog(n, [r["rss_bytes_per_image"] * r["images"] / 2**20 for r in rows], "o-",
             label=f"regis RSS growth (with the float16 pages read){tag}")
    if compare_label and other:
        b.loglog([r["images"] for r in other], [r["rss_bytes_per_image"] * r["images"] / 2**20 for r in other], "x-",
                 color="C3", label=f"regis RSS growth, {compare_label}")
    b.loglog(n, [r["rss_anon_bytes_per_image"] * r["images"] / 2**20 for r in rows], "s--",
             label="... of it anonymous (FAISS index, arrays, Python)")
    b.loglog(n, [(r["faiss_bytes_per_image"] + r["codes_bytes_per_image"] + r["locations_bytes_per_image"])
                 * r["images"] / 2**20 for r in rows], "d-", label="index data held in RAM (FAISS + SQ4 codes)")
    b.loglog(n, [r["images"] * r["dim"] * 2 * r.get("tokens", 10) / 2**20 for r in rows], "^-", color="grey",
             label="float16 tokens (what exact scoring reads)")
    b.loglog(n, [r["images"] * 4096 / 2**20 for r in rows], color="red", lw=0.8, ls=":", label="4 KB per image")
    b.set_xlabel("images")
    b.set_ylabel("MiB")
    b.set_title("Memory")
    b.legend(fontsize=7, loc="upper left")
    b.grid(True, which="both", alpha=0.3)
    tokens = f"{rows[0].get('tokens', 10)} per image" + (f"; {compare_label}: {other[0].get('tokens', 10)}"
                                                       if compare_label and other else "")
    fig.suptitle(f"regis on {rows[0]['dim']}-d tokens, {tokens}, k = 10 (python -m bench.million)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=Path, default=None, help="a bench.corpus1m folder")
    p.add_argument("--sizes", default="10000,100000,300000,1000000")
    p.add_argument("--slice", choices=["first", "generated"], default="first",
                   help="first: the first N images (real ones first); generated: N generated images only")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--exact-queries", type=int, default=5, help="single queries timed with exact MaxSim")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--spec", default=None, help="FAISS spec (default: regis's choice)")
    p.add_argument("--token-store", default=None, help="token store (default: regis's choice)")
    p.add_argument("--k-factor", type=int, default=None,
                   help="FaissInfo.k_factor recorded in the index (default: regis's choice)")
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--encoder-record", choices=["bench", "servable"], default="bench",
                   help="the manifest's encoder: bench (search only) or servable (efficientnet-lite0-regis, "
                        "center-crop: regis serve opens the index; bench.data.bench_encoder)")
    p.add_argument("--build-only", action="store_true",
                   help="ground truth and index builds only (so a timed run under a lock measures, not builds)")
    p.add_argument("--sweep", default=None,
                   help='also "nprobe:depth[:refine[:share]],..." on the warm index: recall@10, p50, p99 of each')
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--rows", default=None, help="comma list of --json files: print and plot their rows only")
    p.add_argument("--compare", default=None,
                   help="with --rows: comma list of --json files drawn as crosses (e.g. the previous default)")
    p.add_argument("--label", default=None, help="with --plot: the layout of the --rows rows, in the legend")
    p.add_argument("--compare-label", default=None,
                   help="with --compare: its rows are another layout over the sizes, drawn as lines under this name")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--index", default=None, help=argparse.SUPPRESS)
    p.add_argument("--gt", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args)))
        return
    if args.rows:  # table and plot of rows saved by earlier runs (--json), in size order
        rows = sorted((r for f in args.rows.split(",") for r in json.loads(Path(f).read_text())),
                      key=lambda r: r["images"])
        compare = [r for f in args.compare.split(",") for r in json.loads(Path(f).read_text())] if args.compare else []
        print(table(rows + compare))
        if args.plot:
            plot(rows, args.plot, compare, args.label, args.compare_label)
        return
    print_machine({"bench": "million", "source": str(args.source), "sizes": args.sizes, "slice": args.slice,
                   "encoder_record": args.encoder_record})
    rows = parent(args)
    if args.build_only:
        return
    print(table(rows))
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
