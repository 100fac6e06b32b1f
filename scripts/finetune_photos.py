"""Fine-tune the whole encoder on the Debian photo corpus's training split, edits made on the fly (issue 22, GPU).

    PYTHONPATH=$PWD python scripts/finetune_photos.py --corpus /work/cache/photos --out runs/finetune \
        --device cuda --arms head,tail3,all --budget-s 330 --workers 14

Starts from the shipped encoder (``efficientnet-lite0-regis``, centre crop) and trains each arm on the same
batches (``training.photos.finetune``); writes ``<arm>-s<step>.safetensors`` and ``finetune.json`` in ``--out``.
Evaluate with ``scripts/eval_finetuned.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--arms", default="head,all")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--budget-s", type=float, default=None, help="Fit the steps to this many seconds of training.")
    p.add_argument("--batch", type=int, default=128, help="instances per batch")
    p.add_argument("--per-photo", type=int, default=4)
    p.add_argument("--lr-head", type=float, default=3e-4)
    p.add_argument("--lr-backbone", type=float, default=5e-5)
    p.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 1))
    p.add_argument("--checkpoint-at", default="", help="Comma-separated steps to save besides the last.")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    import torch

    from regis.models.encoder import build_encoder
    from training.photos.finetune import FinetuneConfig, finetune, load_photos

    cfg = FinetuneConfig(arms=tuple(a.arms.split(",")), steps=a.steps, batch=a.batch,
                         per_photo=a.per_photo, lr_head=a.lr_head, lr_backbone=a.lr_backbone, workers=a.workers,
                         seed=a.seed, checkpoint_at=tuple(int(s) for s in a.checkpoint_at.split(",") if s))
    # no cudnn.benchmark: the batch size varies with the number of scene photos drawn, and each new size would
    # be benchmarked anew (on an H200 that made a step take 28 s instead of under 1 s)
    t0 = time.perf_counter()
    photos, kinds, _ = load_photos(a.corpus, "train", cfg.photo_max_side)
    print(f"{len(photos)} training photos ({kinds.count('scene')} scenes) in {time.perf_counter() - t0:.1f} s",
          flush=True)
    start = build_encoder("efficientnet-lite0-regis", frame="center-crop")
    summary = finetune(start, photos, kinds, a.out, cfg, device=a.device, budget_s=a.budget_s)
    meta = {"command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "machine": platform.machine(), "cpus": os.cpu_count(), "start": start.weights_info.model_dump()}
    (a.out / "finetune.json").write_text(json.dumps({**meta, **summary}) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "arms"}), flush=True)
    return summary


if __name__ == "__main__":
    main()
