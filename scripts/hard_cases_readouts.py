"""Readout and scoring variants on the hard set (``scripts/eval_hard_cases.py``) over cached feature maps.

A backbone pass of the 715 hard-set images costs about a minute of CPU; every readout (pooling, ROI windows,
buddy rules, query scales, centring) is a function of the feature maps alone. So the maps are computed once per
(seed, input size) and cached (float16 ``.pt`` files under ``--cache``, not in git), and each variant below takes
seconds. ``cache`` fills the cache; ``run`` scores every variant and prints one table row per variant and scorer.

Usage:
    python scripts/hard_cases_readouts.py cache --seed 0 --sizes 224 320 160 [--cache /tmp/regis-quality]
    python scripts/hard_cases_readouts.py run --seed 0 [--cache ...] [--json OUT.json]

    Third round, on the default encoder's own two passes (224 px, and the 160 px ROI pass resized from that
    tensor, float32: its "kept" row is exactly scripts/eval_hard_cases.py's), several seeds pooled:
    python scripts/hard_cases_readouts.py cache --encoder --sizes --seeds 0 1 2 3
    python scripts/hard_cases_readouts.py run3 --seeds 0 1 2 3 [--json OUT.json]
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


def encoder_cache_path(cache: Path, seed: int, repeats: int) -> Path:
    return cache / f"encoder-s{seed}-r{repeats}.pt"


def fill_encoder_cache(cache: Path, seed: int, repeats: int) -> None:
    """The default encoder's two passes, exactly as it indexes (224 px centre crop, then the ROI pass resized
    from that tensor): float32 patch maps of the gallery and the queries, with the number of queries (a cache
    of another version of the set is refused by ``load_encoder_maps``)."""
    path = encoder_cache_path(cache, seed, repeats)
    if path.is_file():
        return
    torch.set_num_threads(1)
    hard, _ = load_hard_set(repeats, seed)
    cache.mkdir(parents=True, exist_ok=True)
    encoder = build_encoder("efficientnet-lite0")
    t0 = time.perf_counter()
    maps = {}
    for part, items in (("gallery", hard.gallery), ("queries", hard.queries)):
        images = [it.image for it in items]
        _, p, grid = backbone_pass(encoder, images)
        _, rp, rgrid = backbone_pass(encoder, images, roi=True)
        maps |= {part: p, part + "_roi": rp, "grid": grid, "roi_grid": rgrid}
    tmp = path.with_suffix(".tmp")
    torch.save(maps | {"queries_n": len(hard.queries), "config": encoder.config.model_dump()}, tmp)
    tmp.rename(path)
    print(f"[seed {seed}, encoder] both passes {time.perf_counter() - t0:.0f} s", flush=True)


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


def load_encoder_maps(cache: Path, seed: int, repeats: int, queries: int) -> dict:
    """``fill_encoder_cache``'s maps (float32); refuses a cache of another version of the set."""
    d = torch.load(encoder_cache_path(cache, seed, repeats))
    if d["queries_n"] != queries:
        raise SystemExit(f"{encoder_cache_path(cache, seed, repeats)} holds {d['queries_n']} queries, the set has "
                         f"{queries}: delete it and run cache --encoder again")
    return d


def pooled_roi(patches: torch.Tensor, grid, buddy: torch.Tensor, n: int, p: float) -> torch.Tensor:
    """(B, C, D) ROI tokens pooled over the n x n window (clipped) around each buddy with GeM ``p`` (inf: max)."""
    from regis.models.roi import window_matrix

    mask = window_matrix(grid, n) > 0  # (P, P)
    out = []
    for c in range(buddy.shape[1]):
        m = mask[buddy[:, c]]  # (B, P)
        if p == float("inf"):
            out.append(patches.masked_fill(~m[..., None], float("-inf")).amax(1))
        else:
            x = patches.clamp(min=1e-6).pow(p) * m[..., None]
            out.append((x.sum(1) / m.sum(1, keepdim=True)).pow(1.0 / p))
    return torch.stack(out, 1)


def corner_parts(patches: torch.Tensor, grid, p: float = 3.0, frac: float = 2 / 3) -> torch.Tensor:
    """(B, 4, D) partial-view-oriented parts: GeM of 4 overlapping corner windows, ``frac`` of each side (the
    gallery's corner crops and the partial views are of that size; the 2 x 2 grid cells are half a side)."""
    b, _, d = patches.shape
    h, w = grid
    fmap = patches.transpose(1, 2).reshape(b, d, h, w)
    sh, sw = max(1, round(frac * h)), max(1, round(frac * w))
    cells = [gem(fmap[:, :, r:r + sh, c:c + sw].flatten(2), 2, p) for r in (0, h - sh) for c in (0, w - sw)]
    return torch.stack(cells, 1)


def round3_variants(m: dict):
    """Readouts on top of the default encoder's two passes (224 px cues, ROI tokens from the 160 px pass):
    yields (name, {scorer: (query tokens, gallery tokens)})."""
    big, small = {}, {}
    for side in ("gallery", "queries"):
        big[side] = (m[side], tuple(m["grid"]))
        small[side] = (m[side + "_roi"], tuple(m["roi_grid"]))

    def tokens(side, cue_p=(3.0, 3.0), roi_n=1, roi_p=1.0, chooser="own", parts="grid", layout="5+5"):
        (bp, bg), (sp, sg) = big[side], small[side]
        cues = cue_tokens(bp, bg, *cue_p)
        if parts == "corners":
            cues = torch.cat([cues[:, :1], corner_parts(bp, bg, cue_p[1])], 1)
        scues = cue_tokens(sp, sg, *cue_p)
        if parts == "corners":
            scues = torch.cat([scues[:, :1], corner_parts(sp, sg, cue_p[1])], 1)
        # which cues choose the buddies on the 160 px map: its own (the encoder), the 224 px ones, or its own
        # with no patch twice
        bud = buddies(cues if chooser == "224" else scues, sp, sg, "distinct" if chooser == "distinct" else "argmax")
        rois = roi(sp, sg, bud, [roi_n] * 5) if roi_p == 1.0 else pooled_roi(sp, sg, bud, roi_n, roi_p)
        if layout == "5+5":
            out = torch.cat([cues, rois], 1)
        elif layout == "global160":  # the global cue's ROI token replaced by the 160 px global token
            out = torch.cat([cues, scues[:, :1], rois[:, 1:]], 1)
        elif layout == "cues160":  # 224 px cues + the 160 px pass's cues (no ROI tokens)
            out = torch.cat([cues, scues], 1)
        else:
            raise ValueError(layout)
        return F.normalize(out, dim=-1)

    def both(**kw):
        return tokens("queries", **kw), tokens("gallery", **kw)

    q, g = both()
    unit = lambda x: F.normalize(x, dim=-1)  # noqa: E731
    yield "kept defaults (224 px cues, ROI N = 1 from the 160 px pass)", {
        "maxsim-10": (q, g), "global": (q[:, :1], g[:, :1]),
        "dense": (unit(big["queries"][0]), unit(big["gallery"][0])),
        "dense-160": (unit(small["queries"][0]), unit(small["gallery"][0])),
        "global-2q": (torch.cat([q[:, :1], unit(cue_tokens(*small["queries"])[:, :1])], 1), g[:, :1]),
    }
    for label, kw in (
        ("ROI window N = 3 at 160 px, mean", {"roi_n": 3}),
        ("ROI window N = 3 at 160 px, max", {"roi_n": 3, "roi_p": float("inf")}),
        ("ROI window N = 3 at 160 px, GeM p = 3", {"roi_n": 3, "roi_p": 3.0}),
        ("cues max-pooled (global and parts, both passes)", {"cue_p": (float("inf"), float("inf"))}),
        ("parts max-pooled (global GeM)", {"cue_p": (3.0, float("inf"))}),
        ("buddies on the 160 px map chosen by the 224 px cues", {"chooser": "224"}),
        ("buddies distinct (no 160 px patch twice)", {"chooser": "distinct"}),
        ("tokens: 5 cues + 160 px global + 4 part ROIs", {"layout": "global160"}),
        ("tokens: 5 cues at 224 + 5 cues at 160 px (no ROI)", {"layout": "cues160"}),
        ("partial-view parts: 4 corner windows, 2/3 of each side", {"parts": "corners"}),
    ):
        q2, g2 = both(**kw)
        yield label, {"maxsim-10": (q2, g2)}
    def mixed(side):  # the global cue's ROI token from the 224 px map, the parts' from the 160 px map
        (bp, bg), (sp, sg) = big[side], small[side]
        cues, scues = cue_tokens(bp, bg), cue_tokens(sp, sg)
        r224 = roi(bp, bg, buddies(cues, bp, bg), [1] * 5)[:, :1]
        r160 = roi(sp, sg, buddies(scues, sp, sg), [1] * 5)[:, 1:]
        return F.normalize(torch.cat([cues, r224, r160], 1), dim=-1)

    yield "ROI: the global cue's at 224 px, the parts' at 160 px", {"maxsim-10": (mixed("queries"), mixed("gallery"))}

    def grid9(side):  # global token at 224 px + GeM of the 3 x 3 cells of the 160 px map (no ROI tokens)
        (bp, bg), (sp, sg) = big[side], small[side]
        d, (h, w) = sp.shape[-1], sg
        fmap = sp.transpose(1, 2).reshape(len(sp), d, h, w).clamp(min=1e-6).pow(3.0)
        cells = F.adaptive_avg_pool2d(fmap, 3).pow(1 / 3).flatten(2).transpose(1, 2)
        return F.normalize(torch.cat([cue_tokens(bp, bg)[:, :1], cells], 1), dim=-1)

    yield "tokens: global at 224 + 3 x 3 GeM cells of the 160 px map", {
        "maxsim-10": (grid9("queries"), grid9("gallery"))}
    before = {"p_global": 1, "p_parts": 1, "roi_sizes": (3,) * 5}
    for label, kw in (("before: mean pooling, N = 3, one pass (224 px)", before),
                      ("first round: GeM, N = 1, one pass (224 px)", {})):
        yield label, {"maxsim-10": (readout(*big["queries"], **kw), readout(*big["gallery"], **kw))}
    q160 = tokens("queries", layout="cues160")[:, 5:]  # the query's 160 px pass's 5 cues (unit-norm)
    yield "query 15 tokens (+ its 160 px pass's 5 cues) vs the kept gallery", {
        "maxsim-10": (torch.cat([q, q160], 1), g)}
    # siblings of "query 15", fixed before their first measurement (fourth round)
    yield "query 11 tokens (+ its 160 px pass's global cue) vs the kept gallery", {
        "maxsim-10": (torch.cat([q, q160[:, :1]], 1), g)}
    yield "query 14 tokens (+ its 160 px pass's 4 part cues) vs the kept gallery", {
        "maxsim-10": (torch.cat([q, q160[:, 1:]], 1), g)}
    # fifth round: scoring in both directions (fixed before their first measurement). MaxSim S(Q, D) is
    # asymmetric: a gallery image that shows more than the query (the whole photo, a corner crop around a tile)
    # matches every query token and is not penalised for what the query lacks. The reverse direction S(D, Q) asks
    # how much of the gallery image the query shows.
    q15 = torch.cat([q, q160], 1)
    yield "both directions: S(Q,D)/m + S(D,Q)/T (query 15)", {"maxsim-10": (q15, g, "symmetric")}
    yield "reverse direction only: S(D,Q)/T (query 15)", {"maxsim-10": (q15, g, "reverse")}


def direction_scores(q: torch.Tensor, g: torch.Tensor, how: str = "forward") -> torch.Tensor:
    """(Q, N) scores of queries q (Q, m, D) against gallery g (N, T, D): ``forward`` MaxSim S(Q, D) (regis),
    ``reverse`` S(D, Q) / T (each gallery token's best query token), ``symmetric`` S(Q, D) / m + S(D, Q) / T."""
    from regis.scores.maxsim import maxsim_scores

    forward = maxsim_scores(q, g, chunk_size=64)
    if how == "forward":
        return forward
    reverse = maxsim_scores(g, q, chunk_size=64).T / g.shape[1]
    if how == "reverse":
        return reverse
    if how == "symmetric":
        return forward / q.shape[1] + reverse
    raise ValueError(how)


def variant_rows(pooled: dict[tuple[str, str], dict[str, np.ndarray]], kinds: np.ndarray, photos: np.ndarray,
                 ref_key: tuple[str, str], diff_key: str) -> tuple[tuple[str, ...], list[dict]]:
    """Per (variant, scorer) of ``pooled`` ({(variant, scorer): ``query_hits``' arrays pooled over seeds, (Q,)
    each}), per kind ("all", then each of ``QUERY_KINDS`` but ``stereo`` that has queries; the one stereo query per
    seed is left out, as in RESULTS.md section 4): n, Recall@1 with its 95 % Wilson interval, mAP, and its Recall@1
    minus ``ref_key``'s with the 95 % photo-cluster bootstrap interval, the Recall@1 figures ``per_kind_table``'s
    (unrounded). ``kinds``, ``photos``: (Q,) per query.

    Returns:
        (the kinds tabulated, in order; one row per key of ``pooled``, in order: {"variant", "scorer", "kinds":
        {kind: {"n", "R@1", "R@1_95": [lo, hi], "mAP", diff_key: [d, lo, hi]}}}).

    Raises:
        ValueError: ``ref_key`` not in ``pooled``, or ``per_kind_table``'s (arrays not all (Q,)).
    """
    from regis.data.hard_cases import QUERY_KINDS
    from training.evaluation.intervals import per_kind_table

    if ref_key not in pooled:
        raise ValueError(f"reference {ref_key} is not among the variants")
    ids = {key: str(i) for i, key in enumerate(pooled)}  # per_kind_table's scorer names
    ref = ids[ref_key]
    table = per_kind_table({ids[key]: h["R@1"] for key, h in pooled.items()}, kinds, photos,
                           [(i, ref) for i in ids.values()], kinds_order=[k for k in QUERY_KINDS if k != "stereo"],
                           digits=None)
    rows = []
    for key, h in pooled.items():
        row = {"variant": key[0], "scorer": key[1], "kinds": {}}
        for k, r in table.items():
            sel = np.ones(len(kinds), bool) if k == "all" else kinds == k
            s, d = r["scorers"][ids[key]], r["diffs"][f"{ids[key]} - {ref}"]
            row["kinds"][k] = {"n": r["n"], "R@1": s["r1"], "R@1_95": [s["lo"], s["hi"]],
                               "mAP": float(h["mAP"][sel].mean()), diff_key: [d["d"], d["lo"], d["hi"]]}
        rows.append(row)
    return tuple(table), rows


def run3(args) -> int:
    """Round 3: ``round3_variants`` over the encoder caches of ``--seeds``, Recall@1 pooled with intervals."""
    from eval_hard_cases import pooled_table, query_hits

    torch.set_num_threads(1)
    hits, kinds, photos = {}, [], []
    for seed in args.seeds:
        hard, _ = load_hard_set(args.repeats, seed)
        m = load_encoder_maps(args.cache, seed, args.repeats, len(hard.queries))
        kinds += [it.kind for it in hard.queries]
        photos += [it.photo for it in hard.queries]
        for name, scorers in round3_variants(m):
            if args.only and not any(o in name for o in args.only) and not name.startswith("kept"):
                continue
            for scorer, (q, g, *how) in scorers.items():
                h = query_hits(direction_scores(q, g, *how), hard.relevance)
                hits.setdefault((name, scorer), []).append(h)
    kinds, photos = np.array(kinds), np.array(photos)
    pooled = {key: {k: np.concatenate([h[k] for h in hs]) for k in hs[0]} for key, hs in hits.items()}
    kept = next(k for k in pooled if k[0].startswith("kept"))[0]
    print(f"seeds {args.seeds}: {len(kinds)} queries; Recall@1 pooled, 95 % intervals")
    print(pooled_table({s: v for (n, s), v in pooled.items() if n == kept}, kinds, photos))
    ref_key = (kept, "maxsim-10")
    if args.reference:  # the first variant whose name contains it (its maxsim-10 scorer) is the reference instead
        ref_key = next(k for k in pooled if args.reference in k[0] and k[1] == "maxsim-10")
    diff_key = "minus_reference" if args.reference else "minus_kept"
    order, rows = variant_rows(pooled, kinds, photos, ref_key, diff_key)
    print(f"\n{'variant (maxsim-10 unless said)':58s} " + " ".join(f"{k:>22s}" for k in order))
    if args.reference:
        print(f"differences: minus {ref_key[0]}")
    for row in rows:
        cells = [f"{c['R@1']:.3f} {c[diff_key][0]:+.3f} [{c[diff_key][1]:+.2f},{c[diff_key][2]:+.2f}]"
                 for c in row["kinds"].values()]
        name, scorer = row["variant"], row["scorer"]
        label = name if scorer == "maxsim-10" else f"{name[:40]} [{scorer}]"
        print(f"{label[:58]:58s} " + " ".join(f"{c:>22s}" for c in cells), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "seeds": args.seeds,
                                         "reference": ref_key[0],
                                         "repeats": args.repeats, "queries": len(kinds), "rows": rows},
                                        indent=2) + "\n")
    return 0


def table_kinds(queries: list) -> tuple[tuple[str, ...], dict[str, str]]:
    """The columns of ``run``'s table for these queries (``regis.data.hard_cases.Item``): "all", then each of
    ``QUERY_KINDS`` (the hard set's one list of kinds) that has queries, in its order; and the kinds skipped,
    with why ({kind: reason}, ``absent_kinds``)."""
    from regis.data.hard_cases import QUERY_KINDS, absent_kinds

    skipped = absent_kinds(queries)
    return ("all", *(k for k in QUERY_KINDS if k not in skipped)), skipped


def run(args) -> int:
    """Every ``variants`` row (``--only``: those whose name contains one of them) scored per kind of
    ``table_kinds``: a table on stdout, a line per kind skipped (which kind, why), and with ``--json`` the rows
    and the kinds skipped."""
    from regis.scores.maxsim import maxsim_scores

    hard, _ = load_hard_set(args.repeats, args.seed)
    kinds = np.array([it.kind for it in hard.queries])
    rows = []
    order, skipped = table_kinds(hard.queries)
    print(f"seed {args.seed}: {len(hard.queries)} queries; R@1 / mAP")
    for kind, why in skipped.items():
        print(f"kind {kind} skipped: {why}")
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
                                         "repeats": args.repeats, "queries": len(hard.queries),
                                         "kinds_skipped": skipped, "rows": rows},
                                        indent=2) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("cache", "run", "run3"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="*", default=[224, 320, 160])
    ap.add_argument("--encoder", action="store_true",
                    help="cache: the default encoder's two passes (what the third round reads)")
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="several seeds (default: --seed)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--only", nargs="*", default=None, help="run the variants whose name contains one of these")
    ap.add_argument("--reference", default=None,
                    help="run3: differences to the variant whose name contains this (default: the kept defaults)")
    args = ap.parse_args()
    if args.what == "cache":
        for seed in args.seeds or [args.seed]:
            if args.encoder:
                fill_encoder_cache(args.cache, seed, args.repeats)
            if args.sizes:
                fill_cache(args.cache, seed, args.sizes, args.repeats)
        return 0
    if args.what == "run3":
        args.seeds = args.seeds or [args.seed]
        return run3(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
