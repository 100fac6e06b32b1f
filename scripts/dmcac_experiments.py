#!/usr/bin/env python
"""DMCAC experiments on Fashion-MNIST, class-disjoint (train classes 0-4, test classes 5-9); METHODS.md section 2.

For each backbone, runs ``regis train dmcac`` in these variants (all else equal), plus the triplet recipe with
the same number of training images, then gathers each run's ``summary.json`` into ``OUT/results.json`` and
``OUT/results.md``: test Recall@1/2/4/8 and mAP@R before (the starting point) and after, single-vector (token 0)
and multi-vector (MaxSim); training seconds per epoch (steps + database refreshes, evaluation excluded); the
last logged loss terms; and ``regis eval --weights RUN_DIR`` on the main run (the exported encoder).

Variants:
  dmcac            betas (1, 1, 1), top-k retrieval, CLS similarity: the method as specified
  betas-1-1-0      without CAC
  betas-0-1-1      without L_frob
  full-retrieval   the whole cached database as context (FR)
  maxsim           P (and the neighbours) from MaxSim over all tokens instead of token-0 dot products
  tau-0.1          temperature 0.1 instead of 1 (not in METHODS.md: with unit vectors and tau = 1, P' is nearly
                   uniform over the context and L_frob is tiny)
  plain-ce         betas (0, 1, 0) with A = 1 view: plain CE fine-tuning of the same backbone, no database
  triplet          ``regis train triplet`` (METHODS.md section 1 defaults) with the main run's image budget

Profiles:
  gpu  one CUDA GPU: EfficientNet-Lite0 (ImageNet weights) and ViT-S/14 with 4 registers from random init
       (``dinov2-vits14-reg --random-init``), 224 px, the whole training split (15,000 queries, 15,000 database
       images), B = 32 queries x A = 6 views, k = 12, 15 epochs, refresh every 5, the full 5,000-image test split,
       bf16 autocast.
  cpu  a small version for a 2-core CPU (~20 minutes): EfficientNet-Lite0 at 128 px on 40 training images per
       class (3 epochs) and the tiny 64-px random ViT with registers (``vit-tiny-reg4-test``, a stand-in for
       ViT-S random init) on 200 per class (8 epochs); the database refreshed every epoch (effnet) or every
       2 (ViT) so that refreshes happen within so few epochs; seeded test subsets; one thread.

A rerun skips finished runs and resumes interrupted ones (``--resume``).

    python scripts/dmcac_experiments.py --profile gpu --out runs/dmcac-gpu
    python scripts/dmcac_experiments.py --profile cpu --out runs/dmcac-cpu
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
CLASSES = 5  # Fashion-MNIST training classes

VARIANTS = {
    "dmcac": [],
    "betas-1-1-0": ["--betas", "1,1,0"],
    "betas-0-1-1": ["--betas", "0,1,1"],
    "full-retrieval": ["--retrieval", "full"],
    "maxsim": ["--similarity", "maxsim"],
    "tau-0.1": ["--tau", "0.1"],
    "plain-ce": ["--betas", "0,1,0", "--views", "1"],
}

PROFILES = {
    "gpu": {
        "env": {},
        "common": ["--device", "cuda", "--num-workers", "8", "--eval-max-images", "0", "--eval-batch-size", "256",
                   "--checkpoint-every", "500", "--log-every", "20"],
        "dmcac": {"per_class": None, "batch_size": 32, "views": 6, "epochs": 15,
                  "args": ["--top-k", "12", "--refresh-every", "5", "--warmup-steps", "300", "--eval-every",
                           "2000"]},
        "triplet": {"triplets": 32, "args": ["--sampler", "random", "--warmup-steps", "300", "--eval-every", "2000"]},
        "backbones": {
            "effnet-lite0": ["--backbone", "efficientnet-lite0", "--lr", "5e-5"],
            "vits14reg-random": ["--backbone", "dinov2-vits14-reg", "--random-init", "--lr", "3e-4"],
        },
        "eval": ["--device", "cuda", "--num-workers", "8", "--batch-size", "256"],
    },
    "cpu": {
        "env": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        "common": ["--device", "cpu", "--num-workers", "0", "--checkpoint-every", "1000", "--log-every", "5"],
        "backbone_dmcac": {
            "effnet-lite0-128px": {"per_class": 40, "batch_size": 10, "views": 6, "epochs": 3,
                                   "args": ["--top-k", "12", "--refresh-every", "1", "--warmup-steps", "3",
                                            "--eval-max-images", "500", "--eval-batch-size", "100"]},
            "vit-tiny-reg4-random": {"per_class": 200, "batch_size": 25, "views": 6, "epochs": 8,
                                     "args": ["--top-k", "12", "--refresh-every", "2", "--warmup-steps", "10",
                                              "--eval-max-images", "1000", "--eval-batch-size", "100"]},
        },
        "triplet": {"triplets": 10, "args": ["--sampler", "random"]},
        "backbones": {
            "effnet-lite0-128px": ["--backbone", "efficientnet-lite0", "--image-size", "128", "--lr", "2e-5"],
            "vit-tiny-reg4-random": ["--backbone", "vit-tiny-reg4-test", "--random-init", "--lr", "1e-3"],
        },
        "eval": ["--device", "cpu", "--num-workers", "0", "--batch-size", "100"],
    },
}

TRAIN_PER_CLASS = 6000  # Fashion-MNIST training images per class


def dmcac_settings(profile: dict, backbone: str) -> dict:
    return profile.get("backbone_dmcac", {}).get(backbone) or profile["dmcac"]


def image_budget(s: dict) -> int:
    """Images the main DMCAC run forwards: epochs x steps per epoch x B x A (stratified split: half are queries)."""
    per_class = s["per_class"] or TRAIN_PER_CLASS
    queries = CLASSES * (per_class // 2)
    return s["epochs"] * (queries // s["batch_size"]) * s["batch_size"] * s["views"]


def _eval_args(args: list[str]) -> list[str]:
    """The --eval-* options of a DMCAC settings list (shared with the triplet run, so both test the same subset)."""
    out = []
    for i, a in enumerate(args):
        if a.startswith("--eval-"):
            out += [a, args[i + 1]]
    return out


def plan(profile_name: str, only: list[str] | None) -> list[dict]:
    prof = PROFILES[profile_name]
    runs = []
    for backbone, bargs in prof["backbones"].items():
        s = dmcac_settings(prof, backbone)
        base = ["--batch-size", str(s["batch_size"]), "--views", str(s["views"]), "--epochs", str(s["epochs"]),
                *s["args"], *prof["common"]]
        if s["per_class"]:
            base += ["--max-train-per-class", str(s["per_class"])]
        for variant, vargs in VARIANTS.items():
            if only and variant not in only:
                continue
            runs.append({"backbone": backbone, "variant": variant, "recipe": "dmcac", "name": f"{backbone}__{variant}",
                         "args": [*bargs, *base, *vargs]})
        if not only or "triplet" in only:
            t = prof["triplet"]
            steps = max(1, image_budget(s) // (3 * t["triplets"]))
            eval_args = _eval_args(s["args"])
            warmup = [] if "--warmup-steps" in t["args"] else ["--warmup-steps", str(max(1, steps // 10))]
            runs.append({"backbone": backbone, "variant": "triplet", "recipe": "triplet",
                         "name": f"{backbone}__triplet",
                         "args": [*bargs, *t["args"], "--triplets-per-batch", str(t["triplets"]), "--steps", str(steps),
                                  *warmup, *eval_args, *prof["common"]]})
    return runs


def gather(run_dir: Path) -> dict:
    """The figures of one finished run."""
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    config = json.loads((run_dir / "config.json").read_text())
    trains = [r for r in records if r["kind"] == "train"]
    refreshes = [r for r in records if r["kind"] == "refresh"]
    sess = summary["this_session"]
    epochs = config["trainer"].get("epochs")
    train_s = sum(r["seconds"] for r in trains)
    refresh_s = sum(r["seconds"] for r in refreshes)
    return {
        "summary": summary, "recipe_info": config.get("recipe_info"), "epochs": epochs,
        "first_train": trains[0], "last_train": trains[-1],
        "train_seconds": round(train_s, 2), "refresh_seconds": round(refresh_s, 2), "refreshes": len(refreshes),
        "seconds_per_epoch": round((train_s + refresh_s) / epochs, 2) if epochs else None,
        "images": sum(r["images"] for r in trains), "steady_images_per_s": sess["steady_images_per_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=sorted(PROFILES), required=True)
    ap.add_argument("--out", type=Path, required=True, help="Folder for the run directories and results.")
    ap.add_argument("--data", default=DEFAULT_DATA, help="Folder with the Fashion-MNIST idx files.")
    ap.add_argument("--only", nargs="*", help=f"Variants to run (default all): {[*VARIANTS, 'triplet']}.")
    ap.add_argument("--dry-run", action="store_true", help="Print the commands only.")
    opts = ap.parse_args()
    prof = PROFILES[opts.profile]
    regis = [sys.executable, "-m", "regis"]
    opts.out.mkdir(parents=True, exist_ok=True)
    results = {"profile": opts.profile, "data": opts.data, "env": prof["env"], "runs": []}
    t_start = time.perf_counter()
    for run in plan(opts.profile, opts.only):
        run_dir = opts.out / run["name"]
        if (run_dir / "summary.json").is_file():
            print(f"# {run['name']}: finished earlier, kept")
            cmd, wall = None, None
        elif (run_dir / "trainer_state.pt").is_file():
            cmd = [*regis, "train", run["recipe"], "--out", str(run_dir), "--resume", "--quiet"]
            wall = sh(cmd, prof["env"], opts.dry_run)
        else:
            cmd = [*regis, "train", run["recipe"], "--data", opts.data, "--out", str(run_dir), "--quiet",
                   *run["args"]]
            wall = sh(cmd, prof["env"], opts.dry_run)
        record = {**{k: run[k] for k in ("name", "backbone", "variant", "recipe")},
                  "train_command": shlex.join(cmd) if cmd else None, "wall_seconds": wall}
        if not opts.dry_run:
            record.update(gather(run_dir))
        if run["variant"] == "dmcac":  # the exported encoder through --weights RUN_DIR, as index and serve use it
            report = opts.out / f"{run['name']}.eval.json"
            eval_opts = _eval_args(run["args"])
            max_images = eval_opts[eval_opts.index("--eval-max-images") + 1] if "--eval-max-images" in eval_opts \
                else "0"
            ecmd = [*regis, "eval", "--data", opts.data, "--weights", str(run_dir), "--out", str(report), "--quiet",
                    *prof["eval"], *(["--max-images", max_images] if max_images != "0" else [])]
            if not report.is_file():
                sh(ecmd, prof["env"], opts.dry_run)
            record["eval_command"] = shlex.join(ecmd)
            if not opts.dry_run:
                rep = json.loads(report.read_text())
                record["eval_report"] = {k: rep[k] for k in ("single", "multi", "num_queries", "weights")}
        results["runs"].append(record)
    results["total_wall_seconds"] = round(time.perf_counter() - t_start, 1)
    if opts.dry_run:
        return
    write_results(opts.out, results, markdown)


def _metrics(m: dict) -> str:
    return " | ".join(pct(m[f"recall@{k}"]) for k in (1, 2, 4, 8)) + f" | {pct(m['map@r'])}"


def markdown(results: dict) -> str:
    """Tables of the gathered runs (percentages)."""
    lines = [f"Profile `{results['profile']}`, data `{results['data']}`, env {results['env'] or '{}'}; "
             f"total wall time {results['total_wall_seconds']} s.", ""]
    lines += ["| backbone | run | when | scoring | R@1 | R@2 | R@4 | R@8 | mAP@R |",
              "|---|---|---|---|---|---|---|---|---|"]
    starts = set()
    for r in results["runs"]:
        s = r["summary"]
        if r["backbone"] not in starts:  # every run starts from the same encoder: show the starting point once
            starts.add(r["backbone"])
            for scoring in ("single", "multi"):
                ev = s["eval_before"]
                lines.append(f"| {r['backbone']} | starting point | step 0, {ev['num_queries']} queries | {scoring} | "
                             + _metrics(ev[scoring]) + " |")
        ev = s["eval_after"]
        for scoring in ("single", "multi"):
            lines.append(f"| {r['backbone']} | {r['variant']} | after (step {ev['step']}) | {scoring} | "
                         + _metrics(ev[scoring]) + " |")
    lines += ["", "| backbone | run | images | train s | refreshes (s) | s / epoch | images/s | first -> last loss | "
              "L_frob | L_ce | L_cac | context same class (first -> last) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        f, la = r["first_train"], r["last_train"]

        def term(key, la=la):
            return f"{la[key]:.4f}" if key in la else "-"

        same = (f"{f['context_same_class']:.2f} -> {la['context_same_class']:.2f}" if "context_same_class" in la
                else "-")
        lines.append(f"| {r['backbone']} | {r['variant']} | {r['images']} | {r['train_seconds']} | "
                     f"{r['refreshes']} ({r['refresh_seconds']}) | {r['seconds_per_epoch'] or '-'} | "
                     f"{r['steady_images_per_s']} | {f['loss']:.3f} -> {la['loss']:.3f} | {term('frob')} | "
                     f"{term('ce')} | {term('cac')} | {same} |")
    for r in results["runs"]:
        if "eval_report" in r:
            same = r["eval_report"]["multi"] == r["summary"]["eval_after"]["multi"]
            lines.append(f"\n`regis eval --weights` on {r['name']}: multi-vector metrics "
                         f"{'identical to' if same else 'DIFFER from'} the run's final evaluation.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
