"""Every change tried on the hard set (``scripts/eval_hard_cases.py``), one table row per change.

Two kinds of change: what the backbone sees (frame: centre crop / squash / pad, input size), which costs one
backbone pass of the 715 images per setting (cached under ``--cache``), and how the tokens are read out of one
pass (ROI window size, cue method, ...), which is cheap. All rows read the ROI tokens from the one pass
(``roi_image_size=0``); the second ROI pass and the other readouts are in ``scripts/hard_cases_readouts.py``.
Each row: the all-queries and per-kind Recall@1 of the 10-token MaxSim, the global token and the dense
all-patches reference, and mAP.

Usage:
    python scripts/hard_cases_experiments.py [--repeats 3] [--seed 0] [--cache /tmp/regis-hard-cache]
        [--out docs/results/hard_cases]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from eval_hard_cases import backbone_pass, evaluate, kind_metrics, load_hard_set, print_table  # noqa: E402

from regis.models.cues import cnn_cues  # noqa: E402
from regis.models.encoder import build_encoder  # noqa: E402
from regis.scores.maxsim import maxsim_scores  # noqa: E402

# (row name, what the backbone sees, readout options); the first row is the "before", the row marked
# AFTER the chosen defaults (regis.models.encoder: DEFAULT_CUE_POOLING, DEFAULT_CNN_ROI_SIZE).
BEFORE = dict(roi_size=3, cue_pooling="mean", cue_method="grid")
AFTER = dict(roi_size=1, cue_pooling="gem", cue_method="grid")
FRAMES = {
    "crop224": dict(frame="center-crop", image_size=224),
    "squash224": dict(frame="squash", image_size=224),
    "pad224": dict(frame="pad", image_size=224),
}
ROWS = [  # grouped by backbone pass
    ("before: centre crop 224 px, mean pooling, N = 3", "crop224", BEFORE),
    ("N = 5", "crop224", {**BEFORE, "roi_size": 5}),
    ("N = 1", "crop224", {**BEFORE, "roi_size": 1}),
    ("GeM pooling", "crop224", {**BEFORE, "cue_pooling": "gem"}),
    ("AFTER: GeM pooling + N = 1", "crop224", AFTER),
    ("GeM + N = 1, kmeans cues", "crop224", {**AFTER, "cue_method": "kmeans"}),
    ("GeM + N = 1, attention cues", "crop224", {**AFTER, "cue_method": "attention"}),
    ("squash the whole frame", "squash224", BEFORE),
    ("GeM + N = 1, squash", "squash224", AFTER),
    ("pad the whole frame", "pad224", BEFORE),
]
TYPED_GROUPS = ((0, 1), (1, 5), (5, 6), (6, 10))  # global, parts, ROI of the global cue, ROIs of the parts


def typed_maxsim(q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """A scoring variant tried: MaxSim where a query token only meets gallery tokens of its own role (global /
    part / ROI of the global cue / part ROIs); (Q, N)."""
    return sum(maxsim_scores(q[:, a:b], g[:, a:b]) for a, b in TYPED_GROUPS)


def with_cues(encoder, parts):
    """Parts with the cue tokens recomputed from the cached patch tokens by this encoder's cue rule (CNN)."""
    _, patches, grid = parts
    cfg = encoder.config
    return cnn_cues(patches, grid, cfg.num_registers, cfg.cue_method, cfg.cue_pooling), patches, grid


_LOADED: dict = {}


def cached_parts(encoder, hard, key: str, cache: Path):
    """Backbone parts of the gallery and the queries for one frame setting, from ``cache`` when there."""
    path = cache / f"{key}.pt"
    if key in _LOADED:
        return _LOADED[key]
    if path.is_file():
        _LOADED.clear()
        _LOADED[key] = torch.load(path)
        return _LOADED[key]
    t0 = time.perf_counter()
    parts = (backbone_pass(encoder, [it.image for it in hard.gallery]),
             backbone_pass(encoder, [it.image for it in hard.queries]))
    print(f"[{key}] backbone pass {time.perf_counter() - t0:.0f} s", flush=True)
    cache.mkdir(parents=True, exist_ok=True)
    torch.save(parts, path)
    return parts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/regis-hard-cache"))
    ap.add_argument("--out", type=Path, default=None, help="write results.json here")
    ap.add_argument("--only", nargs="*", default=None, help="frame settings to run (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    hard, _ = load_hard_set(args.repeats, args.seed)
    kinds = np.array([it.kind for it in hard.queries])
    rows, dense = [], {}
    for name, key, readout in ROWS:
        if args.only and key not in args.only:
            continue
        encoder = build_encoder("efficientnet-lite0", **FRAMES[key], **readout, roi_image_size=0)
        g, q = cached_parts(encoder, hard, f"{key}-s{args.seed}-r{args.repeats}", args.cache)
        g, q = with_cues(encoder, g), with_cues(encoder, q)
        result = evaluate(encoder, hard, g, q, known={"dense": dense[key]} if key in dense else None)
        dense[key] = result["metrics"]["dense"]
        if readout in (BEFORE, AFTER):
            tq, tg = encoder.readout(*q), encoder.readout(*g)
            result["metrics"]["typed"] = kind_metrics(typed_maxsim(tq, tg), hard.relevance, kinds)
            result["vectors_per_image"]["typed"] = 10
        print_table(result, f"== {name}")
        rows.append({"change": name, "frame": FRAMES[key], "readout": readout,
                     **{k: v for k, v in result.items() if k != "hits"}})
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({
            "command": "python " + " ".join(sys.argv), "repeats": args.repeats, "seed": args.seed, "rows": rows,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
