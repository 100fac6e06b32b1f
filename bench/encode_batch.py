"""Encoder throughput against batch size: what dynamic batching can gain at most on this machine.

The offline EfficientNet-Lite0 encoder (224 px, the service's query encoder) runs ``--repeats`` forward passes
of random (B, 3, 224, 224) inputs per batch size B after one warm-up pass; printed: ms per pass and images/s.

Usage::

    python -m bench.encode_batch --batch-sizes 1,4,16,32
    python -m bench.encode_batch --roi-image-size 0     # without the second (160 px) ROI pass of new CNN encoders
"""

from __future__ import annotations

import argparse
import json
import time

from bench.common import print_machine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", default="1,4,16,32")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--roi-image-size", type=int, default=None,
                   help="side (px) of the ROI pass (0: none; default: the encoder's, 160 px)")
    args = p.parse_args()

    import torch

    from regis.models.encoder import build_encoder

    if args.threads:
        torch.set_num_threads(args.threads)
    encoder = build_encoder("efficientnet-lite0", roi_image_size=args.roi_image_size)
    print_machine({"bench": "encode_batch", "torch_threads": torch.get_num_threads(),
                   "roi_image_size": encoder.config.roi_image_size})
    rows = []
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        x = torch.randn(b, 3, 224, 224)
        encoder.encode(x)  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            encoder.encode(x)
        dt = (time.perf_counter() - t0) / args.repeats
        rows.append({"batch": b, "ms_per_pass": dt * 1e3, "images_per_s": b / dt})
        print("row:", json.dumps(rows[-1]), flush=True)
    print("\n| batch | ms per forward pass | images/s |\n|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['ms_per_pass']:.0f} | {r['images_per_s']:.1f} |")


if __name__ == "__main__":
    main()
