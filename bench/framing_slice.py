"""One framing of a two-framing corpus: the central square's tokens alone, as ``regis index --frame center-crop``
would store them (issue 24).

A ``bench.corpus1m`` corpus made with the shipped encoder's two framings (``bench.corpus --frame
center-crop+aspect``: T = 20 tokens per image, the central square's 10 first; queries m = 30, the central
square's 15 first) holds, in its first blocks, exactly what the one-framing encoder (``--frame center-crop``, the
same weights) gives: the same backbone passes over the same central square. This writes those blocks as a corpus
of their own (``db.f16`` (N, T/2, D) float16, ``q.npy`` (Q, m/2, D) float32, ``info.json`` with
``score_framings`` 1), so ``bench.million`` measures both layouts on the same images and queries.

Usage::

    python -m bench.framing_slice --source $REGIS_BENCH_DATA/tok1m-regis --out $REGIS_BENCH_DATA/tok1m-regis-crop
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.common import print_machine

CHUNK = 50_000


def first_framing(source: Path, out: Path) -> dict:
    """Write the first framing of ``source`` to ``out`` (module docstring); returns the new info.json content.

    Raises:
        SystemExit: ``source`` is not a corpus of two framings scored apart.
    """
    info = json.loads((source / "info.json").read_text())
    if info.get("score_framings", 1) != 2:
        raise SystemExit(f"{source} is not a corpus of two framings scored apart (score_framings 2)")
    n, t, d = info["db"], info["tokens"], info["dim"]
    db = np.memmap(source / "db.f16", dtype=np.float16, mode="r", shape=(n, t, d))
    q = np.load(source / "q.npy")
    out.mkdir(parents=True, exist_ok=True)
    half = np.memmap(out / "db.f16", dtype=np.float16, mode="w+", shape=(n, t // 2, d))
    for s in range(0, n, CHUNK):
        half[s : s + CHUNK] = db[s : s + CHUNK, : t // 2]
    half.flush()
    np.save(out / "q.npy", np.ascontiguousarray(q[:, : q.shape[1] // 2]))
    new = {**info, "tokens": t // 2, "query_tokens": q.shape[1] // 2, "score_framings": 1,
           "framing_of": str(source), "framing": "center-crop (the first of center-crop+aspect)"}
    (out / "info.json").write_text(json.dumps(new, indent=2))
    return new


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=Path, required=True, help="a bench.corpus1m folder of two framings")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    print_machine({"bench": "framing_slice"})
    print("corpus:", json.dumps(first_framing(args.source, args.out)), flush=True)


if __name__ == "__main__":
    main()
