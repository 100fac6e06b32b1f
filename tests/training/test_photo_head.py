"""The token head's training (issue 22): the loss by hand, a short run on cached tokens, the head file."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from regis.models.head import TokenHead, file_sha256, load_head, save_head
from training.photos.features import InstanceCache
from training.photos.loss import head_loss, koleo, maxsim_matrix
from training.photos.train import HeadTrainConfig, positives, read_metrics, train_head, val_recall


def test_loss_by_hand_on_2x2_tokens():
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]]])
    g = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]])
    # MaxSim / m: q1.g1 = (1 + 1) / 2, q1.g2 = (0 + 1) / 2, q2.g1 = (1 + 1) / 2, q2.g2 = (0 + 0) / 2
    assert torch.allclose(maxsim_matrix(q, g), torch.tensor([[1.0, 0.5], [1.0, 0.0]]))
    loss, parts = head_loss(q, g, tau=0.5)
    # logits / tau, target the diagonal: q1 [2, 1] -> -log(e^2 / (e^2 + e^1)) = log(1 + e^-1);
    # q2 [2, 0] with target g2 -> -log(e^0 / (e^2 + e^0)) = log(1 + e^2)
    expected = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(2))) / 2
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    assert parts["batch_r1"] == 0.5  # q2 ranks g1 first
    # KoLeo over the gallery's token 0: [1, 0] and [0, 1] are sqrt(2) apart
    assert float(koleo(g[:, 0])) == pytest.approx(-math.log(math.sqrt(2)), abs=1e-6)
    with_koleo, parts = head_loss(q, g, tau=0.5, koleo_weight=2.0)
    assert float(with_koleo) == pytest.approx(expected - 2 * math.log(math.sqrt(2)), abs=1e-6)
    # an ignored logit leaves the softmax: q1 without g2 has nothing to lose
    ignored, _ = head_loss(q, g, tau=0.5, ignore=torch.tensor([[False, True], [False, False]]))
    assert float(ignored) == pytest.approx(math.log(1 + math.exp(2)) / 2, abs=1e-6)


def fake_cache(photos: int, per_photo: int, views: int, dim: int = 48, m: int = 6, seed: int = 0) -> InstanceCache:
    """Instances whose clean tokens are random unit vectors and whose views are noisy copies, with a shared
    nuisance direction that the head must learn to ignore."""
    g = torch.Generator().manual_seed(seed)
    n = photos * per_photo
    base = torch.nn.functional.normalize(torch.randn(n, m, dim, generator=g), dim=-1)
    nuisance = torch.randn(n, views, 1, dim, generator=g) * 3.0 * torch.eye(dim)[0]
    noisy = base[:, None] + 0.9 * torch.randn(n, views, m, dim, generator=g) + nuisance
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0]] * n)
    return InstanceCache(
        clean=base.half(), views=torch.nn.functional.normalize(noisy, dim=-1).half(),
        photo=torch.arange(photos).repeat_interleave(per_photo), box=boxes,
        view_box=torch.tensor([[[0.0, 0.0, 5.0, 5.0]] * views] * n), photos=[f"p{i}" for i in range(photos)],
        config={"fake": True},
    )


def test_positives_follow_geometry():
    cache = fake_cache(2, 2, 1)
    cache.box[1] = torch.tensor([20.0, 20.0, 30.0, 30.0])  # instance 1 does not show instance 0's views
    pos = positives(cache, torch.tensor([0, 1]), torch.tensor([0, 0]), torch.arange(4))
    # view of instance 0 (box 0-5): its own, and instance 1? no (box 20-30); other photo's never
    assert pos.tolist() == [[True, False, False, False], [True, True, False, False]]


def test_twenty_steps_on_cached_tokens_lower_the_loss(tmp_path, one_thread):
    train, val = fake_cache(12, 3, 4), fake_cache(6, 3, 4, seed=1)
    config = HeadTrainConfig(out_dim=16, hidden=32, steps=20, batch_photos=8, per_photo=3, lr=3e-3,
                             warmup_steps=2, eval_every=10, log_every=5, checkpoint_every=10, tau=0.1,
                             koleo_weight=0.0, ema_decay=0.5)
    summary = train_head(train, val, tmp_path / "run", config, progress=False, tokens=6)
    losses = [r["loss"] for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert summary["steps"] == 20 and summary["head_sha256"] == file_sha256(tmp_path / "run" / "head.safetensors")
    head = load_head(tmp_path / "run" / "head.safetensors")
    assert head(torch.zeros(3, 48)).shape == (3, 16)
    assert 0.0 <= val_recall(head, val, tokens=6) <= 1.0
    # resume: stopping at 10 and continuing gives the very head of the uninterrupted run
    part = tmp_path / "part"
    assert train_head(train, val, part, config, progress=False, tokens=6, stop_at=10)["stopped"]
    train_head(train, val, part, config, resume=True, progress=False, tokens=6)
    a, b = load_head(tmp_path / "run" / "head.safetensors"), load_head(part / "head.safetensors")
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), k


def _disk_full_writing(monkeypatch, stem: str) -> None:
    """Fault point: the write of ``write_json_atomic``'s temporary file for the run-directory file ``stem.json``
    (``regis.indexes.layout.write_bytes_atomic``): the temporary file is created, then the write fails as on a
    full disk, before the rename."""
    from regis.indexes import layout

    def fake_open(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        if "w" in mode and Path(path).name.startswith(f"{layout.TMP_PREFIX}{stem}.json"):
            f.close()
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return f

    monkeypatch.setattr(layout, "open", fake_open, raising=False)


def test_a_failed_config_or_summary_write_leaves_the_previous_file(tmp_path, one_thread, monkeypatch):
    """``config.json`` (which ``resume`` checks) and ``summary.json`` are written, then renamed, like the head, the
    checkpoint and the tail: a write that fails midway (disk full) leaves the run's previous file as it was."""
    train = fake_cache(12, 3, 4)
    config = HeadTrainConfig(out_dim=16, hidden=32, steps=4, batch_photos=8, per_photo=3, warmup_steps=1,
                             eval_every=0, log_every=2, checkpoint_every=2, koleo_weight=0.0)
    run = tmp_path / "run"
    assert train_head(train, None, run, config, progress=False, tokens=6, stop_at=2)["stopped"]
    saved_config = (run / "config.json").read_text()
    with monkeypatch.context() as patch:  # a new start in the same directory, out of space writing config.json
        _disk_full_writing(patch, "config")
        with pytest.raises(OSError, match="No space"):
            train_head(train, None, run, config, progress=False, tokens=6)
    assert (run / "config.json").read_text() == saved_config
    summary = train_head(train, None, run, config, resume=True, progress=False, tokens=6)
    saved_summary = (run / "summary.json").read_text()
    assert json.loads(saved_summary) == summary
    with monkeypatch.context() as patch:  # the finished run resumed again: the summary rewritten, out of space
        _disk_full_writing(patch, "summary")
        with pytest.raises(OSError, match="No space"):
            train_head(train, None, run, config, resume=True, progress=False, tokens=6)
    assert (run / "summary.json").read_text() == saved_summary


def test_head_file_round_trip(tmp_path):
    head = TokenHead(20, 8, 6)
    torch.nn.init.normal_(head.fc2.weight)
    sha = save_head(head, tmp_path / "h.safetensors", extra={"note": "x"})
    back = load_head(tmp_path / "h.safetensors")
    x = torch.nn.functional.normalize(torch.randn(4, 20), dim=-1)
    assert torch.allclose(back(x), head.half().float()(x), atol=1e-3)
    assert sha == file_sha256(tmp_path / "h.safetensors") and len(sha) == 64


def test_edits_return_regions_inside_the_photo():
    from training.photos import edits

    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (120, 160, 3), dtype=np.uint8))
    rng = np.random.default_rng(0)
    for edit in (edits.train_edit, edits.easy_edit, edits.hard_edit, edits.crop_edit):
        for _ in range(5):
            out, box = edit(img, rng)
            assert out.mode == "RGB" and min(out.size) >= 8
            assert 0 <= box[0] < box[2] <= 160 and 0 <= box[1] < box[3] <= 120
