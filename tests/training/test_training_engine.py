"""Warm-up + cosine schedule, parameter groups, frozen BatchNorm, and the seeded batch samplers."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from regis.errors import ConfigError
from training.data.samplers import PKSampler, RandomTripletSampler, StepBatches
from training.engine.optim import build_optimizer, param_groups
from training.engine.schedule import build_scheduler, warmup_cosine


def test_warmup_cosine_values():
    assert warmup_cosine(0, 4, 14) == pytest.approx(0.25)
    assert warmup_cosine(3, 4, 14) == pytest.approx(1.0)
    assert warmup_cosine(4, 4, 14) == pytest.approx(1.0)  # cosine starts at 1
    assert warmup_cosine(9, 4, 14) == pytest.approx(0.5)  # half-way through the decay
    assert warmup_cosine(14, 4, 14) == pytest.approx(0.0)
    assert warmup_cosine(14, 4, 14, min_ratio=0.1) == pytest.approx(0.1)
    assert warmup_cosine(6, 0, 12) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    with pytest.raises(ConfigError):
        warmup_cosine(0, 5, 4)


class _WithHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(2, 2)
        self.head = nn.Linear(2, 1)


def test_param_groups_and_scheduler():
    model = _WithHead()
    groups = param_groups(model, 1e-5, 1e-3, 1e-2)
    assert [g["name"] for g in groups] == ["backbone", "head"]
    assert [len(g["params"]) for g in groups] == [2, 2]
    only_backbone = param_groups(model.backbone, 1e-5, 1e-3, 1e-2)  # no "backbone." prefix: all are head
    assert [g["name"] for g in only_backbone] == ["backbone", "head"] and only_backbone[0]["params"] == []
    opt = build_optimizer(model, 1e-5, 1e-3)
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["weight_decay"] == 1e-2
    sched = build_scheduler(opt, 2, 4)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.5e-5, 0.5e-3])
    opt.step()
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-5, 1e-3])


def test_encoder_has_only_a_backbone_group(tiny):
    groups = param_groups(tiny, 1e-5, 1e-3, 1e-2)
    assert [g["name"] for g in groups] == ["backbone"]


@pytest.fixture
def tiny():
    from regis.models.encoder import build_encoder

    return build_encoder("vit-tiny-reg4-test", random_init=True)


LABELS = np.repeat(np.arange(6), 5)  # 6 classes x 5 images
LABELS = np.concatenate([LABELS, [6]])  # plus a singleton class (cannot give a positive)


def test_pk_sampler_batches():
    s = PKSampler(LABELS, p=3, k=4, seed=1)
    batch = s.batch(0)
    assert len(batch) == 12 == s.batch_size
    idx = [i for i, _ in batch]
    labels = LABELS[idx].reshape(3, 4)
    assert (labels == labels[:, :1]).all()  # class-major blocks of K
    assert len(set(labels[:, 0])) == 3 and 6 not in labels
    assert all(len(set(idx[i * 4 : i * 4 + 4])) == 4 for i in range(3))  # no repeat when a class has >= K images
    assert s.batch(0) == batch  # a pure function of (seed, step, micro)
    assert s.batch(1) != batch and s.batch(0, micro=1) != batch
    assert PKSampler(LABELS, 3, 4, seed=2).batch(0) != batch


def test_pk_sampler_repeats_when_class_is_small():
    s = PKSampler(np.array([0, 0, 1, 1]), p=2, k=3)
    assert len(s.batch(0)) == 6


def test_pk_sampler_rejects_too_few_classes():
    with pytest.raises(ConfigError, match="lower --p"):
        PKSampler(LABELS, p=7, k=2)
    with pytest.raises(ConfigError):
        PKSampler(LABELS, p=2, k=1)


def test_random_triplets():
    s = RandomTripletSampler(LABELS, triplets=50, seed=0)
    idx = [i for i, _ in s.batch(3)]
    a, p, n = idx[:50], idx[50:100], idx[100:]
    assert all(x != y for x, y in zip(a, p, strict=True))
    assert (LABELS[a] == LABELS[p]).all() and (LABELS[a] != LABELS[n]).all()
    assert 6 not in LABELS[a]  # the singleton class never anchors
    with pytest.raises(ConfigError):
        RandomTripletSampler(np.array([0, 0, 0]), triplets=2)


def test_step_batches_resume_draws_the_same_batches():
    s = PKSampler(LABELS, 2, 2, seed=0)
    full = list(StepBatches(s, 0, 5, accum=2))
    tail = list(StepBatches(s, 3, 5, accum=2))
    assert len(full) == 10 and full[6:] == tail
    assert StepBatches(s, 3, 5).state_dict(3) == {"seed": 0, "next_step": 3}


def test_frozen_batchnorm_keeps_running_statistics():
    from training.engine.modes import set_train_mode

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(6, 2))
    before = model[1].running_mean.clone()
    assert set_train_mode(model, freeze_batchnorm=True) == 1
    assert model.training and model[2].training and not model[1].training
    model(torch.randn(2, 3, 8, 8) + 5)
    assert torch.equal(model[1].running_mean, before)
    assert set_train_mode(model, freeze_batchnorm=False) == 0
    model(torch.randn(2, 3, 8, 8) + 5)
    assert not torch.equal(model[1].running_mean, before)
