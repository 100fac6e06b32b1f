"""Hub weights offline (issue 25, item 10): when the model hub cannot be reached, no download is attempted (the
hub client's retries cost about a minute): the weights come from the local cache, or the good error comes at
once."""

from __future__ import annotations

import socket

import pytest

from regis.errors import WeightsError
from regis.models import weights as weights_module
from regis.models.encoder import build_encoder
from regis.models.registry import get_backbone_spec
from regis.models.weights import OFFLINE_HINT, hub_reachable, state_dict_sha256


@pytest.fixture
def unreachable_hub(monkeypatch, tmp_path):
    """No route to any host, an empty Hugging Face cache, HF_HUB_OFFLINE unset; a download attempt fails the test."""
    import timm

    probes = []

    def refuse(address, timeout=None, *args, **kwargs):
        probes.append((address, timeout))
        raise OSError("network is unreachable")

    real_create = timm.create_model

    def create_model(name, pretrained=False, **kwargs):
        assert not pretrained, "a download was attempted although the hub cannot be reached"
        return real_create(name, pretrained=False, **kwargs)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(timm, "create_model", create_model)
    return probes


def test_an_unreachable_hub_fails_at_once_with_the_offline_hint(unreachable_hub):
    with pytest.raises(WeightsError) as info:
        build_encoder("dinov2-vits14-reg")
    assert "cannot be reached" in str(info.value) and OFFLINE_HINT in str(info.value)
    assert len(unreachable_hub) == 1 and unreachable_hub[0][0] == ("huggingface.co", 443)
    assert unreachable_hub[0][1] <= 3.0


def test_an_unreachable_hub_uses_the_cached_weights(unreachable_hub, monkeypatch, tmp_path):
    from safetensors.torch import save_file

    spec = get_backbone_spec("dinov2-vits14-reg")
    model = weights_module.create_timm_model(spec, pretrained=False)
    cached = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(cached))
    monkeypatch.setattr(weights_module, "cached_hub_file", lambda s: cached if s.name == spec.name else None)
    encoder = build_encoder("dinov2-vits14-reg")
    assert encoder.weights_info.source == "hub:vit_small_patch14_reg4_dinov2.lvd142m"
    assert encoder.weights_info.sha256 == state_dict_sha256(model)


def test_hf_hub_offline_means_unreachable_without_a_probe(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed although offline"))
    assert not hub_reachable()


def test_the_cli_says_it_in_one_line_without_retries(tmp_path, photos_dir, cli):
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "coffee.png").write_bytes((photos_dir / "skimage-coffee.png").read_bytes())
    out = cli("index", "build", folder, "--index", tmp_path / "i", "--backbone", "dinov2-vits14-reg", "--no-progress",
              env={"HF_HUB_OFFLINE": "", "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "https://nosuch.invalid"})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert "https://nosuch.invalid cannot be reached" in lines[0] and "--backbone efficientnet-lite0" in lines[0]
    assert "Retry" not in out.stderr
