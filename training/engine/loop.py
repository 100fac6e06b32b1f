"""The training loop every recipe shares (triplet: METHODS.md section 1; DMCAC: section 2) and its run directory.

Run directory (``RUN_DIR``):
    config.json          the resolved configuration (trainer, encoder, dataset counts, runtime, versions)
    encoder.safetensors  the latest weights + encoder config (``--weights RUN_DIR`` for index / serve / eval)
    trainer_state.pt     optimizer, scheduler, sampler and RNG state of the same step (``--resume``)
    metrics.jsonl        training and evaluation records; metrics.png their plot
    summary.json         written when the run reaches its last step

A recipe (``training.engine.recipe``) supplies the batches, the loss and its own state (e.g. DMCAC's heads and
database cache); this loop owns the encoder, optimiser, schedule, evaluation, checkpoints and resume.
"""

from __future__ import annotations

import json
import logging
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from regis.errors import ConfigError
from regis.models.weights import ENCODER_WEIGHTS_FILE
from training.config import TrainerConfig, TripletConfig
from training.engine.checkpoint import load_trainer_state, save_encoder, save_trainer_state
from training.engine.interrupt import StopSignals, clamp_warmup
from training.engine.metrics_log import MetricsLog, plot_metrics
from training.engine.modes import set_train_mode
from training.engine.recipe import Recipe, recipe_classes
from training.errors import CheckpointError

logger = logging.getLogger("regis.training")
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "metrics.png"
SUMMARY_FILE = "summary.json"
PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(frozen=True)
class Runtime:
    """How a run executes, without changing what it computes (not part of the run's config).

    Attributes:
        device: "auto" (cuda when available), "cpu", "cuda", "cuda:1", ...
        num_workers: DataLoader worker processes.
        precision: "auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32" or "bf16".
        stop_at_step: stop (with a checkpoint) after this many steps, to resume later; None: run to the end.
        progress: show tqdm bars.
    """

    device: str = "auto"
    num_workers: int = 0
    precision: str = "auto"
    stop_at_step: int | None = None
    progress: bool = True


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> cuda if available else cpu; otherwise ``torch.device(name)``.

    Raises:
        ConfigError: a CUDA device asked for on a machine without CUDA, or an unknown device string.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {name!r}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name} asked for, but CUDA is not available here")
    return device


def _use_bf16(precision: str, device: torch.device) -> bool:
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def _build_encoder(config: TrainerConfig, weights: str | None):
    from regis.models.encoder import build_encoder

    return build_encoder(
        backbone=config.backbone,
        weights=weights,
        random_init=config.random_init and weights is None,
        seed=config.init_seed,
        roi_size=config.roi_size,
        border=config.border,
        token_set=config.token_set,
        cue_method=config.cue_method,
        image_size=config.image_size,
    )


def _versions() -> dict:
    import timm

    import regis

    return {"regis": regis.__version__, "torch": torch.__version__, "timm": timm.__version__,
            "python": platform.python_version()}


def train_triplet(config: TripletConfig, run_dir: Path, runtime: Runtime = Runtime()) -> dict:
    """Start a new triplet run in ``run_dir`` (see ``start_run``)."""
    return start_run("triplet", config, run_dir, runtime)


def resume_triplet(run_dir: Path, runtime: Runtime = Runtime()) -> dict:
    """Continue a triplet run from its last checkpoint (see ``resume_run``)."""
    return resume_run(run_dir, runtime, "triplet")


def start_run(recipe: str, config: TrainerConfig, run_dir: Path, runtime: Runtime = Runtime()) -> dict:
    """Start a new run of ``recipe`` ("triplet" or "dmcac") in ``run_dir`` (created; it must not already hold a run).

    Returns:
        The run summary (also in ``summary.json`` when the last step was reached); see ``_run``.

    Raises:
        ConfigError: bad configuration or ``run_dir`` already used.
        DatasetError, WeightsError: the data or the starting weights cannot be read.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"run directory {run_dir} is not empty; pass --resume to continue it, or another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    return _run(recipe, config, run_dir, runtime, state=None)


def resume_run(run_dir: Path, runtime: Runtime = Runtime(), recipe: str | None = None) -> dict:
    """Continue a run from its last checkpoint, at the same step, with the same optimizer, scheduler, sampler,
    RNG and recipe state (heads, database cache); records written after that checkpoint are dropped from
    ``metrics.jsonl``.

    Args:
        run_dir: the run directory.
        runtime: how to execute.
        recipe: the recipe the caller expects (None: whichever the run used).

    Raises:
        CheckpointError: ``run_dir`` is not a resumable run, its files disagree, or it is another recipe's run.
    """
    run_dir = Path(run_dir)
    cfg_path = run_dir / CONFIG_FILE
    if not cfg_path.is_file():
        raise CheckpointError(f"{run_dir} has no {CONFIG_FILE}: not a regis training run")
    stored = json.loads(cfg_path.read_text(encoding="utf-8"))
    name = stored.get("recipe", "triplet")  # runs from before DMCAC have no "recipe" key
    if recipe is not None and name != recipe:
        raise CheckpointError(f"{run_dir} is a {name} run; resume it with regis train {name} --resume")
    config = recipe_classes(name)[1](**stored["trainer"])
    return _run(name, config, run_dir, runtime, state=load_trainer_state(run_dir))


def _run(recipe_name: str, config: TrainerConfig, run_dir: Path, runtime: Runtime, state: dict | None) -> dict:
    from tqdm import tqdm

    from training.data.registry import open_dataset
    from training.engine.optim import build_optimizer
    from training.engine.schedule import build_scheduler
    from training.evaluation.report import evaluate_encoder

    device = resolve_device(runtime.device)
    bf16 = _use_bf16(runtime.precision, device)
    dataset = open_dataset(
        Path(config.data), config.data_format, Path(config.train_classes) if config.train_classes else None,
        config.check_counts,
    )
    recipe_cls = recipe_classes(recipe_name)[0]
    recipe: Recipe = recipe_cls(config, dataset)  # fails fast on a batch shape the data cannot give
    total = recipe.total_steps
    encoder = _build_encoder(config, str(run_dir / ENCODER_WEIGHTS_FILE) if state else config.weights)
    start = 0
    if state is not None:
        if state.get("encoder_sha256") != encoder.weights_info.sha256:
            raise CheckpointError(
                f"{run_dir}: {ENCODER_WEIGHTS_FILE} is not the one trainer_state.pt was saved with (a crash between "
                "the two writes?); cannot resume exactly"
            )
        start = int(state["step"])
        if state["sampler"]["seed"] != config.seed:
            raise CheckpointError(f"{run_dir}: sampler seed in trainer_state.pt differs from config.json")
    encoder.to(device)
    with torch.random.fork_rng(devices=[]):  # heads initialised from the seed, the global RNG left as it is
        torch.manual_seed(config.seed)
        recipe.bind(encoder, device, bf16, runtime.num_workers)
    optimizer = build_optimizer(encoder, config.lr, config.head_lr, config.weight_decay, heads=recipe.heads)
    scheduler = build_scheduler(optimizer, clamp_warmup(config.warmup_steps, total, logger), total,
                                config.min_lr_ratio)
    log = MetricsLog(run_dir / METRICS_FILE)
    runtime_info = {**asdict(runtime), "device": str(device), "bf16_autocast": bf16}
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        recipe.load_state_dict(state.get("recipe", {}))
        torch.set_rng_state(state["torch_rng_state"])
        log.truncate_after(start)
        log.append({"kind": "resume", "step": start, "runtime": runtime_info})
    else:
        torch.manual_seed(config.seed)
        resolved = {
            "recipe": recipe_name,
            "trainer": config.model_dump(),
            "recipe_info": recipe.describe(),
            "encoder": encoder.config.model_dump(),
            "initial_weights": encoder.weights_info.model_dump(),
            "dataset": dataset.summary(),
            "runtime": runtime_info,
            "versions": _versions(),
        }
        (run_dir / CONFIG_FILE).write_text(json.dumps(resolved, indent=2) + "\n", encoding="utf-8")

    stop = total if runtime.stop_at_step is None else min(total, runtime.stop_at_step)
    if stop < start:
        raise ConfigError(f"stop_at_step {stop} is before the checkpoint's step {start}")

    def train_mode() -> None:
        set_train_mode(encoder, config.freeze_batchnorm)
        if recipe.heads is not None:
            recipe.heads.train()

    def evaluate(step: int) -> dict:
        report = evaluate_encoder(
            encoder, dataset.test, dataset.recall_ks, config.eval_batch_size, runtime.num_workers,
            config.eval_max_images, config.seed, runtime.progress,
        )
        train_mode()
        record = {"kind": "eval", "step": step, **report}
        log.append(record)
        return record

    def checkpoint(step: int) -> None:
        sha = save_encoder(encoder, run_dir)
        save_trainer_state(run_dir, {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "sampler": recipe.sampler_state(step),
            "recipe": recipe.state_dict(),
            "torch_rng_state": torch.get_rng_state(),
            "encoder_sha256": sha,
        })

    if start == 0:
        evaluate(0)
    recipe.on_start(start, log)
    train_mode()
    batches = recipe.batches(start, stop)
    bar = tqdm(total=total, initial=start, desc="train", disable=not runtime.progress, dynamic_ncols=True)
    interval = _Interval()
    train_seconds, train_images, hook_seconds, steady = 0.0, 0, 0.0, []
    interrupted = None
    with StopSignals() as signals:
        for step in range(start, stop):
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            lrs = {g.get("name", str(i)): g["lr"] for i, g in enumerate(optimizer.param_groups)}
            for _ in range(config.accum_steps):
                out = recipe.micro_step(next(batches))
                (out.loss / config.accum_steps).backward()
                interval.add(out)
            optimizer.step()
            scheduler.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0
            interval.seconds += seconds
            done = step + 1
            bar.update(1)
            bar.set_postfix(loss=f"{out.stats['loss']:.4f}", lr=f"{lrs['backbone']:.2e}")
            if done % config.log_every == 0 or done == stop:
                record = interval.record(done, lrs)
                log.append(record)
                train_seconds += interval.seconds
                train_images += interval.images
                steady.append(record["images_per_s"])
                interval = _Interval()
            hook_seconds += recipe.after_step(done, log)
            train_mode()
            if config.eval_every and done % config.eval_every == 0 and done != total:
                evaluate(done)
            if done % config.checkpoint_every == 0 or done == stop or signals.received:
                checkpoint(done)
            if signals.received:  # Ctrl-C / SIGTERM: stopped after a complete step, resumable from here
                logger.warning("%s: stopped at step %d with a checkpoint; continue with --resume", signals.received,
                               done)
                stop, interrupted = done, signals.received
                break
    bar.close()
    del batches
    if start == stop:  # nothing ran (resuming a finished or stopped-at run): still leave a consistent checkpoint
        checkpoint(stop)
    summary = {"run_dir": str(run_dir), "recipe": recipe_name, "step": stop, "total_steps": total,
               "finished": stop == total, "interrupted": interrupted}
    if stop == total and (start < stop or not (run_dir / SUMMARY_FILE).exists()):
        evaluate(stop)
    records = log.records()
    plot_metrics(records, run_dir / PLOT_FILE, title=f"{recipe_name}: {encoder.config.backbone}, "
                 f"{encoder.config.token_set}", loss_label=recipe.loss_label)
    evals = [r for r in records if r["kind"] == "eval"]
    trains = [r for r in records if r["kind"] == "train"]
    summary.update({
        "device": str(device),
        "bf16_autocast": bf16,
        "this_session": {
            "steps": stop - start,
            "train_images": train_images,
            "train_seconds": round(train_seconds, 3),
            "train_images_per_s": round(train_images / train_seconds, 2) if train_seconds else None,
            "steady_images_per_s": round(sorted(steady[1:])[len(steady[1:]) // 2], 2) if len(steady) > 1 else None,
            "between_steps_seconds": round(hook_seconds, 3),
            **recipe.session_summary(),
        },
        "first_loss": trains[0]["loss"] if trains else None,
        "last_loss": trains[-1]["loss"] if trains else None,
        "eval_before": _strip(evals[0]) if evals else None,
        "eval_after": _strip(evals[-1]) if evals and evals[-1]["step"] == total else None,
    })
    if summary["finished"]:
        (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "kind"}


class _Interval:
    """Accumulates the micro-batches of one logging interval: means of the recipe's stats, sums of its counts."""

    def __init__(self):
        self.stats: dict[str, list[float]] = {}
        self.counts: dict[str, int] = {}
        self.images, self.seconds = 0, 0.0

    def add(self, out) -> None:
        for key, value in out.stats.items():
            self.stats.setdefault(key, []).append(float(value))
        for key, value in out.counts.items():
            self.counts[key] = self.counts.get(key, 0) + int(value)
        self.images += out.images

    def record(self, step: int, lrs: dict) -> dict:
        def mean(xs):
            xs = [x for x in xs if not math.isnan(x)]
            return sum(xs) / len(xs) if xs else float("nan")

        return {
            "kind": "train", "step": step, **{k: mean(v) for k, v in self.stats.items()}, **self.counts,
            "images": self.images, "seconds": round(self.seconds, 4),
            "images_per_s": round(self.images / self.seconds, 2) if self.seconds else None,
            **{f"lr_{name}": lr for name, lr in lrs.items()},
        }
