"""Instance retrieval on the bundled real photos: augmented copies queried against the originals.

For every photo of ``regis photos`` (21 distinct scenes), each edit of ``regis.data.augment.EDITS`` (crop,
resize, JPEG quality, colour jitter, mixed) makes ``--repeats`` copies with different random draws. Every
copy is a query against the 21 originals; Recall@1 = the fraction of queries whose original ranks first.
Three scorers over the same tokens, side by side:

- ``maxsim-10``: late interaction over all 2(R + 1) tokens (the query's and the original's);
- ``maxsim-cls+reg``: late interaction over the R + 1 cue tokens only;
- ``global``: the single global token (CLS, or a CNN's global average pool), cosine similarity;
- ``maxsim-q<m>`` (an encoder whose queries get m tokens other than the index's, ``EncoderConfig.query_layout``):
  the query's m tokens against the originals' 2(R + 1) (what a search with that encoder ranks by).

Usage:
    python scripts/eval_instance_retrieval.py [--backbone efficientnet-lite0] [--cue-method kmeans]
        [--roi-size 3] [--repeats 1] [--seed 0] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from regis.data.augment import make_edits
from regis.data.sample_photos import collect_sample_photos
from regis.images.decode import decode_image
from regis.models.encoder import build_encoder
from regis.models.transforms import eval_transform
from regis.scores.maxsim import maxsim_scores


def encode_images(encoder, images: list[Image.Image], batch: int = 16, query: bool = False) -> torch.Tensor:
    """(n, T, D) float32 unit-norm tokens of PIL images, through the index's eval transform (``query``: the
    query's (n, m, D) tokens, ``encode_query``; its first T are the index's)."""
    tf = eval_transform(encoder.config)
    encode = encoder.encode_query if query else encoder.encode
    out = []
    for i in range(0, len(images), batch):
        out.append(encode(torch.stack([tf(im) for im in images[i : i + batch]])))
    return torch.cat(out)


def recall_at_1(scores: torch.Tensor, truth: np.ndarray) -> float:
    """Fraction of rows whose argmax (first on ties) is the true gallery index."""
    return float((scores.argmax(dim=1).numpy() == truth).mean())


def margin(scores: torch.Tensor, truth: np.ndarray, m: int) -> float:
    """Mean over queries of (score of the original - best other score) / m, m = query tokens scored: how far
    ahead the original is, in per-token cosine units (comparable across scorers)."""
    s = scores.clone()
    rows = torch.arange(len(truth))
    true = s[rows, torch.from_numpy(truth)]
    s[rows, torch.from_numpy(truth)] = float("-inf")
    return float(((true - s.max(dim=1).values) / m).mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbone", default="efficientnet-lite0")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--random-init", action="store_true")
    ap.add_argument("--cue-method", default=None)
    ap.add_argument("--roi-size", type=int, default=None, help="default: the encoder's")
    ap.add_argument("--query-layout", default=None, help="tokens or tokens+roi-cues (default: the encoder's)")
    ap.add_argument("--repeats", type=int, default=1, help="copies per (photo, edit)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--crop-area", type=float, nargs=2, default=(0.5, 0.8), metavar=("LOW", "HIGH"),
                    help="fraction of the area a crop keeps (crop and mixed edits); 0.1 0.3 is the hard setting")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()

    torch.manual_seed(0)
    encoder = build_encoder(args.backbone, weights=args.weights, random_init=args.random_init,
                            roi_size=args.roi_size, cue_method=args.cue_method, query_layout=args.query_layout)
    r = encoder.config.num_registers
    with tempfile.TemporaryDirectory() as tmp:
        paths = collect_sample_photos(Path(tmp))
        originals = [decode_image(p).image for p in paths]
    names = [p.name for p in paths]
    t0 = time.perf_counter()
    gallery = encode_images(encoder, originals)

    edits = make_edits(tuple(args.crop_area))
    rng = np.random.default_rng(args.seed)
    queries, truth, kinds = [], [], []
    for gi, img in enumerate(originals):
        for edit_name, edit in edits.items():
            for _ in range(args.repeats):
                queries.append(decode_image(edit(img, rng)).image)
                truth.append(gi)
                kinds.append(edit_name)
    q_all = encode_images(encoder, queries, query=True)
    t = encoder.config.tokens_per_image
    q = q_all[:, :t]
    truth, kinds = np.array(truth), np.array(kinds)
    elapsed = time.perf_counter() - t0

    scorers = {
        "maxsim-10": (maxsim_scores(q, gallery), q.shape[1]),
        "maxsim-cls+reg": (maxsim_scores(q[:, : r + 1], gallery[:, : r + 1]), r + 1),
        "global": (q[:, 0] @ gallery[:, 0].T, 1),
    }
    if q_all.shape[1] != t:
        scorers[f"maxsim-q{q_all.shape[1]}"] = (maxsim_scores(q_all, gallery), q_all.shape[1])
    table = {}
    for name, (scores, m) in scorers.items():
        row = {"all": recall_at_1(scores, truth), "margin": margin(scores, truth, m)}
        for edit_name in edits:
            sel = kinds == edit_name
            row[edit_name] = recall_at_1(scores[sel], truth[sel])
        table[name] = row

    cfg = encoder.config
    print(f"instance retrieval, {len(names)} photos x {len(edits)} edits x {args.repeats} copies = {len(q)} queries, "
          f"crops keep {args.crop_area[0]:.0%}-{args.crop_area[1]:.0%} of the area")
    print(f"backbone {cfg.backbone} ({encoder.weights_info.source}), cue method {cfg.cue_method}, N = {cfg.roi_size}, "
          f"seed {args.seed}; {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{elapsed:.1f} s to encode")
    cols = ["all", *edits, "margin"]
    print(f"{'Recall@1':16s}" + "".join(f"{c:>9s}" for c in cols))
    for name, row in table.items():
        print(f"{name:16s}" + "".join(f"{row[c]:9.3f}" for c in cols))
    missed = [(names[truth[i]], kinds[i]) for i in np.flatnonzero(scorers["maxsim-10"][0].argmax(1).numpy() != truth)]
    if missed:
        print("maxsim-10 misses:", ", ".join(f"{n} ({k})" for n, k in missed))
    for name, (scores, _) in scorers.items():
        if name.startswith("maxsim-q"):
            wrong = np.flatnonzero(scores.argmax(1).numpy() != truth)
            print(f"{name} misses:", ", ".join(f"{names[truth[i]]} ({kinds[i]})" for i in wrong) or "none")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": "python " + " ".join(sys.argv),
            "queries": len(q), "photos": len(names), "repeats": args.repeats, "seed": args.seed,
            "crop_area": list(args.crop_area),
            "encoder": cfg.model_dump(), "weights": encoder.weights_info.source,
            "recall_at_1": table, "maxsim10_misses": missed,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
