"""The query encoder's CPU inference copy (``regis.models.inference``): batch norm folded into the convolutions
and channels-last layout give the same tokens as the encoder itself, on real photos, and leave the encoder (its
state dict, hence its weights checksum) untouched."""

from __future__ import annotations

import torch
from torch import nn

from regis.models.inference import fold_batchnorm, inference_copy
from regis.models.weights import state_dict_sha256


def test_folded_lite0_gives_the_same_tokens_on_real_photos(lite0_encoder, photos_dir, one_thread):
    from regis.images.decode import decode_image
    from regis.models.transforms import eval_transform

    before = state_dict_sha256(lite0_encoder.backbone)
    fast = inference_copy(lite0_encoder)
    assert fast is not lite0_encoder and inference_copy(lite0_encoder) is fast  # made once, cached
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fast.modules())  # every norm was folded
    transform = eval_transform(lite0_encoder.config)
    files = sorted(photos_dir.iterdir())[:6]
    pixels = torch.stack([transform(decode_image(f.read_bytes()).image) for f in files])
    want, got = lite0_encoder.encode(pixels), fast.encode(pixels)
    assert got.shape == want.shape == (6, lite0_encoder.config.tokens_per_image, lite0_encoder.config.dim)
    assert torch.allclose(got, want, atol=1e-4, rtol=0)
    assert state_dict_sha256(lite0_encoder.backbone) == before
    assert fast.weights_info == lite0_encoder.weights_info and fast.config == lite0_encoder.config


def test_fold_batchnorm_keeps_a_conv_bn_act_stack_and_skips_unpaired_norms():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(),
                        nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4), nn.BatchNorm2d(4))
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-1, 1)
    net.eval()
    x = torch.randn(2, 3, 16, 16)
    want = net(x)
    assert fold_batchnorm(net) == 2  # the second norm of the last pair follows a norm, not a convolution
    assert isinstance(net[1], nn.Identity) and isinstance(net[5], nn.BatchNorm2d)
    assert torch.allclose(net(x), want, atol=1e-5)
