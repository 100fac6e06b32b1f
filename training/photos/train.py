"""Training the token head on cached backbone tokens (issue 22): SSCD's recipe with MaxSim as the similarity.

Each step draws P photos of the training split, K of each photo's instances (the whole photo and random regions:
other regions of the same photo are negatives, the tiles case), and one cached edited view per instance; the
views are the queries (all m tokens), the instances' clean images the gallery (their T tokens), both through the
head and L2-normalised; the loss is ``training.photos.loss.head_loss`` (InfoNCE over MaxSim + KoLeo). AdamW,
timm's cosine schedule with warm-up, timm's EMA of the head's weights (what is saved and evaluated).

With ``tail_stages`` S > 0 (issue 22's "then try unfreezing the last stage(s)") the caches hold the activations
at the input of the backbone's last S stages (``training.photos.tail``) and those stages train with the head
(``TailHead``; AdamW at ``tail_lr``, no weight decay, optionally L2-SP towards the pretrained weights with weight
``tail_l2sp``; the EMA covers both); ``tail_lr`` 0 keeps them frozen: the caches are read through them once and
the run is exactly the frozen recipe on those tokens (the comparison's other arm).

The head starts as the PCA projection of the training tokens (``pca_init``). Every ``eval_every`` steps the EMA
head is scored on the validation split's cached instances (``val_recall``): each edited view against every clean
instance, Recall@1, a right answer being its own instance or another region of its photo that shows it.

Run directory: ``config.json``, ``metrics.jsonl`` (one line per ``log_every`` steps and per validation),
``checkpoint.pt`` (head, EMA, optimiser, schedule, RNG states, step; every ``checkpoint_every`` steps),
``head.safetensors`` (the EMA head, float16) and ``summary.json`` at the end. ``resume`` continues from the
checkpoint with the same batches.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from regis.errors import ConfigError, WeightsError
from regis.indexes.layout import write_json_atomic
from regis.models.head import TokenHead, file_sha256, save_head
from regis.models.weights import HEAD_RUN_FILE as HEAD_FILE
from training.photos.features import InstanceCache
from training.photos.loss import head_loss
from training.photos.tail import TailHead, TailReadout, cached_tail, tail_tokens


class HeadTrainConfig(BaseModel):
    """What a head-training run computes (saved as ``config.json``; units in brackets).

    Attributes:
        out_dim: D' [dims]; hidden: the MLP branch's width (0: linear head).
        steps, batch_photos (P), per_photo (K): optimiser steps and the batch: P photos x up to K instances.
        lr, weight_decay, warmup_steps: AdamW and timm's cosine schedule (to lr x ``min_lr_ratio``).
        ema_decay: timm ModelEmaV3 decay of the saved head.
        tau: InfoNCE temperature; koleo_weight: lambda of KoLeo (0: off).
        seed: batch sampling and initialisation seed.
        eval_every, log_every, checkpoint_every: [steps].
        tail_stages, tail_lr, tail_l2sp: the backbone's last stages trained with the head (module docstring);
            recorded only when ``tail_stages`` > 0 (``record``), so that a frozen run's files are unchanged.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    out_dim: int = Field(256, ge=8)
    hidden: int = Field(0, ge=0)
    steps: int = Field(400, ge=1)
    batch_photos: int = Field(64, ge=2)
    per_photo: int = Field(4, ge=1)
    lr: float = Field(1e-3, gt=0)
    min_lr_ratio: float = Field(0.01, ge=0, le=1)
    weight_decay: float = Field(1e-4, ge=0)
    warmup_steps: int = Field(100, ge=0)
    ema_decay: float = Field(0.995, ge=0, lt=1)
    tau: float = Field(0.05, gt=0)
    koleo_weight: float = Field(0.1, ge=0)
    seed: int = 0
    eval_every: int = Field(250, ge=0)
    log_every: int = Field(50, ge=1)
    checkpoint_every: int = Field(500, ge=1)
    tail_stages: int = Field(0, ge=0)
    tail_lr: float = Field(1e-4, ge=0)
    tail_l2sp: float = Field(0.0, ge=0)

    def record(self) -> dict:
        """What ``config.json`` and the head file's metadata hold: the fields, less the tail's when there is
        none."""
        return self.model_dump(exclude={"tail_stages", "tail_lr", "tail_l2sp"} if not self.tail_stages else None)


def pca_init(head: TokenHead, tokens: torch.Tensor) -> None:
    """Set ``head.lin`` to the PCA projection of ``tokens`` (n, F) onto its top D' components (centred: bias =
    -W mean)."""
    x = tokens.float()
    mean = x.mean(0)
    _, _, v = torch.linalg.svd(x - mean, full_matrices=False)
    w = v[: head.out_dim]
    with torch.no_grad():
        head.lin.weight.copy_(w)
        head.lin.bias.copy_(-w @ mean)


def project(head: TokenHead | None, tokens: torch.Tensor) -> torch.Tensor:
    """(…, F) unit-norm float16/32 tokens -> (…, D') unit-norm float32 (``head`` None: the tokens themselves)."""
    x = tokens.float()
    return F.normalize(head(x) if head is not None else x, dim=-1)


def region_shows(view_photo: torch.Tensor, view_box: torch.Tensor, gallery_photo: torch.Tensor,
                 gallery_box: torch.Tensor) -> torch.Tensor:
    """(B, N) bool: gallery region n is of the same photo as view b and covers >= 75 % of the view's region.

    Args:
        view_photo: (B,) int64 photo of each view; view_box: (B, 4) float32 its region in the photo [px].
        gallery_photo: (N,) int64; gallery_box: (N, 4) float32, likewise.
    """
    vb, gb = view_box, gallery_box
    iw = (torch.minimum(vb[:, None, 2], gb[None, :, 2]) - torch.maximum(vb[:, None, 0], gb[None, :, 0])).clamp(min=0)
    ih = (torch.minimum(vb[:, None, 3], gb[None, :, 3]) - torch.maximum(vb[:, None, 1], gb[None, :, 1])).clamp(min=0)
    area = ((vb[:, 2] - vb[:, 0]) * (vb[:, 3] - vb[:, 1]))[:, None]
    return (view_photo[:, None] == gallery_photo[None, :]) & (iw * ih >= 0.75 * area)


def positives(cache: InstanceCache, views_of: torch.Tensor, view_idx: torch.Tensor,
              gallery_of: torch.Tensor) -> torch.Tensor:
    """(B, N) bool: gallery instance n is a right answer for the view (instance ``views_of[b]``, view
    ``view_idx[b]``): its own instance, or an instance of the same photo showing >= 75 % of the view's region
    (``region_shows``)."""
    shows = region_shows(cache.photo[views_of], cache.view_box[views_of, view_idx], cache.photo[gallery_of],
                         cache.box[gallery_of])
    return shows | (views_of[:, None] == gallery_of[None, :])


def gallery(head: TokenHead | TailHead | None, clean: torch.Tensor, tokens: int) -> torch.Tensor:
    """The gallery side: ``project`` of the first ``tokens`` tokens of cached clean images (B, m, F); with a
    ``TailHead``, of cached activations (B, P, C), whose tokens are read first."""
    if isinstance(head, TailHead):
        return project(head, clean)[:, :tokens]
    return project(head, clean[:, :tokens])


@torch.no_grad()
def val_hits(head: TokenHead | TailHead | None, cache: InstanceCache, tokens: int = 10, chunk: int = 256
             ) -> torch.Tensor:
    """(I V,) bool: whether each cached view (instance-major) of ``cache`` finds a right answer first among all its
    clean instances (module docstring); the gallery keeps its first ``tokens`` tokens, the views all of theirs."""
    from training.photos.loss import maxsim_matrix

    n, v = cache.views.shape[:2]
    g = gallery(head, cache.clean, tokens)
    inst = torch.arange(n).repeat_interleave(v)
    vidx = torch.arange(v).repeat(n)
    hits = []
    for i in range(0, n * v, chunk):
        b_inst, b_v = inst[i : i + chunk], vidx[i : i + chunk]
        q = project(head, cache.views[b_inst, b_v])
        best = maxsim_matrix(q, g).argmax(1)
        ok = positives(cache, b_inst, b_v, torch.arange(n))
        hits.append(ok[torch.arange(len(best)), best])
    return torch.cat(hits)


def val_recall(head: TokenHead | TailHead | None, cache: InstanceCache, tokens: int = 10, chunk: int = 256
               ) -> float:
    """Recall@1 of every cached view against every clean instance of ``cache``: the mean of ``val_hits``."""
    return float(val_hits(head, cache, tokens, chunk).float().mean())


class BatchSampler:
    """P photos x up to K instances x one view each, from a seeded numpy Generator (its state is checkpointed)."""

    def __init__(self, cache: InstanceCache, photos: int, per_photo: int, seed: int):
        self.by_photo = [np.flatnonzero(cache.photo.numpy() == p) for p in range(len(cache.photos))]
        self.by_photo = [ix for ix in self.by_photo if len(ix)]
        if len(self.by_photo) < photos:
            raise ConfigError(f"the cache has {len(self.by_photo)} photos, fewer than a batch's {photos}")
        self.photos, self.per_photo, self.views = photos, per_photo, cache.views.shape[1]
        self.rng = np.random.default_rng([seed, 11])

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = self.rng.choice(len(self.by_photo), self.photos, replace=False)
        inst = np.concatenate([self.rng.choice(self.by_photo[p], min(self.per_photo, len(self.by_photo[p])),
                                               replace=False) for p in chosen])
        return torch.from_numpy(inst), torch.from_numpy(self.rng.integers(0, self.views, len(inst)))


def train_head(train: InstanceCache, val: InstanceCache | None, out: Path, config: HeadTrainConfig,
               resume: bool = False, progress: bool = True, tokens: int = 10, stop_at: int | None = None,
               tail: TailReadout | None = None) -> dict:
    """Train (or with ``resume`` continue) a head on cached tokens; writes the run directory (module docstring).

    Args:
        train, val: instance caches of the training and validation splits (``training.photos.features``).
        out: the run directory.
        tokens: T, the gallery's tokens (the first T of each cached clean image; the views keep all m).
        stop_at: checkpoint and return at this step (``resume`` continues from there).
        tail: the backbone's last ``config.tail_stages`` stages (``training.photos.tail.TailReadout``), when the
            caches hold pre-tail activations (module docstring).

    Returns:
        The summary: steps, seconds, final and best validation Recall@1, the head file's SHA-256.

    Raises:
        ConfigError: ``resume`` without a checkpoint, or with another config than the saved one; ``tail`` and
            ``config.tail_stages`` or the caches disagree.
        WeightsError: the head file read back is not the one written.
    """
    from timm.scheduler import CosineLRScheduler
    from timm.utils import ModelEmaV3
    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _check_tail(train, val, config, tail)
    start = None  # the pretrained tail's parameters (L2-SP)
    if tail is not None:
        frozen = tail_tokens(train, tail)  # the PCA start of both arms
        if not config.tail_lr:  # the frozen arm: today's recipe on the tokens the tail gives
            train, val, tail = frozen, (tail_tokens(val, tail) if val is not None else None), None
    torch.manual_seed(config.seed)
    head = TokenHead(tail.readout.config.dim if tail else train.clean.shape[-1], config.out_dim, config.hidden)
    groups = [{"params": list(head.parameters()), "lr": config.lr, "weight_decay": config.weight_decay}]
    if tail is not None:
        tail.requires_grad_(True)
        groups.append({"params": list(tail.parameters()), "lr": config.tail_lr, "weight_decay": 0.0})
        start = [q.detach().clone() for q in tail.parameters()]
        head = TailHead(tail, head)
    opt = torch.optim.AdamW(groups)
    sched = CosineLRScheduler(opt, t_initial=config.steps, lr_min=config.lr * config.min_lr_ratio,
                              warmup_t=config.warmup_steps, warmup_lr_init=config.lr * 0.01, t_in_epochs=True)
    sampler = BatchSampler(train, config.batch_photos, config.per_photo, config.seed)
    step, t_used = 0, 0.0
    ckpt = out / "checkpoint.pt"
    if resume:
        if not ckpt.is_file():
            raise ConfigError(f"nothing to resume in {out}: no checkpoint.pt")
        saved = json.loads((out / "config.json").read_text())
        if saved != config.record():
            raise ConfigError(f"{out} was started with another configuration: {saved}")
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        head.load_state_dict(state["head"])
        ema = ModelEmaV3(head, decay=config.ema_decay)
        ema.module.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"])
        sampler.rng.bit_generator.state = state["sampler"]
        torch.set_rng_state(state["torch_rng"])
        step, t_used = state["step"], state["seconds"]
    else:
        pcs = frozen if tail is not None else train
        pca_init(head.head if tail is not None else head,
                 torch.cat([pcs.clean[:, :tokens].flatten(0, 1), pcs.views.flatten(0, 2)])[::7])
        ema = ModelEmaV3(head, decay=config.ema_decay)
        write_json_atomic(out / "config.json", config.record())  # written, then renamed: never half-written
        (out / "metrics.jsonl").write_text("")
        if val is not None:
            untrained = tail_tokens(val, tail) if tail is not None else val  # the frozen encoder's tokens
            _log(out, {"step": 0, "val_r1_untrained": val_recall(None, untrained, tokens),
                       "val_r1": val_recall(ema.module, val, tokens)})
    log = []
    t0 = time.perf_counter() - t_used
    bar = tqdm(total=config.steps, initial=step, desc="head", unit="step", disable=not progress)
    end = min(config.steps, stop_at or config.steps)
    while step < end:
        sched.step(step)
        inst, view = sampler()
        q = project(head, train.views[inst, view])
        g = gallery(head, train.clean[inst], tokens)
        pos = positives(train, inst, view, inst)
        ignore = pos & ~torch.eye(len(inst), dtype=torch.bool)
        loss, parts = head_loss(q, g, config.tau, config.koleo_weight, ignore)
        if start is not None and config.tail_l2sp:
            l2sp = sum(((w - w0) ** 2).sum() for w, w0 in zip(tail.parameters(), start, strict=True))
            loss = loss + config.tail_l2sp * l2sp
            parts["l2sp"] = float(l2sp.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ema.update(head, step=step)
        step += 1
        bar.update(1)
        log.append({"loss": float(loss.detach()), **parts})
        if step % config.log_every == 0 or step == config.steps:
            mean = {k: round(float(np.mean([r[k] for r in log])), 4) for k in log[0]}
            _log(out, {"step": step, "lr": opt.param_groups[0]["lr"], **mean,
                       "seconds": round(time.perf_counter() - t0, 1)})
            bar.set_postfix(loss=mean["loss"])
            log = []
        if val is not None and config.eval_every and (step % config.eval_every == 0 or step == config.steps):
            _log(out, {"step": step, "val_r1": val_recall(ema.module, val, tokens)})
        if step % config.checkpoint_every == 0 or step == config.steps:
            _checkpoint(ckpt, head, ema, opt, sampler, step, time.perf_counter() - t0)
    bar.close()
    seconds = time.perf_counter() - t0
    if step < config.steps:
        _checkpoint(ckpt, head, ema, opt, sampler, step, seconds)
        return {"steps": step, "seconds": round(seconds, 1), "stopped": True}
    # the file's metadata holds what decides the weights and nothing that varies between runs (no timings), so
    # a rerun writes a file with the same SHA-256
    final = ema.module.head if tail is not None else ema.module
    sha = save_head(final, out / HEAD_FILE, extra={"config": config.record(), "steps": step,
                                                    "train_cache": without_timings(train.config)})
    if tail is not None:  # the trained tail (not loadable by regis's encoders yet: an experiment's output)
        from safetensors.torch import save_file

        tmp = out / "tail.tmp"  # written, then renamed (as save_head and _checkpoint do): never a half-written file
        save_file({k: v.contiguous() for k, v in ema.module.tail.tail.state_dict().items()}, str(tmp))
        tmp.replace(out / "tail.safetensors")
    vals = [r["val_r1"] for r in read_metrics(out) if "val_r1" in r]
    summary = {"steps": step, "seconds": round(seconds, 1), "val_r1_final": vals[-1] if vals else None,
               "val_r1_best": max(vals) if vals else None, "head_sha256": sha, "head_bytes":
               (out / HEAD_FILE).stat().st_size}
    write_json_atomic(out / "summary.json", summary)
    if file_sha256(out / HEAD_FILE) != sha:  # the file on disk is not the head just saved
        raise WeightsError(f"{out / HEAD_FILE} does not hold the head just written (SHA-256 differs)")
    return summary


def _check_tail(train: InstanceCache, val: InstanceCache | None, config: HeadTrainConfig,
                tail: TailReadout | None) -> None:
    """Raise ``ConfigError`` unless ``tail``, ``config.tail_stages`` and the caches' kind agree."""
    stages = tail.stages if tail is not None else 0
    if stages != config.tail_stages:
        raise ConfigError(f"config.tail_stages is {config.tail_stages} but the tail given has {stages} stages")
    for name, cache in (("training", train), ("validation", val)):
        cached = cached_tail(cache.config)["stages"] if cache is not None else stages
        if cached != stages:
            raise ConfigError(f"the {name} cache was made with tail_stages {cached}, the run has {stages}")


def without_timings(value):
    """``value`` (JSON-like) without its "seconds" entries, at any depth."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def _checkpoint(path: Path, head, ema, opt, sampler, step: int, seconds: float) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"head": head.state_dict(), "ema": ema.module.state_dict(), "opt": opt.state_dict(),
                "sampler": sampler.rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "step": step,
                "seconds": seconds}, tmp)
    tmp.replace(path)


def _log(out: Path, record: dict) -> None:
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def read_metrics(out: Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl``."""
    path = Path(out) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
