"""The small development corpus (``$REGIS_BENCH_DATA/dev16k``): 15,500 database images + 300..500 queries.

Exactly: the first 16,000 rows of ``bench.corpus``'s 1280-d tokens (Fashion-MNIST training images, in order);
a 384-d basis from the top singular vectors of the uncentred tokens of the first 5,000 of them; every token
projected and re-normalised; rows 0..15,499 are the database, rows 15,500..15,999 the queries (use
``--n-queries 300`` in ``bench.search`` as BENCHMARKS.md does). Used to measure regis at a mid size
(the Flat / IVF threshold) without the 100k build.

Usage::

    python -m bench.devset && python -m bench.search --source $REGIS_BENCH_DATA/dev16k --n-queries 300
"""

from __future__ import annotations

import json

import numpy as np

from bench.common import CORPUS_DIR, DATA_DIR, print_machine


def main() -> None:
    print_machine({"bench": "devset"})
    info = json.loads((CORPUS_DIR / "info.json").read_text())
    raw = np.memmap(CORPUS_DIR / "raw1280.f16", dtype=np.float16, mode="r",
                    shape=(info["rows"], info["tokens_per_image"], info["dim"]))
    x = raw[:16000].astype(np.float32)
    s = x[:5000].reshape(-1, x.shape[-1])
    ev, evec = np.linalg.eigh((s.T @ s).astype(np.float64))
    basis = evec[:, np.argsort(ev)[::-1][:384]].astype(np.float32)
    y = x @ basis
    y /= np.linalg.norm(y, axis=-1, keepdims=True)
    out = DATA_DIR / "dev16k"
    out.mkdir(exist_ok=True)
    db = np.memmap(out / "db.f16", dtype=np.float16, mode="w+", shape=(15500, 10, 384))
    db[:] = y[:15500]
    db.flush()
    np.save(out / "q.npy", y[15500:16000])
    (out / "info.json").write_text(json.dumps({"db": 15500, "tokens": 10, "dim": 384}))
    print(json.dumps({"db": 15500, "queries": 500, "out": str(out)}))


if __name__ == "__main__":
    main()
