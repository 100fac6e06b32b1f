"""The query encoder's CPU inference copies (``regis.models.inference``): batch norm folded into the
convolutions and channels-last layout, or the backbone run by ONNX Runtime, give the same tokens as the encoder
itself, on real photos, and leave the encoder (its state dict, hence its weights checksum) untouched; a copy
that cannot be made or differs falls back with a warning; REGIS_QUERY_RUNTIME chooses the runtime."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from regis.models.inference import (
    OrtBackbone,
    _ChannelsLast,
    default_onnx_threads,
    fold_batchnorm,
    inference_copy,
    onnxruntime_available,
)
from regis.models.weights import state_dict_sha256


def test_folded_lite0_gives_the_same_tokens_on_real_photos(lite0_encoder, photos_dir, one_thread):
    from regis.images.decode import decode_image
    from regis.models.transforms import eval_transform

    before = state_dict_sha256(lite0_encoder.backbone)
    fast = inference_copy(lite0_encoder, runtime="torch")
    assert fast is not lite0_encoder and inference_copy(lite0_encoder, runtime="torch") is fast  # made once, cached
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


def _photo_pixels(encoder, photos_dir, n: int = 6) -> torch.Tensor:
    from regis.images.decode import decode_image
    from regis.models.transforms import eval_transform

    transform = eval_transform(encoder.config)
    return torch.stack([transform(decode_image(f.read_bytes()).image) for f in sorted(photos_dir.iterdir())[:n]])


def test_onnx_runtime_copy_gives_the_same_tokens_and_buddies_on_real_photos(lite0_encoder, photos_dir, one_thread):
    """ONNX Runtime runs the backbone (both passes: 224 px and the 160 px ROI pass) with the encoder's tokens
    and buddy patches; one session per input shape, at the thread count asked; the encoder is left untouched."""
    pytest.importorskip("onnxruntime", reason="the ONNX Runtime copy needs onnxruntime (a core dependency)")
    assert lite0_encoder.config.roi_image_size == 160  # today's default: two backbone passes
    before = state_dict_sha256(lite0_encoder.backbone)
    fast = inference_copy(lite0_encoder, runtime="onnx", threads=1)
    assert isinstance(fast.backbone, OrtBackbone) and fast.backbone.threads == 1
    assert inference_copy(lite0_encoder, runtime="onnx", threads=1) is fast  # made once, cached
    assert inference_copy(lite0_encoder, runtime="auto", threads=1) is fast  # auto: onnx when installed
    pixels = _photo_pixels(lite0_encoder, photos_dir)
    want, want_buddies, want_grid = lite0_encoder.encode_with_buddies(pixels)
    got, got_buddies, got_grid = fast.encode_with_buddies(pixels)
    assert got.shape == want.shape == (6, lite0_encoder.config.tokens_per_image, lite0_encoder.config.dim)
    assert torch.allclose(got, want, atol=1e-4, rtol=0)
    assert torch.equal(got_buddies, want_buddies) and got_grid == want_grid
    for n in (1, 3):  # other batch sizes: sessions of their own shapes
        assert torch.allclose(fast.encode(pixels[:n]), want[:n], atol=1e-4, rtol=0)
    sessions = fast.backbone._sessions
    assert {(6, 3, 224, 224), (6, 3, 160, 160), (1, 3, 224, 224), (3, 3, 160, 160)} <= set(sessions)
    assert all(s.get_session_options().intra_op_num_threads == 1 for s in sessions.values())
    assert all(_uses_env_allocator(s) for s in sessions.values())  # one shared arena (bench.query_memory)
    assert state_dict_sha256(lite0_encoder.backbone) == before
    assert fast.weights_info == lite0_encoder.weights_info and fast.config == lite0_encoder.config


def test_past_max_sessions_one_dynamic_session_serves_the_other_shapes(lite0_encoder, photos_dir, one_thread,
                                                                        monkeypatch):
    pytest.importorskip("onnxruntime", reason="the ONNX Runtime copy needs onnxruntime (a core dependency)")
    fast = inference_copy(lite0_encoder, runtime="onnx", threads=1)
    backbone = OrtBackbone(fast.backbone.model, threads=1)
    monkeypatch.setattr(backbone, "MAX_SESSIONS", 0)
    pixels = _photo_pixels(lite0_encoder, photos_dir, 2)
    want = lite0_encoder.backbone.forward_features(pixels)
    assert torch.allclose(backbone.forward_features(pixels), want, atol=1e-4, rtol=0)
    assert torch.allclose(backbone.forward_features(pixels[:1]), want[:1], atol=1e-4, rtol=0)
    assert list(backbone._sessions) == [None]


@pytest.fixture
def fresh_copies(monkeypatch):
    """No copies or exports cached from other tests."""
    import weakref

    from regis.models import inference

    monkeypatch.setattr(inference, "_copies", weakref.WeakKeyDictionary())
    monkeypatch.setattr(inference, "_onnx_models", {})


def test_runtime_torch_and_a_missing_onnxruntime_give_the_folded_copy(lite0_encoder, fresh_copies, one_thread,
                                                                      monkeypatch, caplog):
    import sys

    folded = inference_copy(lite0_encoder, runtime="torch")
    assert isinstance(folded.backbone, _ChannelsLast)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    assert inference_copy(lite0_encoder, runtime="auto") is folded  # auto: quietly torch
    assert not caplog.records
    with caplog.at_level("WARNING", logger="regis.models"):
        assert inference_copy(lite0_encoder, runtime="onnx", threads=1) is folded  # asked for: a warning
    assert "ONNX Runtime query encoder could not be made (ModuleNotFoundError" in caplog.text


def test_a_copy_that_fails_the_token_check_falls_back_with_a_warning(lite0_encoder, fresh_copies, one_thread,
                                                                     monkeypatch, caplog):
    pytest.importorskip("onnxruntime", reason="the ONNX Runtime copy needs onnxruntime (a core dependency)")
    import weakref

    from regis.models import inference

    real_export = inference.export_backbone_onnx

    def wrong_export(backbone, image_size):  # the export of another backbone: other features
        other = copy.deepcopy(backbone)
        with torch.no_grad():
            next(other.parameters()).mul_(-1)
        return real_export(other, image_size)

    monkeypatch.setattr(inference, "export_backbone_onnx", wrong_export)
    with caplog.at_level("WARNING", logger="regis.models"):
        fast = inference_copy(lite0_encoder, runtime="onnx", threads=1)
    assert isinstance(fast.backbone, _ChannelsLast)
    assert "ONNX Runtime query encoder's tokens differ by" in caplog.text
    assert inference_copy(lite0_encoder, runtime="torch") is fast  # the fallback is the cached torch copy
    monkeypatch.setattr(inference, "_copies", weakref.WeakKeyDictionary())
    monkeypatch.setattr(inference, "MAX_ABS_DIFF", -1.0)  # nothing passes: the encoder as it is
    caplog.clear()
    with caplog.at_level("WARNING", logger="regis.models"):
        assert inference_copy(lite0_encoder, runtime="onnx", threads=1) is lite0_encoder
    assert "ONNX Runtime query encoder's tokens differ" in caplog.text
    assert "folded torch query encoder's tokens differ" in caplog.text


def test_query_runtime_setting(monkeypatch):
    from regis.errors import ConfigError
    from regis.models.inference import query_runtime

    monkeypatch.delenv("REGIS_QUERY_RUNTIME", raising=False)
    assert query_runtime() == "auto"
    monkeypatch.setenv("REGIS_QUERY_RUNTIME", "torch")
    assert query_runtime() == "torch"
    monkeypatch.setenv("REGIS_QUERY_RUNTIME", "tensorrt")
    with pytest.raises(ConfigError, match="REGIS_QUERY_RUNTIME must be one of"):
        query_runtime()
    with pytest.raises(ConfigError, match="query runtime must be one of"):
        inference_copy(object(), runtime="gpu")


def test_engines_in_one_process_keep_their_own_query_runtime(lite0_encoder, lite0_index, fresh_copies, one_thread,
                                                            monkeypatch):
    """The runtime is each engine's: two engines over one encoder encode with different copies, and a service
    started with runtime "torch" leaves a later engine on the environment's default (once process-wide, it
    leaked from one test's service into a later test)."""
    from fastapi.testclient import TestClient

    from regis.errors import ConfigError
    from regis.indexes.snapshot import IndexSnapshot
    from regis.retrieve.query import QueryEngine
    from service.app import create_app
    from service.settings import Settings

    monkeypatch.delenv("REGIS_QUERY_RUNTIME", raising=False)
    engines = []
    try:
        for runtime in ("torch", "onnx"):
            engines.append(QueryEngine(lite0_encoder, IndexSnapshot.open(lite0_index), query_runtime=runtime,
                                       query_threads=1))
        folded, ort = (e.query_encoder for e in engines)
        assert isinstance(folded.backbone, _ChannelsLast)
        if onnxruntime_available():
            assert isinstance(ort.backbone, OrtBackbone) and ort.backbone.threads == 1
        assert engines[0].query_encoder is folded  # still its own, after the other engine made its copy
        app = create_app(Settings(index_dir=lite0_index, query_runtime="torch", batch_max_size=1))
        with TestClient(app):
            assert isinstance(app.state.live.engine.query_encoder.backbone, _ChannelsLast)
        engines.append(QueryEngine(lite0_encoder, IndexSnapshot.open(lite0_index), query_threads=1))
        assert engines[-1].query_runtime == "auto"  # the environment's default, not the service's "torch"
        if onnxruntime_available():
            assert engines[-1].query_encoder is ort
        monkeypatch.setenv("REGIS_QUERY_RUNTIME", "torch")  # read when the engine is made
        assert engines[-1].query_runtime == "auto"
        engines.append(QueryEngine(lite0_encoder, IndexSnapshot.open(lite0_index)))
        assert engines[-1].query_encoder is folded
        with pytest.raises(ConfigError, match="query runtime must be one of"):
            QueryEngine(lite0_encoder, engines[0].snapshot, query_runtime="tensorrt")
        with pytest.raises(ConfigError, match="ONNX Runtime threads"):
            QueryEngine(lite0_encoder, engines[0].snapshot, query_threads=0)
    finally:
        for engine in engines:
            engine.close()


def test_service_setting_reaches_the_query_encoder(lite0_index, fresh_copies, one_thread):
    """REGIS_QUERY_RUNTIME=torch: the service encodes queries with the folded copy, made at start-up."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    with pytest.raises(ValueError, match="query_runtime"):
        Settings(index_dir=lite0_index, query_runtime="tensorrt")
    app = create_app(Settings(index_dir=lite0_index, query_runtime="torch", batch_max_size=1))
    with TestClient(app):
        engine = app.state.live.engine
        assert isinstance(engine.query_encoder.backbone, _ChannelsLast)
    if onnxruntime_available():  # REGIS_QUERY_THREADS reaches the ONNX Runtime sessions
        app = create_app(Settings(index_dir=lite0_index, query_runtime="onnx", query_threads=3, batch_max_size=3))
        with TestClient(app):
            backbone = app.state.live.engine.query_encoder.backbone
            assert isinstance(backbone, OrtBackbone) and backbone.threads == 3
            # the batched service made a session per batch size at start-up (BatchedSearch.warm_up), for
            # each backbone pass, before any request
            batches = {shape[0] for shape in backbone._sessions if shape is not None}
            assert batches == {1, 2, 3}


def test_onnx_threads_default_to_half_the_cores_of_each_encoder_thread(monkeypatch):
    from regis.errors import ConfigError
    from regis.models import inference

    for cores, workers, want in [(2, 1, 1), (1, 1, 1), (16, 1, 8), (16, 2, 4), (16, 64, 1)]:
        monkeypatch.setattr(inference.os, "cpu_count", lambda cores=cores: cores)
        assert default_onnx_threads(workers) == want
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="ONNX Runtime threads"):
            inference_copy(object(), threads=bad)


def test_torch_threads_default_to_the_cores_onnx_runtime_leaves(monkeypatch, tmp_path):
    from regis.models import inference
    from service import settings as service_settings
    from service.settings import Settings

    monkeypatch.setattr(inference, "onnxruntime_available", lambda: True)
    for cores, workers, query_threads, want in [(2, 1, None, 1), (1, 1, None, 1), (16, 1, None, 8),
                                                (16, 2, None, 8), (16, 1, 4, 12), (4, 2, 3, 1)]:
        monkeypatch.setattr(inference.os, "cpu_count", lambda cores=cores: cores)
        monkeypatch.setattr(service_settings.os, "cpu_count", lambda cores=cores: cores)
        s = Settings(index_dir=tmp_path, batch_encode_workers=workers, query_threads=query_threads)
        assert s.resolved_torch_threads() == want, (cores, workers, query_threads)
    # torch encodes the queries (or the GPU does): torch's own default; an explicit value always wins
    assert Settings(index_dir=tmp_path, query_runtime="torch").resolved_torch_threads() is None
    assert Settings(index_dir=tmp_path, device="cuda").resolved_torch_threads() is None
    assert Settings(index_dir=tmp_path, torch_threads=5).resolved_torch_threads() == 5
    monkeypatch.setattr(inference, "onnxruntime_available", lambda: False)
    assert Settings(index_dir=tmp_path).resolved_torch_threads() is None
    assert Settings(index_dir=tmp_path, query_runtime="onnx").resolved_torch_threads() == 2  # 4 cores - 2


def test_the_benchs_session_variants_give_the_same_features(lite0_encoder, photos_dir, one_thread):
    """``bench.query_memory``'s variants the library did not keep (``bench.ort_variants.VariantBackbone``): one
    session per backbone pass with a free batch axis, sessions with an arena each or on the shared one, given
    the model's weights as shared initializers: all give the backbone's features."""
    pytest.importorskip("onnxruntime", reason="the ONNX Runtime copy needs onnxruntime (a core dependency)")
    import torch.nn.functional as F

    from bench.ort_variants import VariantBackbone
    from bench.query_memory import shared_initializers

    fast = inference_copy(lite0_encoder, runtime="onnx", threads=1)
    model = fast.backbone.model
    pixels = _photo_pixels(lite0_encoder, photos_dir, 3)
    small = F.interpolate(pixels, size=(160, 160), mode="bilinear", align_corners=False)
    _, initializers = shared_initializers(model)
    for dynamic, arena, shared in [(True, False, False), (False, False, False), (True, True, False),
                                   (False, False, True)]:
        backbone = VariantBackbone(model, threads=1, dynamic_batch=dynamic, env_allocator=arena,
                                   initializers=initializers if shared else None)
        for x in (pixels, pixels[:1], small, small[:2]):
            want = lite0_encoder.backbone.forward_features(x)
            assert torch.allclose(backbone.forward_features(x), want, atol=1e-4, rtol=0)
        sessions = backbone._sessions
        if dynamic:  # one session per pass, whatever the batch size
            assert set(sessions) == {(0, 3, 224, 224), (0, 3, 160, 160)}
        else:
            assert set(sessions) == {(3, 3, 224, 224), (1, 3, 224, 224), (3, 3, 160, 160), (2, 3, 160, 160)}
        assert {_uses_env_allocator(s) for s in sessions.values()} == {arena}


def _uses_env_allocator(session) -> bool:
    try:
        return session.get_session_options().get_session_config_entry("session.use_env_allocators") == "1"
    except RuntimeError:  # "SessionOptions does not have configuration with key"
        return False


class _TinyBackbone(nn.Module):
    """A one-conv stand-in for a timm CNN: ``forward_features`` (B, 3, H, W) -> (B, 4, H / 2, W / 2)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward_features(self, x):
        return self.conv(x)


def test_the_onnx_export_leaves_the_process_warning_filters_alone(monkeypatch):
    """``warnings.catch_warnings`` swaps the process-wide filter list and is not thread-safe: an export in a worker
    thread that entered one (to silence the exporter's deprecation notices) dropped or restored filters for the
    threads serving requests meanwhile (as decode's did, tests/test_decode.py). The export (fault point:
    ``torch.onnx.export``) must run under the process's filters as they are, and leave them so."""
    import warnings

    pytest.importorskip("onnx", reason="torch.onnx's exporter needs the onnx package")
    from regis.models import inference

    inside = []
    real = torch.onnx.export

    def spy(*args, **kwargs):
        inside.append(list(warnings.filters))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", spy)
    before = list(warnings.filters)
    model = inference.export_backbone_onnx(_TinyBackbone().eval(), 32)
    assert inside == [before] and list(warnings.filters) == before
    assert model.startswith(b"\x08")  # a serialised ModelProto (field 1, ir_version, first)
