"""FAISS token-index specs for wide tokens (EfficientNet-Lite0's 1280-d): recall@10 of the exact MaxSim ranking,
candidates, search CPU per query and FAISS bytes per image, on the raw real-token corpus.

The candidate probe of a 1280-d ``IVF,SQ8`` index scans 1,280 bytes per token vector and is the larger part of a
served query's search (BENCHMARKS.md section 6). This compares specs on the same gallery and queries:

- gallery: the first ``--n-db`` database rows of ``bench.corpus``'s raw 1280-d tokens (Fashion-MNIST through
  Lite0, 10 tokens per image);
- queries: the corpus's held-out Fashion-MNIST queries (10 tokens each), and the bench's 16 photo queries
  encoded by today's default encoder (``encode_query``: 15 tokens each, what the service searches with);
- per spec: ``bench.data.build_index`` (the real ``IndexWriter``), then ``Searcher.search_batch`` in batches of 4
  with 1 FAISS and 1 torch thread (the batched server's search thread), timed in CPU seconds.

Usage::

    python -m bench.corpus --n-db 20000 --n-queries 500 --db-rows 10000     # once
    python -m bench.faiss_specs --n-db 10000 --specs "IVF1024,SQ8;IVF1024,PQ640x4fs" --depths 64,128
    python -m bench.shared --n 20000 --dim 1280 --queries 500 --out $REGIS_BENCH_DATA/shared20k-1280
    python -m bench.faiss_specs --gallery shared:$REGIS_BENCH_DATA/shared20k-1280 --n-db 20000 \
        --specs "IVF2048,SQ8;IVF2048,PQ640x4fs" --depths 64,128      # many images share each token (issue 15)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import CORPUS_DIR, DATA_DIR, print_machine, recall_at_k


def corpus(n_db: int, n_queries: int, root: Path = CORPUS_DIR) -> tuple[np.ndarray, np.ndarray]:
    """(n_db, 10, 1280) float16 gallery rows and (n_queries, 10, 1280) float32 corpus queries (raw tokens) of a
    ``bench.corpus`` folder."""
    info = json.loads((root / "info.json").read_text())
    raw = np.memmap(root / "raw1280.f16", dtype=np.float16, mode="r",
                    shape=(info["rows"], info["tokens_per_image"], info["dim"]))
    if info["db"] < n_db:
        raise SystemExit(f"the corpus at {root} has {info['db']} database rows, fewer than --n-db {n_db}")
    q0 = info["query_start"]
    return np.asarray(raw[:n_db]), np.asarray(raw[q0 : q0 + n_queries], dtype=np.float32)


def photo_queries() -> np.ndarray:
    """(16, 15, 1280) float32: the bench's photo queries as today's default encoder encodes a query."""
    import torch

    from bench.indexing import JPEG_DIR, make_photos
    from regis.images.decode import decode_image
    from regis.models.encoder import build_encoder
    from regis.models.transforms import eval_transform

    torch.set_num_threads(1)
    make_photos(64)
    encoder = build_encoder("efficientnet-lite0").eval()
    transform = eval_transform(encoder.config)
    files = sorted((JPEG_DIR / "photos").glob("*.jpg"))[:16]
    pixels = torch.stack([transform(decode_image(f.read_bytes()).image) for f in files])
    with torch.inference_mode():
        return encoder.encode_query(pixels).float().numpy()


def measure(searcher, queries: np.ndarray, gt: np.ndarray, nprobe: int | None = None, depth: int | None = None,
            batch: int = 4, repeats: int = 3) -> dict:
    """recall@10 against ``gt``, mean candidates, and search CPU ms per query (batches of ``batch``, 1 thread)."""
    found = np.full((len(queries), 10), -1, dtype=np.int64)
    results = []
    for b in range(0, len(queries), batch):
        results += searcher.search_batch(queries[b : b + batch], k=10, depth=depth, nprobe=nprobe, threads=1)
    for i, r in enumerate(results):
        found[i, : len(r.ids)] = r.ids
    t0 = time.process_time()
    for _ in range(repeats):
        for b in range(0, len(queries), batch):
            searcher.search_batch(queries[b : b + batch], k=10, depth=depth, nprobe=nprobe, threads=1)
    cpu_ms = (time.process_time() - t0) / (repeats * len(queries)) * 1e3
    return {"recall@10": round(recall_at_k(found, gt, 10), 4),
            "candidates": round(float(np.mean([r.num_candidates for r in results])), 1),
            "search_cpu_ms": round(cpu_ms, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-db", type=int, default=10_000)
    p.add_argument("--n-queries", type=int, default=500)
    p.add_argument("--specs", default="IVF1024,SQ8;IVF1024,PQ640x4fs")
    p.add_argument("--nprobes", default="", help="comma list of IVF probes per query token (default: the manifest's)")
    p.add_argument("--depths", default="", help="comma list of candidate depths (default: the manifest's)")
    p.add_argument("--gallery", default="fmnist",
                   help="fmnist (bench.corpus in $REGIS_BENCH_DATA/corpus), corpus:DIR (another bench.corpus folder) "
                        "or shared:DIR (a bench.shared folder: no photo queries)")
    p.add_argument("--rebuild", action="store_true")
    args = p.parse_args()
    import faiss
    import torch

    from bench.data import build_index, exact_topk, load_corpus
    from regis.indexes.snapshot import IndexSnapshot
    from regis.retrieve.searcher import Searcher

    torch.set_num_threads(1)
    print_machine({"bench": "faiss_specs", "n_db": args.n_db, "gallery": args.gallery})
    kind, _, folder = args.gallery.partition(":")
    if kind == "shared":  # the bench.synth layout that bench.data reads
        db, sq = load_corpus(n_db=args.n_db, n_queries=args.n_queries, source=folder)
        sets = {"shared-10tok": np.asarray(sq, dtype=np.float32)}
    else:
        db, fq = corpus(args.n_db, args.n_queries, Path(folder) if folder else CORPUS_DIR)
        sets = {"fmnist-10tok": fq, "photos-15tok": photo_queries()}
    gts = {name: exact_topk(db, q, k=10)[0] for name, q in sets.items()}
    for spec in args.specs.split(";"):
        tag = "" if args.gallery == "fmnist" else "-" + args.gallery.replace(":", "-").replace("/", "_")
        path = DATA_DIR / "idx-specs" / f"{spec.replace(',', '_')}-{args.n_db}{tag}"
        built = None
        if args.rebuild or not (path / "CURRENT").exists():
            built = build_index(path, db, faiss_spec=spec)
        snapshot = IndexSnapshot.open(path)
        faiss_bytes = faiss.serialize_index(snapshot.faiss).nbytes
        nprobes = [int(x) for x in args.nprobes.split(",") if x] or [snapshot.manifest.faiss.nprobe]
        depths = [int(x) for x in args.depths.split(",") if x] or [snapshot.manifest.faiss.depth]
        for nprobe, depth in ((n, d) for n in nprobes for d in depths):
            row = {"spec": spec, "nprobe": nprobe, "depth": depth,
                   "faiss_bytes_per_image": round(faiss_bytes / args.n_db),
                   "build_s": built and round(built["build_s"])}
            for name, q in sets.items():
                row[name] = measure(Searcher(snapshot), q, gts[name], nprobe, depth)
            print("row:", json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
