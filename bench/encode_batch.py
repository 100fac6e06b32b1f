"""Encoder throughput against batch size: what dynamic batching can gain at most on this machine.

The offline EfficientNet-Lite0 encoder (224 px, the service's query encoder) runs ``--repeats`` forward passes
of random (B, 3, 224, 224) inputs per batch size B and torch thread count after two warm-up passes, as built
(``eager``), as the folded torch copy (``folded``: ``regis.models.inference.inference_copy(runtime="torch")``,
batch norm folded and channels-last) and as ONNX Runtime runs it (``onnx``: ``inference_copy(runtime="onnx")``,
one session per thread count; what the service encodes queries with by default); printed: the median ms per
pass, ms per image and images/s, and each copy's largest token difference from ``eager``. A pass is
``encode``: both backbone passes (224 px, then the 160 px ROI pass) unless ``--roi-image-size 0``.

Usage::

    python -m bench.encode_batch --batch-sizes 1,2,4,8,16 --threads 1,2
    python -m bench.encode_batch --batch-sizes 1,4 --threads 2 --variants folded,onnx
    python -m bench.encode_batch --roi-image-size 0     # without the second (160 px) ROI pass of new CNN encoders
    python -m bench.encode_batch --frames center-crop,aspect,center-crop+aspect --photo 1024x768 --batch-sizes 8 \
        --threads 1 --variants eager    # the framings' cost (issue 29): inputs of a 4:3 photo's shapes

``--frames``: one encoder per frame (the default backbone, ``efficientnet-lite0-regis``), each fed inputs of the
shape its transform gives a ``--photo`` W x H image (224 x 224 for the square frames; "aspect" and
"center-crop+aspect": ``regis.models.geometry.aspect_input_size``); the table adds the frame and the tokens per image.
"""

from __future__ import annotations

import argparse
import json
import time

from bench.common import print_machine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", default="1,2,4,8,16")
    p.add_argument("--threads", default="1,2", help="torch intra-op thread counts to measure")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--variants", default="eager,folded,onnx")
    p.add_argument("--roi-image-size", type=int, default=None,
                   help="side (px) of the ROI pass (0: none; default: the encoder's, 160 px)")
    p.add_argument("--frames", default=None, help="comma list of frames to compare (module docstring)")
    p.add_argument("--photo", default="1024x768", help="W x H of the photo whose input shape --frames use")
    args = p.parse_args()
    if args.frames:
        return frames(args)

    import torch

    from regis.models.encoder import build_encoder
    from regis.models.inference import inference_copy

    encoder = build_encoder("efficientnet-lite0", roi_image_size=args.roi_image_size)
    print_machine({"bench": "encode_batch", "threads": args.threads, "variants": args.variants,
                   "roi_image_size": encoder.config.roi_image_size})
    names = args.variants.split(",")
    x = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    want = encoder.encode(x)
    copies = {"folded": lambda threads: inference_copy(encoder, runtime="torch"),
              "onnx": lambda threads: inference_copy(encoder, runtime="onnx", threads=threads)}
    for name in names:
        if name != "eager":
            gap = float((copies[name](2).encode(x) - want).abs().max())
            print(f"tokens max abs difference {name} vs eager: {gap:.3g} ({type(copies[name](2).backbone).__name__})",
                  flush=True)
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for name in names:
            model = encoder if name == "eager" else copies[name](threads)
            for b in [int(x) for x in args.batch_sizes.split(",")]:
                x = torch.randn(b, 3, 224, 224)
                dt = _median_s(model.encode, x, args.repeats)
                rows.append({"threads": threads, "variant": name, "batch": b, "ms_per_pass": dt * 1e3,
                             "ms_per_image": dt * 1e3 / b, "images_per_s": b / dt})
                print("row:", json.dumps(rows[-1]), flush=True)
    print("\n| torch threads | encoder | batch | ms per forward pass | ms per image | images/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['threads']} | {r['variant']} | {r['batch']} | {r['ms_per_pass']:.1f} | {r['ms_per_image']:.1f} | "
              f"{r['images_per_s']:.1f} |")


def _median_s(encode, x, repeats: int, warmup: int = 2) -> float:
    """Median wall time of ``encode(x)`` in seconds over ``repeats`` runs, after ``warmup`` untimed runs."""
    for _ in range(warmup):
        encode(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        encode(x)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def frames(args) -> None:
    """``--frames``: ms per image of each frame's encoder (eager, ``encode``) on its input shape for ``--photo``."""
    import torch

    from regis.models.encoder import build_encoder
    from regis.models.geometry import aspect_input_size, is_aspect

    pw, ph = (int(v) for v in args.photo.lower().split("x"))
    encoders = {f: build_encoder("efficientnet-lite0-regis", frame=f, roi_image_size=args.roi_image_size)
                for f in args.frames.split(",")}
    print_machine({"bench": "encode_batch --frames", "photo": args.photo, "threads": args.threads})
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for b in [int(x) for x in args.batch_sizes.split(",")]:
            for f, enc in encoders.items():
                w, h = aspect_input_size(enc.config, pw, ph) if is_aspect(enc.config) else (224, 224)
                x = torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(0))
                dt = _median_s(enc.encode, x, args.repeats)
                rows.append({"threads": threads, "frame": f, "input": f"{w}x{h}", "batch": b,
                             "tokens": enc.config.tokens_per_image, "ms_per_image": dt * 1e3 / b})
                print("row:", json.dumps(rows[-1]), flush=True)
    print("\n| torch threads | frame | input (W x H) | tokens per image | batch | ms per image |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['threads']} | {r['frame']} | {r['input']} | {r['tokens']} | {r['batch']} | "
              f"{r['ms_per_image']:.1f} |")


if __name__ == "__main__":
    main()
