"""``bench.data.build_index``'s encoder record: "bench" indexes cannot be served (their backbone is a name only),
"servable" ones are rebuilt by ``encoder_for`` exactly as ``regis serve`` rebuilds an index's encoder
(bench.million ``--encoder-record servable``, the 1M index that ``bench.service --index`` serves)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.data import bench_encoder, build_index


def _tokens(n: int = 50, t: int = 10, d: int = 256) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((n, t, d)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float16)


def test_servable_record_is_rebuilt_as_regis_serve_does(tmp_path):
    from regis.errors import ConfigError
    from regis.index_encoder import encoder_for

    for record in ("bench", "servable"):
        build_index(tmp_path / record, _tokens(), encoder_record=record)
    enc = encoder_for(tmp_path / "servable", None, None, False, None, None, "cpu")
    assert (enc.config.backbone, enc.config.frame) == ("efficientnet-lite0-regis", "center-crop")
    assert (enc.config.dim, enc.config.tokens_per_image) == (256, 10)
    with pytest.raises(ConfigError, match="unknown backbone 'bench-tokens-256'"):
        encoder_for(tmp_path / "bench", None, None, False, None, None, "cpu")


def test_servable_record_refuses_tokens_of_another_shape():
    with pytest.raises(ValueError, match="not 10 x 384"):
        bench_encoder(384, 10, "servable")
    with pytest.raises(ValueError, match="'bench' or 'servable'"):
        bench_encoder(256, 10, "other")
