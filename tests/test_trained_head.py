"""The registered backbone with regis's trained token head (issue 22): tokens, manifest, the index keeping its
encoder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import build
from regis.errors import IndexMismatchError
from regis.indexes.layout import VERSIONS_DIR, read_current
from regis.indexes.manifest import read_manifest
from regis.models.encoder import build_encoder, encoder_from_manifest
from regis.models.head import file_sha256, load_head, save_head
from regis.models.registry import HEADS_DIR, get_backbone_spec

SHIPPED = "efficientnet-lite0-regis"
pytestmark = pytest.mark.slow  # the real backbone: ~10 s on an idle 2-core machine


@pytest.fixture(scope="module")
def regis_encoder():
    torch.set_num_threads(1)
    return build_encoder(SHIPPED)


def shipped_head_path() -> Path:
    import regis.models

    return Path(regis.models.__file__).parent / HEADS_DIR / get_backbone_spec(SHIPPED).head


def test_shipped_head_is_small_and_gives_256_d_tokens(regis_encoder):
    path = shipped_head_path()
    assert path.stat().st_size < 5 * 2**20
    cfg, info = regis_encoder.config, regis_encoder.weights_info
    assert cfg.dim == 256 and cfg.tokens_per_image == 10 and cfg.query_tokens_per_image == 15
    assert info.head_source == f"package:{path.name}" and info.head_sha256 == file_sha256(path)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    tokens, query = regis_encoder.encode(x), regis_encoder.encode_query(x)
    assert tokens.shape == (2, 10, 256) and query.shape == (2, 15, 256)
    assert torch.allclose(tokens.norm(dim=-1), torch.ones(2, 10), atol=1e-5)
    assert torch.allclose(query[:, :10], tokens, atol=1e-5)
    # the head is per token: the same map whatever the input geometry (a wider input: more patches, same head)
    wide = regis_encoder.encode(torch.randn(1, 3, 224, 320, generator=torch.Generator().manual_seed(1)))
    assert wide.shape == (1, 10, 256)


def test_index_manifest_records_the_head_and_reopens(tmp_path, photos_dir, regis_encoder):
    images = tmp_path / "images"
    images.mkdir()
    for p in sorted(photos_dir.iterdir())[:3]:
        shutil.copy(p, images / p.name)
    build(images, tmp_path / "index", regis_encoder)
    manifest = read_manifest(tmp_path / "index" / VERSIONS_DIR / read_current(tmp_path / "index"))
    assert manifest.encoder.backbone == SHIPPED and manifest.dim == 256
    assert manifest.weights.head_sha256 == file_sha256(shipped_head_path())
    assert json.loads((tmp_path / "index" / VERSIONS_DIR / read_current(tmp_path / "index")
                       / "manifest.json").read_text())["weights"]["head_sha256"] == manifest.weights.head_sha256
    again = encoder_from_manifest(manifest.encoder, manifest.weights)
    assert again.weights_info == manifest.weights
    # another head (same shapes, other values) is refused by the index
    other = load_head(shipped_head_path())
    with torch.no_grad():
        other.lin.bias.add_(0.5)
    save_head(other, tmp_path / "other.safetensors")
    with pytest.raises(IndexMismatchError):
        encoder_from_manifest(manifest.encoder, manifest.weights, str(tmp_path / "other.safetensors"))
    # and the plain backbone's manifests are unchanged: no head fields
    plain = build_encoder("efficientnet-lite0")
    assert plain.head is None and plain.weights_info.head_sha256 is None and plain.config.dim == 1280
