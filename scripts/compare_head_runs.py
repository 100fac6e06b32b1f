"""Compare `regis train head` runs on the validation split, paired (issue 22: frozen head vs the backbone's last
stage unfrozen, docs/TRAINING.md "Unfreezing the last stage").

Each run's saved weights (head.safetensors, float16; tail.safetensors when its last stages trained) are scored on
the same validation cache of pre-tail activations (the one `regis train head --tail-stages N` built: every edited
view against every clean instance, Recall@1); differences against the first run with a paired bootstrap over the
validation photos (``training.evaluation.intervals.paired_bootstrap``). The runs' curves (metrics.jsonl), configs
and summaries are copied into the JSON.

    PYTHONPATH=$PWD python scripts/compare_head_runs.py --corpus /work/cache/photos --cache /work/cache/i22 \\
        --tail-stages 1 --json docs/results/trained_head/unfreeze_val.json \\
        frozen=/work/cache/i22/runs/frozen tail1=/work/cache/i22/runs/tail1

A second training seed on the same caches (``regis train head --seed 1 --cache-seed 0``), pooled with the first:
``... frozen-s1=RUN tail2-s1=RUN frozen=RUN tail2=RUN --pool tail2=frozen,tail2-s1=frozen-s1``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="NAME=RUN_DIR; the first is the baseline")
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--tail-stages", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0, help="the runs' seed (the validation cache's is seed + 1)")
    ap.add_argument("--views", type=int, default=4)
    ap.add_argument("--regions", type=int, default=4)
    ap.add_argument("--pool", default="",
                    help="NAME=BASE,NAME=BASE,...: one difference pooled over these pairs (e.g. one per training "
                         "seed), a paired bootstrap over the validation photos with each photo's views of every "
                         "pair resampled together")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()

    import numpy as np
    import torch
    from safetensors.torch import load_file

    from cli.train_head import BASE_BACKBONE, _instances
    from regis.models.encoder import build_encoder
    from regis.models.head import load_head
    from training.evaluation.intervals import paired_bootstrap, wilson_interval
    from training.photos.tail import TailHead, TailReadout, cached_tail
    from training.photos.train import read_metrics, val_hits

    torch.set_num_threads(1)
    load_before, t0 = os.getloadavg(), time.perf_counter()
    encoder = build_encoder(BASE_BACKBONE)
    val = _instances(encoder, args.corpus, args.cache, "val", args.seed + 1, args.views, args.regions, False,
                     args.tail_stages)
    grids = cached_tail(val.config)["grids"]
    photo_of_view = val.photo.repeat_interleave(val.views.shape[1]).numpy()
    results, hits = {}, {}
    for spec in args.runs:
        name, _, run = spec.partition("=")
        run = Path(run)
        config = json.loads((run / "config.json").read_text())
        tail = TailReadout(encoder, args.tail_stages, grids)
        if (run / "tail.safetensors").is_file():
            tail.tail.load_state_dict(load_file(str(run / "tail.safetensors")))
        h = val_hits(TailHead(tail, load_head(run / "head.safetensors")), val).numpy().astype(float)
        hits[name] = h
        results[name] = {
            "run": str(run), "config": config, "tail_trained": (run / "tail.safetensors").is_file(),
            "val_r1": float(h.mean()), "wilson95": wilson_interval(h.sum(), len(h)),
            "summary": json.loads((run / "summary.json").read_text()), "metrics": read_metrics(run),
        }
    base = args.runs[0].partition("=")[0]
    for name in hits:
        if name != base:
            d, lo, hi = paired_bootstrap(hits[name], hits[base], photo_of_view)
            results[name]["minus_" + base] = {"mean": d, "low95": lo, "high95": hi}
    pooled = None
    if args.pool:
        pairs = [p.partition("=")[::2] for p in args.pool.split(",")]
        unknown = sorted({n for pair in pairs for n in pair} - hits.keys())
        if unknown:
            raise SystemExit(f"--pool names runs that are not given: {unknown}")
        d, lo, hi = paired_bootstrap(np.concatenate([hits[n] for n, _ in pairs]),
                                     np.concatenate([hits[b] for _, b in pairs]),
                                     np.concatenate([photo_of_view] * len(pairs)))
        pooled = {"pairs": [f"{n} - {b}" for n, b in pairs], "mean": d, "low95": lo, "high95": hi}
    report = {
        "command": "PYTHONPATH=$PWD python scripts/compare_head_runs.py " + " ".join(os.sys.argv[1:]),
        "validation": {"views": len(photo_of_view), "photos": int(len(np.unique(photo_of_view))),
                       "instances": int(len(val.photo)), "cache": val.config},
        "runs": results, "pooled": pooled, "machine": platform.machine(), "torch": torch.__version__,
        "load_before": load_before, "load_after": os.getloadavg(), "seconds": round(time.perf_counter() - t0, 1),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    for name, r in results.items():
        diff = r.get("minus_" + base)
        extra = f"  {name} - {base}: {diff['mean']:+.3f} [{diff['low95']:+.3f}, {diff['high95']:+.3f}]" if diff else ""
        print(f"{name}: val R@1 {r['val_r1']:.3f}{extra}")
    if pooled:
        print(f"pooled {', '.join(pooled['pairs'])}: {pooled['mean']:+.3f} [{pooled['low95']:+.3f}, "
              f"{pooled['high95']:+.3f}]")


if __name__ == "__main__":
    main()
