"""The multi-vector triplet fine-tuning loop (METHODS.md section 1) and its run directory.

Run directory (``RUN_DIR``):
    config.json          the resolved configuration (trainer, encoder, dataset counts, runtime, versions)
    encoder.safetensors  the latest weights + encoder config (``--weights RUN_DIR`` for index / serve / eval)
    trainer_state.pt     optimizer, scheduler, sampler and RNG state of the same step (``--resume``)
    metrics.jsonl        training and evaluation records; metrics.png their plot
    summary.json         written when the run reaches its last step
"""

from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from regis.errors import ConfigError
from regis.models.weights import ENCODER_WEIGHTS_FILE
from training.config import TripletConfig
from training.engine.checkpoint import load_trainer_state, save_encoder, save_trainer_state
from training.engine.metrics_log import MetricsLog, plot_metrics
from training.engine.modes import set_train_mode
from training.errors import CheckpointError

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "metrics.png"
SUMMARY_FILE = "summary.json"
PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(frozen=True)
class Runtime:
    """How a run executes, without changing what it computes (not part of ``TripletConfig``).

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


def _build_encoder(config: TripletConfig, weights: str | None):
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


def _make_sampler(config: TripletConfig, labels):
    from training.data.samplers import PKSampler, RandomTripletSampler

    if config.sampler == "pk":
        return PKSampler(labels, config.p, config.k, config.seed)
    return RandomTripletSampler(labels, config.triplets_per_batch, config.seed)


def _versions() -> dict:
    import timm

    import regis

    return {"regis": regis.__version__, "torch": torch.__version__, "timm": timm.__version__,
            "python": platform.python_version()}


def train_triplet(config: TripletConfig, run_dir: Path, runtime: Runtime = Runtime()) -> dict:
    """Start a new run in ``run_dir`` (created; it must not already hold a run).

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
    return _run(config, run_dir, runtime, state=None)


def resume_triplet(run_dir: Path, runtime: Runtime = Runtime()) -> dict:
    """Continue a run from its last checkpoint, at the same step, with the same optimizer, scheduler, sampler and
    RNG state; records written after that checkpoint are dropped from ``metrics.jsonl``.

    Raises:
        CheckpointError: ``run_dir`` is not a resumable run, or its files disagree.
    """
    run_dir = Path(run_dir)
    cfg_path = run_dir / CONFIG_FILE
    if not cfg_path.is_file():
        raise CheckpointError(f"{run_dir} has no {CONFIG_FILE}: not a regis training run")
    stored = json.loads(cfg_path.read_text(encoding="utf-8"))
    config = TripletConfig(**stored["trainer"])
    return _run(config, run_dir, runtime, state=load_trainer_state(run_dir))


def _run(config: TripletConfig, run_dir: Path, runtime: Runtime, state: dict | None) -> dict:
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    from regis.models.transforms import train_transform
    from training.data.images import TransformedImages
    from training.data.registry import open_dataset
    from training.data.samplers import StepBatches
    from training.engine.optim import build_optimizer
    from training.engine.schedule import build_scheduler
    from training.evaluation.report import evaluate_encoder
    from training.losses.triplet import multi_vector_triplet_loss

    device = resolve_device(runtime.device)
    bf16 = _use_bf16(runtime.precision, device)
    dataset = open_dataset(
        Path(config.data), config.data_format, Path(config.train_classes) if config.train_classes else None,
        config.check_counts,
    )
    sampler = _make_sampler(config, dataset.train.labels)  # fails fast on a batch shape the data cannot give
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
    optimizer = build_optimizer(encoder, config.lr, config.head_lr, config.weight_decay)
    scheduler = build_scheduler(optimizer, config.warmup_steps, config.steps, config.min_lr_ratio)
    log = MetricsLog(run_dir / METRICS_FILE)
    runtime_info = {**asdict(runtime), "device": str(device), "bf16_autocast": bf16}
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng_state"])
        log.truncate_after(start)
        log.append({"kind": "resume", "step": start, "runtime": runtime_info})
    else:
        torch.manual_seed(config.seed)
        resolved = {
            "trainer": config.model_dump(),
            "encoder": encoder.config.model_dump(),
            "initial_weights": encoder.weights_info.model_dump(),
            "dataset": dataset.summary(),
            "runtime": runtime_info,
            "versions": _versions(),
        }
        (run_dir / CONFIG_FILE).write_text(json.dumps(resolved, indent=2) + "\n", encoding="utf-8")

    stop = config.steps if runtime.stop_at_step is None else min(config.steps, runtime.stop_at_step)
    if stop < start:
        raise ConfigError(f"stop_at_step {stop} is before the checkpoint's step {start}")
    miner = config.miner if config.sampler == "pk" else None

    def evaluate(step: int) -> dict:
        report = evaluate_encoder(
            encoder, dataset.test, dataset.recall_ks, config.eval_batch_size, runtime.num_workers,
            config.eval_max_images, config.seed, runtime.progress,
        )
        set_train_mode(encoder, config.freeze_batchnorm)
        record = {"kind": "eval", "step": step, **report}
        log.append(record)
        return record

    def checkpoint(step: int) -> None:
        sha = save_encoder(encoder, run_dir)
        save_trainer_state(run_dir, {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "sampler": plan.state_dict(step),
            "torch_rng_state": torch.get_rng_state(),
            "encoder_sha256": sha,
        })

    if start == 0:
        evaluate(0)
    set_train_mode(encoder, config.freeze_batchnorm)
    plan = StepBatches(sampler, start, stop, config.accum_steps)
    loader = DataLoader(
        TransformedImages(dataset.train, train_transform(encoder.config)), batch_sampler=plan,
        num_workers=runtime.num_workers, pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(config.seed),  # worker seeds; the global RNG stays untouched
    )
    batches = iter(loader)
    bar = tqdm(total=config.steps, initial=start, desc="train", disable=not runtime.progress, dynamic_ncols=True)
    interval = _Interval()
    train_seconds, train_images, steady = 0.0, 0, []
    for step in range(start, stop):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        lrs = {g.get("name", str(i)): g["lr"] for i, g in enumerate(optimizer.param_groups)}
        for _ in range(config.accum_steps):
            images, labels = next(batches)
            images, labels = images.to(device, non_blocking=True), labels.to(device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
                tokens = encoder(images)
            out = multi_vector_triplet_loss(tokens.float(), labels, miner, config.margin, config.reducer)
            (out.loss / config.accum_steps).backward()
            interval.add(out, images.shape[0])
        optimizer.step()
        scheduler.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
        interval.seconds += seconds
        done = step + 1
        bar.update(1)
        bar.set_postfix(loss=f"{out.loss.item():.4f}", lr=f"{lrs['backbone']:.2e}")
        if done % config.log_every == 0 or done == stop:
            record = interval.record(done, lrs)
            log.append(record)
            train_seconds += interval.seconds
            train_images += interval.images
            steady.append(record["images_per_s"])
            interval = _Interval()
        if config.eval_every and done % config.eval_every == 0 and done != config.steps:
            evaluate(done)
        if done % config.checkpoint_every == 0 or done == stop:
            checkpoint(done)
    bar.close()
    del batches
    if start == stop:  # nothing ran (resuming a finished or stopped-at run): still leave a consistent checkpoint
        checkpoint(stop)
    summary = {"run_dir": str(run_dir), "step": stop, "finished": stop == config.steps}
    if stop == config.steps and (start < stop or not (run_dir / SUMMARY_FILE).exists()):
        evaluate(stop)
    records = log.records()
    plot_metrics(records, run_dir / PLOT_FILE, title=f"{encoder.config.backbone}, {encoder.config.token_set}")
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
        },
        "first_loss": trains[0]["loss"] if trains else None,
        "last_loss": trains[-1]["loss"] if trains else None,
        "eval_before": _strip(evals[0]) if evals else None,
        "eval_after": _strip(evals[-1]) if evals and evals[-1]["step"] == config.steps else None,
    })
    if summary["finished"]:
        (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "kind"}


class _Interval:
    """Accumulates the micro-batches of one logging interval."""

    def __init__(self):
        self.losses, self.active, self.pos, self.neg, self.triplets = [], [], [], [], 0
        self.images, self.seconds = 0, 0.0

    def add(self, out, images: int) -> None:
        self.losses.append(float(out.loss.detach()))
        self.active.append(out.active_fraction)
        self.pos.append(out.pos_score)
        self.neg.append(out.neg_score)
        self.triplets += out.num_triplets
        self.images += images

    def record(self, step: int, lrs: dict) -> dict:
        def mean(xs):
            xs = [x for x in xs if not math.isnan(x)]
            return sum(xs) / len(xs) if xs else float("nan")

        return {
            "kind": "train", "step": step, "loss": mean(self.losses), "active_fraction": mean(self.active),
            "pos_score": mean(self.pos), "neg_score": mean(self.neg), "triplets": self.triplets,
            "images": self.images, "seconds": round(self.seconds, 4),
            "images_per_s": round(self.images / self.seconds, 2) if self.seconds else None,
            **{f"lr_{name}": lr for name, lr in lrs.items()},
        }
