"""The peers on the same token vectors, same queries, same recall metric and k as ``bench.search``.

Engines (``--engine``):

- ``torch``: brute-force exact MaxSim in plain torch on the CPU (database held in RAM as float32 or bfloat16,
  one GEMM per chunk), single query and batches of ``--batch``.
- ``fast-plaid``: ``fast_plaid.search.FastPlaid`` (PyPI ``fast-plaid``), device "cpu": ``create`` (nbits 4,
  its defaults) then ``search`` over a sweep of ``n_ivf_probe`` (``n_full_scores`` 4096, its default).
- ``pylate-voyager`` / ``pylate-plaid``: PyLate's ``indexes.Voyager`` (per-token HNSW, union of the hits,
  exact MaxSim rerank by ``retrieve.ColBERT``) and ``indexes.PLAID`` (PyLate 1.6 wraps fast-plaid 1.4.6).

Each engine runs in the Python environment that has it (fast-plaid and PyLate pin torch 2.11, which clashes
with regis's torch): ``--all`` runs every engine in a subprocess with the interpreter given by
``--python-torch``, ``--python-fast-plaid``, ``--python-pylate``, after regis's own default row
(``bench.search`` with regis's defaults), so that one command prints every row of the comparison.

Each peer runs in two processes (``--phase build``, then ``--phase search``), as a user would run it: the
search process opens the index from disk and its resident memory is measured there (``rss_bytes_per_image``:
VmRSS after the queries minus VmRSS before the index was opened, over the images; ``rss_total_mib``: the whole
process), not inflated by the float32 copy of the database that the build needs. Voyager is built in chunks of
``--add-chunk`` images (one HNSW, added to); fast-plaid and PyLate's PLAID in one call (their k-means sees all).

The database images, queries and exact ground truth are read from ``$REGIS_BENCH_DATA`` (``bench.corpus``,
``bench.project``, then ``bench.search`` writes ``gt-*.npz``); this file imports nothing from regis.

Usage::

    python -m bench.peers --all
    python -m bench.peers --engine fast-plaid --probes 8,32
"""

from __future__ import annotations

import argparse
import json
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
)

PEER_DIR = DATA_DIR / "peers"
DEFAULT_PYTHONS = {
    "torch": sys.executable,
    "fast-plaid": str(DATA_DIR / "peers-venv/bin/python"),
    "pylate": str(DATA_DIR / "pylate-venv/bin/python"),
}


def _gt(n_db: int, n_q: int, tag: str) -> np.ndarray:
    path = gt_path(tag, n_db, n_q)
    if not path.exists():
        raise SystemExit(f"{path} is missing: run `python -m bench.search` first (it writes the ground truth)")
    return np.load(path)["ids"]


def _load(args):
    """(db (N, T, D) float16 memory map, queries (Q, T, D) float32, ground truth (Q, 100) int64, tag)."""
    from bench.data import load_corpus

    db, q = load_corpus(args.dim, args.n_db, args.n_queries, args.source)
    tag = "fmnist" if args.source == "fmnist" else Path(args.source).name
    return db, q, _gt(len(db), len(q), tag), tag


def _as_float32(db: np.ndarray, start: int = 0, stop: int | None = None):
    """Images ``start:stop`` of the memory-mapped float16 database as a list of (T, D) float32 torch tensors."""
    import torch

    return list(torch.from_numpy(np.asarray(db[start:stop], dtype=np.float32)).unbind(0))


def _measure(search_one, search_many, q, gt, k, batch, n_single) -> dict:
    """single-query latencies over the first ``n_single`` queries, batched QPS and recall over all."""
    search_one(q[0])
    lat, found1 = [], []
    for i in range(n_single):
        t0 = time.perf_counter()
        found1.append(search_one(q[i]))
        lat.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    found = []
    for start in range(0, len(q), batch):
        found += search_many(q[start : start + batch])
    secs = time.perf_counter() - t0
    pad = lambda rows: np.array([list(r[:k]) + [-1] * (k - len(r[:k])) for r in rows], dtype=np.int64)  # noqa: E731
    return {"recall@10": recall_at_k(pad(found), gt, k), "recall@10_single": recall_at_k(pad(found1), gt[:n_single], k),
            **latency_stats(lat), "single_qps": n_single / sum(lat), "batched_qps": len(q) / secs}


def run_torch(args) -> list[dict]:
    import torch

    db, q, gt, _ = _load(args)
    n, t, d = db.shape
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        t0 = time.perf_counter()
        flat = torch.from_numpy(np.ascontiguousarray(db)).reshape(n * t, d).to(dtype)
        load_s = time.perf_counter() - t0

        def scores(qs: np.ndarray, flat=flat, dtype=dtype) -> torch.Tensor:
            qq = torch.from_numpy(qs.reshape(-1, d)).to(dtype).T.contiguous()
            out = []
            for start in range(0, n * t, 200_000):
                part = flat[start : start + 200_000]
                out.append((part @ qq).float().view(part.shape[0] // t, t, len(qs), -1).amax(1).sum(-1))
            return torch.cat(out).T  # (Q, N)

        def one(qi):
            return torch.topk(scores(qi[None])[0], args.k).indices.tolist()

        def many(qs):
            return torch.topk(scores(qs), args.k, dim=1).indices.tolist()

        res = _measure(one, many, q, gt, args.k, args.batch, min(args.n_single, len(q)))
        rows.append({"system": f"torch brute force ({str(dtype).replace('torch.', '')})", "params": "exact",
                     "build_s": load_s, "bytes_per_image_ram": t * d * flat.element_size(), **res})
        del flat
    return rows


def run_fast_plaid(args) -> list[dict]:
    import torch
    from fast_plaid import search as fp_search

    db, q, gt, tag = _load(args)
    path = PEER_DIR / f"fast-plaid-{tag}-{len(db)}"
    marker = PEER_DIR / f"fast-plaid-{tag}-{len(db)}.built.json"
    if args.phase != "search" and (args.rebuild or not marker.exists()):
        fp = fp_search.FastPlaid(index=str(path), device="cpu")
        t0 = time.perf_counter()
        fp.create(documents_embeddings=_as_float32(db), nbits=args.nbits)
        marker.write_text(json.dumps({"build_s": time.perf_counter() - t0, "threads": torch.get_num_threads()}))
        print("built:", marker.read_text(), flush=True)
        del fp
    if args.phase == "build":
        return []
    built = json.loads(marker.read_text())["build_s"]
    size = dir_bytes(path)
    base = proc_memory()
    fp = fp_search.FastPlaid(index=str(path), device="cpu")
    rows = []
    for probe in [int(x) for x in args.probes.split(",")]:
        kw = dict(top_k=args.k, n_ivf_probe=probe, n_full_scores=args.full_scores, show_progress=False)

        def one(qi, kw=kw):
            return [i for i, _ in fp.search(torch.from_numpy(qi[None]), **kw)[0]]

        def many(qs, kw=kw):
            return [[i for i, _ in r] for r in fp.search(torch.from_numpy(qs), **kw)]

        res = _measure(one, many, q, gt, args.k, args.batch, min(args.n_single, len(q)))
        rows.append({"system": "fast-plaid", "params": f"nbits {args.nbits}, n_ivf_probe {probe}, "
                     f"n_full_scores {args.full_scores}", "build_s": built, "bytes_per_image_disk": size / len(db),
                     **res, **rss_growth(base, proc_memory(), len(db))})
        print("row:", json.dumps(rows[-1]), flush=True)
    return rows


def run_pylate(args, kind: str) -> list[dict]:
    import torch
    from pylate import indexes, retrieve

    db, q, gt, tag = _load(args)
    folder = PEER_DIR / f"pylate-{kind}-{tag}-{len(db)}"
    ids = [str(i) for i in range(len(db))]
    rows = []
    base = proc_memory()
    override = args.phase != "search" and (args.rebuild or not folder.exists())
    if kind == "voyager":
        index = indexes.Voyager(index_folder=str(folder), index_name="idx", override=override,
                                embedding_size=db.shape[2], M=args.voyager_m, ef_construction=args.voyager_efc)
    else:
        index = indexes.PLAID(index_folder=str(folder), index_name="idx", override=override, nbits=args.nbits,
                              device="cpu", n_full_scores=args.full_scores, show_progress=False)
    if args.phase != "search" and (args.rebuild or not (folder / "built.json").exists()):
        t0 = time.perf_counter()
        # PLAID: one call (PyLate's PLAID trains its centroids on the first call only; later calls are updates)
        step = args.add_chunk if kind == "voyager" else len(db)
        for start in range(0, len(db), step):
            index.add_documents(documents_ids=ids[start : start + step],
                                documents_embeddings=_as_float32(db, start, start + step))
            print(f"added: {min(start + step, len(db))} images, {time.perf_counter() - t0:.0f} s", flush=True)
        (folder / "built.json").write_text(json.dumps({"build_s": time.perf_counter() - t0,
                                                       "threads": torch.get_num_threads()}))
        print("built:", (folder / "built.json").read_text(), flush=True)
    if args.phase == "build":
        return []
    built = json.loads((folder / "built.json").read_text())["build_s"]
    retriever = retrieve.ColBERT(index=index)
    params = [int(x) for x in (args.ef_search if kind == "voyager" else args.probes).split(",")]
    for p in params:
        kw = {"k": args.k}
        if kind == "voyager":
            index.ef_search = p  # read by Voyager.__call__ (PyLate 1.6)
            kw["k_token"] = args.k_token
        else:
            index._index.n_ivf_probe = p  # PyLate 1.6: the FastPlaid backend reads these per call
            index._index.n_full_scores = args.full_scores

        def one(qi, kw=kw):
            return [int(r["id"]) for r in retriever.retrieve(queries_embeddings=[torch.from_numpy(qi)], **kw)[0]]

        def many(qs, kw=kw):
            res = retriever.retrieve(queries_embeddings=[torch.from_numpy(x) for x in qs], **kw)
            return [[int(r["id"]) for r in rr] for rr in res]

        res = _measure(one, many, q, gt, args.k, args.batch, min(args.n_single, len(q)))
        label = f"M {args.voyager_m}, ef_c {args.voyager_efc}, ef_search {p}, k_token {args.k_token}" \
            if kind == "voyager" else f"nbits {args.nbits}, n_ivf_probe {p}, n_full_scores {args.full_scores}"
        rows.append({"system": f"PyLate {'Voyager' if kind == 'voyager' else 'PLAID'}", "params": label,
                     "build_s": built, "bytes_per_image_disk": dir_bytes(folder) / len(db), **res,
                     **rss_growth(base, proc_memory(), len(db))})
        print("row:", json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table of peer rows."""
    out = ["| system | parameters | recall@10 | p50 ms | p99 ms | QPS 1-query | QPS batched | build s | bytes/image "
           "(disk or RAM) | RSS bytes/image |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(key, fmt, r=r):
            return format(r[key], fmt) if isinstance(r.get(key), (int, float)) else "-"
        size = r.get("bytes_per_image_disk", r.get("bytes_per_image_ram"))
        out.append(f"| {r['system']} | {r['params']} | {f('recall@10', '.4f')} | {f('p50_ms', '.2f')} | "
                   f"{f('p99_ms', '.2f')} | {f('single_qps', '.1f')} | {f('batched_qps', '.1f')} | "
                   f"{f('build_s', '.1f')} | {format(size, '.0f') if size else '-'} | "
                   f"{f('rss_bytes_per_image', '.0f')} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=["torch", "fast-plaid", "pylate-voyager", "pylate-plaid"])
    p.add_argument("--all", action="store_true", help="regis default + every engine, each in its environment")
    p.add_argument("--source", default="fmnist")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--n-db", type=int, default=None)
    p.add_argument("--n-queries", type=int, default=1000)
    p.add_argument("--n-single", type=int, default=200, help="queries timed one at a time")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--probes", default="8,32", help="fast-plaid / PLAID n_ivf_probe sweep")
    p.add_argument("--full-scores", type=int, default=4096)
    p.add_argument("--nbits", type=int, default=4)
    p.add_argument("--ef-search", default="128,512", help="Voyager ef_search sweep (>= --k-token)")
    p.add_argument("--k-token", type=int, default=100, help="Voyager neighbours per query token")
    p.add_argument("--voyager-m", type=int, default=16)
    p.add_argument("--voyager-efc", type=int, default=100)
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--phase", choices=["both", "build", "search"], default="both",
                   help="build the index only, search a built one only (its memory measured), or both")
    p.add_argument("--add-chunk", type=int, default=50_000, help="images per Voyager add_documents call")
    p.add_argument("--build-threads", type=int, default=None, help="torch threads of the build phase (--all)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--python-torch", default=DEFAULT_PYTHONS["torch"])
    p.add_argument("--python-fast-plaid", default=DEFAULT_PYTHONS["fast-plaid"])
    p.add_argument("--python-pylate", default=DEFAULT_PYTHONS["pylate"])
    p.add_argument("--skip", default="", help="engines to leave out of --all, comma list")
    p.add_argument("--threads", type=int, default=None, help="torch threads of every engine (and regis's)")
    args = p.parse_args()
    PEER_DIR.mkdir(parents=True, exist_ok=True)
    if args.all:
        run_all(args)
        return
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    print_machine({"bench": "peers", "engine": args.engine})
    fn = {"torch": run_torch, "fast-plaid": run_fast_plaid,
          "pylate-voyager": lambda a: run_pylate(a, "voyager"), "pylate-plaid": lambda a: run_pylate(a, "plaid")}
    rows = fn[args.engine](args)
    for r in rows:
        print("result:", json.dumps(r), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def run_all(args) -> None:
    """Every engine in a subprocess (its own environment), then one table with regis's default row on top."""
    print_machine({"bench": "peers --all"})
    rows = []
    common = ["--source", args.source, "--dim", str(args.dim), "--n-queries", str(args.n_queries),
              "--n-single", str(args.n_single), "--k", str(args.k), "--batch", str(args.batch)]
    if args.n_db:
        common += ["--n-db", str(args.n_db)]
    if args.threads:
        common += ["--threads", str(args.threads)]
    regis_cmd = [args.python_torch, "-m", "bench.search", "--source", args.source, "--dim", str(args.dim),
                 "--n-queries", str(args.n_queries), "--json", str(PEER_DIR / "regis-default.json")]
    if args.n_db:
        regis_cmd += ["--n-db", str(args.n_db)]
    if args.threads:
        regis_cmd += ["--threads", str(args.threads)]
    plan = [("regis", regis_cmd)]
    skip = set(args.skip.split(","))
    engines = [("torch", args.python_torch, []),
               ("fast-plaid", args.python_fast_plaid, ["--probes", args.probes]),
               ("pylate-voyager", args.python_pylate, ["--ef-search", args.ef_search]),
               ("pylate-plaid", args.python_pylate, ["--probes", args.probes])]
    build_common = [x for x in common if x not in ("--threads", str(args.threads))] if args.threads else common
    if args.build_threads:
        build_common += ["--threads", str(args.build_threads)]
    for name, python, extra in engines:
        if name in skip:
            continue
        if name != "torch":  # the build in its own process, so that the search process's memory is the index's
            plan.append((f"{name} build", [python, "-m", "bench.peers", "--engine", name, *build_common, *extra,
                                           "--phase", "build", "--add-chunk", str(args.add_chunk)]
                         + (["--rebuild"] if args.rebuild else [])))
        plan.append((name, [python, "-m", "bench.peers", "--engine", name, *common, *extra,
                            "--phase", "search" if name != "torch" else "both",
                            "--json", str(PEER_DIR / f"{name}.json")]))
    for name, cmd in plan:
        print(f"$ {' '.join(cmd)}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            if line.startswith(("machine:", "row:", "built:", "result:", "added:")):
                print(f"  [{name}] {line}", flush=True)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
            print(f"  [{name}] FAILED (exit {proc.returncode}):\n{tail}", flush=True)
            rows.append({"system": name, "params": f"failed: {tail.splitlines()[-1] if tail else proc.returncode}"})
            continue
        if name.endswith(" build"):
            continue
        out = json.loads((PEER_DIR / ("regis-default.json" if name == "regis" else f"{name}.json")).read_text())
        if name == "regis":
            out = [{"system": "regis (defaults)", "params": f"{r['spec']}, nprobe {r['nprobe']}, depth {r['depth']}, "
                    f"store {r['token_store']}", **r} for r in out]
        rows += out
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
