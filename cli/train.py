"""``regis train triplet``, ``regis train dmcac`` and ``regis eval`` (added to the root CLI by ``register``).

Nothing heavy is imported at module level: the root CLI imports this module on every ``regis`` invocation.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import typer

from cli.options import Backbone, CueMethod, RandomInit, RoiSize, Weights

Data = Annotated[Path, typer.Option("--data", help="Dataset folder (imagefolder, CUB, Cars, SOP, In-Shop or "
                                    "Fashion-MNIST idx files).")]
Format = Annotated[str, typer.Option("--format", help="auto, imagefolder, cub, cars, sop, inshop, fashion-mnist.")]
TrainClasses = Annotated[Path | None, typer.Option("--train-classes", help="imagefolder: file naming the training "
                         "classes (one a line); default: first half of the sorted class names.")]
SkipCountCheck = Annotated[bool, typer.Option("--skip-count-check", help="Accept a benchmark copy whose image or "
                           "class counts differ from the standard release.")]
TokenSet = Annotated[str | None, typer.Option("--token-set", help="cls, cls+reg or cls+reg+roi (default).")]
ImageSize = Annotated[int | None, typer.Option("--image-size", help="Input side in px (CNN backbones only).")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto (cuda if available), cpu, cuda, cuda:1 ...")]
Workers = Annotated[int, typer.Option("--num-workers", help="DataLoader worker processes.")]

# Options shared by the training recipes.
RunDir = Annotated[Path, typer.Option("--out", help="Run directory (created; or the run to --resume).")]
TrainData = Annotated[Path | None, typer.Option("--data", help="Dataset folder (see regis eval --help).")]
InitSeed = Annotated[int, typer.Option("--init-seed", help="Seed of --random-init.")]
TrainRoiSize = Annotated[int, typer.Option("--roi-size", "-N", help="ROI window side N (odd).")]
Border = Annotated[str, typer.Option("--border", help="ROI window at the grid border: clip or shift.")]
AccumSteps = Annotated[int, typer.Option("--accum-steps", help="Micro-batches per step.")]
BackboneLR = Annotated[float, typer.Option("--lr", help="Backbone learning rate.")]
WeightDecay = Annotated[float, typer.Option("--weight-decay", help="AdamW weight decay.")]
WarmupSteps = Annotated[int, typer.Option("--warmup-steps", help="Linear warm-up steps.")]
MinLrRatio = Annotated[float, typer.Option("--min-lr-ratio", help="Cosine floor, x lr.")]
EvalEvery = Annotated[int, typer.Option("--eval-every", help="Test every N steps (0: before/after only).")]
EvalMaxImages = Annotated[int, typer.Option("--eval-max-images", help="Test-subset size (0: all).")]
LogEvery = Annotated[int, typer.Option("--log-every", help="Steps per metrics.jsonl line.")]
CheckpointEvery = Annotated[int, typer.Option("--checkpoint-every", help="Steps per checkpoint.")]
Resume = Annotated[bool, typer.Option("--resume", help="Continue the run in --out from its checkpoint.")]
Precision = Annotated[str, typer.Option("--precision", help="auto (bf16 on CUDA), fp32 or bf16.")]
StopAtStep = Annotated[int | None, typer.Option("--stop-at-step", help="Checkpoint and stop here.")]
Quiet = Annotated[bool, typer.Option("--quiet", help="No progress bars.")]
TrainBatchnorm = Annotated[bool, typer.Option("--train-batchnorm", help="Update BatchNorm running statistics "
                          "while training (default: frozen at their pretrained values).")]

# Options that may accompany --resume (they change how the run executes, not what it computes).
RUNTIME_PARAMS = {"out", "resume", "device", "num_workers", "precision", "stop_at_step", "quiet"}
_OWN = object()  # in _recipe_options: a place for an option of the recipe's own


def _recipe_options(
    ctx: typer.Context,
    out: RunDir,
    data: TrainData = None,
    data_format: Format = "auto",
    train_classes: TrainClasses = None,
    skip_count_check: SkipCountCheck = False,
    backbone: Backbone = None,
    weights: Weights = None,
    random_init: RandomInit = False,
    init_seed: InitSeed = 0,
    token_set=_OWN,
    roi_size: TrainRoiSize = 3,
    border: Border = "clip",
    cue_method: CueMethod = None,
    image_size: ImageSize = None,
    train_batchnorm: TrainBatchnorm = False,
    recipe=_OWN,
    accum_steps: AccumSteps = 1,
    lr: BackboneLR = 2e-5,
    head_lr=_OWN,
    weight_decay: WeightDecay = 1e-2,
    warmup_steps: WarmupSteps = 100,
    min_lr_ratio: MinLrRatio = 0.0,
    seed=_OWN,
    eval_every: EvalEvery = 0,
    eval_max_images: EvalMaxImages = 2000,
    eval_batch_size=_OWN,
    log_every: LogEvery = 10,
    checkpoint_every: CheckpointEvery = 500,
    resume: Resume = False,
    device: DeviceOpt = "auto",
    num_workers: Workers = 2,
    precision: Precision = "auto",
    stop_at_step: StopAtStep = None,
    quiet: Quiet = False,
) -> None:
    """The options of every training recipe, in the order ``--help`` lists them: ``_recipe_command`` puts the
    recipe's own ``token_set``, ``head_lr``, ``seed`` and ``eval_batch_size`` (their help differs) where this
    signature has them, and its other options at ``recipe``."""


def _recipe_command(command: Callable[..., None]) -> Callable[..., None]:
    """Give a recipe's command (its own options, then ``**shared``) the options of ``_recipe_options`` too: typer
    reads the signature set here, and calls the command with every option by name (the shared ones land in
    ``shared``).

    Raises:
        TypeError: the command lacks one of the options ``_recipe_options`` leaves to the recipe.
    """
    own = {name: p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
           for name, p in inspect.signature(command, eval_str=True).parameters.items() if p.kind != p.VAR_KEYWORD}
    layout = inspect.signature(_recipe_options, eval_str=True).parameters
    params = []
    for name, p in layout.items():
        if p.default is not _OWN:
            params.append(p)
        elif name == "recipe":
            params += [q for q in own.values() if q.name not in layout]
        elif name in own:
            params.append(own[name])
        else:
            raise TypeError(f"{command.__name__} must declare its own {name!r} option")
    command.__signature__ = inspect.Signature(params)
    return command


def _train(recipe: str, shared: dict, make_config: Callable[..., object]) -> None:
    """The steps of every recipe: with ``--resume``, continue the run in ``--out`` (refusing options that change
    what it computes); else start one from ``make_config(**values)``, ``values`` being the config fields of the
    shared options (``--data`` required); then print its summary.

    Raises:
        ConfigError: no ``--data`` without ``--resume``, config options with it, or a bad configuration.
    """
    from regis.errors import ConfigError
    from training.engine.loop import Runtime, resume_run, start_run

    o = SimpleNamespace(**shared)
    runtime = Runtime(device=o.device, num_workers=o.num_workers, precision=o.precision,
                      stop_at_step=o.stop_at_step, progress=not o.quiet)
    if o.resume:
        _refuse_config_options(o.ctx)
        summary = resume_run(o.out, runtime, recipe)
    else:
        if o.data is None:
            raise ConfigError("--data is required (unless --resume)")
        config = make_config(
            data=str(o.data.expanduser().resolve()), data_format=o.data_format,
            train_classes=str(o.train_classes.resolve()) if o.train_classes else None,
            check_counts=not o.skip_count_check, backbone=o.backbone,
            weights=str(o.weights) if o.weights else None, random_init=o.random_init,
            init_seed=o.init_seed, roi_size=o.roi_size, border=o.border, cue_method=o.cue_method,
            image_size=o.image_size, freeze_batchnorm=not o.train_batchnorm, accum_steps=o.accum_steps,
            lr=o.lr, weight_decay=o.weight_decay, warmup_steps=o.warmup_steps,
            min_lr_ratio=o.min_lr_ratio, eval_every=o.eval_every,
            eval_max_images=o.eval_max_images or None, log_every=o.log_every,
            checkpoint_every=o.checkpoint_every,
        )
        summary = start_run(recipe, config, o.out, runtime)
    _print_summary(summary)


@_recipe_command
def triplet(
    token_set: Annotated[str, typer.Option("--token-set", help="cls, cls+reg or cls+reg+roi.")] = "cls+reg+roi",
    sampler: Annotated[str, typer.Option("--sampler", help="random (random triplets) or pk (P x K batches + "
                                         "--miner).")] = "random",
    miner: Annotated[str, typer.Option("--miner", help="batch-hard or semi-hard (pk sampler).")] = "batch-hard",
    p: Annotated[int, typer.Option("--p", help="Classes per batch (pk).")] = 8,
    k: Annotated[int, typer.Option("--k", help="Images per class (pk).")] = 4,
    triplets_per_batch: Annotated[int, typer.Option("--triplets-per-batch", help="T (random sampler).")] = 16,
    margin: Annotated[float, typer.Option("--margin", help="alpha, on the summed MaxSim score.")] = 0.2,
    reducer: Annotated[str, typer.Option("--reducer", help="mean or mean-nonzero.")] = "mean",
    steps: Annotated[int, typer.Option("--steps", help="Optimiser steps.")] = 1000,
    head_lr: Annotated[float, typer.Option("--head-lr", help="Learning rate outside the backbone.")] = 1e-3,
    seed: Annotated[int, typer.Option("--seed", help="Sampler and augmentation seed.")] = 0,
    eval_batch_size: Annotated[int, typer.Option("--eval-batch-size")] = 64,
    **shared,
) -> None:
    """Fine-tune an encoder with the multi-vector triplet loss on MaxSim scores (METHODS.md section 1)."""
    from training.config import make_config

    _train("triplet", shared, lambda **values: make_config(
        **values, token_set=token_set, sampler=sampler, miner=miner, p=p, k=k,
        triplets_per_batch=triplets_per_batch, margin=margin, reducer=reducer, steps=steps, head_lr=head_lr,
        seed=seed, eval_batch_size=eval_batch_size,
    ))


def _refuse_config_options(ctx: typer.Context) -> None:
    """With --resume, the saved config.json decides: refuse options that would change what the run computes.

    Raises:
        ConfigError: naming the options given on the command line besides ``RUNTIME_PARAMS``.
    """
    from regis.errors import ConfigError

    given = sorted(
        name for name in ctx.params
        # compared by name: typer vendors its own copy of click's ParameterSource enum
        if name not in RUNTIME_PARAMS and getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"
    )
    if given:
        raise ConfigError(f"--resume continues the run's saved config.json; do not pass {given}")


@_recipe_command
def dmcac(
    token_set: Annotated[str, typer.Option("--token-set", help="Tokens the exported encoder gives: cls, cls+reg "
                                           "or cls+reg+roi (DMCAC trains token 0, or all with --similarity "
                                           "maxsim).")] = "cls+reg+roi",
    split: Annotated[str, typer.Option("--split", help="stratified (half of each class queries, half database) or "
                                       "overlap (both = all; a query is never its own neighbour).")] = "stratified",
    max_train_per_class: Annotated[int | None, typer.Option("--max-train-per-class", help="Seeded subset of the "
                                                            "training images per class (default: all).")] = None,
    views: Annotated[int, typer.Option("--views", help="A views per query: the original + A-1 augmented.")] = 6,
    top_k: Annotated[int, typer.Option("--top-k", help="k neighbours per view in the cached database.")] = 12,
    retrieval: Annotated[str, typer.Option("--retrieval", help="topk (union of the views' top-k) or full (the "
                                           "whole cached database as context).")] = "topk",
    faiss_index: Annotated[str, typer.Option("--faiss-index", help="FAISS factory spec of the database cache "
                                             "(Flat = exact; e.g. HNSW32).")] = "Flat",
    refresh_every: Annotated[int, typer.Option("--refresh-every", help="r: recompute the database every r "
                                               "epochs.")] = 5,
    tau: Annotated[float, typer.Option("--tau", help="Temperature of the similarity distributions.")] = 1.0,
    betas: Annotated[str, typer.Option("--betas", help="b_frob,b_ce,b_cac (0,1,0 = plain CE fine-tuning).")]
    = "1,1,1",
    similarity: Annotated[str, typer.Option("--similarity", help="cls (token-0 dot products) or maxsim (MaxSim "
                                            "over all tokens).")] = "cls",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Queries per micro-batch (x A images).")] = 32,
    epochs: Annotated[int, typer.Option("--epochs", help="Passes over the training queries.")] = 20,
    head_lr: Annotated[float, typer.Option("--head-lr", help="Learning rate of the CAC and CE heads.")] = 1e-3,
    seed: Annotated[int, typer.Option("--seed", help="Split, sampler and augmentation seed.")] = 0,
    eval_batch_size: Annotated[int, typer.Option("--eval-batch-size", help="Images per forward pass when "
                                                 "embedding the test split and the database.")] = 64,
    **shared,
) -> None:
    """Fine-tune an encoder with DMCAC: retrieval against a cached training database inside the loop, L_frob +
    L_ce + L_cac (METHODS.md section 2). The exported encoder.safetensors holds the encoder only."""
    from training.config import make_dmcac_config

    _train("dmcac", shared, lambda **values: make_dmcac_config(
        **values, token_set=token_set, split=split, max_train_per_class=max_train_per_class, views=views,
        top_k=top_k, retrieval=retrieval, faiss_index=faiss_index, refresh_every=refresh_every, tau=tau,
        betas=_floats(betas, "--betas", 3), similarity=similarity, batch_size=batch_size, epochs=epochs,
        head_lr=head_lr, seed=seed, eval_batch_size=eval_batch_size,
    ))


def _floats(text: str, option: str, count: int) -> tuple[float, ...]:
    """Parse ``count`` comma-separated numbers.

    Raises:
        ConfigError: not ``count`` numbers (names ``option``).
    """
    from regis.errors import ConfigError

    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if len(values) != count:
        raise ConfigError(f"{option} takes {count} comma-separated numbers, got {text!r}")
    return values


def _print_summary(summary: dict) -> None:
    s = summary["this_session"]
    typer.echo(f"run {summary['run_dir']}: step {summary['step']} ({'finished' if summary['finished'] else 'stopped'})")
    typer.echo(f"train: {s['steps']} steps, {s['train_images']} images in {s['train_seconds']} s = "
               f"{s['train_images_per_s']} images/s on {summary['device']}; loss {summary['first_loss']} -> "
               f"{summary['last_loss']}")
    if "refreshes" in s:
        typer.echo(f"database refreshed at epochs {s['refreshes']} in {s['refresh_seconds']} s "
                   f"({s['steps_per_epoch']} steps per epoch)")
    for label, rec in (("before", summary.get("eval_before")), ("after", summary.get("eval_after"))):
        if rec:
            typer.echo(f"test {label} (step {rec['step']}): " + _metrics_line(rec))


def _metrics_line(report: dict) -> str:
    parts = []
    for scoring in ("single", "multi"):
        if scoring in report:
            m = report[scoring]
            parts.append(f"{scoring}: " + " ".join(f"{key}={100 * val:.2f}" for key, val in m.items()))
    return "; ".join(parts)


def evaluate(
    data: Data,
    data_format: Format = "auto",
    train_classes: TrainClasses = None,
    skip_count_check: SkipCountCheck = False,
    split: Annotated[str, typer.Option("--split", help="test (class-disjoint protocol) or train (leave-one-out).")]
    = "test",
    weights: Weights = None,
    backbone: Backbone = None,
    random_init: RandomInit = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of --random-init and of the --max-images subset.")] = 0,
    token_set: TokenSet = None,
    roi_size: RoiSize = None,
    cue_method: CueMethod = None,
    image_size: ImageSize = None,
    query_layout: Annotated[str | None, typer.Option(
        "--query-layout", help="tokens or tokens+roi-cues: the query's tokens for the multi-vector scores "
        "(default: the encoder's).")] = None,
    ks: Annotated[str | None, typer.Option("--ks", help="Recall@K values, e.g. 1,2,4,8 (default: the "
                                           "dataset's protocol).")] = None,
    max_images: Annotated[int | None, typer.Option("--max-images", help="Evaluate a seeded random subset of "
                                                   "this many query images.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 64,
    num_workers: Workers = 2,
    device: DeviceOpt = "auto",
    out: Annotated[Path | None, typer.Option("--out", help="Write the JSON report here.")] = None,
    quiet: Quiet = False,
) -> None:
    """Retrieval evaluation: Recall@K, mAP@R and R-precision, single-vector (token 0, cosine) and multi-vector
    (MaxSim), on the class-disjoint test split (METHODS.md section 3)."""
    import time

    from regis.errors import ConfigError
    from regis.models.encoder import build_encoder
    from training.data.base import EvalSplit
    from training.data.registry import open_dataset
    from training.engine.loop import resolve_device
    from training.evaluation.report import evaluate_encoder

    if split not in ("test", "train"):
        raise ConfigError(f"--split must be test or train, got {split!r}")
    dataset = open_dataset(data, data_format, train_classes, not skip_count_check)
    recall_ks = dataset.recall_ks
    if ks:
        try:
            recall_ks = tuple(int(x) for x in ks.split(","))
        except ValueError:
            raise ConfigError(f"--ks must be comma-separated integers, got {ks!r}") from None
    dev = resolve_device(device)
    encoder = build_encoder(
        backbone=backbone, weights=str(weights) if weights else None, random_init=random_init, seed=seed,
        roi_size=roi_size, token_set=token_set, cue_method=cue_method, image_size=image_size, device=dev,
        query_layout=query_layout,
    )
    eval_split = dataset.test if split == "test" else EvalSplit(dataset.train)
    t0 = time.perf_counter()
    metrics = evaluate_encoder(encoder, eval_split, recall_ks, batch_size, num_workers, max_images, seed, not quiet)
    report = {
        "dataset": {k: v for k, v in dataset.summary().items() if not k.endswith("_names")},
        "split": split,
        "encoder": encoder.config.model_dump(),
        "weights": encoder.weights_info.model_dump(),
        "device": str(dev),
        "seconds": round(time.perf_counter() - t0, 3),
        **metrics,
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    typer.echo(f"{dataset.name} {split} ({metrics['protocol']}, {metrics['num_queries']} queries), "
               f"{encoder.config.backbone} {encoder.config.token_set} N={encoder.config.roi_size}, "
               f"weights {encoder.weights_info.source}")
    typer.echo(_metrics_line(metrics))


def register(app: typer.Typer) -> None:
    """Attach ``regis train triplet``, ``regis train dmcac``, ``regis train head``, ``regis eval`` and
    ``regis eval-photos`` to the root ``regis`` app."""
    train_app = typer.Typer(help="Fine-tune encoders on labelled images.", no_args_is_help=True)
    train_app.command("triplet")(triplet)
    train_app.command("dmcac")(dmcac)
    from cli.train_head import eval_photos_cmd, train_head_cmd

    train_app.command("head")(train_head_cmd)
    app.add_typer(train_app, name="train")
    app.command("eval")(evaluate)
    app.command("eval-photos")(eval_photos_cmd)
