"""Near-duplicate groups on a labelled set of real photos: calibrate the thresholds, measure issue 26's targets.

The set (``regis.data.near_duplicates``): every photo becomes a copy family (the photo, a byte copy, a pixel copy,
4 edited copies, 3 crops of 10-70 % of the area), a scene family (3 shots of the scene by a moved camera and an
edited copy of one), or, for 2 in 3 of the small object photos, a single unrelated image. Photos: the Debian corpus
of issue 22 (``regis photos --source debian``: 135 scenes, 411 object photos, split by photo into train / val /
test), or the 21 photos bundled with scikit-image, scikit-learn and matplotlib (+ scikit-image's real stereo pair).

The set is indexed with the default encoder, and ``regis.duplicates`` runs on it once with a low floor (0.30; each
image keeps its 6 best pairs, as a shipped run does), keeping every candidate pair's evidence; thresholds are then
applied to that table:

- ``--calibrate``: fit the thresholds on the calibration split (Debian train + val photos) by a grid search: the
  highest edited-copy recall + crop-direction accuracy with edited-copy precision >= 0.995 and at most 0.5 % of
  same-scene pairs called duplicates; the middle of the best plateau. Written to ``--calibration-out`` (the file
  the package ships for the backbone).
- then every split is measured with those thresholds (the test split, photos never used to fit: the figures to
  quote), and the one-global-vector baseline beside them: the global token's cosine with the threshold that gives
  the same recall of duplicate pairs (exact + edited copies), counting its false duplicate pairs.

Figures: edited copies (precision, recall, as pairs: a pair counts when regis reports that very pair as an edited
copy); crops (the containing image named correctly, over every crop pair of the set; and over those reported as
crops); same-scene pairs put into one duplicate group (through any chain of copies); false duplicate pairs against
the global vector at equal recall.

Usage:
    python scripts/eval_duplicates.py --set debian --calibrate \\
        --calibration-out regis/duplicates/calibrations/efficientnet-lite0.json \\
        --json docs/results/duplicates/debian.json
    python scripts/eval_duplicates.py --set bundled --json docs/results/duplicates/bundled.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from regis.data.near_duplicates import LabelledSet, build_labelled_set, labelled_pairs  # noqa: E402
from regis.duplicates import relations as rel  # noqa: E402
from regis.duplicates.config import DuplicateConfig, parse_overrides, shipped_calibration  # noqa: E402
from regis.duplicates.groups import group_pairs  # noqa: E402
from regis.duplicates.store import PairTable  # noqa: E402

RUN_FLOOR = 0.30  # the evaluation run keeps every pair above this; thresholds then filter
# the run keeps each image's best `neighbours` pairs as a shipped run does (DuplicateConfig's default, 6 since
# 2026-11-30, 16 before; the calibration does not vary it): its best pairs above RUN_FLOOR are its best above any
# higher floor. Until 2026-11-29 (night) the run kept 32, so the figures counted candidate pairs a shipped run never
# has
RUN_NEIGHBOURS = DuplicateConfig().neighbours
LABELS = {"exact": 0, "edited": 1, "crop": 2, "scene": 3, "overlap": 4, "unrelated": 5, "ambiguous": 6}
MAX_PRECISION_LOSS = 0.005  # calibration: edited-copy precision >= 1 - this ...
MAX_SCENE_AS_COPY = 0.005  # ... and at most this fraction of same-scene pairs called duplicates
MIN_CROP_PRECISION = 0.85  # stages 4-5: at least this share of the reported crops true crops


# ------------------------------------------------------------------ the set
def debian_photos(corpus: Path, work: Path) -> tuple[list[Path], dict[str, str], dict[str, str]]:
    """Links to the Debian corpus photos with unique names; their roles and splits ("calibration" / "test")."""
    from regis.data.debian_photos.corpus import read_corpus

    _, records = read_corpus(corpus)
    links = work / "photos"
    links.mkdir(parents=True, exist_ok=True)
    photos, roles, splits = [], {}, {}
    scenes = sorted((r for r in records if r.kind == "scene"), key=lambda r: r.file)
    objects = sorted((r for r in records if r.kind != "scene"), key=lambda r: r.file)
    for n, r in enumerate(scenes):
        roles[r.file] = "copy" if n % 2 == 0 else "scene"
    for n, r in enumerate(objects):
        roles[r.file] = "copy" if n % 3 == 0 else "single"
    out_roles = {}
    for r in scenes + objects:
        name = r.file.replace("photos/", "", 1).replace("/", "--")
        link = links / name
        if not link.exists():
            link.symlink_to((corpus / r.file).resolve())
        photos.append(link)
        out_roles[name] = roles[r.file]
        splits[name] = "test" if r.split == "test" else "calibration"
    return photos, out_roles, splits


def bundled_photos(work: Path) -> tuple[list[Path], dict[str, str], dict[str, str], Path | None]:
    """The bundled photos (all "test": never used to fit), and the stereo pair's right image."""
    from regis.data.hard_cases import skimage_data_dir
    from regis.data.sample_photos import collect_sample_photos

    photos = collect_sample_photos(work / "photos")
    right = skimage_data_dir()
    return photos, {}, {p.name: "test" for p in photos}, (right / "motorcycle_right.png") if right else None


def make_set(args) -> tuple[LabelledSet, dict[str, str], Path]:
    """Build (or reuse) the labelled set and its index; returns the set, family -> split, the index dir."""
    work = Path(args.work).expanduser() / f"{args.set}-s{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    stereo = None
    if args.set == "debian":
        photos, roles, splits = debian_photos(Path(args.corpus), work)
    else:
        photos, roles, splits, stereo = bundled_photos(work)
    files = work / "files"
    if not (files / "labels.json").is_file():
        t = time.time()
        build_labelled_set(photos, files, seed=args.seed, roles=roles, stereo_right=stereo)
        print(f"labelled set written in {time.time() - t:.0f} s", file=sys.stderr)
    labelled = LabelledSet.load(files)
    index = work / "index"
    if not (index / "CURRENT").is_file():
        from indexer.build import BuildOptions, build_index
        from regis.index_encoder import encoder_for

        # what `regis index build` gives a new index of this backbone: two framings for a CNN (centre-all join)
        encoder = encoder_for(None, args.backbone, None, False, None, None, "cpu")
        report = build_index(files, index, encoder, BuildOptions(progress=True, num_workers=args.workers))
        print(f"indexed {report.added} images in {report.total_s:.0f} s", file=sys.stderr)
    return labelled, splits, index


# ------------------------------------------------------------------ the evaluation table
@dataclass
class Evaluation:
    """Every candidate pair with its label, and every labelled pair, for one split."""

    table: PairTable  # the candidate pairs of the split (both images in it)
    label: np.ndarray  # (p,) label code of each candidate pair
    small_is_a: np.ndarray  # (p,) for crop pairs: a is the contained image
    counts: dict  # labelled pairs of the split per label (found or not)
    images: np.ndarray  # image ids of the split
    by_id: dict  # image id -> Item
    pair_labels: dict  # (id a, id b) -> (label, container id)
    global_tokens: np.ndarray  # (n, D) the global token of every image of the split (rows of ``images``)
    small_side: np.ndarray  # (p,) the longest side (px) of the smaller image of each candidate pair


def as_run(ev: Evaluation, cfg: DuplicateConfig) -> Evaluation:
    """``ev`` as a run with ``cfg`` would have left it: the stored run searched every pair by template, a run with
    ``template_max_side`` only the pairs whose smaller image is below it (``finder.template_sized``)."""
    if cfg.template_max_side is None:
        return ev
    t = ev.table.take(np.ones(len(ev.table), dtype=bool))
    t.located = t.located & (ev.small_side < cfg.template_max_side)
    return Evaluation(t, ev.label, ev.small_is_a, ev.counts, ev.images, ev.by_id, ev.pair_labels, ev.global_tokens,
                      ev.small_side)


def evaluation(labelled: LabelledSet, splits: dict[str, str], snapshot, table: PairTable, split: str) -> Evaluation:
    """The evaluation table of one split (images whose photo is in ``split``)."""
    by_file = labelled.by_file()
    recs = snapshot.table.get_many(snapshot.store.live_ids.tolist())
    id_of = {r.path: i for i, r in recs.items()}
    items = [it for it in labelled.items if splits.get(it.family) == split]
    images = np.array(sorted(id_of[it.file] for it in items), dtype=np.int64)
    by_id = {i: by_file[recs[i].path] for i in images.tolist()}
    pairs = {}
    for (fa, fb), (lab, cont) in labelled_pairs(items).items():
        a, b = sorted((id_of[fa], id_of[fb]))
        pairs[(a, b)] = (lab, id_of[cont] if cont else -1)
    keep = np.isin(table.a, images) & np.isin(table.b, images)
    sub = table.take(keep)
    label = np.full(len(sub), LABELS["unrelated"], dtype=np.int8)
    small_is_a = np.zeros(len(sub), dtype=bool)
    for k in range(len(sub)):
        lab, cont = pairs.get((int(sub.a[k]), int(sub.b[k])), ("unrelated", -1))
        label[k] = LABELS[lab]
        small_is_a[k] = cont == int(sub.b[k])
    counts = {name: 0 for name in LABELS}
    for lab, _ in pairs.values():
        counts[lab] += 1
    glob = snapshot.store.get(images)[:, 0].astype(np.float32)
    side = {i: max(r.width, r.height) for i, r in recs.items()}
    small_side = np.array([min(side[int(a)], side[int(b)]) for a, b in zip(sub.a, sub.b, strict=True)], np.int64)
    return Evaluation(sub, label, small_is_a, counts, images, by_id, pairs, glob, small_side)


def pair_metrics(ev: Evaluation, relation: np.ndarray, container: np.ndarray, cfg: DuplicateConfig) -> dict:
    """Edited-copy precision / recall, crop direction, same-scene pairs called copies (pair level)."""
    lab = ev.label
    pred_edit = relation == rel.EDITED
    tp = int((pred_edit & (lab == LABELS["edited"])).sum())
    fp = int((pred_edit & ~np.isin(lab, [LABELS["edited"], LABELS["exact"], LABELS["ambiguous"]])).sum())
    n_edit = ev.counts["edited"]
    dup = np.isin(relation, rel.DUPLICATE_CODES)
    dup_true = np.isin(lab, [LABELS["edited"], LABELS["exact"]])
    dup_fp = int((dup & ~dup_true & (lab != LABELS["ambiguous"])).sum())
    dup_tp = int((dup & dup_true).sum())
    n_dup = ev.counts["edited"] + ev.counts["exact"]
    crop = lab == LABELS["crop"]
    right = crop & (relation == rel.CROP) & (container == np.where(ev.small_is_a, ev.table.b, ev.table.a))
    reported = crop & (relation == rel.CROP)
    scene = lab == LABELS["scene"]
    return {
        "edited": {"labelled_pairs": n_edit, "reported": int(pred_edit.sum()), "true": tp, "false": fp,
                   "precision": tp / max(1, tp + fp), "recall": tp / max(1, n_edit)},
        "duplicates": {"labelled_pairs": n_dup, "true": dup_tp, "false": dup_fp, "recall": dup_tp / max(1, n_dup),
                       "precision": dup_tp / max(1, dup_tp + dup_fp)},
        "crops": {"labelled_pairs": ev.counts["crop"], "found": int(crop.sum()),
                  "reported_as_crop": int(reported.sum()), "direction_right": int(right.sum()),
                  "direction_right_of_all": int(right.sum()) / max(1, ev.counts["crop"]),
                  "direction_right_of_reported": int(right.sum()) / max(1, int(reported.sum())),
                  "all_reported_as_crop": int((relation == rel.CROP).sum()),
                  "precision": int(right.sum()) / max(1, int((relation == rel.CROP).sum())),
                  "reported_by_label": {name: int(((relation == rel.CROP) & (lab == code)).sum())
                                        for name, code in LABELS.items()}},
        "scene": {"labelled_pairs": ev.counts["scene"], "called_duplicates": int((scene & dup).sum()),
                  "fraction_called_duplicates": int((scene & dup).sum()) / max(1, ev.counts["scene"])},
    }


def group_metrics(ev: Evaluation, config: DuplicateConfig) -> dict:
    """Through groups: same-scene pairs that end up in one duplicate group; labelled duplicate pairs in one group;
    false pairs in groups (two images in one group that are neither exact nor edited copies)."""
    grouping = group_pairs(ev.table, config)
    group_of = {}
    for g_id, g in enumerate(grouping.groups):
        if g.is_duplicate:
            for i in g.images:
                group_of[i] = g_id
    together = {k for k, (lab, _) in ev.pair_labels.items()
                if group_of.get(k[0], -1) == group_of.get(k[1], -2)}
    scene = [k for k, (lab, _) in ev.pair_labels.items() if lab == "scene"]
    dup = [k for k, (lab, _) in ev.pair_labels.items() if lab in ("edited", "exact")]
    in_groups = sum(len(g.images) * (len(g.images) - 1) // 2 for g in grouping.groups if g.is_duplicate)
    true_in_groups = sum(1 for k in dup if k in together)
    amb = sum(1 for k, (lab, _) in ev.pair_labels.items() if lab == "ambiguous" and k in together)
    shots = {i for k in scene for i in k}
    shots_grouped = {i for k in scene if k in together for i in k}
    return {"scene_pairs_in_one_group": sum(1 for k in scene if k in together),
            "scene_pair_fraction_in_one_group": sum(1 for k in scene if k in together) / max(1, len(scene)),
            "scene_images_grouped_with_another_shot": len(shots_grouped), "scene_images": len(shots),
            "duplicate_pairs_in_one_group": true_in_groups, "duplicate_pair_recall_through_groups":
                true_in_groups / max(1, len(dup)),
            "false_pairs_in_groups": in_groups - true_in_groups - amb,
            "duplicate_groups": sum(1 for g in grouping.groups if g.is_duplicate)}


def global_baseline(ev: Evaluation, recall: float) -> dict:
    """One global vector (the encoder's global token), cosine threshold set for the same recall of labelled
    duplicate pairs (exact + edited copies); its false duplicate pairs over every pair of the split."""
    g = ev.global_tokens
    sims = g @ g.T
    iu = np.triu_indices(len(g), 1)
    s = sims[iu]
    ids = ev.images
    lab = np.full(len(s), LABELS["unrelated"], dtype=np.int8)
    pos = {k: LABELS[v[0]] for k, v in ev.pair_labels.items()}
    a, b = ids[iu[0]], ids[iu[1]]
    index = {(int(x), int(y)): k for k, (x, y) in enumerate(zip(a, b, strict=True)) if (int(x), int(y)) in pos}
    for key, k in index.items():
        lab[k] = pos[key]
    dup = np.isin(lab, [LABELS["edited"], LABELS["exact"]])
    neg = ~dup & (lab != LABELS["ambiguous"])
    n_dup = int(dup.sum())
    order = np.sort(s[dup])[::-1]
    need = int(np.ceil(recall * n_dup))
    tau = float(order[need - 1]) if need >= 1 else float("inf")
    fp = int((neg & (s >= tau)).sum())
    fp_scene = int((neg & (s >= tau) & (lab == LABELS["scene"])).sum())
    fp_crop = int((neg & (s >= tau) & (lab == LABELS["crop"])).sum())
    return {"threshold": tau, "recall": int((dup & (s >= tau)).sum()) / max(1, n_dup), "false_pairs": fp,
            "false_scene_pairs": fp_scene, "false_crop_pairs": fp_crop, "pairs_scored": int(len(s))}


def measure(ev: Evaluation, config: DuplicateConfig) -> dict:
    """Every figure of one split under ``config``."""
    ev = as_run(ev, config)
    relation, container = rel.classify(ev.table, config)
    out = pair_metrics(ev, relation, container, config)
    out["groups"] = group_metrics(ev, config)
    base = global_baseline(ev, out["duplicates"]["recall"])
    ours = out["duplicates"]["false"]
    out["global_vector"] = {**base, "regis_false_pairs": ours,
                            "fewer_false_pairs": (base["false_pairs"] / ours) if ours else None}
    out["images"] = int(len(ev.images))
    return out


# ------------------------------------------------------------------ calibration
GRID = {
    "floor": [0.35, 0.40, 0.45],
    "min_inliers": [8, 10, 12, 15, 20],
    "edited_min_cover": [round(x, 2) for x in np.arange(0.70, 0.93, 0.02)],
    "edited_max_cover": [round(x, 2) for x in np.arange(0.84, 0.99, 0.02)],
    "crop_cover": [0.70, 0.75, 0.80, 0.85, 0.90],
    "token_edited": [0.90, 0.93, 0.95, 0.97, 0.99],
    "token_scene": [0.50, 0.60, 0.70, 0.80],
}


# stage 2: the token rule beside the geometry (None: off), searched with the stage-1 thresholds fixed
TOKEN_GRID = {
    "token_edited_verified": [None, 0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98],
}
# stage 3: the verification gate, the highest that costs at most VERIFY_GATE_LOSS of the objective
VERIFY_FLOORS = [0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80]
VERIFY_GATE_LOSS = 0.002
# stage 4: the template search's crop rule (regis.duplicates.template), then its gate like stage 3
TEMPLATE_GRID = {
    "template_ncc": [round(x, 3) for x in np.arange(0.70, 0.976, 0.025)],
    "template_margin": [0.0, 0.05, 0.10, 0.15, 0.20, 0.30],
    "template_max_area": [0.75, 0.85, 0.95],
}
TEMPLATE_FLOORS = [0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70]
# stage 4b: the template search's size gate (template_max_side, px), the smallest within VERIFY_GATE_LOSS
TEMPLATE_SIDES = [1024, 800, 640, 480, 400, 320]
# stage 4c: the cheap first match before the full one (geometry.prefilter), the highest within VERIFY_GATE_LOSS
PREFILTERS = [5, 8, 10, 12, 15, 20, 25, 30]
PLATEAU = 0.002  # settings within this of the best objective form its plateau


def _score(ev: Evaluation, cfg: DuplicateConfig, min_crop_precision: float = 0.0) -> float | None:
    """The objective (edited-copy recall + crop-direction accuracy), None when a constraint fails."""
    ev = as_run(ev, cfg)
    relation, container = rel.classify(ev.table, cfg)
    m = pair_metrics(ev, relation, container, cfg)
    ok = (m["edited"]["precision"] >= 1 - MAX_PRECISION_LOSS
          and m["scene"]["fraction_called_duplicates"] <= MAX_SCENE_AS_COPY
          and m["crops"]["precision"] >= min_crop_precision)
    return m["edited"]["recall"] + m["crops"]["direction_right_of_all"] if ok else None


def _search(ev: Evaluation, base: DuplicateConfig, grid: dict, min_crop_precision: float = 0.0) -> tuple[dict, dict]:
    """Every setting of ``grid`` on ``base``; the centre of the best plateau (None values: ranked as the
    lowest) and the search's facts."""
    names = list(grid)
    scored = []
    for values in itertools.product(*(grid[n] for n in names)):
        got = _score(ev, base.model_copy(update=dict(zip(names, values, strict=True))), min_crop_precision)
        if got is not None:
            scored.append((got, values))
    if not scored:
        raise SystemExit("no threshold setting meets the precision and same-scene constraints on this split")
    best = max(s for s, _ in scored)
    plateau = [v for s, v in scored if s >= best - PLATEAU]
    pos = np.array([[grid[n].index(x) / max(1, len(grid[n]) - 1) for n, x in zip(names, v, strict=True)]
                    for v in plateau], dtype=np.float64)  # positions in the grid, 0..1 per axis
    pick = plateau[int(np.argmin(((pos - pos.mean(axis=0)) ** 2).sum(axis=1)))]
    chosen = dict(zip(names, pick, strict=True))
    chosen = {n: (v if v is None or isinstance(v, int) else round(float(v), 2)) for n, v in chosen.items()}
    return chosen, {"settings_tried": int(np.prod([len(grid[n]) for n in names])),
                    "settings_meeting_constraints": len(scored), "best_objective": best,
                    "plateau_size": len(plateau), "chosen": chosen}


def calibrate(ev: Evaluation, base: DuplicateConfig) -> tuple[DuplicateConfig, dict]:
    """Five stages on one split: ``GRID`` (geometry and floors), ``TOKEN_GRID`` (token rules, the rest fixed),
    the verification gate, ``TEMPLATE_GRID`` (the template search's crop rule), its gate and its size gate
    (``TEMPLATE_SIDES``), the prefilter, then the verification ceiling (lossless); returns the chosen config and
    each stage's facts."""
    chosen1, facts1 = _search(ev, base, GRID)
    cfg = base.model_copy(update=chosen1)
    chosen2, facts2 = _search(ev, cfg, TOKEN_GRID)
    cfg = cfg.model_copy(update=chosen2)
    ref = _score(ev, cfg)
    gate = None
    tried = {}
    for v in VERIFY_FLOORS:  # the highest gate whose objective stays within VERIFY_GATE_LOSS
        got = _score(ev, cfg.model_copy(update={"verify_floor": v}))
        tried[str(v)] = {"objective": got, "verified_fraction": verified_fraction(ev.table, cfg, v)}
        if got is not None and ref is not None and got >= ref - VERIFY_GATE_LOSS:
            gate = v
    cfg = cfg.model_copy(update={"verify_floor": gate})
    chosen4, facts4 = _search(ev, cfg, TEMPLATE_GRID, MIN_CROP_PRECISION)
    cfg = cfg.model_copy(update=chosen4)
    ref4 = _score(ev, cfg, MIN_CROP_PRECISION)
    t_gate, t_tried = None, {}
    for v in TEMPLATE_FLOORS:  # the highest template gate whose objective stays within VERIFY_GATE_LOSS
        got = _score(ev, cfg.model_copy(update={"template_floor": v}), MIN_CROP_PRECISION)
        t_tried[str(v)] = {"objective": got, "located_fraction": located_fraction(ev.table, cfg, v)}
        if got is not None and ref4 is not None and got >= ref4 - VERIFY_GATE_LOSS:
            t_gate = v
    cfg = cfg.model_copy(update={"template_floor": t_gate})
    ref_side = _score(ev, cfg, MIN_CROP_PRECISION)
    side_gate, side_tried = None, {}
    for v in TEMPLATE_SIDES:  # the smallest size gate whose objective stays within VERIFY_GATE_LOSS
        got = _score(ev, cfg.model_copy(update={"template_max_side": v}), MIN_CROP_PRECISION)
        side_tried[str(v)] = {"objective": got, "located_fraction": located_fraction(
            ev.table, cfg, cfg.template_floor, ev.small_side < v)}
        if got is not None and ref_side is not None and got >= ref_side - VERIFY_GATE_LOSS:
            side_gate = v
    cfg = cfg.model_copy(update={"template_max_side": side_gate})
    ref_pre = _score(ev, cfg, MIN_CROP_PRECISION)
    pre_gate, pre_tried = None, {}
    for v in PREFILTERS:
        got = _score(ev, cfg.model_copy(update={"prefilter": v}), MIN_CROP_PRECISION)
        pre_tried[str(v)] = {"objective": got, "matched_in_full_fraction": float(
            (ev.table.pre[to_verify_rows(ev.table, cfg)] >= v).mean()) if len(ev.table) else 0.0}
        if got is not None and ref_pre is not None and got >= ref_pre - VERIFY_GATE_LOSS:
            pre_gate = v
    cfg = cfg.model_copy(update={"prefilter": pre_gate})
    # stage 5: pairs the tokens make edited copies whatever verification says are not verified (lossless)
    ceiling = (cfg.token_edited if cfg.token_edited_verified is not None
               and cfg.token_edited_verified <= cfg.token_edited else None)
    before = _score(ev, cfg, MIN_CROP_PRECISION)
    cfg = cfg.model_copy(update={"verify_ceiling": ceiling})
    return cfg, {"verify_ceiling": {"chosen": ceiling, "objective_before": before,
                                    "objective_after": _score(ev, cfg, MIN_CROP_PRECISION),
                                    "verified_fraction_after": verified_fraction(ev.table, cfg, cfg.verify_floor)},
                 "geometry": facts1, "tokens": facts2,
                 "verify_floor": {"objective_without": ref, "tried": tried, "chosen": gate,
                                  "max_loss": VERIFY_GATE_LOSS},
                 "template": facts4,
                 "template_floor": {"objective_without": ref4, "tried": t_tried, "chosen": t_gate,
                                    "max_loss": VERIFY_GATE_LOSS},
                 "template_max_side": {"objective_without": ref_side, "tried": side_tried, "chosen": side_gate,
                                       "max_loss": VERIFY_GATE_LOSS},
                 "prefilter": {"objective_without": ref_pre, "tried": pre_tried, "chosen": pre_gate,
                               "max_loss": VERIFY_GATE_LOSS}}


def to_verify_rows(table: PairTable, cfg: DuplicateConfig) -> np.ndarray:
    """The rows a run with ``cfg`` verifies (``finder.to_verify``) among those above its floor."""
    from regis.duplicates.finder import to_verify

    rows = to_verify(table, cfg)
    return rows[np.maximum(table.s_ab[rows], table.s_ba[rows]) >= cfg.floor]


ABLATIONS = {"verify_floor": {"verify_floor": None}, "token_edited_verified": {"token_edited_verified": None},
             "both": {"verify_floor": None, "token_edited_verified": None},
             "template": {"template_ncc": None}, "template_floor": {"template_floor": None},
             "verify_ceiling": {"verify_ceiling": None}, "prefilter": {"prefilter": None},
             "template_max_side": {"template_max_side": None}}


def ablations(ev: Evaluation, config: DuplicateConfig) -> dict:
    """Edited-copy and crop figures of one split with each of the second round's rules off (same stored pairs)."""
    out = {}
    for name, off in ABLATIONS.items():
        cfg = config.model_copy(update=off)
        run = as_run(ev, cfg)
        relation, container = rel.classify(run.table, cfg)
        m = pair_metrics(run, relation, container, cfg)
        out[name] = {"edited_true": m["edited"]["true"], "edited_false": m["edited"]["false"],
                     "edited_recall": m["edited"]["recall"], "crops_right": m["crops"]["direction_right"],
                     "crops_right_of_all": m["crops"]["direction_right_of_all"],
                     "scene_called_duplicates": m["scene"]["called_duplicates"]}
    return out


def verified_fraction(table: PairTable, cfg: DuplicateConfig, verify_floor: float | None) -> float:
    """The fraction of candidate pairs (at or above ``cfg.floor``, not exact) a run would verify with this gate."""
    s_hi = np.maximum(table.s_ab, table.s_ba)
    cand = (s_hi >= cfg.floor) & ~table.exact
    gate = -2.0 if verify_floor is None else verify_floor
    below = (np.minimum(table.s_ab, table.s_ba) < cfg.verify_ceiling) if cfg.verify_ceiling is not None else True
    return float((cand & (s_hi >= gate) & below).sum() / max(1, cand.sum()))


def located_fraction(table: PairTable, cfg: DuplicateConfig, template_floor: float | None,
                     sized: np.ndarray | None = None) -> float:
    """The fraction of candidate pairs (at or above ``cfg.floor``, not exact) a run would search by template with
    this gate (verified-gated, fewer than ``min_inliers`` inliers, file readable; only ``sized`` pairs when
    given: ``template_max_side``)."""
    s_hi = np.maximum(table.s_ab, table.s_ba)
    cand = (s_hi >= cfg.floor) & ~table.exact
    gate = max(-2.0 if cfg.verify_floor is None else cfg.verify_floor,
               -2.0 if template_floor is None else template_floor)
    want = cand & (s_hi >= gate) & table.files & (table.inliers < cfg.min_inliers)
    if sized is not None:
        want &= sized
    return float(want.sum() / max(1, cand.sum()))


def locate_prefiltered(snapshot, run, cfg: DuplicateConfig) -> dict | None:
    """Template search also on the verified pairs the highest ``PREFILTERS`` value would keep from the full
    match (the run matched every pair in full, and searched only the ones it left unverified), so that the
    calibration sees what a run with a prefilter would find; the table is stored again."""
    from regis.duplicates import finder, store

    t = run.stored.table
    want = np.zeros(len(t), dtype=bool)
    want[finder.to_verify(t, cfg)] = True
    rows = np.flatnonzero(want & t.files & ~t.located & (t.pre >= 0) & (t.pre < max(PREFILTERS)))
    if len(rows) == 0:
        return None
    got = finder._verify(t, finder._live(snapshot)[2], finder.index_file_resolver(snapshot), cfg,
                         os.cpu_count() or 1, None, rows, match=False)
    store.save(snapshot.index_dir, run.stored)
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", choices=["debian", "bundled"], default="debian")
    p.add_argument("--corpus", default="/work/cache/photos", help="the Debian corpus (regis photos --source debian)")
    p.add_argument("--work", default="~/.cache/regis/duplicates-eval", help="where the set and its index are kept")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backbone", default="efficientnet-lite0")
    p.add_argument("--workers", type=int, default=0, help="decoding processes of the index build")
    p.add_argument("--calibrate", action="store_true", help="fit the thresholds on the calibration split")
    p.add_argument("--calibration-out", help="write the fitted thresholds here (JSON)")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--run-set", action="append", metavar="NAME=VALUE",
                   help="a setting of the finder's run (e.g. features=1000, verify_side=480), repeatable; the "
                        "thresholds applied afterwards are the shipped (or calibrated) ones")
    args = p.parse_args()

    from regis.duplicates.finder import update_pairs
    from regis.indexes.snapshot import IndexSnapshot

    labelled, splits, index = make_set(args)
    snapshot = IndexSnapshot.open(index)
    # template search on every pair with fewer inliers than the grid's highest min_inliers (then filtered)
    # prefilter 0: every pair matched in full, its first match's count kept (stage 4c calibrates the prefilter)
    run_cfg = DuplicateConfig(**{"floor": RUN_FLOOR, "neighbours": RUN_NEIGHBOURS, "prefilter": 0,
                                 "min_inliers": max(GRID["min_inliers"]), **parse_overrides(args.run_set)})
    t = time.time()
    # candidates added through duplicate groups (finder.group_candidates) as a shipped run adds them: decided
    # by the shipped thresholds, not the run's low gates
    run = update_pairs(snapshot, run_cfg, threads=None,
                       groups_by=shipped_calibration(args.backbone) or DuplicateConfig())
    located_more = locate_prefiltered(snapshot, run, run_cfg)
    print(f"pairs: {len(run.stored.table)} candidates ({run.searched} images searched) in {time.time() - t:.0f} s;"
          f" timings {run.timings_ms}", file=sys.stderr)
    table = run.stored.table
    present = sorted(set(splits.values()))
    evals = {s: evaluation(labelled, splits, snapshot, table, s) for s in present}
    config = shipped_calibration(args.backbone) or DuplicateConfig()
    search = None
    if args.calibrate:
        config, search = calibrate(evals["calibration"], DuplicateConfig())
        config = config.model_copy(update={"calibration": {
            "set": f"scripts/eval_duplicates.py --set {args.set} --seed {args.seed}", "split": "calibration",
            "backbone": args.backbone, "images": int(len(evals["calibration"].images)),
            "created_at": time.strftime("%Y-%m-%d"), "search": search}})
        if args.calibration_out:
            Path(args.calibration_out).write_text(json.dumps(config.model_dump(), indent=2) + "\n")
    results = {s: measure(ev, config) for s, ev in evals.items()}
    for split, ev in evals.items():
        results[split]["verified_fraction"] = verified_fraction(ev.table, config, config.verify_floor)
        results[split]["located_fraction"] = located_fraction(
            ev.table, config, config.template_floor,
            None if config.template_max_side is None else ev.small_side < config.template_max_side)
        results[split]["without"] = ablations(ev, config)
    out = {"command": " ".join(sys.argv), "run_config": run_cfg.model_dump(exclude={"calibration"}),
           "set": args.set, "seed": args.seed, "backbone": args.backbone,
           "images": len(labelled.items), "run": {"candidate_pairs": len(table), "timings_ms": run.timings_ms,
                                                  "verification": run.stored.settings.get("verification"),
                                                  "template_added": run.stored.settings.get("template_added"),
                                                  "located_for_prefilter": located_more},
           "config": config.model_dump(exclude={"calibration"}), "calibration_search": search,
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
           "splits": results}
    text = json.dumps(out, indent=1, default=float)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    for split, r in results.items():
        e, c, sc, gv = r["edited"], r["crops"], r["groups"], r["global_vector"]
        print(f"[{split}] {r['images']} images | edited copies: precision {e['precision']:.3f}, recall "
              f"{e['recall']:.3f} ({e['true']}/{e['labelled_pairs']}, {e['false']} false) | crops: direction right "
              f"{c['direction_right_of_all']:.3f} of all ({c['direction_right']}/{c['labelled_pairs']}), "
              f"{c['direction_right_of_reported']:.3f} of reported, crop precision {c['precision']:.3f} | "
              f"same-scene pairs in one group: "
              f"{sc['scene_pair_fraction_in_one_group']:.3f} ({sc['scene_pairs_in_one_group']}/"
              f"{r['scene']['labelled_pairs']}) | false duplicate pairs: regis {gv['regis_false_pairs']}, global "
              f"vector {gv['false_pairs']} at recall {gv['recall']:.3f} | candidate pairs verified: "
              f"{r['verified_fraction']:.3f}")


if __name__ == "__main__":
    main()
