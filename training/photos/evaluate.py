"""Evaluating the token head on held-out photos (issue 22): Recall@1 per query kind of four scorers, pooled over
seeds, with intervals from a bootstrap over photos.

Scorers, on the same backbone pass (``training.photos.features.encode_tokens``, cached per seed):

- ``untrained-global``: the untrained encoder's global token (token 0, GeM), cosine;
- ``untrained-maxsim``: its MaxSim, the query's m tokens against the gallery's T (what regis searches with today);
- ``trained-global``, ``trained-maxsim``: the same after the token head (``regis.models.head``).

The set is ``training.photos.evalset`` on the corpus's test split, one set per seed (each seed draws other
queries and burst frames). Per kind: Recall@1 (a right answer ranked first) with its 95 % Wilson interval, and
the differences "trained-maxsim minus each other scorer" with a 95 % bootstrap interval that resamples whole
photos (``training.evaluation.intervals.paired_bootstrap``). A cross-check of our Recall@1 with
pytorch-metric-learning's AccuracyCalculator (precision_at_1) runs on the object photos' copy-detection kinds,
where every query has exactly one right answer (its photo).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from regis.data.debian_photos import read_corpus
from regis.models.encoder import RegisEncoder
from regis.models.head import TokenHead
from training.evaluation.intervals import per_kind_table
from training.photos.evalset import KINDS, build_eval_set
from training.photos.features import encode_tokens
from training.photos.loss import maxsim_matrix
from training.photos.train import project

SCORERS = ("untrained-global", "untrained-maxsim", "trained-global", "trained-maxsim")


def test_photos(corpus: Path, split: str = "test") -> list[tuple[Path, str]]:
    """[(file, kind)] of the corpus's ``split``, sorted."""
    _, records = read_corpus(corpus)
    return [(Path(corpus) / r.file, r.kind) for r in records if r.split == split]


def encoder_key(encoder: RegisEncoder) -> str:
    """12 hex characters naming an encoder's config and weights (cache file names)."""
    import hashlib

    return hashlib.sha256((encoder.config.model_dump_json() + encoder.weights_info.sha256).encode()).hexdigest()[:12]


def eval_cache(encoder: RegisEncoder, corpus: Path, seeds: list[int], cache_dir: Path, split: str = "test",
               progress: bool = True) -> list[dict]:
    """Per seed: {"gallery": (N, m, F) float16, "queries": (Q, m, F) float16, "kinds", "photos" (per query),
    "relevance": (Q, N) bool, "seed"}; computed once per (encoder weights, split, seed) and kept in
    ``cache_dir``."""
    from tqdm import tqdm

    photos = test_photos(corpus, split)
    out = []
    for seed in tqdm(seeds, desc="eval sets", disable=not progress):
        path = Path(cache_dir) / f"evalset-{split}-s{seed}-{encoder_key(encoder)}.pt"
        if path.is_file():
            out.append(torch.load(path, map_location="cpu", weights_only=False))
            continue
        t0 = time.perf_counter()
        es = build_eval_set(photos, seed)
        record = {
            "seed": seed, "gallery": _gallery_tokens(encoder, es.gallery, out),
            "queries": encode_tokens(encoder, [q.image for q in es.queries]),
            "kinds": [q.kind for q in es.queries], "photos": [q.photo for q in es.queries],
            "gallery_photos": [g.photo for g in es.gallery], "gallery_keys": [_key(g) for g in es.gallery],
            "relevance": torch.from_numpy(es.relevance),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(record, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
        out.append(record)
    return out


def _key(item) -> str:
    """What makes a gallery item the same across seeds (the photo, its kind and box; burst frames are drawn anew)."""
    return f"{item.photo}|{item.kind}|{tuple(round(v, 2) for v in item.box)}"


def _gallery_tokens(encoder: RegisEncoder, gallery: list, done: list[dict]) -> torch.Tensor:
    """The gallery's tokens, reusing those of the same items in sets already encoded (``done``): the photo, its
    tiles and corner crops do not depend on the seed."""
    known = {k: rec["gallery"][i] for rec in done for i, k in enumerate(rec.get("gallery_keys", []))
             if "|burst|" not in k}
    todo = [i for i, g in enumerate(gallery) if _key(g) not in known]
    fresh = dict(zip(todo, encode_tokens(encoder, [gallery[i].image for i in todo]), strict=True))
    return torch.stack([fresh[i] if i in fresh else known[_key(g)] for i, g in enumerate(gallery)])


@torch.no_grad()
def scorer_hits(record: dict, head: TokenHead | None, tokens: int = 10) -> dict[str, np.ndarray]:
    """Per query 0 / 1 (right answer first) of the global and the MaxSim scorer, with ``head`` (None: untrained)."""
    g = project(head, record["gallery"][:, :tokens])
    q = project(head, record["queries"])
    rel = record["relevance"]
    out = {}
    for name, scores in (("global", q[:, 0] @ g[:, 0].T), ("maxsim", maxsim_matrix(q, g))):
        best = scores.argmax(1)
        out[name] = rel[torch.arange(len(best)), best].numpy().astype(float)
    return out


def evaluate_head(records: list[dict], head: TokenHead | None, tokens: int = 10) -> dict:
    """The four scorers on every seed's set (``head`` None: the trained rows are left out).

    Returns:
        {"per_kind": {kind: {"n", scorer: {"r1", "lo", "hi"}, "diff": {"trained-maxsim - X": {"d", "lo", "hi"}}}},
        "per_seed": [{seed: {scorer: r1 over all queries}}], "crosscheck": {...}} pooled over the seeds.
    """
    hits: dict[str, list[np.ndarray]] = {s: [] for s in SCORERS}
    kinds, photos, per_seed = [], [], []
    for rec in records:
        base = scorer_hits(rec, None, tokens)
        tr = scorer_hits(rec, head, tokens) if head is not None else {}
        row = {}
        for name in SCORERS:
            src, _, kind = name.partition("-")
            arr = (base if src == "untrained" else tr).get(kind)
            if arr is not None:
                hits[name].append(arr)
                row[name] = float(arr.mean())
        per_seed.append({"seed": rec["seed"], **row})
        kinds += rec["kinds"]
        photos += rec["photos"]
    pooled = {name: np.concatenate(v) for name, v in hits.items() if v}
    diffs = [("trained-maxsim", other) for other in SCORERS[:-1]] if "trained-maxsim" in pooled else []
    table = {kind: {"n": r["n"], **r["scorers"], **({"diff": r["diffs"]} if diffs else {})}
             for kind, r in per_kind_table(pooled, kinds, photos, diffs, kinds_order=KINDS).items()}
    return {"per_kind": table, "per_seed": per_seed, "crosscheck": crosscheck(records, head, tokens)}


@torch.no_grad()
def crosscheck(records: list[dict], head: TokenHead | None, tokens: int = 10) -> dict:
    """Our Recall@1 of the global scorer against pytorch-metric-learning's AccuracyCalculator precision_at_1, on
    the queries whose only right answer is their photo (object photos, kinds easy / hard / crops), seed by seed.
    Returns {"ours": [...], "pml": [...]} (they agree unless there are exact score ties)."""
    try:
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    except ImportError:
        return {"skipped": "pytorch-metric-learning is not installed"}
    calc = AccuracyCalculator(include=("precision_at_1",), k=1)
    ours, pml = [], []
    for rec in records:
        rel = rec["relevance"]
        single = rel.sum(1) == 1
        gal_unique = torch.tensor([rec["gallery_photos"].count(p) == 1 for p in rec["gallery_photos"]])
        sel = single & (rel.float() @ gal_unique.float() > 0)
        if not sel.any():
            continue
        g = project(head, rec["gallery"][:, :tokens])[:, 0]
        q = project(head, rec["queries"][sel])[:, 0]
        labels = {p: i for i, p in enumerate(sorted(set(rec["gallery_photos"])))}
        g_lab = torch.tensor([labels[p] for p, u in zip(rec["gallery_photos"], gal_unique, strict=True) if u])
        q_lab = torch.tensor([labels[p] for p, s in zip(rec["photos"], sel, strict=True) if s])
        acc = calc.get_accuracy(q.contiguous(), q_lab, g[gal_unique].contiguous(), g_lab, ref_includes_query=False)
        pml.append(round(float(acc["precision_at_1"]), 4))
        best = (q @ g[gal_unique].T).argmax(1)
        ours.append(round(float((g_lab[best] == q_lab).float().mean()), 4))
    return {"ours": ours, "pml": pml}


def format_table(result: dict) -> str:
    """The per-kind table: n, each scorer's Recall@1 [95 %], trained-maxsim minus untrained-maxsim [95 %]."""
    rows = result["per_kind"]
    scorers = [s for s in SCORERS if s in rows["all"]]
    head = f"{'kind':7s} {'n':>5s}" + "".join(f"{s:>26s}" for s in scorers)
    has_diff = "diff" in rows["all"]
    if has_diff:
        head += f"{'trained - untrained maxsim':>30s}{'trained maxsim - untr. global':>32s}"
    lines = [head]
    for kind, row in rows.items():
        line = f"{kind:7s} {row['n']:5d}"
        for s in scorers:
            c = row[s]
            line += f"{c['r1']:>12.3f} [{c['lo']:.3f}, {c['hi']:.3f}]"
        if has_diff:
            for key in ("trained-maxsim - untrained-maxsim", "trained-maxsim - untrained-global"):
                d = row["diff"][key]
                line += f"{d['d']:>+14.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"
        lines.append(line)
    return "\n".join(lines)
