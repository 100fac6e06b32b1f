"""Index benchmark: build time, bytes per image on disk and in RAM, float16 vs compressed token stores, and the
recall@10 each costs.

1. Builds (or reuses, from ``bench.search``'s cache) the regis index of the corpus with the default FAISS
   spec and a float16 token store, timing the build (``IndexWriter``: put + commit = IVF training + adds).
2. For each compressed store spec (``--stores``): copies the version (hard links for the big files), trains
   the codec on the same sample the writer uses (``regis.indexes.codes.TRAIN_IMAGES`` images), encodes every
   token, writes ``codec.faiss`` + ``codes.npy`` and the manifest's ``token_store`` exactly as
   ``IndexWriter._write_codes`` does, timing train and encode.
3. Searches every variant with the default depth/nprobe and reports recall@10 against the exact ranking:
   with the default exact re-scoring of ``refine x k`` candidates on float16 (``Searcher`` default), and
   codes alone (``refine 0``: the float16 segments are never read).

Bytes per image: disk = every file of the index / images (segments + FAISS + codes + table + locations);
RAM = what a search keeps resident: the FAISS index (read into memory) + the store the rerank reads
(codes, or the float16 segments) + locations.

Usage::

    python -m bench.index_size --stores "SQ8;SQ4;PQ96;OPQ96,PQ96;PQ48"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from bench.common import DATA_DIR, dir_bytes, print_machine, recall_at_k


def add_token_store(src: Path, dst: Path, spec: str) -> dict:
    """Copy index ``src`` to ``dst`` (hard links) and give its live version a compressed token store ``spec``."""
    from regis.indexes import codes as token_codes
    from regis.indexes.layout import MANIFEST_FILE, SEGMENTS_DIR, VERSIONS_DIR, read_current
    from regis.indexes.manifest import TokenStoreInfo, read_manifest
    from regis.indexes.snapshot import IndexSnapshot

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, copy_function=os.link)
    vdir = dst / VERSIONS_DIR / read_current(dst)
    snap = IndexSnapshot.open(dst)
    store = snap.store
    live = store.live_ids
    rng = np.random.default_rng(0)
    n_train = min(len(live), token_codes.TRAIN_IMAGES)
    sample = np.sort(rng.choice(live, size=n_train, replace=False)) if n_train < len(live) else live
    t0 = time.perf_counter()
    codec = token_codes.train_codec(spec, store.get(sample).reshape(-1, store.dim).astype(np.float32))
    t1 = time.perf_counter()
    cs = token_codes.code_size(codec)
    codes = np.zeros((len(store.locations), store.tokens_per_image, cs), np.uint8)
    for start in range(0, len(live), 16384):
        part = live[start : start + 16384]
        codes[part] = token_codes.encode(codec, store.get(part))
    t2 = time.perf_counter()
    token_codes.write_codec(codec, vdir / token_codes.CODEC_FILE)
    np.save(vdir / token_codes.CODES_FILE, codes)
    manifest = read_manifest(vdir).model_copy(update={"token_store": TokenStoreInfo(spec=spec, code_size=cs)})
    (vdir / MANIFEST_FILE).unlink()  # a hard link to the source's manifest: replace, do not write through
    (vdir / MANIFEST_FILE).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    snap.close()
    assert (dst / SEGMENTS_DIR).is_dir()
    return {"train_s": t1 - t0, "encode_s": t2 - t1, "code_size": cs}


def sizes(index: Path) -> dict:
    """Bytes of each part of an index's live version."""
    from regis.indexes import codes as token_codes
    from regis.indexes.layout import FAISS_FILE, LOCATIONS_FILE, SEGMENTS_DIR, TABLE_FILE, VERSIONS_DIR, read_current

    vdir = index / VERSIONS_DIR / read_current(index)
    part = {"faiss": FAISS_FILE, "codes": token_codes.CODES_FILE, "codec": token_codes.CODEC_FILE,
            "table": TABLE_FILE, "locations": LOCATIONS_FILE}
    out = {k: (vdir / f).stat().st_size if (vdir / f).exists() else 0 for k, f in part.items()}
    out["segments"] = dir_bytes(index / SEGMENTS_DIR)
    return out


def search_recall(index: Path, q: np.ndarray, gt: np.ndarray, refine: int, k: int = 10) -> tuple[float, float]:
    """(recall@k, mean single-query ms) of the default ANN search of ``index`` re-scoring exactly ``refine x k``
    candidates on float16 (``refine_share`` 0: the table's rows compare stores at a fixed number of re-scored rows)."""
    from regis.indexes.snapshot import IndexSnapshot
    from regis.retrieve.searcher import Searcher

    snap = IndexSnapshot.open(index)
    searcher = Searcher(snap, refine=refine, refine_share=0.0)
    found = np.full((len(q), k), -1, np.int64)
    t0 = time.perf_counter()
    for i in range(len(q)):
        r = searcher.search(q[i], k=k)
        found[i, : len(r.ids)] = r.ids
    ms = (time.perf_counter() - t0) * 1e3 / len(q)
    snap.close()
    return recall_at_k(found, gt, k), ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default="fmnist")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--n-db", type=int, default=None)
    p.add_argument("--n-queries", type=int, default=1000)
    p.add_argument("--stores", default="SQ8;SQ4;PQ96;OPQ96,PQ96;PQ48;PQ64")
    p.add_argument("--rebuild", action="store_true")
    args = p.parse_args()

    from bench.data import build_index, ground_truth, load_corpus

    db, q = load_corpus(args.dim, args.n_db, args.n_queries, args.source)
    tag = "fmnist" if args.source == "fmnist" else Path(args.source).name
    print_machine({"bench": "index_size", "source": tag, "db_images": len(db), "queries": len(q)})
    gt, _ = ground_truth(db, q, tag)
    n = len(db)
    base = DATA_DIR / "idx" / f"{tag}-{n}-auto-float16"
    built = None
    if args.rebuild or not (base / "CURRENT").exists():
        built = build_index(base, db)
        print("built:", json.dumps(built), flush=True)
    rows = []
    sz = sizes(base)
    rec, ms = search_recall(base, q, gt, refine=1)
    rows.append({"store": "float16", "code_bytes_per_token": 2 * db.shape[2], "build_s": built and built["build_s"],
                 "recall@10": rec, "recall@10_codes_only": rec, "ms_per_query": ms, **sz})
    print("row:", json.dumps(rows[-1]), flush=True)
    for spec in args.stores.split(";"):
        dst = DATA_DIR / "idx" / f"{tag}-{n}-auto-{spec.replace(',', '_')}"
        info = add_token_store(base, dst, spec)
        rec, ms = search_recall(dst, q, gt, refine=4)
        rec0, ms0 = search_recall(dst, q, gt, refine=0)
        rows.append({"store": spec, "code_bytes_per_token": info["code_size"], "build_s": info["train_s"] + info[
            "encode_s"], "train_s": info["train_s"], "encode_s": info["encode_s"], "recall@10": rec,
            "recall@10_codes_only": rec0, "ms_per_query": ms, "ms_per_query_codes_only": ms0, **sizes(dst)})
        print("row:", json.dumps(rows[-1]), flush=True)
    print("\n| token store | bytes/token | store bytes/image | FAISS bytes/image | disk bytes/image | RAM bytes/image "
          "| store build s | recall@10 (codes + float16 re-score of 4k) | recall@10 (codes only) | ms/query |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        store_b = r["codes"] / n if r["store"] != "float16" else r["segments"] / n
        disk = sum(r[k] for k in ("faiss", "codes", "codec", "table", "locations", "segments")) / n
        store_bytes = r["codes"] if r["store"] != "float16" else r["segments"]
        ram = (r["faiss"] + r["locations"] + r["codec"] + store_bytes) / n
        build = f"{r['build_s']:.1f}" if r.get("build_s") else "(cached)"
        print(f"| {r['store']} | {r['code_bytes_per_token']} | {store_b:.0f} | {r['faiss'] / n:.0f} | {disk:.0f} | "
              f"{ram:.0f} | {build} | {r['recall@10']:.4f} | {r['recall@10_codes_only']:.4f} | "
              f"{r.get('ms_per_query_codes_only', r['ms_per_query']):.2f} |")


if __name__ == "__main__":
    main()
