"""The labelled near-duplicate set's run, as the issue-26 bench scripts read it (``scripts/eval_duplicates.py``
builds it under ``WORK/debian-s0``: ``files`` the set, ``index`` its index and the finder's stored pairs)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def eval_module():
    """``scripts/eval_duplicates.py`` as a module (its evaluation, metrics and calibration functions)."""
    spec = importlib.util.spec_from_file_location("eval_duplicates", ROOT / "scripts" / "eval_duplicates.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["eval_duplicates"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@dataclass
class StoredRun:
    """The set, its index, the stored pairs of the evaluation's finder run and the shipped thresholds."""

    ev_mod: object  # eval_module()
    cfg: object  # the shipped DuplicateConfig of the default encoder
    root: Path  # WORK/debian-s0
    labelled: object  # regis.data.near_duplicates.LabelledSet
    snapshot: object  # regis.indexes.snapshot.IndexSnapshot of root / "index"
    stored: object  # regis.duplicates.store.StoredPairs of its version
    splits: dict  # family -> "calibration" | "test"


def stored_run_parser(doc: str | None, work: str = "/work/cache/dup-eval-n16") -> argparse.ArgumentParser:
    """The command line of a bench that reads a stored run: ``--work`` (``scripts/eval_duplicates.py``'s),
    ``--seed`` (the set's draw), ``--corpus`` (the Debian photos the set was made from) and ``--json`` (where the
    figures go); the bench adds its own options."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=work)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", default="/work/cache/photos", help="the Debian corpus the set was built from")
    p.add_argument("--json")
    return p


def stored_run(work: str | Path, corpus: str | Path, seed: int = 0) -> StoredRun:
    """Open ``WORK/debian-s<seed>``'s set, index and stored pairs (``scripts/eval_duplicates.py --seed``).

    Raises:
        SystemExit: no stored pairs (``scripts/eval_duplicates.py`` has not run there).
    """
    from regis.data.near_duplicates import LabelledSet
    from regis.duplicates import store
    from regis.duplicates.config import shipped_calibration
    from regis.indexes.snapshot import IndexSnapshot
    from regis.models.registry import DEFAULT_BACKBONE

    ev_mod = eval_module()
    root = Path(work) / f"debian-s{seed}"
    snapshot = IndexSnapshot.open(root / "index")
    stored = store.latest(snapshot.index_dir, snapshot.version)
    if stored is None:
        raise SystemExit(f"no stored pairs under {snapshot.index_dir}: run scripts/eval_duplicates.py first")
    _, _, splits = ev_mod.debian_photos(Path(corpus), root)
    return StoredRun(ev_mod, shipped_calibration(DEFAULT_BACKBONE), root, LabelledSet.load(root / "files"),
                     snapshot, stored, splits)


def shipped_candidates(work: str | Path):
    """The shipped self-join of ``WORK/debian-s0``'s index: (config, root, labelled set, snapshot, records by id,
    a ``PairTable`` of the candidate pairs with their token scores only)."""
    from regis.data.near_duplicates import LabelledSet
    from regis.duplicates.config import shipped_calibration
    from regis.duplicates.selfjoin import self_join
    from regis.duplicates.store import PairTable
    from regis.indexes.snapshot import IndexSnapshot
    from regis.models.registry import DEFAULT_BACKBONE

    cfg = shipped_calibration(DEFAULT_BACKBONE)
    root = Path(work) / "debian-s0"
    snap = IndexSnapshot.open(root / "index")
    recs = snap.table.get_many(snap.store.live_ids.tolist())
    cand = self_join(snap, floor=cfg.floor, neighbours=cfg.neighbours, depth=cfg.depth)
    t = PairTable.empty(len(cand))
    t.a, t.b, t.s_ab, t.s_ba = cand.a, cand.b, cand.s_ab, cand.s_ba
    return cfg, root, LabelledSet.load(root / "files"), snap, recs, t


def gated_sample(work: str | Path, sample: int):
    """A random sample (seed 0) of the pairs the shipped gates verify (``finder.to_verify``) in the shipped
    self-join of ``WORK/debian-s0``'s index: (config, root, records by id, the candidate ``PairTable``, the sampled
    rows, a function (record a, record b) -> the pair's label in the set: "crop", "edited", ..., "unrelated")."""
    import numpy as np

    from regis.data.near_duplicates import labelled_pairs
    from regis.duplicates.finder import to_verify

    cfg, root, labelled, _, recs, t = shipped_candidates(work)
    labels = labelled_pairs(labelled.items)
    gated = to_verify(t, cfg)
    rows = np.random.default_rng(0).choice(gated, size=min(sample, len(gated)), replace=False)

    def label(ra, rb) -> str:
        return labels.get(tuple(sorted((ra.path, rb.path))), ("unrelated", None))[0]
    return cfg, root, recs, t, rows, label
