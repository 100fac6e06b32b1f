#!/usr/bin/env python
"""Fine-tuning experiments on Fashion-MNIST, class-disjoint (train classes 0-4, test classes 5-9).

Runs ``regis train triplet`` (and ``regis eval`` on the trained runs) as subprocesses, then gathers each run's
``summary.json`` into ``OUT/results.json`` and ``OUT/results.md``: test Recall@1/2/4/8, mAP@R and R-precision
before and after fine-tuning (single-vector token 0 and multi-vector MaxSim), training throughput in images/s,
and the token-set ablation (cls, cls+reg, cls+reg+roi) and ROI size N in {1, 3, 5}, each trained with its own
token set, and the main configuration trained with P x K batches + batch-hard mining instead of random
triplets. Every command is printed and stored in results.json next to its figures.

Profiles:
  gpu  the full runs (one CUDA GPU): (a) ViT-S/14 with 4 registers from random init (``dinov2-vits14-reg
       --random-init``) and (b) the offline EfficientNet-Lite0 (ImageNet weights), 224 px, full 5,000-image
       test split, bf16 autocast.
  cpu  a small version that fits ~20 minutes on a 2-core CPU: EfficientNet-Lite0 at 128 px (token-set ablation
       only: its grid is 4 x 4) and the tiny 64-px random ViT with registers (``vit-tiny-reg4-test``, 8 x 8 grid,
       a stand-in for (a); full ablation), few steps, a seeded 1,000-image subset of the test split, one thread
       (OMP_NUM_THREADS=1).

A rerun skips finished runs and resumes interrupted ones (``--resume``).

    python scripts/fashion_mnist_experiments.py --profile gpu --out runs/fmnist-gpu
    python scripts/fashion_mnist_experiments.py --profile cpu --out runs/fmnist-cpu
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from experiment_runs import pct, sh, write_results

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
# (token set, N, sampler): the main run is cls+reg+roi, N = 3, random triplets (METHODS.md section 1).
MAIN = ("cls+reg+roi", 3, "random")
ABLATION = [("cls", 3, "random"), ("cls+reg", 3, "random"), ("cls+reg+roi", 1, "random"), MAIN,
            ("cls+reg+roi", 5, "random")]
TOKEN_SETS_ONLY = [("cls", 3, "random"), ("cls+reg", 3, "random"), MAIN]
PK_BATCH_HARD = ("cls+reg+roi", 3, "pk-batch-hard")

PROFILES = {
    "gpu": {
        "env": {},
        # ~96 images per step: 32 random triplets (96), or P = 5 classes x K = 19 (95) for batch-hard
        "samplers": {"random": ["--sampler", "random", "--triplets-per-batch", "32"],
                     "pk-batch-hard": ["--sampler", "pk", "--p", "5", "--k", "19", "--miner", "batch-hard"]},
        "common": ["--device", "cuda", "--num-workers", "8", "--steps", "3000",
                   "--warmup-steps", "300", "--eval-every", "500", "--eval-max-images", "0",
                   "--eval-batch-size", "256", "--checkpoint-every", "500", "--log-every", "20"],
        "backbones": {
            "vits14reg-random": ["--backbone", "dinov2-vits14-reg", "--random-init", "--lr", "3e-4"],
            "effnet-lite0": ["--backbone", "efficientnet-lite0", "--lr", "5e-5"],
        },
        "ablate": {"vits14reg-random": [*ABLATION, PK_BATCH_HARD], "effnet-lite0": [*ABLATION, PK_BATCH_HARD]},
        "eval": ["--device", "cuda", "--num-workers", "8", "--batch-size", "256"],
    },
    "cpu": {
        "env": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        # 30 images per step either way
        "samplers": {"random": ["--sampler", "random", "--triplets-per-batch", "10"],
                     "pk-batch-hard": ["--sampler", "pk", "--p", "5", "--k", "6", "--miner", "batch-hard"]},
        "common": ["--device", "cpu", "--num-workers", "0", "--warmup-steps", "10",
                   "--eval-max-images", "1000", "--eval-batch-size", "100", "--checkpoint-every", "1000",
                   "--log-every", "10"],
        "backbones": {
            "vit-tiny-reg4-random": ["--backbone", "vit-tiny-reg4-test", "--random-init", "--lr", "1e-3",
                                     "--steps", "300"],
            "effnet-lite0-128px": ["--backbone", "efficientnet-lite0", "--image-size", "128", "--lr", "2e-5",
                                   "--steps", "80"],
        },
        # At 128 px EfficientNet's grid is 4 x 4, too small for a meaningful N ablation: token sets only.
        "ablate": {"vit-tiny-reg4-random": [*ABLATION, PK_BATCH_HARD],
                   "effnet-lite0-128px": [*TOKEN_SETS_ONLY, PK_BATCH_HARD]},
        "eval": ["--device", "cpu", "--num-workers", "0", "--batch-size", "100", "--max-images", "1000"],
    },
}


def run_name(backbone: str, token_set: str, n: int, sampler: str) -> str:
    return f"{backbone}__{token_set.replace('+', '-')}__N{n}__{sampler}"


def plan(profile: str, only_main: bool) -> list[dict]:
    prof = PROFILES[profile]
    runs = []
    for backbone, args in prof["backbones"].items():
        variants = [MAIN] if only_main else prof["ablate"].get(backbone, [MAIN])
        for token_set, n, sampler in variants:
            runs.append({"backbone": backbone, "token_set": token_set, "roi_size": n, "sampler": sampler,
                         "name": run_name(backbone, token_set, n, sampler), "main": (token_set, n, sampler) == MAIN,
                         "args": [*args, "--token-set", token_set, "--roi-size", str(n), *prof["samplers"][sampler],
                                  *prof["common"]]})
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=sorted(PROFILES), required=True)
    ap.add_argument("--out", type=Path, required=True, help="Folder for the run directories and results.")
    ap.add_argument("--data", default=DEFAULT_DATA, help="Folder with the Fashion-MNIST idx files.")
    ap.add_argument("--only-main", action="store_true", help="Skip the token-set / N ablation runs.")
    ap.add_argument("--dry-run", action="store_true", help="Print the commands only.")
    opts = ap.parse_args()
    prof = PROFILES[opts.profile]
    regis = [sys.executable, "-m", "regis"]
    opts.out.mkdir(parents=True, exist_ok=True)
    results = {"profile": opts.profile, "data": opts.data, "env": prof["env"], "runs": []}
    t_start = time.perf_counter()
    for run in plan(opts.profile, opts.only_main):
        run_dir = opts.out / run["name"]
        if (run_dir / "summary.json").is_file():
            print(f"# {run['name']}: finished earlier, kept")
            cmd, wall = None, None
        elif (run_dir / "trainer_state.pt").is_file():
            cmd = [*regis, "train", "triplet", "--out", str(run_dir), "--resume", "--quiet"]
            wall = sh(cmd, prof["env"], opts.dry_run)
        else:
            cmd = [*regis, "train", "triplet", "--data", opts.data, "--out", str(run_dir), "--quiet", *run["args"]]
            wall = sh(cmd, prof["env"], opts.dry_run)
        record = {**{k: run[k] for k in ("name", "backbone", "token_set", "roi_size", "sampler", "main")},
                  "train_command": shlex.join(cmd) if cmd else None, "wall_seconds": wall}
        if not opts.dry_run:
            record["summary"] = json.loads((run_dir / "summary.json").read_text())
            metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            record["last_train"] = [m for m in metrics if m["kind"] == "train"][-1]
        if run["main"]:  # the trained run used through --weights RUN_DIR, as the indexer and service use it
            report = opts.out / f"{run['name']}.eval.json"
            ecmd = [*regis, "eval", "--data", opts.data, "--weights", str(run_dir), "--out", str(report), "--quiet",
                    *prof["eval"]]
            if not report.is_file():
                sh(ecmd, prof["env"], opts.dry_run)
            record["eval_command"] = shlex.join(ecmd)
            if not opts.dry_run:
                record["eval_report"] = json.loads(report.read_text())
        results["runs"].append(record)
    results["total_wall_seconds"] = round(time.perf_counter() - t_start, 1)
    if opts.dry_run:
        return
    write_results(opts.out, results, markdown)


def markdown(results: dict) -> str:
    """Tables of the gathered runs (percentages)."""
    lines = [f"Profile `{results['profile']}`, data `{results['data']}`, env {results['env'] or '{}'}; "
             f"total wall time {results['total_wall_seconds']} s.", ""]
    lines += ["| run | when | scoring | R@1 | R@2 | R@4 | R@8 | mAP@R | R-prec |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        if not r["main"]:
            continue
        for when in ("eval_before", "eval_after"):
            ev = r["summary"][when]
            for scoring in ("single", "multi"):
                m = ev[scoring]
                lines.append(f"| {r['backbone']} | {when[5:]} (step {ev['step']}, {ev['num_queries']} queries) | "
                             f"{scoring} | " + " | ".join(pct(m[f"recall@{k}"]) for k in (1, 2, 4, 8))
                             + f" | {pct(m['map@r'])} | {pct(m['r_precision'])} |")
    lines += ["", "| run | token set | N | sampler | tokens | multi R@1 before | after | mAP@R before | after | "
              "last loss | pos / neg score | train images/s (median interval) | train s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        s = r["summary"]
        b, a = s["eval_before"]["multi"], s["eval_after"]["multi"]
        tokens = {"cls": 1, "cls+reg": 5, "cls+reg+roi": 10}[r["token_set"]]
        sess = s["this_session"]
        last = r.get("last_train", {})
        lines.append(f"| {r['backbone']} | {r['token_set']} | {r['roi_size']} | {r['sampler']} | {tokens} | "
                     f"{pct(b['recall@1'])} | {pct(a['recall@1'])} | {pct(b['map@r'])} | {pct(a['map@r'])} | "
                     f"{last.get('loss', 0):.3f} | {last.get('pos_score', 0):.2f} / {last.get('neg_score', 0):.2f} | "
                     f"{sess['steady_images_per_s']} | {sess['train_seconds']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
