"""Faster copies of a CNN encoder for CPU query encoding; the encoder itself is left untouched (its state dict
and weights checksum are what index manifests record), a copy only answers ``encode`` / ``forward`` calls.

Two runtimes, chosen per caller (``inference_copy``'s ``runtime``: ``QueryEngine``'s ``query_runtime``, the
service's ``REGIS_QUERY_RUNTIME``), by default ``REGIS_QUERY_RUNTIME`` (``InferenceSettings``):

- ``torch``: batch norm folded into the convolutions, channels-last (``fold_batchnorm``). Measured on the
  2-core CPU (BENCHMARKS.md section 6, ``python -m bench.encode_batch``): ~1.5x less CPU per image than the
  encoder as built.
- ``onnx``: the backbone's ``forward_features`` exported once per encoder with ``torch.onnx`` and run by ONNX
  Runtime (``onnxruntime``; ``OrtBackbone``: a session per input shape, all allocating from one shared CPU
  arena); the ROI pass's resize and the cue, ROI and GeM readout stay in torch. 1.3-2x the
  folded torch copy's images/s, and 48 instead of 67 ms of server CPU per query at 32 clients (BENCHMARKS.md
  section 6).
- ``auto`` (default): ``onnx`` when ``onnxruntime`` can be imported, else ``torch``.

Every copy is checked against the encoder before it is used (max abs token difference <= ``MAX_ABS_DIFF`` on a
seeded random batch, both backbone passes); a copy that fails the check, or an ONNX export or session that
fails, is replaced by the next runtime down (onnx -> torch -> the encoder as it is) with a logged warning.
"""

from __future__ import annotations

import copy
import io
import itertools
import logging
import os
import threading
import weakref

import torch
from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from torch import nn

from regis.errors import ConfigError
from regis.models.ort import ort_session, ort_session_options, use_env_allocator  # noqa: F401  (re-exported)
from regis.settings_types import QueryRuntime

log = logging.getLogger("regis.models")
MAX_ABS_DIFF = 1e-3  # tokens are unit-norm: a larger gap than float32 rounding means the copy went wrong
QUERY_RUNTIMES = ("auto", "onnx", "torch")
ONNX_OPSET = 17
_copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # encoder -> {(runtime, threads): copy}
# (config JSON, weights sha256) -> exported ONNX bytes: one export per encoder per process, also when the service
# rebuilds the same encoder (a new collection, a test's app); a stale entry would fail the token check
_onnx_models: dict[tuple[str, str], bytes] = {}
ONNX_MODELS_KEPT = 2
_lock = threading.RLock()


class InferenceSettings(BaseSettings):
    """How queries are encoded on CPU (environment, prefix ``REGIS_``).

    Attributes:
        query_runtime: ``REGIS_QUERY_RUNTIME``: "auto" (ONNX Runtime when ``onnxruntime`` is installed, else
            torch), "onnx" (ONNX Runtime; falls back to torch with a warning when it cannot be used) or "torch"
            (the folded torch copy).
    """

    model_config = SettingsConfigDict(env_prefix="REGIS_", extra="ignore")

    query_runtime: QueryRuntime = "auto"


def check_query_runtime(runtime: str | None) -> str | None:
    """``runtime`` if it is None or one of ``QUERY_RUNTIMES``.

    Raises:
        ConfigError: an unknown runtime.
    """
    if runtime is not None and runtime not in QUERY_RUNTIMES:
        raise ConfigError(f"query runtime must be one of {QUERY_RUNTIMES}, got {runtime!r}")
    return runtime


def check_onnx_threads(threads: int | None) -> int | None:
    """``threads`` if it is None or an integer >= 1.

    Raises:
        ConfigError: anything else.
    """
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"ONNX Runtime threads must be an integer >= 1, got {threads!r}")
    return threads


def default_onnx_threads(encode_workers: int = 1) -> int:
    """The service's default intra-op threads per ONNX Runtime query session: half the cores shared out between
    the ``encode_workers`` encoder threads, at least 1 (the other half decode, search and answer HTTP; on the
    2-core CPU 1 thread gave more requests/s than 2, docs/benchmarks/history.md,
    "Memory and sessions of the query copy")."""
    return max(1, (os.cpu_count() or 1) // 2 // max(1, encode_workers))


def query_runtime() -> str:
    """The default query runtime: ``REGIS_QUERY_RUNTIME`` (default "auto"), read now.

    Raises:
        ConfigError: ``REGIS_QUERY_RUNTIME`` holds an unknown value.
    """
    try:
        return InferenceSettings().query_runtime
    except ValidationError:
        raise ConfigError(f"REGIS_QUERY_RUNTIME must be one of {QUERY_RUNTIMES}") from None


def fold_batchnorm(module: nn.Module) -> int:
    """Fold every eval-mode ``BatchNorm2d`` (or subclass, e.g. timm's ``BatchNormAct2d``) that directly follows a
    ``Conv2d`` among its parent's children into that convolution's weight and bias, in place; the norm is
    replaced by what it applied after normalising (timm: dropout and activation), else by ``Identity``.

    Only valid when the parent's forward applies the two in that order (true of timm's EfficientNet blocks);
    ``inference_copy`` checks the outputs.

    Returns:
        The number of norms folded.
    """
    folded = 0
    for parent in list(module.modules()):
        kids = list(parent.named_children())
        for (_, conv), (name, bn) in itertools.pairwise(kids):
            if not (isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d) and bn.running_var is not None
                    and bn.num_features == conv.out_channels):
                continue
            with torch.no_grad():
                scale = (bn.weight if bn.affine else torch.ones_like(bn.running_var)) / torch.sqrt(
                    bn.running_var + bn.eps)
                shift = bn.bias if bn.affine else torch.zeros_like(bn.running_mean)
                bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
                conv.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
                conv.bias = nn.Parameter((bias - bn.running_mean) * scale + shift, requires_grad=False)
            after = [m for m in (getattr(bn, "drop", None), getattr(bn, "act", None)) if isinstance(m, nn.Module)]
            setattr(parent, name, nn.Sequential(*after) if after else nn.Identity())
            folded += 1
    return folded


class _ChannelsLast(nn.Module):
    """A CNN backbone whose ``forward_features`` takes its input in channels-last layout (same values)."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.inner = backbone.to(memory_format=torch.channels_last)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        return self.inner.forward_features(images.contiguous(memory_format=torch.channels_last))


class _Features(nn.Module):
    """``backbone.forward_features`` as ``forward`` (what ``torch.onnx.export`` traces)."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone.forward_features(images)


class OrtBackbone(nn.Module):
    """A CNN backbone's ``forward_features`` run by ONNX Runtime on the CPU, with sessions made on first use: one
    per input shape (batch, height, width), whose free dimensions are fixed with
    ``add_free_dimension_override_by_name`` (ONNX Runtime then plans for that shape), all allocating from the
    process's shared CPU arena (``ort_session``); past ``MAX_SESSIONS``, one session with dynamic axes serves
    the other shapes.

    Why these sessions (``python -m bench.query_memory``, BENCHMARKS.md section 6, "Memory"): the shared arena
    took ~80 MiB less RSS for the 8 warm-up shapes than an arena per session, at the same ms/image; one session
    per backbone pass with a free batch axis took less memory but ~20-30 % more ms/image. The variants not kept
    live in that bench.

    Args:
        model: ``export_backbone_onnx``'s model.
        threads: intra-op threads of each session.
    """

    MAX_SESSIONS = 16

    def __init__(self, model: bytes, threads: int):
        super().__init__()
        self.model = model
        self.threads = threads
        self._sessions: dict[tuple | None, object] = {}
        self._lock = threading.Lock()
        # RegisEncoder.encode reads its device from its first parameter: an empty one on the CPU
        self.device_anchor = nn.Parameter(torch.empty(0), requires_grad=False)

    def new_session(self, dims: dict[str, int] | None):
        """A session of the model with its free dimensions fixed to ``dims`` (None: all left free)."""
        return ort_session(self.model, self.threads, dims)

    def session(self, shape: tuple[int, ...]):
        """The session for (B, 3, H, W) inputs of this ``shape`` (made on first use)."""
        key = tuple(shape)
        with self._lock:
            found = self._sessions.get(key)
            if found is None:
                if len(self._sessions) < self.MAX_SESSIONS:
                    dims = {"batch": shape[0], "height": shape[2], "width": shape[3]}
                    found = self._sessions[key] = self.new_session(dims)
                else:
                    found = self._sessions.get(None)
                    if found is None:
                        found = self._sessions[None] = self.new_session(None)
            return found

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) float -> (B, D, H / 32, W / 32) float32 feature map (the backbone's), on the CPU."""
        pixels = images.detach().to("cpu", torch.float32).contiguous().numpy()
        return torch.from_numpy(self.session(pixels.shape).run(None, {"images": pixels})[0])


def export_backbone_onnx(backbone: nn.Module, image_size: int) -> bytes:
    """Export ``backbone.forward_features`` to ONNX (torch.onnx's TorchScript exporter, which runs offline;
    opset ``ONNX_OPSET``), with the batch, height and width axes free (one model for both CNN passes; the
    sessions fix them per shape).

    Args:
        backbone: a timm CNN in eval mode, on the CPU.
        image_size: side (px) of the example input traced.

    Returns:
        The serialised ONNX model (input "images" (B, 3, H, W) float32, output "features" (B, D, h, w)).

    Raises:
        Exception: whatever the exporter raises (the ``onnx`` package missing, an operator it cannot export).
    """
    example = torch.zeros(1, 3, image_size, image_size)
    buf = io.BytesIO()
    # no warnings.catch_warnings here: it swaps the process-wide filter list and is not thread-safe (the export
    # runs in a worker thread while others serve requests; it dropped their filters). The exporter's
    # DeprecationWarnings (the TorchScript exporter's notice; dynamo needs onnxscript) meet the process's filters,
    # which ignore them outside __main__ by default (pyproject.toml's pytest filterwarnings for the tests).
    with torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(_Features(backbone).eval(), (example,), buf, dynamo=False, opset_version=ONNX_OPSET,
                          input_names=["images"], output_names=["features"],
                          dynamic_axes={"images": {0: "batch", 2: "height", 3: "width"},
                                        "features": {0: "batch", 2: "rows", 3: "cols"}})
    return buf.getvalue()


def _torch_copy(encoder):
    fast = copy.deepcopy(encoder)
    fold_batchnorm(fast.backbone)
    fast.backbone = _ChannelsLast(fast.backbone)
    return fast


def onnx_copy(encoder, threads: int):
    """A copy of a CNN ``encoder`` whose backbone is an ``OrtBackbone`` on ``threads`` intra-op threads, the rest
    copied; the ONNX export is made once per encoder config and weights. Unchecked (``inference_copy`` checks
    the tokens).

    Raises:
        ImportError: onnxruntime (or onnx, for the export) is not installed.
        Exception: whatever the exporter raises.
    """
    import onnxruntime  # noqa: F401  (missing: fail before the export)

    key = (encoder.config.model_dump_json(), encoder.weights_info.sha256)
    model = _onnx_models.get(key)
    if model is None:
        model = export_backbone_onnx(encoder.backbone, encoder.config.image_size)
        while len(_onnx_models) >= ONNX_MODELS_KEPT:
            del _onnx_models[next(iter(_onnx_models))]
        _onnx_models[key] = model
    backbone = OrtBackbone(model, threads)
    return copy.deepcopy(encoder, memo={id(encoder.backbone): backbone})  # everything but the backbone copied


def _token_gap(fast, encoder) -> float:
    """Max abs token difference between ``fast`` and ``encoder`` on a seeded random (2, 3, S, S) batch."""
    size = encoder.config.image_size
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    return float((fast.encode_query(x) - encoder.encode_query(x)).abs().max())  # encode's tokens, and more


def _checked(make, encoder, name: str):
    """``make()``, if it builds and gives the encoder's tokens within ``MAX_ABS_DIFF``; else None (warning)."""
    try:
        fast = make()
        gap = _token_gap(fast, encoder)
    except Exception as exc:  # an export or session failure must not stop query encoding
        log.warning("the %s query encoder could not be made (%s: %s); falling back", name, type(exc).__name__, exc)
        return None
    if not gap <= MAX_ABS_DIFF:
        log.warning("the %s query encoder's tokens differ by %.3g (> %g); falling back", name, gap, MAX_ABS_DIFF)
        return None
    return fast


def onnxruntime_available() -> bool:
    """Whether ``onnxruntime`` can be imported."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def inference_copy(encoder, runtime: str | None = None, threads: int | None = None):
    """A copy of a CNN ``RegisEncoder`` on CPU for query encoding, cached per encoder, runtime and thread count
    (the ONNX model is exported once per encoder). Any other encoder (ViT, CUDA, training mode, an object that
    is not a torch module such as a remote encoder) is returned as it is.

    Args:
        encoder: a ``regis.models.encoder.RegisEncoder`` in eval mode.
        runtime: "auto", "onnx" or "torch" (module docstring); None: ``query_runtime()``
            (``REGIS_QUERY_RUNTIME``). Nothing process-wide: each caller (``QueryEngine``) passes its own.
        threads: intra-op threads of an ONNX Runtime session (None: the calling thread's torch threads); the
            torch copy runs on the calling thread's torch threads.

    Returns:
        An encoder with the same ``config``, ``weights_info`` and ``encode`` outputs (float32 rounding aside):
        the ONNX Runtime copy, else the folded torch copy, else (both failed the check) the encoder itself.

    Raises:
        ConfigError: an unknown runtime, or threads that are not an integer >= 1.
    """
    runtime = check_query_runtime(runtime) or query_runtime()
    check_onnx_threads(threads)
    if (not isinstance(encoder, nn.Module) or encoder.config.kind != "cnn" or encoder.training
            or next(encoder.parameters()).device.type != "cpu"):
        return encoder
    use_onnx = runtime == "onnx" or (runtime == "auto" and onnxruntime_available())
    threads = threads or torch.get_num_threads()
    key = ("onnx", threads) if use_onnx else ("torch", 0)
    with _lock:
        cached = _copies.setdefault(encoder, {})
        if key in cached:
            return cached[key]
        fast = _checked(lambda: onnx_copy(encoder, threads), encoder, "ONNX Runtime") if use_onnx else None
        if fast is None:
            fast = cached.get(("torch", 0))
            if fast is None:
                fast = cached[("torch", 0)] = _checked(lambda: _torch_copy(encoder), encoder, "folded torch") or encoder
        cached[key] = fast
        return fast
