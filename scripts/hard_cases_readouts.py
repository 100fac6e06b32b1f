"""Readout and scoring variants on the hard set (``scripts/eval_hard_cases.py``) over cached feature maps.

A backbone pass of the 715 hard-set images costs about a minute of CPU; every readout (pooling, ROI windows,
buddy rules, query scales, centring) is a function of the feature maps alone. So the maps are computed once per
(seed, input size) and cached (float16 ``.pt`` files under ``--cache``, not in git), and each variant below takes
seconds. ``cache`` fills the cache; ``run`` scores every variant and prints one table row per variant and scorer.

Usage:
    python scripts/hard_cases_readouts.py cache --seed 0 --sizes 224 320 160 [--cache /tmp/regis-quality]
    python scripts/hard_cases_readouts.py run --seed 0 [--cache ...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from eval_hard_cases import backbone_pass, kind_metrics, load_hard_set  # noqa: E402

from regis.models.encoder import build_encoder  # noqa: E402

DEFAULT_CACHE = Path("/tmp/regis-quality")


def cache_path(cache: Path, seed: int, size: int, repeats: int) -> Path:
    return cache / f"crop{size}-s{seed}-r{repeats}.pt"


def fill_cache(cache: Path, seed: int, sizes: list[int], repeats: int) -> None:
    """One backbone pass (centre crop at each size) of the gallery and the queries -> float16 patch maps."""
    torch.set_num_threads(1)
    hard, _ = load_hard_set(repeats, seed)
    cache.mkdir(parents=True, exist_ok=True)
    for size in sizes:
        path = cache_path(cache, seed, size, repeats)
        if path.is_file():
            continue
        encoder = build_encoder("efficientnet-lite0", image_size=size)
        t0 = time.perf_counter()
        _, gp, grid = backbone_pass(encoder, [it.image for it in hard.gallery])
        _, qp, _ = backbone_pass(encoder, [it.image for it in hard.queries])
        tmp = path.with_suffix(".tmp")
        torch.save({"gallery": gp.half(), "queries": qp.half(), "grid": grid}, tmp)
        tmp.rename(path)
        print(f"[seed {seed}, {size} px] backbone pass {time.perf_counter() - t0:.0f} s, grid {grid}", flush=True)


def gem(x: torch.Tensor, dim: int, p: float) -> torch.Tensor:
    """GeM over ``dim`` (p = 1: the mean; p = inf: the max)."""
    if p == 1:
        return x.mean(dim)
    if p == float("inf"):
        return x.amax(dim)
    return x.clamp(min=1e-6).pow(p).mean(dim).pow(1.0 / p)


def cue_tokens(patches: torch.Tensor, grid, p_global: float = 3.0, p_parts: float = 3.0) -> torch.Tensor:
    """(B, 5, D): the global token (GeM p_global) and the 2 x 2 grid parts (GeM p_parts), not normalised."""
    b, _, d = patches.shape
    h, w = grid
    fmap = patches.transpose(1, 2).reshape(b, d, h, w)
    cells = []
    for r0, r1 in ((0, (h + 1) // 2), (h // 2, h)):
        for c0, c1 in ((0, (w + 1) // 2), (w // 2, w)):
            cells.append(gem(fmap[:, :, r0:r1, c0:c1].flatten(2), 2, p_parts))
    return torch.cat([gem(patches, 1, p_global)[:, None], torch.stack(cells, 1)], 1)


def buddies(cues: torch.Tensor, patches: torch.Tensor, grid, rule: str = "argmax") -> torch.Tensor:
    """(B, C) buddy patches: ``argmax`` (regis), ``distinct`` (no patch twice, cues in order), ``own-cell``
    (a part's buddy inside its own grid cell; the global cue anywhere)."""
    sims = torch.einsum("bcd,bpd->bcp", cues, patches)
    if rule == "argmax":
        return sims.argmax(-1)
    if rule == "own-cell":
        h, w = grid
        rows, cols = torch.arange(h * w) // w, torch.arange(h * w) % w
        masks = [torch.ones(h * w, dtype=torch.bool)]
        for r0, r1 in ((0, (h + 1) // 2), (h // 2, h)):
            for c0, c1 in ((0, (w + 1) // 2), (w // 2, w)):
                masks.append((rows >= r0) & (rows < r1) & (cols >= c0) & (cols < c1))
        return sims.masked_fill(~torch.stack(masks)[None], float("-inf")).argmax(-1)
    out = torch.empty(sims.shape[:2], dtype=torch.long)
    taken = torch.zeros(sims.shape[0], sims.shape[2], dtype=torch.bool)
    for c in range(sims.shape[1]):
        idx = sims[:, c].masked_fill(taken, float("-inf")).argmax(-1)
        out[:, c] = idx
        taken[torch.arange(len(idx)), idx] = True
    return out


def roi(patches: torch.Tensor, grid, buddy: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """(B, C, D) ROI tokens: the mean of the sizes[c] x sizes[c] window (clipped) around each buddy."""
    from regis.models.roi import window_matrix

    out = []
    for c, n in enumerate(sizes):
        wm = window_matrix(grid, n)
        out.append(torch.einsum("bp,bpd->bd", wm[buddy[:, c]], patches))
    return torch.stack(out, 1)


def readout(patches, grid, p_global=3.0, p_parts=3.0, roi_sizes=(1,) * 5, rule="argmax", roi_from=None):
    """(B, 10, D) unit-norm tokens; ``roi_from`` = (patches, grid) of another pass for the ROI tokens."""
    cues = cue_tokens(patches, grid, p_global, p_parts)
    rp, rg = roi_from or (patches, grid)
    rcues = cues if roi_from is None else cue_tokens(rp, rg, p_global, p_parts)
    rois = roi(rp, rg, buddies(rcues, rp, rg, rule), list(roi_sizes))
    return F.normalize(torch.cat([cues, rois], 1), dim=-1)


def centred(q: torch.Tensor, g: torch.Tensor, per_position: bool = False):
    """Subtract the gallery's mean token (over all gallery tokens, or per position), renormalise."""
    mu = g.mean(0, keepdim=True) if per_position else g.reshape(-1, g.shape[-1]).mean(0)
    return F.normalize(q - mu, dim=-1), F.normalize(g - mu, dim=-1)


def whitened(q: torch.Tensor, g: torch.Tensor, shrink: float = 1.0):
    """PCA whitening learned from the gallery tokens (centre, rotate, scale by (lambda + shrink * mean
    lambda)^-1/2), renormalise."""
    x = g.reshape(-1, g.shape[-1]).double()
    mu = x.mean(0)
    lam, vec = torch.linalg.eigh(torch.cov((x - mu).T))
    lam = lam.clamp(min=0)
    wmat = (vec / (lam + shrink * lam.mean()).sqrt()).float()
    f = lambda t: F.normalize((t - mu.float()) @ wmat, dim=-1)  # noqa: E731
    return f(q), f(g)


def load(cache: Path, seed: int, size: int, repeats: int):
    d = torch.load(cache_path(cache, seed, size, repeats))
    return d["gallery"].float(), d["queries"].float(), tuple(d["grid"])


def variants(cache: Path, seed: int, repeats: int):
    """Yields (name, {scorer: (query tokens, gallery tokens)}) for every variant tried."""
    g224, q224, grid224 = load(cache, seed, 224, repeats)
    have = {s: cache_path(cache, seed, s, repeats).is_file() for s in (320, 160, 288)}
    base_g, base_q = readout(g224, grid224), readout(q224, grid224)
    yield "kept defaults: 224 px, GeM p = 3, N = 1", {
        "maxsim-10": (base_q, base_g), "global": (base_q[:, :1], base_g[:, :1]),
        "dense": (F.normalize(q224, dim=-1), F.normalize(g224, dim=-1))}
    mean_g, mean_q = readout(g224, grid224, 1, 1), readout(q224, grid224, 1, 1)
    yield "mean pooling, N = 1", {"maxsim-10": (mean_q, mean_g), "global": (mean_q[:, :1], mean_g[:, :1])}
    for pg, pp in ((3, 1), (3, float("inf")), (1, 3), (3, 6), (6, 6), (float("inf"), float("inf"))):
        g, q = readout(g224, grid224, pg, pp), readout(q224, grid224, pg, pp)
        yield f"global GeM p = {pg}, parts p = {pp}", {"maxsim-10": (q, g), "global": (q[:, :1], g[:, :1])}
    for sizes in ((3, 1, 1, 1, 1), (1, 3, 3, 3, 3), (3, 3, 3, 3, 3), (5, 1, 1, 1, 1)):
        g, q = readout(g224, grid224, roi_sizes=sizes), readout(q224, grid224, roi_sizes=sizes)
        yield f"ROI windows {sizes}", {"maxsim-10": (q, g)}
    for rule in ("distinct", "own-cell"):
        g, q = readout(g224, grid224, rule=rule), readout(q224, grid224, rule=rule)
        yield f"buddies: {rule}", {"maxsim-10": (q, g)}
    yield "centred on the gallery mean", {"maxsim-10": centred(base_q, base_g),
                                          "global": centred(base_q[:, :1], base_g[:, :1])}
    yield "centred per token position", {"maxsim-10": centred(base_q, base_g, True)}
    yield "PCA-whitened (gallery, shrinkage 1)", {"maxsim-10": whitened(base_q, base_g),
                                                  "global": whitened(base_q[:, :1], base_g[:, :1])}
    for size in (320, 288, 160):
        if not have[size]:
            continue
        gs, qs, grid = load(cache, seed, size, repeats)
        g, q = readout(gs, grid), readout(qs, grid)
        yield f"{size} px input (grid {grid[0]} x {grid[1]})", {
            "maxsim-10": (q, g), "global": (q[:, :1], g[:, :1]),
            "dense": (F.normalize(qs, dim=-1), F.normalize(gs, dim=-1))}
        if size > 224:
            g2, q2 = readout(g224, grid224, roi_from=(gs, grid)), readout(q224, grid224, roi_from=(qs, grid))
            yield f"cues at 224 px, ROI tokens at {size} px (2 passes)", {"maxsim-10": (q2, g2)}
            yield f"query at 224 + {size} px (20 query tokens)", {"maxsim-10": (torch.cat([base_q, q], 1), base_g)}
        else:
            yield f"query at 224 + {size} px (20 query tokens)", {"maxsim-10": (torch.cat([base_q, q], 1), base_g)}
            yield f"query at 224 + {size} px, global only (2 query vectors)", {
                "global": (torch.cat([base_q[:, :1], q[:, :1]], 1), base_g[:, :1])}
    if not have[160]:
        return
    g160, q160, grid160 = load(cache, seed, 160, repeats)
    s_g, s_q = readout(g160, grid160), readout(q160, grid160)
    two = lambda a, b: F.normalize(a + b, dim=-1)  # noqa: E731  (multi-scale GeM: the mean of the scales)
    yield "global token: mean of 224 and 160 px (2 passes)", {
        "global": (two(base_q[:, :1], s_q[:, :1]), two(base_g[:, :1], s_g[:, :1]))}
    yield "query global at 224 + 160 px, gallery mean of 2 scales", {
        "global": (torch.cat([base_q[:, :1], s_q[:, :1]], 1), two(base_g[:, :1], s_g[:, :1]))}
    for label, (ga, gb, qa, qb) in {
        "cues at 224 px, ROI tokens at 160 px (2 passes)": ((g224, grid224), (g160, grid160),
                                                           (q224, grid224), (q160, grid160)),
        "cues at 160 px, ROI tokens at 224 px (2 passes)": ((g160, grid160), (g224, grid224),
                                                           (q160, grid160), (q224, grid224)),
    }.items():
        g, q = readout(*ga, roi_from=gb), readout(*qa, roi_from=qb)
        yield label, {"maxsim-10": (q, g)}
        if label.startswith("cues at 224"):
            yield "dense: all patches of both passes (49 + 25)", {"dense": (
                F.normalize(torch.cat([q224, q160], 1), dim=-1), F.normalize(torch.cat([g224, g160], 1), dim=-1))}
        yield label + ", query both scales (20)", {"maxsim-10": (torch.cat([base_q, s_q], 1), g)}
    # 2 scales in the 10-token layout: global + parts at 224 px, then the 160 px pass's global + parts in the
    # ROI slots (no ROI tokens)
    g, q = torch.cat([base_g[:, :5], s_g[:, :5]], 1), torch.cat([base_q[:, :5], s_q[:, :5]], 1)
    yield "cues at 224 + cues at 160 px (no ROI; 2 passes)", {"maxsim-10": (q, g)}
    yield "gallery 10 tokens at 224 + 160 px (5 + 5), query 20", {
        "maxsim-10": (torch.cat([base_q, s_q], 1), g)}
    yield "query at 224 + 160 px (20), gallery 160 px", {"maxsim-10": (torch.cat([base_q, s_q], 1), s_g)}


def run(args) -> int:
    from regis.scores.maxsim import maxsim_scores

    hard, _ = load_hard_set(args.repeats, args.seed)
    kinds = np.array([it.kind for it in hard.queries])
    rows = []
    order = ("all", "view", "tile", "partial", "rotate", "color", "jpeg", "stereo")
    print(f"seed {args.seed}: {len(hard.queries)} queries; R@1 / mAP")
    print(f"{'variant':58s} {'scorer':10s} {'vec':>4s} " + " ".join(f"{k:>13s}" for k in order))
    for name, scorers in variants(args.cache, args.seed, args.repeats):
        if args.only and not any(o in name for o in args.only):
            continue
        for scorer, (q, g) in scorers.items():
            m = kind_metrics(maxsim_scores(q, g, chunk_size=64), hard.relevance, kinds)
            rows.append({"variant": name, "scorer": scorer, "vectors": int(g.shape[1]),
                         "query_vectors": int(q.shape[1]), "metrics": m})
            cells = " ".join(f"{m[k]['R@1']:.3f} / {m[k]['mAP']:.3f}" for k in order)
            print(f"{name[:58]:58s} {scorer:10s} {g.shape[1]:4d} {cells}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "seed": args.seed,
                                         "repeats": args.repeats, "queries": len(hard.queries), "rows": rows},
                                        indent=2) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("cache", "run"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="*", default=[224, 320, 160])
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--only", nargs="*", default=None, help="run the variants whose name contains one of these")
    args = ap.parse_args()
    if args.what == "cache":
        fill_cache(args.cache, args.seed, args.sizes, args.repeats)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
