"""Rerank cost: ``maxsim_gemm`` of one query against N candidates' float16 tokens, at several GEMM chunk sizes.

The service's rerank upcasts the candidates' stored float16 tokens to float32 and multiplies them by the query's
tokens (``regis.scores.maxsim.maxsim_gemm``). This times that call alone on random tokens of the index's shape,
best of ``--repeats`` calls, on ``--threads`` torch threads::

    python -m bench.rerank --candidates 300,1000,2000 --chunks 8192,default --threads 1

``default`` in ``--chunks`` is ``gemm_chunk_docs``'s choice (cache-sized on a CPU). Form ``wide`` is
``maxsim_gemm`` ((m, D) @ (D, c * n)); ``tall`` is the same scores as (c * n, D) @ (D, m), the product
``maxsim_gemm`` used before (kept here for comparison); ``best2`` is ``maxsim_gemm`` with ``framings=2`` (an index
of two framings scored apart, ``EncoderConfig.framing_score`` "best": the same product, each image's better
framing kept), e.g. ``--tokens 20 --query-tokens 30 --dim 256 --forms wide,best2``.
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch

from bench.common import print_machine
from regis.scores.maxsim import gemm_chunk_docs, maxsim_gemm


def maxsim_tall(query: torch.Tensor, docs: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``maxsim_gemm``'s scores with the tall product (c * n, D) @ (D, m) per chunk (its form before 2026-11-23)."""
    n, d = docs.shape[1], docs.shape[2]
    qt = query.T.contiguous()
    out = []
    for start in range(0, docs.shape[0], chunk_size):
        chunk = docs[start : start + chunk_size]
        flat = chunk.reshape(-1, d).to(dtype=query.dtype)
        out.append((flat @ qt).view(chunk.shape[0], n, -1).amax(dim=1).sum(dim=-1))
    return torch.cat(out)


FORMS = {"wide": maxsim_gemm, "tall": maxsim_tall, "best2": functools.partial(maxsim_gemm, framings=2)}


def best_ms(fn, repeats: int) -> float:
    """Fastest of ``repeats`` calls of ``fn``, ms (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--candidates", default="500,1000,2000", help="comma-separated candidate counts N")
    p.add_argument("--chunks", default="8192,256,default,32", help="comma-separated documents per GEMM")
    p.add_argument("--tokens", type=int, default=10, help="tokens per image (n), and per query (m) by default")
    p.add_argument("--query-tokens", type=int, default=None, help="tokens per query (m; default: --tokens)")
    p.add_argument("--dim", type=int, default=1280)
    p.add_argument("--forms", default="wide,tall",
                   help="comma-separated: wide (maxsim_gemm), tall (the former form), best2 (two framings apart)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    m = args.query_tokens or args.tokens
    print_machine({"bench": "rerank", "threads": args.threads, "tokens": args.tokens, "query_tokens": m,
                   "dim": args.dim})
    rng = np.random.default_rng(0)
    query = torch.from_numpy(rng.standard_normal((m, args.dim)).astype(np.float32))
    print("| candidates | chunk (docs per GEMM) | form | ms per rerank |")
    print("|---|---|---|---|")
    for n in [int(x) for x in args.candidates.split(",")]:
        docs = torch.from_numpy(rng.standard_normal((n, args.tokens, args.dim)).astype(np.float16))
        for chunk in args.chunks.split(","):
            size = gemm_chunk_docs(docs) if chunk == "default" else int(chunk)
            label = f"{size} (default)" if chunk == "default" else str(size)
            for form in args.forms.split(","):
                fn = FORMS[form]
                ms = best_ms(functools.partial(fn, query, docs, chunk_size=size), args.repeats)
                print(f"| {n} | {label} | {form} | {ms:.1f} |", flush=True)


if __name__ == "__main__":
    main()
