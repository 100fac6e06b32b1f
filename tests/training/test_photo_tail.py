"""Unfreezing the backbone's last stage for the token head (issue 22; training.photos.tail): the cached pre-tail
activations read through the pretrained tail give the frozen encoder's tokens, and a few training steps of tail +
head on tiny cached activations lower the loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch

from regis.errors import ConfigError
from regis.models.encoder import build_encoder
from training.photos.features import InstanceCache
from training.photos.tail import TailHead, TailReadout, cached_tail, pre_tail, tail_tokens
from training.photos.train import HeadTrainConfig, read_metrics, train_head, val_recall

pytestmark = pytest.mark.slow  # a (randomly initialised) backbone and 8 steps through its last stage: ~30 s


@pytest.fixture(scope="module")
def encoder():
    torch.set_num_threads(1)
    return build_encoder("efficientnet-lite0", random_init=True, seed=0)


def _images(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, 224, 224, generator=torch.Generator().manual_seed(seed))


def test_the_pretrained_tail_gives_the_frozen_encoders_tokens(encoder):
    x = _images(2, 0)
    with torch.no_grad():
        frozen = encoder.forward_with_buddies(x, query=True)[0]
    for stages in (1, 2):
        acts, grids = pre_tail(encoder, x, stages)
        tail = TailReadout(encoder, stages, grids)
        assert grids == ([[7, 7], [5, 5]] if stages == 1 else [[14, 14], [10, 10]])
        assert frozen.shape == (2, 15, encoder.config.dim)
        torch.testing.assert_close(tail(acts.clone()), frozen, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="stages"):
        pre_tail(encoder, x, 0)
    with pytest.raises(ConfigError, match="cached positions"):
        tail(acts[:, :50].clone())


def _cache(encoder, photos: int, per_photo: int, views: int, seed: int) -> InstanceCache:
    """Instances whose views are the clean image plus noise, as activations before the last stage."""
    n = photos * per_photo
    g = torch.Generator().manual_seed(seed)
    clean = torch.rand(n, 3, 224, 224, generator=g) * 2 - 1
    acts, grids = pre_tail(encoder, torch.cat([clean, (clean[:, None] + 0.3 * torch.randn(
        n, views, 3, 224, 224, generator=g)).flatten(0, 1)]), 1)
    acts = acts.half()
    return InstanceCache(
        clean=acts[:n], views=acts[n:].reshape(n, views, *acts.shape[1:]),
        photo=torch.arange(photos).repeat_interleave(per_photo), box=torch.tensor([[0.0, 0.0, 10.0, 10.0]] * n),
        view_box=torch.tensor([[[0.0, 0.0, 5.0, 5.0]] * views] * n), photos=[f"p{i}" for i in range(photos)],
        config={"parts": [{"tail": {"stages": 1, "grids": grids}}]},
    )


def test_a_few_steps_of_tail_and_head_lower_the_loss(tmp_path, encoder):
    train, val = _cache(encoder, 6, 2, 2, 0), _cache(encoder, 3, 2, 2, 1)
    grids = cached_tail(train.config)["grids"]
    config = HeadTrainConfig(out_dim=16, steps=8, batch_photos=6, per_photo=2, lr=1e-2, warmup_steps=0,
                             eval_every=8, log_every=4, checkpoint_every=8, tau=0.1, koleo_weight=0.0,
                             ema_decay=0.0, tail_stages=1, tail_lr=1e-3)
    tail = TailReadout(encoder, 1, grids)
    before = {k: v.clone() for k, v in tail.tail.state_dict().items()}
    summary = train_head(train, val, tmp_path / "run", config, progress=False, tail=tail)
    losses = [r["loss"] for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(losses) == 2 and losses[-1] < losses[0]
    first = read_metrics(tmp_path / "run")[0]
    assert summary["steps"] == 8 and (tmp_path / "run" / "tail.safetensors").is_file()
    assert any(not torch.equal(before[k], v) for k, v in tail.tail.state_dict().items())  # the tail trained
    assert all(torch.equal(before[k], v) for k, v in tail.tail.state_dict().items() if "running" in k)  # BN stats
    # tail_lr 0: the frozen arm, today's recipe on the tokens read through the tail (the tail does not move)
    frozen = TailReadout(encoder, 1, grids)
    train_head(train, val, tmp_path / "frozen", config.model_copy(update={"tail_lr": 0.0}), progress=False,
               tail=frozen)
    assert all(torch.equal(before[k], v) for k, v in frozen.tail.state_dict().items())
    # both arms start from the same head, scored on the same frozen tokens
    assert read_metrics(tmp_path / "frozen")[0] == first
    tokens = tail_tokens(val, frozen)
    assert tokens.clean.shape == (6, 15, encoder.config.dim)
    assert val_recall(None, tokens) == pytest.approx(val_recall(TailHead(frozen, torch.nn.Identity()), val),
                                                     abs=0.1)
    with pytest.raises(ConfigError, match="tail_stages"):
        train_head(train, val, tmp_path / "bad", config.model_copy(update={"tail_stages": 0}), progress=False)


def test_a_failed_tail_write_leaves_no_partial_tail_file(tmp_path, encoder, monkeypatch):
    """Fault injected in the tail's safetensors write (half the file written, then an error): no
    ``tail.safetensors`` is left, and resuming the run writes a whole one."""
    train = _cache(encoder, 4, 2, 2, 0)
    config = HeadTrainConfig(out_dim=16, steps=1, batch_photos=4, per_photo=2, lr=1e-2, warmup_steps=0,
                             eval_every=0, log_every=1, checkpoint_every=1, tau=0.1, koleo_weight=0.0,
                             ema_decay=0.0, tail_stages=1, tail_lr=1e-3)
    grids = cached_tail(train.config)["grids"]
    real = safetensors.torch.save_file

    def half_then_fail(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        if Path(filename).name.startswith("tail."):  # the tail's write (the head's goes through head.*)
            data = Path(filename).read_bytes()
            Path(filename).write_bytes(data[: len(data) // 2])
            raise OSError("injected: disk full while writing the tail")

    monkeypatch.setattr(safetensors.torch, "save_file", half_then_fail)
    run = tmp_path / "run"
    with pytest.raises(OSError, match="injected"):
        train_head(train, None, run, config, progress=False, tail=TailReadout(encoder, 1, grids))
    assert not (run / "tail.safetensors").exists()
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    tail = TailReadout(encoder, 1, grids)
    train_head(train, None, run, config, progress=False, tail=tail, resume=True)
    saved = safetensors.torch.load_file(str(run / "tail.safetensors"))
    assert saved.keys() == tail.tail.state_dict().keys()
