"""What the duplicates self-join reads and allocates on a two-framing index (issue 26; docs/DUPLICATES.md, Scale).

The collection: the real tokens of a two-framing index (``--real``: built by ``regis index build`` with the default
CNN frame "center-crop+aspect", 2T tokens an image), then images generated from them as ``bench.duplicates`` does
(token-by-token mixes of two neighbouring real images, position by position: each framing stays a framing) up to
``--n``, written once into ``--work`` with the real index's encoder config (so the join sees two framings).

One ``self_join`` with the shipped thresholds (floor, neighbours, depth) in this process, measured by:
bytes read by the process during the join (``rchar`` of ``/proc/self/io``: every ``read``/``pread``, which is how
the token store reads; FAISS and the table are loaded before), the peak of Python and NumPy allocations during the
join (``tracemalloc``), the process's peak RSS after it (``ru_maxrss``: index open + join), and the pairs. The pairs
are saved as ``--work``/pairs-<label>.npz; a later run with another ``--label`` (e.g. an older checkout on
``PYTHONPATH``) compares its pairs and scores with every saved one.

Usage (the script runs against whichever ``regis`` is on ``PYTHONPATH``)::

    python -m bench.duplicates_join_io --real /work/cache/dup-framing/photos-2f --n 5000 \\
        --work /work/cache/dup-framing/io --label after --json docs/results/duplicates/join-io-2f.json
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from bench.common import print_json


def rchar() -> int:
    """Bytes this process has read so far through read-like system calls (``/proc/self/io``), or -1."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def write_collection(real_index: Path, index: Path, n: int, seed: int) -> dict:
    """The collection's index at ``index`` (kept when it already holds ``n`` images); its description."""
    from bench.duplicates import collection, real_tokens
    from regis.indexes.snapshot import IndexSnapshot
    from regis.indexes.table import ImageRecord
    from regis.indexes.writer import IndexWriter

    if (index / "CURRENT").is_file():
        snap = IndexSnapshot.open(index)
        try:
            if len(snap.store) == n:
                return {"reused": True, "faiss": snap.manifest.faiss.spec}
        finally:
            snap.close()
    snap = IndexSnapshot.open(real_index)
    manifest = snap.manifest
    snap.close()
    if manifest.encoder.framings != 2:
        raise SystemExit(f"{real_index} has {manifest.encoder.framings} framing(s) per image; this measures two")
    real = real_tokens(real_index)
    db = collection(real, n, seed)
    t0 = time.perf_counter()
    with IndexWriter(index, manifest.encoder, manifest.weights) as w:
        ids = w.allocate_ids(n)
        for s in range(0, n, 10_000):
            part = ids[s:s + 10_000]
            w.put([ImageRecord(int(i), f"img/{i}.jpg", f"{i:064x}", 640, 480, 1, 0.0) for i in part],
                  np.asarray(db[s:s + 10_000]))
        written = w.commit()
    return {"reused": False, "real_images": int(len(real)), "build_s": time.perf_counter() - t0,
            "faiss": written.faiss.spec}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--real", required=True, help="a two-framing regis index whose tokens seed the collection")
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", required=True)
    p.add_argument("--label", required=True, help="this run's name (the pairs are saved under it)")
    p.add_argument("--threads", type=int, default=1, help="FAISS threads")
    p.add_argument("--json")
    args = p.parse_args()

    import regis
    from regis.duplicates.config import DuplicateConfig, shipped_calibration
    from regis.duplicates.selfjoin import self_join
    from regis.indexes.snapshot import IndexSnapshot

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    index = work / f"index-{args.n}"
    built = write_collection(Path(args.real), index, args.n, args.seed)
    load0 = os.getloadavg()
    snap = IndexSnapshot.open(index)
    try:
        enc = snap.manifest.encoder
        config = shipped_calibration(enc.backbone) or DuplicateConfig()
        stats: dict = {}
        tracemalloc.start()
        r0, t0 = rchar(), time.perf_counter()
        pairs = self_join(snap, floor=config.floor, neighbours=config.neighbours, depth=config.depth,
                          threads=args.threads, stats=stats)
        wall, r1 = time.perf_counter() - t0, rchar()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        t2, faiss_spec = snap.manifest.tokens_per_image, snap.manifest.faiss.spec
    finally:
        snap.close()
    np.savez(work / f"pairs-{args.label}.npz", a=pairs.a, b=pairs.b, s_ab=pairs.s_ab, s_ba=pairs.s_ba)
    same = {}
    for other in sorted(work.glob("pairs-*.npz")):
        name = other.stem[len("pairs-"):]
        if name == args.label:
            continue
        o = np.load(other)
        equal = o["a"].tolist() == pairs.a.tolist() and o["b"].tolist() == pairs.b.tolist()
        same[name] = {"same_pairs": equal,
                      "max_score_diff": float(max(np.abs(o["s_ab"] - pairs.s_ab).max(initial=0.0),
                                                  np.abs(o["s_ba"] - pairs.s_ba).max(initial=0.0))) if equal else None}
    out = {"command": " ".join(["python -m bench.duplicates_join_io", *sys.argv[1:]]), "label": args.label,
           "regis": str(Path(regis.__file__).parent), "n": args.n, "collection": built, "faiss": faiss_spec,
           "tokens_per_image": t2, "framings": enc.framings, "dim": enc.dim,
           "join": {"floor": config.floor, "neighbours": config.neighbours, "depth": config.depth,
                    "threads": args.threads},
           "pairs": len(pairs), "candidates_scored": stats.get("candidates"),
           "bytes_read_mb": (r1 - r0) / 1e6 if r0 >= 0 else None,
           "alloc_peak_mb": peak / 1e6, "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
           "wall_s": wall, "stages_ms": {k: v for k, v in stats.items() if k.endswith("_ms")},
           "compared_with": same, "loadavg_at_start": load0, "loadavg_at_end": os.getloadavg()}
    print_json(out, args.json)


if __name__ == "__main__":
    main()
