"""Hard instance retrieval on real photos: near-duplicate galleries, partial / rotated / recoloured queries.

The set is ``regis.data.hard_cases`` built from the bundled photos (``regis photos``): per photo a gallery
of 16 near duplicates (the photo, its 3 x 3 tiles, 4 overlapping corner crops, 2 burst frames) and queries
of 7 kinds (view, tile, partial, rotate, color, jpeg, stereo). Relevance follows from geometry (see that
module). Three scorers over one backbone pass of the same encoder:

- ``maxsim-10``: late interaction over the encoder's 2(R + 1) tokens (what regis indexes and ranks with; for
  new CNN encoders the ROI tokens come from a second pass at 160 px, ``EncoderConfig.roi_image_size``);
- ``global``: the single global token (CLS, or a CNN's global average pool), cosine similarity;
- ``dense``: late interaction over every patch token of the feature map (7 x 7 = 49 at 224 px), the
  all-patches reference, 5x more vectors per image than the 10 tokens.

Per query kind: Recall@1 and Recall@5 (a relevant item in the top K) and mAP (average precision over the
relevant set, the whole gallery ranked).

``--aspect-photos DIR`` adds portrait and panoramic photos (issue 29: the ``end-crop`` and ``mid-crop`` kinds,
``regis.data.hard_cases``): the ``--aspect-count`` most elongated of each orientation in DIR (a corpus of
``regis photos --source debian``: its "scene" photos only; ties by name), 16 gallery items each. With the
"aspect" frame (non-square inputs of several shapes) the ``dense`` scorer is left out (its vectors per image
differ).

Usage:
    python scripts/eval_hard_cases.py [--backbone efficientnet-lite0] [--repeats 3] [--seed 0 [1 2 3]]
        [--frame ...] [--image-size ...] [--roi-size ...] [--cue-method ...] [--cue-pooling ...] [--json OUT.json]
        [--aspect-photos DIR [--aspect-count 8]]

    The encoder defaults (GeM pooling, N = 1, ROI tokens from a 160 px pass for CNNs) are the "after"; the
    "before" (mean pooling, N = 3, one pass): python scripts/eval_hard_cases.py --roi-size 3 --cue-pooling mean
    --roi-image-size 0; the defaults before the ROI pass: --roi-image-size 0
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
import torch.nn.functional as F
from PIL import Image

from regis.data.hard_cases import MIN_ELONGATION, QUERY_KINDS, HardSet, build_hard_set, skimage_data_dir
from regis.data.sample_photos import collect_sample_photos
from regis.models.batching import shape_groups
from regis.models.encoder import RegisEncoder, build_encoder
from regis.models.geometry import is_aspect, is_two_framings
from regis.models.transforms import eval_transform
from regis.scores.maxsim import maxsim_gemm, maxsim_scores
from training.evaluation.intervals import per_kind_table


def backbone_pass(encoder: RegisEncoder, images: list[Image.Image], batch: int = 16, roi: bool = False):
    """One backbone pass: (cues (n, R + 1, D), patches (n, P, D), grid) through the index's eval transform.

    ``roi``: instead, the encoder's second, smaller pass for ROI tokens (``forward_roi_parts``), or None when
    it has none."""
    if roi and encoder.config.roi_image_size is None:
        return None
    tf = eval_transform(encoder.config)
    cues, patches, grid = [], [], None
    with torch.inference_mode():
        for i in range(0, len(images), batch):
            x = torch.stack([tf(im) for im in images[i : i + batch]])
            c, p, grid = encoder.forward_roi_parts(x) if roi else encoder.forward_parts(x)
            cues.append(c.float())
            patches.append(p.float())
    return torch.cat(cues), torch.cat(patches), grid


def scorer_tokens(encoder: RegisEncoder, parts, roi_parts=None, query: bool = False) -> dict[str, torch.Tensor]:
    """The token sets the scorers compare: name -> (n, T, D) unit-norm float32 (``roi_parts``: the ROI pass,
    ``backbone_pass(..., roi=True)``). An encoder whose queries get other tokens than the index
    (``EncoderConfig.query_layout``) adds the scorer ``maxsim-q<m>``: the query's m tokens (``query``: these are
    the query's) against the gallery's T (what a search with that encoder ranks by)."""
    cues, patches, grid = parts
    with torch.inference_mode():
        tokens = encoder.readout(cues, patches, grid, roi_parts=roi_parts)
        out = {
            "maxsim-10": tokens,
            "global": tokens[:, :1],
            "dense": F.normalize(patches, dim=-1),
        }
        if encoder.config.query_layout != "tokens":
            name = f"maxsim-q{encoder.config.query_tokens_per_image}"
            out[name] = encoder.query_readout(cues, patches, grid, roi_parts=roi_parts) if query else tokens
    return out


def aspect_scorer_tokens(encoder: RegisEncoder, images: list[Image.Image], query: bool = False,
                         batch: int = 16) -> dict[str, torch.Tensor]:
    """``scorer_tokens`` for an encoder whose inputs differ in shape (the "aspect" frame): both backbone passes per
    group of one shape (``regis.models.batching.shape_groups``), the tokens put back in input order; no ``dense``.
    Two framings ("center-crop+aspect"): the encoder's own tokens (``two_framing_tokens``)."""
    tf = eval_transform(encoder.config)
    out: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for positions, pixels in shape_groups([tf(im) for im in images]):
            for i in range(0, len(positions), batch):
                x = pixels[i : i + batch]
                if is_two_framings(encoder.config):
                    got = two_framing_tokens(encoder, x, query)
                    rows = torch.as_tensor(positions[i : i + batch])
                    for name, t in got.items():
                        out.setdefault(name, t.new_zeros((len(images), *t.shape[1:])))[rows] = t
                    continue
                parts, roi = encoder.forward_parts(x), encoder.forward_roi_parts(x)
                parts = (parts[0].float(), parts[1].float(), parts[2])
                roi = None if roi is None else (roi[0].float(), roi[1].float(), roi[2])
                tokens = encoder.readout(*parts, roi_parts=roi)
                got = {"maxsim-10": tokens, "global": tokens[:, :1]}
                if encoder.config.query_layout != "tokens":
                    name = f"maxsim-q{encoder.config.query_tokens_per_image}"
                    got[name] = encoder.query_readout(*parts, roi_parts=roi) if query else tokens
                rows = torch.as_tensor(positions[i : i + batch])
                for name, t in got.items():
                    if name not in out:
                        out[name] = t.new_zeros((len(images), *t.shape[1:]))
                    out[name][rows] = t
    return out


def two_framing_tokens(encoder: RegisEncoder, x: torch.Tensor, query: bool) -> dict[str, torch.Tensor]:
    """A "center-crop+aspect" encoder's scorer tokens of one same-shape batch ``x``: ``maxsim-<T>`` (the T indexed
    tokens, both framings), ``global`` (the two global tokens, one per framing) and ``maxsim-q<m>`` (the query's m
    tokens when ``query``, else the T indexed ones): what a search with that encoder ranks by."""
    cfg = encoder.config
    t1, m1 = cfg.tokens_per_framing, cfg.query_tokens_per_framing
    q = encoder.forward_with_buddies(x, query=True)[0].float()
    tokens = torch.cat([q[:, :t1], q[:, m1 : m1 + t1]], 1)
    return {f"maxsim-{cfg.tokens_per_image}": tokens, "global": tokens[:, [0, t1]],
            f"maxsim-q{cfg.query_tokens_per_image}": q if query else tokens}


def built_scores(config, q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """(Q, N) scores of query tokens (Q, m, D) against gallery tokens (N, T, D) as the index's rerank computes
    them: ``regis.scores.maxsim.maxsim_gemm`` per query with the encoder's ``score_framings`` (two framings with
    ``framing_score`` "best": each image's better framing); one framing: plain MaxSim (``maxsim_scores``)."""
    framings = config.score_framings
    if framings == 1:
        return maxsim_scores(q, g, chunk_size=16)
    with torch.inference_mode():
        return torch.stack([maxsim_gemm(x.float(), g, framings=framings) for x in q]) if len(q) else q.new_zeros(
            (0, len(g)))


def framing_variants(q: torch.Tensor, g: torch.Tensor, mq: int, tg: int) -> dict[str, torch.Tensor]:
    """Other scores of two framings' tokens (query (Q, 2 mq, D), gallery (N, 2 tg, D), each framing's tokens one
    after the other, the central square's first): "|", the better of the per-framing MaxSim scores per pair
    (computed apart, here: the check of the built "best" framing score); "@all", one MaxSim of all the query's
    tokens over all the gallery's (the "union" framing score); "@whole", the query's whole-image tokens against all
    the gallery's; ":crop" and ":whole", one framing alone (query and gallery). {suffix: (Q, N) scores}."""
    crop = maxsim_scores(q[:, :mq], g[:, :tg], chunk_size=16)
    whole = maxsim_scores(q[:, mq:], g[:, tg:], chunk_size=16)
    return {"|": torch.maximum(crop, whole), "@all": maxsim_scores(q, g, chunk_size=16),
            "@whole": maxsim_scores(q[:, mq:], g, chunk_size=16), ":crop": crop, ":whole": whole}


def average_precision(scores: np.ndarray, relevant: np.ndarray) -> float:
    """AP of one ranking: scores (N,), relevant (N,) bool with at least one True; ties broken by index."""
    order = np.argsort(-scores, kind="stable")
    hits = relevant[order]
    ranks = np.flatnonzero(hits) + 1
    return float((np.arange(1, len(ranks) + 1) / ranks).mean())


def query_hits(scores: torch.Tensor, relevance: np.ndarray) -> dict[str, np.ndarray]:
    """Per query: R@1 and R@5 (0 / 1) and AP; scores (Q, N), relevance (Q, N) bool -> {metric: (Q,) float}."""
    s = scores.numpy()
    top = np.argsort(-s, axis=1, kind="stable")[:, :5]
    hit1 = relevance[np.arange(len(s)), top[:, 0]]
    hit5 = np.take_along_axis(relevance, top, axis=1).any(axis=1)
    ap = np.array([average_precision(s[i], relevance[i]) for i in range(len(s))])
    return {"R@1": hit1.astype(float), "R@5": hit5.astype(float), "mAP": ap}


def kind_metrics(scores: torch.Tensor, relevance: np.ndarray, kinds: np.ndarray) -> dict[str, dict[str, float]]:
    """Per query kind (and "all"): Recall@1, Recall@5, mAP and the number of queries."""
    return metrics_of(query_hits(scores, relevance), kinds)


def metrics_of(hits: dict[str, np.ndarray], kinds: np.ndarray) -> dict[str, dict[str, float]]:
    """``query_hits``' arrays -> per kind (and "all"): the means and the number of queries."""
    out = {}
    for kind in ("all", *QUERY_KINDS):
        sel = np.ones(len(kinds), bool) if kind == "all" else kinds == kind
        if sel.any():
            out[kind] = {m: float(v[sel].mean()) for m, v in hits.items()} | {"n": int(sel.sum())}
    return out


def pooled_table(hits: dict[str, dict[str, np.ndarray]], kinds: np.ndarray, photos: np.ndarray,
                 reference: str = "maxsim-10") -> str:
    """Recall@1 pooled over seeds, per kind: n, each scorer's R@1 with its 95 % Wilson interval, and
    ``reference`` minus each other scorer with its 95 % photo-cluster bootstrap interval (``recall_table``).

    ``hits``: {scorer: ``query_hits``' arrays concatenated over seeds}; ``kinds``, ``photos``: (Q,) per query."""
    return recall_table({name: h["R@1"] for name, h in hits.items()}, kinds, photos, reference, reference_first=True)


def recall_table(hits: dict[str, np.ndarray], kinds: np.ndarray, photos: np.ndarray, reference: str,
                 reference_first: bool) -> str:
    """Recall@1 per kind ("all", then each of ``QUERY_KINDS`` present) for each column of ``hits`` ({name: (Q,)
    0/1 over the same queries}) with its 95 % Wilson interval, then the difference of each other column and
    ``reference`` with its 95 % photo-cluster bootstrap interval: ``reference`` minus the other when
    ``reference_first``, else the other minus ``reference``. The figures are ``per_kind_table``'s (unrounded),
    laid out as one text line per kind.

    Raises:
        ValueError: ``per_kind_table``'s (arrays not all (Q,), ``reference`` not in ``hits`` while others are).
    """
    others = [f for f in hits if f != reference]
    pairs = {f: (reference, f) if reference_first else (f, reference) for f in others}
    table = per_kind_table(hits, kinds, photos, list(pairs.values()), kinds_order=QUERY_KINDS, digits=None)
    width = {f: max(26, len(f) + 13) for f in hits}
    dwidth = {f: max(36, len(f) + len(reference) + 12) for f in others}
    label = {f: f"{a} - {b}" for f, (a, b) in pairs.items()}
    head = f"{'kind':11s} {'n':>4s}" + "".join(f"{f + ' R@1 [95 %]':>{width[f]}s}" for f in hits)
    head += "".join(f"{label[f] + ' [95 %]':>{dwidth[f]}s}" for f in others)
    lines = [head]
    for kind, r in table.items():
        row = f"{kind:11s} {r['n']:4d}"
        for f in hits:
            s = r["scorers"][f]
            row += f"{s['r1']:{width[f] - 15}.3f} [{s['lo']:.3f}, {s['hi']:.3f}]"
        for f in others:
            d = r["diffs"][label[f]]
            row += f"{d['d']:+{dwidth[f] - 19}.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"
        lines.append(row)
    return "\n".join(lines)


def evaluate(encoder: RegisEncoder, hard: HardSet, gallery_parts=None, query_parts=None, known=None,
             keep_scores: tuple[str, ...] = (), keep_tokens: bool = False) -> dict:
    """Scores every scorer on the hard set; returns {scorer: {kind: metrics}} plus vectors per image.

    ``known``: {scorer: metrics} already computed on the same backbone pass (the dense reference does not
    depend on the readout), not recomputed. ``keep_scores``: scorers whose (Q, N) score matrices are returned
    too (under "scores"); ``keep_tokens``: their query and gallery tokens too (under "tokens": {scorer:
    (query (Q, m, D), gallery (N, T, D))})."""
    gi, qi = [it.image for it in hard.gallery], [it.image for it in hard.queries]
    if is_aspect(encoder.config):
        g, q = aspect_scorer_tokens(encoder, gi), aspect_scorer_tokens(encoder, qi, query=True)
    else:
        g = scorer_tokens(encoder, gallery_parts or backbone_pass(encoder, gi), backbone_pass(encoder, gi, roi=True))
        q = scorer_tokens(encoder, query_parts or backbone_pass(encoder, qi), backbone_pass(encoder, qi, roi=True),
                          query=True)
    kinds = np.array([it.kind for it in hard.queries])
    known = known or {}
    scores = {name: built_scores(encoder.config, q[name], g[name]) if name != "dense"
              else maxsim_scores(q[name], g[name], chunk_size=16) for name in g if name not in known}
    hits = {name: query_hits(s, hard.relevance) for name, s in scores.items()}
    table = {name: known[name] if name in known else metrics_of(hits[name], kinds) for name in g}
    return {"metrics": table, "vectors_per_image": {name: int(g[name].shape[1]) for name in g},
            "hits": {name: {m: v.tolist() for m, v in h.items()} for name, h in hits.items()},
            **({"scores": {name: scores[name] for name in keep_scores}} if keep_scores else {}),
            **({"tokens": {name: (q[name], g[name]) for name in keep_scores}} if keep_tokens else {})}


def print_table(result: dict, title: str = "") -> None:
    """One row per scorer, R@1 / R@5 / mAP per query kind."""
    kinds = list(next(iter(result["metrics"].values())))
    if title:
        print(title)
    print(f"{'scorer':10s} {'vec':>4s}" + "".join(f"{k + ' (' + str(result['metrics']['global'][k]['n']) + ')':>20s}"
                                                  for k in kinds))
    print(f"{'':15s}" + "".join(f"{'R@1   R@5   mAP':>20s}" for _ in kinds))
    for name, row in result["metrics"].items():
        cells = "".join(f"{row[k]['R@1']:8.3f}{row[k]['R@5']:6.3f}{row[k]['mAP']:6.3f}" for k in kinds)
        print(f"{name:10s} {result['vectors_per_image'][name]:4d}{cells}")


def select_aspect_photos(folder: Path, count: int, min_side: int = 300) -> list[Path]:
    """The ``count`` most elongated portrait and the ``count`` most elongated panoramic photos under ``folder``
    (long side >= ``MIN_ELONGATION`` x the short one, short side >= ``min_side`` px; ties by name). A corpus
    folder of ``regis photos --source debian`` (``corpus.json``): its "scene" photos only.

    Raises:
        ConfigError: the folder holds no such photo.
    """
    from regis.errors import ConfigError

    corpus = folder / "corpus.json"
    if corpus.is_file():
        records = json.loads(corpus.read_text())["photos"]
        sizes = {folder / r["file"]: (r["width"], r["height"]) for r in records if r.get("kind") == "scene"}
    else:
        sizes = {}
        for path in sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp")):
            with Image.open(path) as im:
                sizes[path] = im.size
    tall = [(h / w, p) for p, (w, h) in sizes.items() if h >= MIN_ELONGATION * w and w >= min_side]
    wide = [(w / h, p) for p, (w, h) in sizes.items() if w >= MIN_ELONGATION * h and h >= min_side]
    chosen = [p for group in (tall, wide) for _, p in sorted(group, key=lambda t: (-t[0], t[1].name))[:count]]
    if not chosen:
        raise ConfigError(f"no portrait or panoramic photo (>= {MIN_ELONGATION}:1, short side >= {min_side} px) "
                          f"in {folder}")
    return chosen


def load_hard_set(repeats: int, seed: int, aspect_photos: list[Path] | None = None) -> tuple[HardSet, int]:
    """The hard set from the bundled photos (and ``aspect_photos``, copied under the name
    ``aspect-<file name>``); returns it and the number of photos."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = collect_sample_photos(Path(tmp))
        extra = []
        for src in aspect_photos or []:
            dst = Path(tmp) / "aspect" / f"aspect-{src.name}"
            dst.parent.mkdir(exist_ok=True)
            dst.write_bytes(src.read_bytes())
            extra.append(dst)
        hard = build_hard_set(paths, repeats=repeats, seed=seed, stereo_dir=skimage_data_dir(), aspect_photos=extra)
    return hard, len(paths) + len(extra)


def add_encoder_args(ap: argparse.ArgumentParser) -> None:
    """The encoder options (each default: the encoder's own)."""
    ap.add_argument("--backbone", default="efficientnet-lite0")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--cue-method", default=None)
    ap.add_argument("--roi-size", type=int, default=None)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--frame", default=None, help="center-crop, squash, pad or aspect (default: the encoder's)")
    ap.add_argument("--cue-pooling", default=None, help="mean or gem (CNN; default: the encoder's)")
    ap.add_argument("--roi-image-size", type=int, default=None,
                    help="CNN: side (px) of the second pass the ROI tokens come from; 0: one pass")
    ap.add_argument("--query-layout", default=None,
                    help="tokens or tokens+roi-cues: the query's tokens (default: the encoder's)")


def frame_table(hits: dict[str, np.ndarray], kinds: np.ndarray, photos: np.ndarray, reference: str) -> str:
    """Recall@1 per kind for each frame ({frame: (Q,) 0/1 over the same queries}) and each frame minus
    ``reference`` (``recall_table``)."""
    return recall_table(hits, kinds, photos, reference, reference_first=False)


def compare_frames(args) -> int:
    """``--frames``: the same hard set (per seed) through one encoder per frame; per-query Recall@1 of the
    scorer searches rank by (``maxsim-q15`` for a CNN with the 15-token query, else ``maxsim-10``) and of the
    global token, pooled over the seeds, each frame against the first; JSON with every query's hits.
    ``--combine "A|B"``: also the better of frame A's and B's scores per pair (two framings per image).
    A "center-crop+aspect" frame (F; ranked with its ``framing_score``, "best" for new encoders: ``built_scores``)
    adds the other scores of its tokens (``framing_variants``): "F|", "F@all", "F@whole", "F:crop", "F:whole".
    ``--reuse FILE``: frames whose hits an earlier ``--frames`` JSON of the same seeds holds (the same queries,
    checked) are taken from it, not encoded again."""
    encoders = {f: build_encoder(args.backbone, weights=args.weights, roi_size=args.roi_size,
                                 cue_method=args.cue_method, image_size=args.image_size, frame=f,
                                 cue_pooling=args.cue_pooling, roi_image_size=args.roi_image_size,
                                 query_layout=args.query_layout) for f in args.frames}

    def ranked_by(cfg) -> str:  # the scorer a search with that encoder ranks by
        q = cfg.query_layout != "tokens"
        return f"maxsim-q{cfg.query_tokens_per_image}" if q else f"maxsim-{cfg.tokens_per_image}"

    scorer = ranked_by(next(iter(encoders.values())).config)  # the key every frame's hits are kept under
    reuse = json.loads(args.reuse.read_text()) if args.reuse else None
    if reuse and (reuse["seeds"] != args.seed or reuse["scorer"] != scorer):
        raise SystemExit(f"--reuse {args.reuse}: seeds {reuse['seeds']} / scorer {reuse['scorer']}, not {args.seed}")
    aspect = select_aspect_photos(args.aspect_photos, args.aspect_count) if args.aspect_photos else None
    if aspect:
        print("aspect photos: " + ", ".join(p.name for p in aspect))
    out = {"command": "python " + " ".join(sys.argv), "scorer": scorer, "seeds": args.seed,
           "aspect_photos": [p.name for p in aspect or []],
           "encoders": {f: e.config.model_dump() for f, e in encoders.items()},
           "weights": next(iter(encoders.values())).weights_info.source, "queries": [], "hits": {}, "metrics": {}}
    combos = [c.split("|") for c in args.combine or []]
    duals = [f for f, e in encoders.items() if is_two_framings(e.config)]
    variants = ("|", "@all", "@whole", ":crop", ":whole")
    labels = [*encoders, *(args.combine or []), *(f + v for f in duals for v in variants)]
    hits: dict[str, dict[str, list]] = {f: {scorer: [], "global": []} for f in labels}
    for seed in args.seed:
        hard, n_photos = load_hard_set(args.repeats, seed, aspect)
        print(f"seed {seed}: {n_photos} photos, gallery {len(hard.gallery)}, {len(hard.queries)} queries", flush=True)
        out["queries"] += [{"seed": seed, "kind": q.kind, "photo": q.photo} for q in hard.queries]
        kept = {}
        for f, enc in encoders.items():
            if reuse and f in reuse["hits"]:
                if [{"seed": seed, "kind": q.kind, "photo": q.photo} for q in hard.queries] != reuse["queries"]:
                    raise SystemExit(f"--reuse {args.reuse}: other queries than seed {seed}'s")
                for name in (scorer, "global"):
                    hits[f][name] += reuse["hits"][f][name]
                print(f"  {f}: hits from {args.reuse}", flush=True)
                continue
            t0 = time.perf_counter()
            own = ranked_by(enc.config)
            dual = f in duals
            result = evaluate(enc, hard, keep_scores=(own, "global") if combos or dual else (), keep_tokens=dual)
            kept[f] = result.pop("scores", None)
            for name in (scorer, "global"):
                hits[f][name] += result["hits"][own if name == scorer else name]["R@1"]
            if dual:
                cfg = enc.config
                for name, (q, g) in result.pop("tokens").items():
                    mq, tg = (cfg.query_tokens_per_framing, cfg.tokens_per_framing) if name == own else (1, 1)
                    for v, sc in framing_variants(q, g, mq, tg).items():
                        hits[f + v][scorer if name == own else name] += query_hits(sc, hard.relevance)["R@1"].tolist()
            result["metrics"] = {(scorer if k == own else k): v for k, v in result["metrics"].items()}
            out["metrics"].setdefault(str(seed), {})[f] = result["metrics"]
            print(f"  {f}: {time.perf_counter() - t0:.0f} s; all R@1 {result['metrics'][scorer]['all']['R@1']:.3f}",
                  flush=True)
        for combo in combos:  # tokens of two framings per image: the better of the two MaxSim scores
            for name in (scorer, "global"):
                best = torch.stack([kept[f][name] for f in combo]).amax(0)
                hits["|".join(combo)][name] += query_hits(best, hard.relevance)["R@1"].tolist()
    kinds = np.array([q["kind"] for q in out["queries"]])
    photos = np.array([f"{q['photo']}" for q in out["queries"]])
    reference = args.frames[0]
    for name in (scorer, "global"):
        table = frame_table({f: np.asarray(hits[f][name]) for f in hits}, kinds, photos, reference)
        print(f"\nRecall@1 ({name}) pooled over seeds {' '.join(map(str, args.seed))}, each frame minus {reference}:")
        print(table)
    out["hits"] = {f: {name: [int(v) for v in h] for name, h in hs.items()} for f, hs in hits.items()}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out) + "\n")
    return 0


def pool_frames(files: list[Path]) -> int:
    """``--pool``: the frame tables of several ``--frames`` JSON files (other seeds of the same set) together,
    for the frames (and combinations) every file has."""
    docs = [json.loads(Path(f).read_text()) for f in files]
    scorer = docs[0]["scorer"]
    frames = [f for f in docs[0]["hits"] if all(f in d["hits"] for d in docs)]  # those every file has
    queries = [q for d in docs for q in d["queries"]]
    kinds = np.array([q["kind"] for q in queries])
    photos = np.array([q["photo"] for q in queries])
    seeds = [s for d in docs for s in d["seeds"]]
    for name in (scorer, "global"):
        hits = {f: np.concatenate([np.asarray(d["hits"][f][name]) for d in docs]) for f in frames}
        print(f"\nRecall@1 ({name}) pooled over seeds {' '.join(map(str, seeds))}, each frame minus {frames[0]}:")
        print(frame_table(hits, kinds, photos, frames[0]))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_encoder_args(ap)
    ap.add_argument("--repeats", type=int, default=3, help="queries per (photo, kind)")
    ap.add_argument("--seed", type=int, nargs="+", default=[0],
                    help="one or more seeds; with several, a table per seed, then Recall@1 pooled over them with "
                         "95 %% intervals (Wilson; differences: bootstrap over the source photos)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (the machine is shared)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--aspect-photos", type=Path, default=None,
                    help="folder of portrait / panoramic photos (a `regis photos --source debian` corpus) for "
                         "the end-crop and mid-crop kinds")
    ap.add_argument("--aspect-count", type=int, default=8, help="photos of each orientation taken from it")
    ap.add_argument("--frames", nargs="+", default=None,
                    help="compare these frames (the first is the reference) on the same set: Recall@1 per kind "
                         "with intervals; --json keeps every query's hits")
    ap.add_argument("--pool", nargs="+", type=Path, default=None, help="pool the tables of --frames JSON files")
    ap.add_argument("--reuse", type=Path, default=None,
                    help="with --frames: take the hits of the frames this earlier --frames JSON (same seeds) holds "
                         "from it instead of encoding them again")
    ap.add_argument("--combine", nargs="+", default=None,
                    help="with --frames: also score 'A|B': tokens of frames A and B per image, the better of the two "
                         "MaxSim scores per (query, gallery image) pair")
    args = ap.parse_args()

    if args.pool:
        return pool_frames(args.pool)
    torch.set_num_threads(args.threads)
    if args.frames:
        return compare_frames(args)
    encoder = build_encoder(args.backbone, weights=args.weights, roi_size=args.roi_size,
                            cue_method=args.cue_method, image_size=args.image_size, frame=args.frame,
                            cue_pooling=args.cue_pooling, roi_image_size=args.roi_image_size,
                            query_layout=args.query_layout)
    cfg = encoder.config
    aspect = select_aspect_photos(args.aspect_photos, args.aspect_count) if args.aspect_photos else None
    if aspect:
        print("aspect photos: " + ", ".join(p.name for p in aspect))
    runs, kinds, photos = [], [], []
    for seed in args.seed:
        t0 = time.perf_counter()
        hard, n_photos = load_hard_set(args.repeats, seed, aspect)
        result = evaluate(encoder, hard)
        elapsed = time.perf_counter() - t0
        print(f"hard cases: {n_photos} photos, gallery {len(hard.gallery)} items (16 per photo), "
              f"{len(hard.queries)} queries, {hard.relevance.sum(1).mean():.2f} relevant items per query")
        print(f"encoder {cfg.model_dump_json()} ({encoder.weights_info.source}); seed {seed}; "
              f"{platform.machine()}, torch {torch.__version__}, {elapsed:.0f} s")
        print_table(result)
        runs.append({"command": "python " + " ".join(sys.argv), "photos": n_photos,
                     "aspect_photos": [p.name for p in aspect or []], "gallery": len(hard.gallery),
                     "queries": len(hard.queries), "repeats": args.repeats, "seed": seed,
                     "encoder": cfg.model_dump(), "weights": encoder.weights_info.source, **result})
        kinds += [it.kind for it in hard.queries]
        photos += [it.photo for it in hard.queries]
    if len(runs) > 1:
        hits = {name: {m: np.concatenate([np.asarray(r["hits"][name][m]) for r in runs]) for m in ("R@1",)}
                for name in runs[0]["hits"]}
        print(f"\nRecall@1 pooled over seeds {' '.join(map(str, args.seed))} (n queries per kind):")
        print(pooled_table(hits, np.array(kinds), np.array(photos)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        runs = [{k: v for k, v in r.items() if k != "hits"} for r in runs]  # per-query hits: in memory only
        args.json.write_text(json.dumps(runs[0] if len(runs) == 1 else {"seeds": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
