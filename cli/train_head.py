"""``regis train head`` (train the token head on the Debian real-photo corpus) and ``regis eval-photos`` (its
evaluation on the held-out test photos); issue 22, docs/TRAINING.md. Nothing heavy at import time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

Corpus = Annotated[Path | None, typer.Option("--corpus", help="The real-photo corpus (regis photos --source debian "
                                             "DIR); built there first when missing. Default: ~/.cache/regis/photos.")]
Cache = Annotated[Path | None, typer.Option("--cache", help="Where backbone token caches (and the corpus's "
                                            "packages) are kept. Default: ~/.cache/regis.")]
Quiet = Annotated[bool, typer.Option("--quiet", help="No progress bars.")]
BASE_BACKBONE = "efficientnet-lite0"  # the frozen backbone whose tokens the head reads


def _corpus(corpus: Path | None, cache: Path) -> Path:
    from regis.data.debian_photos import CORPUS_FILE, fetch_and_build

    corpus = corpus or cache / "photos"
    if not (corpus / CORPUS_FILE).is_file():
        typer.echo(f"building the real-photo corpus in {corpus} (apt-get download + dpkg -x)", err=True)
        fetch_and_build(corpus, cache=cache)
    return corpus


def _instances(encoder, corpus: Path, cache: Path, split: str, seed: int, views: int, regions: int,
               progress: bool, tail_stages: int = 0):
    """The split's instance cache: its scene photos (seed ``10 seed``) then its object photos (``10 seed + 1``),
    each built once and kept in ``cache/features`` (resumable: a partial file keeps the work done)."""
    from regis.data.debian_photos import read_corpus
    from training.photos.evaluate import encoder_key
    from training.photos.features import InstanceCache, instance_cache

    _, records = read_corpus(corpus)
    parts = []
    for i, kind in enumerate(("scene", "object")):
        name = f"instances-{split}-{kind}-s{10 * seed + i}-v{views}-r{regions}-{encoder_key(encoder)}"
        name += f"-pretail{tail_stages}" if tail_stages else ""
        path = cache / "features" / f"{name}.pt"
        if not path.is_file():
            photos = [(corpus / r.file, r.kind) for r in records if r.split == split and r.kind == kind]
            typer.echo(f"caching backbone tokens of {len(photos)} {split} {kind} photos -> {path}", err=True)
            part = instance_cache(encoder, photos, seed=10 * seed + i, views=views, scene_regions=regions,
                                  object_regions=0, progress=progress, partial=path.with_suffix(".partial"),
                                  tail_stages=tail_stages)
            part.save(path)
            path.with_suffix(".partial").unlink(missing_ok=True)
        parts.append(InstanceCache.load(path))
    return InstanceCache.concat(parts)


def train_head_cmd(
    out: Annotated[Path, typer.Option("--out", help="Run directory (created; or the run to --resume).")],
    corpus: Corpus = None,
    cache: Cache = None,
    dim: Annotated[int, typer.Option("--dim", help="D', the width of the head's tokens.")] = 256,
    hidden: Annotated[int, typer.Option("--hidden", help="Width of the head's MLP branch (0: linear, the shipped "
                                        "head).")] = 0,
    steps: Annotated[int, typer.Option("--steps", help="Optimiser steps.")] = 400,
    batch_photos: Annotated[int, typer.Option("--batch-photos", help="P: photos per batch.")] = 64,
    per_photo: Annotated[int, typer.Option("--per-photo", help="K: instances (regions) per photo.")] = 4,
    lr: Annotated[float, typer.Option("--lr", help="AdamW learning rate.")] = 1e-3,
    tau: Annotated[float, typer.Option("--tau", help="InfoNCE temperature.")] = 0.05,
    koleo: Annotated[float, typer.Option("--koleo", help="KoLeo weight (0: off).")] = 0.1,
    views: Annotated[int, typer.Option("--views", help="Cached edited views per instance.")] = 4,
    regions: Annotated[int, typer.Option("--regions", help="Random regions per scene photo (+ the whole photo).")]
    = 4,
    seed: Annotated[int, typer.Option("--seed", help="Batch, initialisation and cache seed.")] = 0,
    cache_seed: Annotated[int | None, typer.Option("--cache-seed", help="Seed of the train/val caches' regions and "
                                                   "edits, when it differs from --seed (another training seed on "
                                                   "the same caches). Default: --seed.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --out from its checkpoint.")] = False,
    stop_at_step: Annotated[int | None, typer.Option("--stop-at-step", help="Checkpoint and stop here.")] = None,
    tail_stages: Annotated[int, typer.Option("--tail-stages", help="Also train the backbone's last N stages "
                                             "(caches their input activations instead of the tokens; "
                                             "training.photos.tail). 0: frozen backbone, the shipped head.")] = 0,
    tail_lr: Annotated[float, typer.Option("--tail-lr", help="AdamW learning rate of those stages (0: they stay "
                                           "frozen, the frozen recipe on the same caches).")] = 1e-4,
    tail_l2sp: Annotated[float, typer.Option("--tail-l2sp", help="L2-SP weight pulling those stages towards the "
                                             "pretrained weights (0: off).")] = 0.0,
    quiet: Quiet = False,
) -> None:
    """Train regis's token head (1280 -> D' per token) on the real-photo corpus: InfoNCE over MaxSim + KoLeo on
    cached backbone tokens of edited views (SSCD's recipe; the backbone stays frozen). One command from nothing:
    it builds the corpus and the token caches when they are missing."""
    import torch

    from regis.data.debian_photos import DEFAULT_CACHE
    from regis.models.encoder import build_encoder
    from training.photos.train import HeadTrainConfig, train_head

    torch.set_num_threads(1)  # a 2-core machine: one thread is faster and steadier (ANCHORS.md)
    cache = cache or DEFAULT_CACHE
    corpus = _corpus(corpus, cache)
    encoder = build_encoder(BASE_BACKBONE)
    cache_seed = seed if cache_seed is None else cache_seed
    train = _instances(encoder, corpus, cache, "train", cache_seed, views, regions, not quiet, tail_stages)
    val = _instances(encoder, corpus, cache, "val", cache_seed + 1, views, regions, not quiet, tail_stages)
    config = HeadTrainConfig(out_dim=dim, hidden=hidden, steps=steps, batch_photos=batch_photos,
                             per_photo=per_photo, lr=lr, tau=tau, koleo_weight=koleo, seed=seed, eval_every=100,
                             checkpoint_every=100, tail_stages=tail_stages, tail_lr=tail_lr, tail_l2sp=tail_l2sp)
    tail = None
    if tail_stages:
        from training.photos.tail import TailReadout, cached_tail

        tail = TailReadout(encoder, tail_stages, cached_tail(train.config)["grids"])
    summary = train_head(train, val, out, config, resume=resume, progress=not quiet, stop_at=stop_at_step,
                         tail=tail)
    typer.echo(json.dumps(summary))


def eval_photos_cmd(
    corpus: Corpus = None,
    cache: Cache = None,
    weights: Annotated[Path | None, typer.Option("--weights", "-w", help="A token head (a regis train head run "
                                                 "directory or its head.safetensors). Default: the head shipped "
                                                 "as efficientnet-lite0-regis.")] = None,
    untrained_only: Annotated[bool, typer.Option("--untrained-only", help="Score the untrained encoder only.")]
    = False,
    seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated seeds of the query sets.")] = "0,1,2",
    split: Annotated[str, typer.Option("--split", help="test (held out) or val.")] = "test",
    out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
    quiet: Quiet = False,
) -> None:
    """Recall@1 per query kind (easy, hard, crops, tiles, views, bursts) on the corpus's held-out photos, for the
    untrained global token, the untrained 10-token MaxSim, and both with the token head; pooled over seeds with
    95 % intervals (bootstrap over photos)."""
    import platform
    import sys
    import time

    import torch

    from regis.data.debian_photos import DEFAULT_CACHE
    from regis.errors import ConfigError
    from regis.models.encoder import build_encoder
    from training.photos.evaluate import eval_cache, evaluate_head, format_table

    torch.set_num_threads(1)
    if split not in ("test", "val"):
        raise ConfigError(f"--split must be test or val, got {split!r}")
    try:
        seed_list = [int(s) for s in seeds.split(",")]
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {seeds!r}") from None
    cache = cache or DEFAULT_CACHE
    corpus = _corpus(corpus, cache)
    base = build_encoder(BASE_BACKBONE)
    head_encoder = None if untrained_only else build_encoder(
        "efficientnet-lite0-regis", weights=str(weights) if weights else None)
    t0 = time.perf_counter()
    records = eval_cache(base, corpus, seed_list, cache / "features", split=split, progress=not quiet)
    result = evaluate_head(records, head_encoder.head if head_encoder else None)
    report = {
        "command": "regis " + " ".join(sys.argv[1:]), "split": split, "seeds": seed_list,
        "base": base.config.model_dump(), "head": head_encoder.weights_info.model_dump() if head_encoder else None,
        "machine": platform.machine(), "torch": torch.__version__, "seconds": round(time.perf_counter() - t0, 1),
        **result,
    }
    typer.echo(format_table(result))
    typer.echo(f"AccuracyCalculator cross-check (global, object photos): {result['crosscheck']}")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
