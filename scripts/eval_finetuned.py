"""Recall@1 per query kind of fine-tuned encoders against the shipped one, on the corpus's held-out photos.

    PYTHONPATH=$PWD python scripts/eval_finetuned.py --corpus /work/cache/photos --splits val,test \
        --seeds 0,1,2 --device cuda --json runs/finetune/eval.json runs/finetune/*.safetensors

The query sets are ``regis eval-photos``'s (``training.photos.evalset.build_eval_set``, one per split and seed,
built once in ``--set-workers`` processes and put through the shared evaluation transform once); every encoder
(``training.photos.finetune.load_finetuned``; the baseline: the shipped ``efficientnet-lite0-regis``, centre
crop) encodes the same images (all m query tokens; the gallery keeps its first T = 10). Per split and kind: each
encoder's MaxSim and global Recall@1 [95 % Wilson], and its MaxSim minus the baseline's with a 95 % bootstrap
interval over photos (``training.evaluation.intervals.paired_bootstrap``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch


def _make_set(args: tuple) -> tuple:
    """(corpus, split, seed) -> (key, record): the eval set's images through the evaluation transform, float16."""
    corpus, split, seed = args
    torch.set_num_threads(1)
    from regis.models.encoder import build_encoder
    from regis.models.transforms import eval_transform
    from training.photos.evalset import build_eval_set
    from training.photos.evaluate import test_photos

    tf = eval_transform(build_encoder("efficientnet-lite0-regis", frame="center-crop").config)
    es = build_eval_set(test_photos(corpus, split), seed)
    return (split, seed), {
        "queries": torch.stack([tf(q.image) for q in es.queries]).half(),
        "gallery": torch.stack([tf(g.image) for g in es.gallery]).half(),
        "kinds": [q.kind for q in es.queries], "photos": [q.photo for q in es.queries],
        "relevance": torch.from_numpy(es.relevance)}


def build_sets(corpus: Path, splits: list[str], seeds: list[int], workers: int) -> dict:
    """{(split, seed): record} of ``_make_set``, in ``workers`` processes (0: in this one)."""
    jobs = [(corpus, sp, s) for sp in splits for s in seeds]
    if workers <= 0:
        return dict(map(_make_set, jobs))
    import multiprocessing as mp

    with mp.get_context("fork").Pool(min(workers, len(jobs))) as pool:
        return dict(pool.map(_make_set, jobs))


@torch.inference_mode()
def encode(encoder, x: torch.Tensor, device: str, batch: int = 128) -> torch.Tensor:
    """(n, 3, S, S) float16 images -> (n, m, D) float32 unit-norm query tokens (on the CPU)."""
    out = [encoder.forward_with_buddies(x[i : i + batch].to(device).float(), query=True)[0].float().cpu()
           for i in range(0, len(x), batch)]
    return torch.cat(out)


def hits_of(encoder, sets: dict, split: str, seeds: list[int], device: str) -> dict:
    """Per query of ``split`` (pooled over ``seeds``, in set order): MaxSim and global hits (0/1), kinds, photos."""
    from training.photos.evaluate import scorer_hits

    out = {"maxsim": [], "global": [], "kinds": [], "photos": []}
    for seed in seeds:
        s = sets[(split, seed)]
        rec = {"gallery": encode(encoder, s["gallery"], device), "queries": encode(encoder, s["queries"], device),
               "relevance": s["relevance"]}
        h = scorer_hits(rec, None)
        out["maxsim"].append(h["maxsim"])
        out["global"].append(h["global"])
        out["kinds"] += s["kinds"]
        out["photos"] += s["photos"]
    return {k: (np.concatenate(v) if k in ("maxsim", "global") else np.array(v)) for k, v in out.items()}


def table(base: dict, other: dict) -> dict:
    """Per kind: n, the other's MaxSim and global R@1 [Wilson], and MaxSim - the baseline's MaxSim [bootstrap]."""
    from training.evaluation.intervals import per_kind_table
    from training.photos.evalset import KINDS

    if not (np.array_equal(base["kinds"], other["kinds"]) and np.array_equal(base["photos"], other["photos"])):
        raise ValueError("the two encoders were scored on different query sets")
    hits = {"maxsim": other["maxsim"], "global": other["global"], "base maxsim": base["maxsim"]}
    rows = per_kind_table(hits, base["kinds"], base["photos"], [("maxsim", "base maxsim")], kinds_order=KINDS)
    return {kind: {"n": r["n"], "maxsim": r["scorers"]["maxsim"], "global": r["scorers"]["global"],
                   "maxsim - base maxsim": r["diffs"]["maxsim - base maxsim"]} for kind, r in rows.items()}


def _print(name: str, split: str, rows: dict) -> None:
    for kind, row in rows.items():
        d = row["maxsim - base maxsim"]
        print(f"{name:24s} {split:5s} {kind:7s} {row['n']:5d} {row['maxsim']['r1']:7.3f} {row['global']['r1']:7.3f}"
              f"  {d['d']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]", flush=True)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("weights", nargs="*", type=Path, help="save_finetuned files")
    p.add_argument("--corpus", type=Path, required=True)
    p.add_argument("--splits", default="val")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--set-workers", type=int, default=0, help="processes building the query sets (0: this one)")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)

    from regis.models.encoder import build_encoder
    from training.photos.finetune import load_finetuned

    seeds, splits = [int(s) for s in a.seeds.split(",")], a.splits.split(",")
    if any(s not in ("val", "test") for s in splits):
        raise SystemExit(f"--splits takes val and/or test, got {a.splits!r}")
    t0 = time.perf_counter()
    sets = build_sets(a.corpus, splits, seeds, a.set_workers)
    print(f"query sets built in {time.perf_counter() - t0:.1f} s", flush=True)
    base_enc = build_encoder("efficientnet-lite0-regis", frame="center-crop", device=a.device)
    result = {"command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]), "splits": splits,
              "seeds": seeds, "machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
              "device": a.device, "base": {"weights": base_enc.weights_info.model_dump()}, "runs": {}}
    print(f"{'encoder':24s} {'split':5s} {'kind':7s} {'n':>5s} {'maxsim':>7s} {'global':>7s}  maxsim - shipped [95 %]")
    base = {}
    for split in splits:
        base[split] = hits_of(base_enc, sets, split, seeds, a.device)
        result["base"][split] = table(base[split], base[split])
        _print("shipped", split, result["base"][split])
    for path in a.weights:
        enc, meta = load_finetuned(path, device=a.device)
        run = {"meta": {k: v for k, v in meta.items() if k != "config"}, "config": meta.get("config"),
               "sha256": enc.weights_info.sha256}
        for split in splits:
            run[split] = table(base[split], hits_of(enc, sets, split, seeds, a.device))
            _print(path.name.removesuffix(".safetensors"), split, run[split])
        result["runs"][path.name] = run
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
