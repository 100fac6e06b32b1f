"""Fine-tuning the whole encoder on edits made on the fly (training.photos.finetune): the ignore mask worked out
by hand, which parameters each arm trains, and a 2-step run on real photos that writes loadable weights."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from regis.errors import ConfigError, WeightsError
from training.photos.finetune import (
    FinetuneConfig,
    PhotoBatches,
    PhotoInstances,
    batch_ignore,
    finetune,
    load_finetuned,
    trainable_parameters,
)


def test_batch_ignore_by_hand():
    # photo 0: instance 0 the whole 100 x 100 photo, instance 1 its top-left quarter; photo 1: instance 2
    photo = torch.tensor([0, 0, 1])
    box = torch.tensor([[0, 0, 100, 100], [0, 0, 50, 50], [0, 0, 100, 100]], dtype=torch.float32)
    view_box = torch.tensor([[10, 10, 40, 40],   # inside the quarter: instance 1 shows all of it
                             [40, 40, 90, 90],   # the quarter shows 10 x 10 of 50 x 50 (4 %): a negative
                             [0, 0, 100, 100]], dtype=torch.float32)
    expected = torch.tensor([[False, True, False],
                             [True, False, False],   # the whole photo shows all of view 1
                             [False, False, False]])
    assert torch.equal(batch_ignore(photo, box, view_box), expected)


def test_arms_train_their_own_parts(lite0_regis_centre):
    import copy

    enc = copy.deepcopy(lite0_regis_centre)
    head, backbone = trainable_parameters(enc, "head")
    assert backbone == [] and all(p.requires_grad for p in head)
    assert not any(p.requires_grad for p in enc.backbone.parameters())
    _, backbone = trainable_parameters(enc, "tail2")
    blocks = enc.backbone.blocks
    assert all(p.requires_grad for b in blocks[-2:] for p in b.parameters())
    assert not any(p.requires_grad for p in blocks[0].parameters())
    assert len(backbone) == sum(1 for p in enc.backbone.parameters() if p.requires_grad)
    _, backbone = trainable_parameters(enc, "all")
    assert len(backbone) == len(list(enc.backbone.parameters()))
    with pytest.raises(ConfigError, match="unknown arm"):
        trainable_parameters(enc, "tail9x")


def test_photo_batches_have_a_fixed_size_of_distinct_photos_and_repeat():
    kinds = ["scene", "object"] * 5  # 5 x 3 + 5 x 1 = 20 instances in all
    a, b = list(PhotoBatches(kinds, 3, 7, 4, seed=1)), list(PhotoBatches(kinds, 3, 7, 4, seed=1))
    assert a == b and len(a) == 4
    for batch in a:
        assert sum(k for _, _, k in batch) == 7 and len({p for p, _, _ in batch}) == len(batch)
        assert all(k <= (3 if kinds[p] == "scene" else 1) for p, _, k in batch)
    assert a[0] != a[1]
    with pytest.raises(ConfigError, match="fewer than a batch"):
        PhotoBatches(kinds, 3, 21, 1, seed=0)


@pytest.fixture(scope="module")
def lite0_regis_centre():
    from regis.models.encoder import build_encoder

    return build_encoder("efficientnet-lite0-regis", frame="center-crop", image_size=128)


def test_two_steps_write_weights_that_load(lite0_regis_centre, photos_dir, tmp_path):
    from regis.models.transforms import eval_transform

    files = sorted(photos_dir.iterdir())[:4]
    photos = [Image.open(f).convert("RGB").resize((160, 120)) for f in files]
    kinds = ["scene", "object", "scene", "object"]
    data = PhotoInstances(photos, kinds, eval_transform(lite0_regis_centre.config), 3, 96)
    item = data[(0, 5, 3)]
    assert item["clean"].shape == (3, 3, 128, 128) and item["box"][0].tolist() == [0, 0, 160, 120]
    with pytest.raises(ConfigError, match="cannot give 2 instances"):
        data[(1, 5, 2)]  # an object photo gives one
    start_bb = {k: v.clone() for k, v in lite0_regis_centre.backbone.state_dict().items()}
    cfg = FinetuneConfig(arms=("head", "all"), steps=2, batch=5, per_photo=3, workers=0, warmup_steps=0,
                         lr_backbone=1e-3, ema_decay=0.0, region_max_side=96)
    summary = finetune(lite0_regis_centre, photos, kinds, tmp_path, cfg, progress=False)
    assert summary["steps"] == 2 and sorted(summary["files"]) == ["all-s2.safetensors", "head-s2.safetensors"]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for arm in summary["arms"].values() for r in arm)
    # the start encoder is not changed
    assert all(torch.equal(v, start_bb[k]) for k, v in lite0_regis_centre.backbone.state_dict().items())
    head_enc, meta = load_finetuned(tmp_path / "head-s2.safetensors")
    all_enc, _ = load_finetuned(tmp_path / "all-s2.safetensors")
    assert meta["arm"] == "head" and meta["step"] == 2
    conv = "blocks.3.0.conv_pw.weight"
    start = start_bb[conv].half().float()
    assert torch.equal(head_enc.backbone.state_dict()[conv], start)  # frozen backbone
    assert not torch.equal(all_enc.backbone.state_dict()[conv], start)  # trained backbone
    bn = "bn1.running_mean"  # BatchNorm statistics stay the pretrained ones in every arm
    assert torch.equal(all_enc.backbone.state_dict()[bn], start_bb[bn].half().float())
    assert head_enc.weights_info.sha256 != all_enc.weights_info.sha256
    with pytest.raises(WeightsError, match="do not exist"):
        load_finetuned(tmp_path / "missing.safetensors")
