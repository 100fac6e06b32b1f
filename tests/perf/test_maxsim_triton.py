"""The fused Triton MaxSim kernel equals the GEMM rerank, checked on the CPU with Triton's interpreter.

Correctness only: its speed needs a GPU and is unmeasured (BENCHMARKS.md). The check runs in a subprocess
because Triton reads ``TRITON_INTERPRET`` when it is first imported.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the fused MaxSim kernel needs triton (it comes with CUDA builds of torch)")

CHECK = """
import torch
from regis.scores.maxsim import maxsim_gemm
from regis.scores.maxsim_triton import maxsim_triton

for m, n, n_docs, dim in [(10, 10, 37, 64), (3, 5, 8, 96), (16, 16, 1, 32)]:
    g = torch.Generator().manual_seed(m * 100 + n)
    q = torch.nn.functional.normalize(torch.randn(m, dim, generator=g), dim=-1)
    docs = torch.nn.functional.normalize(torch.randn(n_docs, n, dim, generator=g), dim=-1).half()
    torch.testing.assert_close(maxsim_triton(q, docs), maxsim_gemm(q, docs), rtol=1e-5, atol=1e-5)
for q_shape, d_shape in [((17, 8), (2, 4, 8)), ((4, 8), (2, 4, 9)), ((4, 8), (2, 17, 8))]:
    try:
        maxsim_triton(torch.zeros(q_shape), torch.zeros(d_shape))
    except ValueError:
        continue
    raise SystemExit(f"no ValueError for {q_shape} {d_shape}")
print("ok")
"""


def test_triton_kernel_matches_gemm_in_the_interpreter():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")
