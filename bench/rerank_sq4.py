"""The SQ4 codes' rerank step alone: ``regis.indexes.codes.sq4_maxsim`` of one query against N candidates' random
codes, at several chunk sizes (images per step), one or two framings, on one torch thread with the searcher's
torch GEMM; and the MaxSim reduction of one (m, N, n) block of similarities, numpy's ``max(axis=2)`` against
``regis.scores.maxsim_np.maxsim_terms``. Best of ``--repeats`` calls (after one warm-up), ms::

    python -m bench.rerank_sq4 --candidates 600,3400 --chunks 64,256,512,1024,4096,default --framings 1,2

``default`` is ``sq4_maxsim``'s own choice (``SQ4_CHUNK_TOKENS`` tokens of one framing per step). Tokens per
framing: 10 per image, 15 per query (the shipped encoder's layout).
"""

from __future__ import annotations

import argparse
import functools

import numpy as np
import torch

from bench.common import print_machine
from bench.rerank import best_ms
from regis.indexes.codes import SQ4_CHUNK_TOKENS, sq4_maxsim
from regis.scores.maxsim_np import maxsim_terms


def torch_gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The searcher's GEMM (``Searcher._gemm_nt``): a (m, K) @ b (n, K).T in torch."""
    return (torch.from_numpy(a) @ torch.from_numpy(b).T).numpy()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--candidates", default="600,3400")
    p.add_argument("--chunks", default="256,512,1024,4096,default", help="images per step, or default")
    p.add_argument("--framings", default="1,2")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(1)
    print_machine({"bench": "rerank_sq4", "dim": args.dim, "sq4_chunk_tokens": SQ4_CHUNK_TOKENS})
    rng = np.random.default_rng(0)
    vmin, vdiff = np.zeros(args.dim, np.float32), np.ones(args.dim, np.float32)
    print("| framings | candidates | images per step | ms per call |")
    print("|---|---|---|---|")
    for f in [int(x) for x in args.framings.split(",")]:
        query = rng.standard_normal((15 * f, args.dim)).astype(np.float32)
        for n in [int(x) for x in args.candidates.split(",")]:
            codes = rng.integers(0, 256, (n, 10 * f, args.dim // 2), dtype=np.uint8)
            for chunk in args.chunks.split(","):
                size = None if chunk == "default" else int(chunk)
                call = functools.partial(sq4_maxsim, query, codes, vmin, vdiff, chunk_images=size, gemm=torch_gemm,
                                         framings=f)
                ms = best_ms(call, args.repeats)
                label = f"default ({SQ4_CHUNK_TOKENS // 10})" if size is None else str(size)
                print(f"| {f} | {n} | {label} | {ms:.2f} |", flush=True)
    sims = rng.standard_normal((15, 2000, 10)).astype(np.float32)
    print("| reduction of (15, 2000, 10) | ms |")
    print("|---|---|")
    print(f"| numpy max(axis=2).sum(axis=0) | {best_ms(lambda: sims.max(axis=2).sum(axis=0), 50):.3f} |")
    print(f"| maxsim_terms | {best_ms(lambda: maxsim_terms(sims), 50):.3f} |")


if __name__ == "__main__":
    main()
