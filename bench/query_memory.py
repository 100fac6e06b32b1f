"""Process memory and CPU time of the query encoder's inference copies (``regis.models.inference``).

Each variant runs in a fresh subprocess: it builds the offline EfficientNet-Lite0 encoder (as ``bench.encode_batch``
does; today's default: 224 px pass + 160 px ROI pass), for ONNX Runtime variants exports the backbone first
(``export_backbone_onnx``; its cost is printed apart), then makes the copy and encodes blank images of batch
1..``--max-batch`` (what ``BatchedSearch.warm_up`` does at service start-up: both passes, every session made).
Printed per variant: RSS growth (MiB, ``VmRSS`` of ``/proc/self/status``) from before the copy to after the
warm-up, the number of ONNX Runtime sessions, the copy's largest token difference from the encoder, and the
median ms per image of ``encode`` (both passes) and of each backbone pass alone at batch 1 and ``--max-batch``.

Variants:

- ``torch``: ``inference_copy(runtime="torch")`` (batch norm folded, channels-last);
- ``ort``: one session per input shape, each with its own weights and arena;
- ``ort-arena``: one session per input shape, all allocating from one shared CPU arena (ONNX Runtime's
  environment allocator, ``session.use_env_allocators``): what ``inference_copy(runtime="onnx")`` serves with
  (``OrtBackbone``);
- ``ort-init``: one session per input shape, all given the same weight arrays (``SessionOptions.add_initializer``
  with one ``OrtValue`` per initializer; the Python API has no ``PrepackedWeightsContainer`` in onnxruntime 1.2x);
- ``ort-init-arena``: both;
- ``ort-dynamic``: one session per backbone pass with a free batch axis (2 sessions), arena of its own each;
- ``ort-dynamic-arena``: 2 sessions, shared arena;
- ``ort-one``: one session with every axis free (batch, height, width) for both passes.

Every ONNX Runtime variant but ``ort-arena`` puts a ``bench.ort_variants.VariantBackbone`` in place of the
copy's ``OrtBackbone``: the library keeps only the sessions it serves with.

Usage::

    python -m bench.query_memory                      # all variants, 1 thread, batch 1..4
    python -m bench.query_memory --variants ort,ort-arena --repeats 21
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time

# name -> None (torch), "one" or (dynamic_batch, env_allocator, shared initializers)
VARIANTS = {"torch": None, "ort": (False, False, False), "ort-arena": (False, True, False),
            "ort-init": (False, False, True), "ort-init-arena": (False, True, True),
            "ort-dynamic": (True, False, False), "ort-dynamic-arena": (True, True, False), "ort-one": "one"}


def shared_initializers(model: bytes) -> tuple[list, dict]:
    """The weights (initializers) of an ONNX ``model`` as (numpy arrays to keep alive, name -> CPU ``OrtValue``
    over those arrays), for ``VariantBackbone``'s ``initializers``."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    arrays, values = [], {}
    for init in onnx.load_from_string(model).graph.initializer:
        arrays.append(np.ascontiguousarray(numpy_helper.to_array(init)))
        values[init.name] = ort.OrtValue.ortvalue_from_numpy(arrays[-1])
    return arrays, values


def rss_mib() -> float:
    """This process's resident set size (MiB), from ``/proc/self/status``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS line in /proc/self/status")


def _median_ms(fn, repeats: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def measure(variant: str, threads: int, max_batch: int, repeats: int) -> dict:
    """One variant in this process (see the module docstring); returns its row."""
    import torch
    import torch.nn.functional as F

    from regis.models import inference
    from regis.models.encoder import build_encoder

    torch.set_num_threads(threads)
    encoder = build_encoder("efficientnet-lite0")
    size, roi = encoder.config.image_size, encoder.config.roi_image_size
    row = {"variant": variant, "threads": threads}
    if VARIANTS[variant] is not None:
        gc.collect()
        r = rss_mib()
        t0 = time.perf_counter()
        model = inference.export_backbone_onnx(encoder.backbone, size)
        inference._onnx_models[(encoder.config.model_dump_json(), encoder.weights_info.sha256)] = model
        row["export_s"] = time.perf_counter() - t0
        gc.collect()
        row["export_rss_mib"] = rss_mib() - r
        row["model_mib"] = len(model) / 2**20
    with torch.inference_mode():  # the encoder's own pass once (its workspace; the torch copy is checked against it)
        encoder.encode(torch.zeros(max_batch, 3, size, size))
    gc.collect()
    before = rss_mib()
    with torch.inference_mode():
        if VARIANTS[variant] is None:
            fast = inference.inference_copy(encoder, runtime="torch")
        else:
            from bench.ort_variants import VariantBackbone

            fast = inference.onnx_copy(encoder, threads)  # its OrtBackbone: the ort-arena variant
            if VARIANTS[variant] == "one":
                fast.backbone = VariantBackbone(model, threads, dynamic_batch=False, env_allocator=False)
                fast.backbone.MAX_SESSIONS = 0  # every shape: the one session with dynamic axes
            elif VARIANTS[variant] != (False, True, False):
                dynamic, env_allocator, shared = VARIANTS[variant]
                arrays, initializers = shared_initializers(model) if shared else (None, None)
                fast.backbone = VariantBackbone(model, threads, dynamic, env_allocator, initializers)
                fast.backbone.keep_alive = arrays  # the OrtValues' memory
        for b in range(1, max_batch + 1):
            fast.encode(torch.zeros(b, 3, size, size))
        gc.collect()
        row["rss_growth_mib"] = rss_mib() - before
        row["sessions"] = len(getattr(fast.backbone, "_sessions", {}))
        x = torch.randn(max_batch, 3, size, size, generator=torch.Generator().manual_seed(0))
        row["max_abs_token_diff"] = float((fast.encode(x) - encoder.encode(x)).abs().max())
        for b in sorted({1, max_batch}):
            xb = x[:b]
            small = F.interpolate(xb, size=(roi, roi), mode="bilinear", align_corners=False) if roi else None
            row[f"encode_ms_per_image_b{b}"] = _median_ms(lambda xb=xb: fast.encode(xb), repeats) / b
            row[f"pass{size}_ms_per_image_b{b}"] = _median_ms(
                lambda xb=xb: fast.backbone.forward_features(xb), repeats) / b
            if roi:
                row[f"pass{roi}_ms_per_image_b{b}"] = _median_ms(
                    lambda small=small: fast.backbone.forward_features(small), repeats) / b
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime intra-op threads")
    p.add_argument("--max-batch", type=int, default=4, help="warm-up batch sizes 1..N (REGIS_BATCH_MAX_SIZE)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("ROW " + json.dumps(measure(args.child, args.threads, args.max_batch, args.repeats)), flush=True)
        return

    from bench.common import print_machine

    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    print_machine({"bench": "query_memory", "threads": args.threads, "max_batch": args.max_batch,
                   "repeats": args.repeats})
    rows = []
    for name in names:
        out = subprocess.run([sys.executable, "-m", "bench.query_memory", "--child", name, "--threads",
                              str(args.threads), "--max-batch", str(args.max_batch), "--repeats", str(args.repeats)],
                             capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(next(line[4:] for line in out.splitlines() if line.startswith("ROW "))))
        print("row:", json.dumps(rows[-1]), flush=True)
    b = args.max_batch
    print(f"\n| variant | sessions | RSS growth MiB (copy + warm-up) | encode ms/image b1 | encode ms/image b{b} "
          f"| 224 px pass ms/image b1 / b{b} | 160 px pass ms/image b1 / b{b} | max token diff |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['sessions']} | {r['rss_growth_mib']:.0f} | {r['encode_ms_per_image_b1']:.1f} | "
              f"{r[f'encode_ms_per_image_b{b}']:.1f} | {r['pass224_ms_per_image_b1']:.1f} / "
              f"{r[f'pass224_ms_per_image_b{b}']:.1f} | {r.get('pass160_ms_per_image_b1', float('nan')):.1f} / "
              f"{r.get(f'pass160_ms_per_image_b{b}', float('nan')):.1f} | {r['max_abs_token_diff']:.2g} |")


if __name__ == "__main__":
    main()
