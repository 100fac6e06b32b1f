"""The cached-token recipes' guards against overfitting (issue 22): WiSE-FT mixing, the L2-SP anchor, early
stopping on a validation callable, stop_after, restrict."""

from __future__ import annotations

import pytest
import torch

from training.cached.recipes import interpolate, restrict, start_head, train_dmcac, train_triplet


def _cache(n_per_class: int = 12, classes: int = 3, views: int = 2, m: int = 15, f: int = 32) -> dict:
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(classes, f, generator=g)
    labels = torch.arange(classes).repeat_interleave(n_per_class)
    tokens = centres[labels][:, None, None, :] + 3.0 * torch.randn(len(labels), views, m, f, generator=g)
    return {"tokens": torch.nn.functional.normalize(tokens, dim=-1).half(), "labels": labels, "config": {}}


def _distance(a: torch.nn.Module, b: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(sum(((p - q) ** 2).sum() for p, q in zip(a.parameters(), b.parameters(), strict=True)))


def test_interpolate_mixes_parameters_linearly():
    cache = _cache()
    start = start_head(cache, out_dim=8)
    head, _ = train_triplet(cache, steps=20, triplets=8, out_dim=8, lr=1e-2)
    assert _distance(interpolate(start, head, 0.0), start) == 0.0
    assert _distance(interpolate(start, head, 1.0), head) == 0.0
    half = interpolate(start, head, 0.5)
    assert _distance(half, start) == pytest.approx(0.25 * _distance(head, start), rel=1e-4)
    with pytest.raises(ValueError, match="alpha"):
        interpolate(start, head, 1.5)


def test_anchor_keeps_the_head_near_its_start():
    cache = _cache()
    start = start_head(cache, out_dim=8)
    free, _ = train_triplet(cache, steps=60, triplets=8, out_dim=8, lr=1e-2)
    held, _ = train_triplet(cache, steps=60, triplets=8, out_dim=8, lr=1e-2, anchor=10.0)
    assert _distance(held, start) < 0.5 * _distance(free, start)


def test_early_stopping_returns_the_best_head_by_validation():
    cache = _cache()
    start = start_head(cache, out_dim=8)
    # a validation that prefers the start: the best head is the step-0 one, whatever training did after it
    head, log = train_dmcac(cache, steps=30, batch=8, top_k=4, refresh_every=10, out_dim=8, lr=1e-2,
                            val=lambda h: -_distance(h, start), val_every=10)
    assert log[0]["best_step"] == 0
    assert [p["step"] for p in log[0]["val_curve"]] == [0, 10, 20, 30]
    assert _distance(head, start) == 0.0
    assert log[0]["val_curve"][-1]["val"] < 0.0  # training moved the head; early stopping undid it


def test_stop_after_cuts_the_schedule():
    head, log = train_triplet(_cache(), steps=50, triplets=8, out_dim=8, stop_after=7)
    assert log[0]["steps"] == 7
    with pytest.raises(ValueError, match="stop_after"):
        train_triplet(_cache(), steps=50, triplets=8, out_dim=8, stop_after=-1)


def test_restrict_keeps_the_named_classes():
    cache = _cache()
    part = restrict(cache, [0, 2])
    assert set(part["labels"].tolist()) == {0, 2}
    assert len(part["tokens"]) == 24
    with pytest.raises(ValueError, match="no image of classes"):
        restrict(cache, [7])


def test_the_final_head_is_scored_when_steps_is_no_multiple_of_val_every():
    cache = _cache()
    start = start_head(cache, out_dim=8)
    # the validation prefers the head farthest from the start: the last one (step 25), which the curve must hold
    head, log = train_triplet(cache, steps=25, triplets=8, out_dim=8, lr=1e-2,
                              val=lambda h: _distance(h, start), val_every=10)
    assert [p["step"] for p in log[0]["val_curve"]] == [0, 10, 20, 25]
    assert log[0]["best_step"] == 25
    # a multiple of val_every is scored once, not twice
    _, log = train_triplet(cache, steps=20, triplets=8, out_dim=8, lr=1e-2, val=lambda h: 0.0, val_every=10)
    assert [p["step"] for p in log[0]["val_curve"]] == [0, 10, 20]
