"""Fine-tuning the whole encoder (backbone and token head) on edits made on the fly (issue 22, the GPU arm).

The cached recipe (``training.photos.train``) keeps the backbone frozen, or its last stages
(``training.photos.tail``), and reads four fixed edited views per instance: what fits 2 CPU cores. This module is
its GPU counterpart: every step draws fresh regions and fresh edits (``training.photos.edits.train_edit``) in
DataLoader workers and runs the encoder end to end (224 px pass, 160 px ROI pass, token readout, head), so that
the backbone itself can learn to undo the edits a linear head cannot (RESULTS.md section 5: hard edits 0.718).

Batches are those of the cached recipe, at a fixed size: photos drawn until B instances are reached, per scene photo
the whole photo and K - 1 random regions (10-60 % of the area: other regions of the same photo are negatives, the
tiles case), per object photo the whole photo; per instance its clean image (the gallery: T = 10 index tokens) and
one edited view (the query: all m tokens). B is fixed so that every step has the same shapes: with a size that
changed with the photos drawn, an H200 ran 14 s a step (28 s with cudnn.benchmark) for 3 arms of about 110
instances; the cause is not established (suspected: cuDNN planning its kernels for each new shape). Loss:
``training.photos.loss.head_loss`` (InfoNCE over MaxSim + KoLeo), a gallery item that shows >= 75 % of a view's
region left out of that view's softmax (``batch_ignore``).

Several arms train in one process on the same batches (the edits cost more CPU than the network costs GPU), each
its own copy of the starting encoder with its own trainable part (``ARMS``): "head" (backbone frozen: the control),
"tail2" / "tail3" (the last 2 / 3 stages + ``conv_head`` + the head), "all" (every parameter). BatchNorm statistics
stay the pretrained ones (the encoder stays in eval mode; RESULTS.md section 1: updating them cost 13 points).
AdamW, the project's warm-up + cosine schedule (``training.engine.schedule.warmup_cosine``), timm's EMA (what is
saved).

Output (``out``): ``<arm>-s<step>.safetensors`` at each step of ``checkpoint_at`` and at the end (the EMA encoder:
``backbone.*`` and ``head.*`` float16; metadata ``regis.finetune`` = the config, the arm and the step;
``load_finetuned`` reads it back) and ``finetune.json`` (config, per-arm loss log, seconds, images/s).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from regis.errors import ConfigError
from regis.models.encoder import RegisEncoder
from training.engine.schedule import warmup_cosine
from training.photos import edits
from training.photos.train import region_shows

ARMS = ("head", "tail1", "tail2", "tail3", "all")
METADATA_KEY = "regis.finetune"


class FinetuneConfig(BaseModel):
    """What a fine-tuning run computes (saved with its results; units in brackets).

    Attributes:
        arms: which parts train (``ARMS``), each a separate model on the same batches.
        steps: optimiser steps (with ``budget_s``: an upper bound, the run fits its steps to the budget).
        batch (B), per_photo (K): instances per batch and per scene photo (the whole + K - 1 regions).
        lr_head, lr_backbone: AdamW learning rates of the head and of the backbone's trainable stages.
        weight_decay: AdamW weight decay (head and backbone alike).
        warmup_steps: linear warm-up of the cosine schedule (to lr x ``min_lr_ratio`` at the end).
        ema_decay: timm ModelEmaV3 decay of the saved weights.
        tau, koleo_weight: InfoNCE temperature, KoLeo weight.
        photo_max_side, region_max_side: photos are kept at most this side [px]; a region is downscaled to
            ``region_max_side`` before it is edited (as ``training.photos.features.instance_cache`` does).
        seed: regions, edits, batches and initialisation.
        workers: DataLoader worker processes.
        checkpoint_at: steps at which each arm's EMA weights are also saved.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    arms: tuple[str, ...] = ("head", "all")
    steps: int = Field(600, ge=1)
    batch: int = Field(128, ge=2)
    per_photo: int = Field(4, ge=1)
    lr_head: float = Field(3e-4, ge=0)
    lr_backbone: float = Field(5e-5, ge=0)
    weight_decay: float = Field(1e-4, ge=0)
    warmup_steps: int = Field(30, ge=0)
    min_lr_ratio: float = Field(0.01, ge=0, le=1)
    ema_decay: float = Field(0.99, ge=0, lt=1)
    tau: float = Field(0.05, gt=0)
    koleo_weight: float = Field(0.1, ge=0)
    photo_max_side: int = Field(1024, ge=64)
    region_max_side: int = Field(512, ge=64)
    seed: int = 0
    workers: int = Field(2, ge=0)
    checkpoint_at: tuple[int, ...] = ()


def trainable_parameters(encoder: RegisEncoder, arm: str) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(head parameters, backbone parameters) that ``arm`` trains; every other parameter gets
    ``requires_grad = False``.

    Raises:
        ConfigError: unknown arm, an encoder without a token head, or a tail arm on a backbone that is not a timm
            EfficientNet-like CNN (``blocks``, ``conv_head``, ``bn2``).
    """
    if arm not in ARMS:
        raise ConfigError(f"unknown arm {arm!r}; choose from {ARMS}")
    if encoder.head is None:
        raise ConfigError(f"fine-tuning trains a token head; {encoder.config.backbone} has none")
    bb = encoder.backbone
    encoder.requires_grad_(False)
    if arm == "head":
        parts: list[nn.Module] = []
    elif arm == "all":
        parts = [bb]
    else:
        if not all(hasattr(bb, a) for a in ("blocks", "conv_head", "bn2")):
            raise ConfigError(f"arm {arm} needs a timm EfficientNet-like CNN, not {encoder.config.backbone}")
        s = int(arm[len("tail"):])
        parts = [*bb.blocks[len(bb.blocks) - s :], bb.conv_head, bb.bn2]
    encoder.head.requires_grad_(True)
    for p in parts:
        p.requires_grad_(True)
    backbone = [p for m in parts for p in m.parameters()]
    return list(encoder.head.parameters()), backbone


class PhotoInstances(torch.utils.data.Dataset):
    """Key (photo index, seed) -> the photo's instances, each a clean image and one edited view, both through
    ``transform``.

    Key (photo, seed, k): k instances, k <= ``per_photo`` for a scene photo (the whole photo first, then random
    regions) and k = 1 for an object photo (``instances_of``).

    Item: {"clean": (k, 3, S, S) float32, "view": (k, 3, S, S) float32, "box": (k, 4) float32 the instance's
    region in the photo [px], "view_box": (k, 4) float32 the view's region in the photo [px, rotation ignored],
    "photo": (k,) int64}.
    """

    def __init__(self, photos: list, kinds: list[str], transform, per_photo: int, region_max_side: int):
        if len(photos) != len(kinds):
            raise ConfigError(f"{len(photos)} photos but {len(kinds)} kinds")
        self.photos, self.kinds, self.transform = photos, kinds, transform
        self.per_photo, self.region_max_side = per_photo, region_max_side

    def __len__(self) -> int:
        return len(self.photos)

    def __getitem__(self, key: tuple[int, int, int]) -> dict:
        p, seed, k = key
        if not 1 <= k <= instances_of(self.kinds[p], self.per_photo):
            raise ConfigError(f"photo {p} ({self.kinds[p]}) cannot give {k} instances")
        rng = np.random.default_rng([seed, p, 23])
        img = self.photos[p]
        w, h = img.size
        n = k - 1
        boxes = [(0, 0, w, h)] + [edits.random_box(w, h, rng, 0.1, 0.6) for _ in range(n)]
        clean, views, vboxes = [], [], []
        for box in boxes:
            region = img.crop(tuple(int(v) for v in box))
            f = min(1.0, self.region_max_side / max(region.size))
            small = edits.scale(region, f, min_side=8) if f < 1 else region
            view, b = edits.train_edit(small, rng)
            clean.append(self.transform(small))
            views.append(self.transform(view))
            vboxes.append((box[0] + b[0] / f, box[1] + b[1] / f, box[0] + b[2] / f, box[1] + b[3] / f))
        return {"clean": torch.stack(clean), "view": torch.stack(views),
                "box": torch.tensor(boxes, dtype=torch.float32), "view_box": torch.tensor(vboxes, dtype=torch.float32),
                "photo": torch.full((len(boxes),), p, dtype=torch.int64)}


def collate(items: list[dict]) -> dict:
    """Concatenate ``PhotoInstances`` items along the instance axis."""
    return {k: torch.cat([it[k] for it in items]) for k in items[0]}


def instances_of(kind: str, per_photo: int) -> int:
    """Instances a photo gives a batch: ``per_photo`` for a scene, 1 for an object."""
    return per_photo if kind == "scene" else 1


class PhotoBatches(torch.utils.data.Sampler):
    """``steps`` batches of exactly ``batch`` instances: distinct photos in a random order, each key (photo, seed,
    k) giving ``instances_of`` its kind (the last photo fewer, to make up ``batch``), with a seed unique to its batch
    and slot; the same batches for the same ``seed``.

    Raises:
        ConfigError: all the photos together give fewer than ``batch`` instances.
    """

    def __init__(self, kinds: list[str], per_photo: int, batch: int, steps: int, seed: int):
        total = sum(instances_of(k, per_photo) for k in kinds)
        if total < batch:
            raise ConfigError(f"{len(kinds)} photos give {total} instances, fewer than a batch's {batch}")
        self.kinds, self.per_photo, self.batch, self.steps, self.seed = kinds, per_photo, batch, steps, seed

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        rng = np.random.default_rng([self.seed, 29])
        n = len(self.kinds)
        for step in range(self.steps):
            keys, total = [], 0
            for i, p in enumerate(rng.permutation(n)):
                k = min(instances_of(self.kinds[p], self.per_photo), self.batch - total)
                keys.append((int(p), self.seed * 1_000_003 + step * n + i, k))
                total += k
                if total == self.batch:
                    break
            yield keys


def batch_ignore(photo: torch.Tensor, box: torch.Tensor, view_box: torch.Tensor) -> torch.Tensor:
    """(B, B) bool: gallery instance n is another right answer for view b (same photo, its region covers >= 75 %
    of the view's region), so it is left out of b's softmax; the diagonal (b's own instance) is never set.

    Args:
        photo: (B,) int64 photo of each instance; box: (B, 4) its region; view_box: (B, 4) its view's region [px].
    """
    shows = region_shows(photo, view_box, photo, box)
    return shows & ~torch.eye(len(photo), dtype=torch.bool, device=photo.device)


def save_finetuned(encoder: RegisEncoder, path: Path, meta: dict) -> None:
    """Write ``encoder``'s backbone and head as float16 safetensors (``backbone.*``, ``head.*``) with ``meta`` as
    JSON under ``METADATA_KEY`` (a temporary file, then renamed)."""
    from safetensors.torch import save_file

    sd = {f"backbone.{k}": v for k, v in encoder.backbone.state_dict().items()}
    sd |= {f"head.{k}": v for k, v in encoder.head.state_dict().items()}
    sd = {k: (v.half() if v.is_floating_point() else v).contiguous().cpu() for k, v in sd.items()}
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    save_file(sd, str(tmp), metadata={METADATA_KEY: json.dumps(meta)})
    tmp.replace(path)


def load_finetuned(path: Path, device: str = "cpu") -> tuple[RegisEncoder, dict]:
    """The encoder a ``save_finetuned`` file holds: ``efficientnet-lite0-regis`` (centre crop) with the file's
    backbone and head (float32), ``weights_info`` naming the file and hashing the loaded weights, and its metadata.

    Raises:
        WeightsError: the file is missing, unreadable, or not a fine-tuned encoder of this backbone.
    """
    from safetensors import safe_open

    from regis.errors import WeightsError
    from regis.models.config import WeightsInfo
    from regis.models.encoder import build_encoder
    from regis.models.weights import state_dict_sha256

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"fine-tuned weights {path} do not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})[METADATA_KEY])
            sd = {k: f.get_tensor(k) for k in f.keys()}
    except (KeyError, ValueError, OSError) as exc:
        raise WeightsError(f"{path} is not a fine-tuned regis encoder ({type(exc).__name__})") from exc
    enc = build_encoder("efficientnet-lite0-regis", frame="center-crop", device=device)
    for name, module in (("backbone", enc.backbone), ("head", enc.head)):
        part = {k[len(name) + 1 :]: v.float() for k, v in sd.items() if k.startswith(name + ".")}
        try:
            module.load_state_dict(part)
        except RuntimeError as exc:
            raise WeightsError(f"{path}: its {name} does not fit {enc.config.backbone}") from exc
    info = WeightsInfo(source=f"file:{path.resolve()}", sha256=state_dict_sha256(
        nn.ModuleDict({"backbone": enc.backbone, "head": enc.head})))
    enc.weights_info = info
    return enc.eval(), meta


class _Arm:
    """One arm's model, optimiser, schedule and EMA."""

    def __init__(self, name: str, start: RegisEncoder, cfg: FinetuneConfig, device):
        import copy

        from timm.utils import ModelEmaV3

        self.name = name
        self.encoder = copy.deepcopy(start).to(device).eval()
        if str(device).startswith("cuda"):  # the inputs are channels-last too (``finetune``): one layout throughout
            self.encoder.backbone.to(memory_format=torch.channels_last)
        head, backbone = trainable_parameters(self.encoder, name)
        groups = [{"params": head, "lr": cfg.lr_head}]
        if backbone:
            groups.append({"params": backbone, "lr": cfg.lr_backbone})
        for g in groups:
            g["base_lr"] = g["lr"]
        self.opt = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        self.ema = ModelEmaV3(self.encoder, decay=cfg.ema_decay)
        self.log: list[dict] = []

    def step(self, batch: dict, cfg: FinetuneConfig, lr_scale: float, step: int, autocast) -> dict:
        from training.photos.loss import head_loss

        for g in self.opt.param_groups:
            g["lr"] = g["base_lr"] * lr_scale
        with autocast():
            q = self.encoder.forward_with_buddies(batch["view"], query=True)[0]
            g = self.encoder.forward_with_buddies(batch["clean"])[0]
        loss, parts = head_loss(q.float(), g.float(), cfg.tau, cfg.koleo_weight, batch["ignore"])
        if not torch.isfinite(loss):
            raise FloatingPointError(f"arm {self.name}: loss {float(loss)} at step {step}")
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.ema.update(self.encoder, step=step)
        return {"loss": float(loss.detach()), **parts}


def finetune(start: RegisEncoder, photos: list, kinds: list[str], out: Path, cfg: FinetuneConfig,
             device: str = "cpu", budget_s: float | None = None, progress: bool = True) -> dict:
    """Train every arm of ``cfg`` from ``start`` on the same batches; write ``out`` (module docstring).

    Args:
        start: the starting encoder (with a token head; centre-crop frame); copied per arm, not changed.
        photos: PIL RGB images (the training split), at most ``cfg.photo_max_side`` px; kinds: "scene" | "object".
        device: "cpu" or "cuda" (bfloat16 autocast on CUDA).
        budget_s: when given, after ``calibrate`` steps the run sets its number of steps (at most ``cfg.steps``)
            so that training ends within ``budget_s`` seconds of its start; the steps run are recorded.

    Returns:
        {"steps", "seconds", "images_per_s", "arms": {arm: [log records]}, "files": [...]}.

    Raises:
        ConfigError: bad arms, too few photos for a batch, a start encoder without a head.
        FloatingPointError: a loss that is not finite.
    """
    import contextlib

    from regis.models.transforms import eval_transform

    if start.config.frame != "center-crop":
        raise ConfigError(f"fine-tuning reads centre-cropped inputs; the start encoder's frame is {start.config.frame}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    arms = [_Arm(a, start, cfg, device) for a in cfg.arms]
    data = PhotoInstances(photos, kinds, eval_transform(start.config), cfg.per_photo, cfg.region_max_side)
    loader = torch.utils.data.DataLoader(
        data, batch_sampler=PhotoBatches(kinds, cfg.per_photo, cfg.batch, cfg.steps, cfg.seed), collate_fn=collate,
        num_workers=cfg.workers, pin_memory=device != "cpu", persistent_workers=False,
        prefetch_factor=4 if cfg.workers else None)
    cuda = str(device).startswith("cuda")

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

    steps, calibrate, files, images = cfg.steps, 8, [], 0
    t0 = time.perf_counter()
    t_cal = None
    wait = 0.0
    tw = time.perf_counter()
    for step, batch in enumerate(loader):
        wait += time.perf_counter() - tw
        if step >= steps:
            break
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        batch["ignore"] = batch_ignore(batch["photo"], batch["box"], batch["view_box"])
        if cuda:
            batch["view"] = batch["view"].contiguous(memory_format=torch.channels_last)
            batch["clean"] = batch["clean"].contiguous(memory_format=torch.channels_last)
        # the project's warm-up + cosine (training.engine.schedule); the warm-up shortened when the budget fits
        # fewer steps than it
        scale = warmup_cosine(step, min(cfg.warmup_steps, steps), steps, cfg.min_lr_ratio)
        for arm in arms:
            arm.log.append({"step": step, **arm.step(batch, cfg, scale, step, autocast)})
        images += 2 * len(batch["photo"])
        if step == 2:
            t_cal = time.perf_counter()
        if budget_s is not None and step == calibrate and t_cal is not None:
            per_step = (time.perf_counter() - t_cal) / (calibrate - 2)
            fit = int((budget_s - (time.perf_counter() - t0)) / per_step) + calibrate
            steps = max(calibrate + 1, min(cfg.steps, fit))
        if progress and (step < 12 or step % 20 == 0 or step == steps - 1):  # the first steps: where time goes
            el = time.perf_counter() - t0
            print(json.dumps({"step": step, "of": steps, "s": round(el, 1), "data_wait_s": round(wait, 1),
                              **{a.name: round(float(np.mean([r["loss"] for r in a.log[-20:]])), 4) for a in arms},
                              **{a.name + "_r1": round(float(np.mean([r["batch_r1"] for r in a.log[-20:]])), 3)
                                 for a in arms}}), flush=True)
        if step + 1 in cfg.checkpoint_at and step + 1 < steps:
            files += _save_arms(arms, out, cfg, step + 1)
        tw = time.perf_counter()
    seconds = time.perf_counter() - t0
    files += _save_arms(arms, out, cfg, steps)
    summary = {"config": cfg.model_dump(), "steps": steps, "seconds": round(seconds, 1),
               "data_wait_s": round(wait, 1), "images_per_s": round(images / seconds, 1), "device": str(device),
               "files": files, "arms": {a.name: a.log for a in arms}}
    (out / "finetune.json").write_text(json.dumps(summary) + "\n")
    return summary


def _save_arms(arms: list[_Arm], out: Path, cfg: FinetuneConfig, step: int) -> list[str]:
    names = []
    for arm in arms:
        name = f"{arm.name}-s{step}.safetensors"
        save_finetuned(arm.ema.module, out / name, {"config": cfg.model_dump(), "arm": arm.name, "step": step})
        names.append(name)
    return names


def load_photos(corpus: Path, split: str, max_side: int) -> tuple[list, list[str], list[str]]:
    """The corpus's ``split`` photos decoded as RGB PIL images, downscaled to at most ``max_side`` px; their kinds
    and relative file names (``regis.data.debian_photos.read_corpus``)."""
    from regis.data.debian_photos import read_corpus
    from regis.images.decode import decode_image

    _, records = read_corpus(corpus)
    photos, kinds, names = [], [], []
    for r in records:
        if r.split != split:
            continue
        img = decode_image(Path(corpus) / r.file).image.convert("RGB")
        f = min(1.0, max_side / max(img.size))
        photos.append(edits.scale(img, f, min_side=8) if f < 1 else img)
        kinds.append(r.kind)
        names.append(r.file)
    return photos, kinds, names
