"""The torch-free query encoder: a CNN encoder's backbone as an ONNX model run by ONNX Runtime, its readout in
numpy (``regis.models.np_readout``), its preprocessing in PIL + numpy (``regis.models.np_transforms``). What
``regis search`` encodes its one query with, so that the command imports neither torch nor timm (their imports
alone cost ~8 s of CPU here: scripts/import_costs.py).

A bundle is made once per encoder (``regis.models.query_export.write_query_bundle``: the ONNX export and the
token check against the torch encoder need torch) and kept on disk, keyed by what decides the tokens (the
encoder config, the weights' and head's checksums, ``BUNDLE_FORMAT``)::

    $REGIS_QUERY_BUNDLES/<key>/     (default $REGIS_CACHE/query-encoders/<key>/, ~/.cache/regis/query-encoders/<key>/)
        backbone.onnx     the backbone's forward_features (regis.models.inference.export_backbone_onnx), as ONNX
                          Runtime's portable graph optimisations (ORT_ENABLE_EXTENDED) left it: a session then
                          starts in ~0.05 instead of ~0.14 s
        head.npz          the token head's float32 weights (absent without a head)
        bundle.json       format, config, weights, the measured token gap, versions

Written into a temporary folder, checked, then renamed: a reader sees a whole bundle or none.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

import numpy as np

from regis.errors import ConfigError
from regis.models.config import EncoderConfig, WeightsInfo
from regis.models.np_readout import HeadWeights, query_tokens, unsupported_reason
from regis.models.np_transforms import resize_aa_bicubic

log = logging.getLogger("regis.models")
BUNDLE_FORMAT = 1
BUNDLE_DIR = "query-encoders"
MODEL_FILE, HEAD_FILE, META_FILE = "backbone.onnx", "head.npz", "bundle.json"
HEAD_KEYS = ("lin_w", "lin_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b")


def cache_root() -> Path:
    """Where bundles are kept: ``$REGIS_QUERY_BUNDLES``, else ``$REGIS_CACHE/query-encoders``, else
    ``~/.cache/regis/query-encoders``."""
    if os.environ.get("REGIS_QUERY_BUNDLES"):
        return Path(os.environ["REGIS_QUERY_BUNDLES"]).expanduser()
    base = os.environ.get("REGIS_CACHE") or Path.home() / ".cache" / "regis"
    return Path(base).expanduser() / BUNDLE_DIR


def bundle_key(config: EncoderConfig, weights: WeightsInfo) -> str:
    """24 hex digits of the SHA-256 of the format, the config and the weights' and head's checksums (not their
    sources: the same weights moved elsewhere give the same tokens)."""
    what = {"format": BUNDLE_FORMAT, "config": config.model_dump(mode="json"),
            "weights": weights.sha256, "head": weights.head_sha256}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


def bundle_dir(config: EncoderConfig, weights: WeightsInfo, root: Path | None = None) -> Path:
    """The folder of this encoder's bundle (it may not exist)."""
    return Path(root or cache_root()) / bundle_key(config, weights)


class OnnxQueryEncoder:
    """A query encoder that needs neither torch nor timm: ``encode_query`` gives the tokens
    ``RegisEncoder.encode_query`` gives, to float32 rounding (checked when the bundle is written).

    Args:
        config: the encoder's config (``np_readout.unsupported_reason`` None).
        model: the backbone's ONNX model (bytes or a path).
        head: the token head's weights, or None.
        threads: ONNX Runtime intra-op threads (1: one query on the shared 2-core CPU).

    Raises:
        ConfigError: a config the numpy readout does not cover.
    """

    def __init__(self, config: EncoderConfig, model: bytes | Path, head: HeadWeights | None, threads: int = 1):
        reason = unsupported_reason(config)
        if reason:
            raise ConfigError(reason)
        self.config, self.model, self.head, self.threads = config, model, head, threads
        self._sess = None
        self._lock = threading.Lock()

    def _session(self):
        """One session for every input shape (the model's free dimensions left free): for one or two queries,
        making a session per shape (as ``regis.models.inference.OrtBackbone`` does for the service) costs more
        than it saves (~0.14 s each here)."""
        from regis.models.ort import ort_session

        with self._lock:
            if self._sess is None:
                model = self.model if isinstance(self.model, bytes) else str(self.model)
                self._sess = ort_session(model, self.threads)
            return self._sess

    def features(self, pixels: np.ndarray) -> np.ndarray:
        """(B, 3, H, W) float32 -> (B, F, H / 32, W / 32) float32: the backbone's feature map."""
        pixels = np.ascontiguousarray(pixels, dtype=np.float32)
        return self._session().run(None, {"images": pixels})[0]

    def roi_input(self, pixels: np.ndarray, aspect: bool | None = None) -> np.ndarray | None:
        """The ROI pass's input (``RegisEncoder.forward_roi_parts``' resize), or None without a ROI pass.
        ``aspect``: whether ``pixels`` is an "aspect" input (default: ``is_aspect(config)``; the central square of
        "center-crop+aspect" is not)."""
        from regis.models.geometry import is_aspect, roi_input_size

        cfg = self.config
        if cfg.roi_image_size is None or cfg.token_set != "cls+reg+roi":
            return None
        h, w = pixels.shape[-2:]
        if is_aspect(cfg) if aspect is None else aspect:
            rw, rh = roi_input_size(cfg, w, h)
        else:
            ratio = cfg.roi_image_size / cfg.image_size
            rh, rw = max(1, round(h * ratio)), max(1, round(w * ratio))
        return resize_aa_bicubic(pixels, (rh, rw))

    def central_square(self, pixels: np.ndarray) -> np.ndarray:
        """``RegisEncoder.central_square``: the central square of a (B, 3, H, W) "aspect" input, resized (bicubic,
        antialiased) to ``image_size`` when its side is not that -> (B, 3, image_size, image_size) float32."""
        from regis.models.geometry import central_square

        left, top, side = central_square(pixels.shape[-1], pixels.shape[-2])
        square = pixels[..., top : top + side, left : left + side]
        size = self.config.image_size
        if side != size:
            return resize_aa_bicubic(np.ascontiguousarray(square), (size, size))
        return square

    def _framed(self, pixels: np.ndarray, aspect: bool) -> np.ndarray:
        """One framing's (B, m', D) tokens (``RegisEncoder._framed`` with ``query=True``)."""
        small = self.roi_input(pixels, aspect=aspect)
        fmap = self.features(pixels)
        roi_fmap = self.features(small) if small is not None else None
        return query_tokens(self.config, fmap, roi_fmap, self.head)

    def encode_query(self, pixels: np.ndarray) -> np.ndarray:
        """Query tokens of a batch.

        Args:
            pixels: (B, 3, H, W) float32 normalised pixels (``np_transforms.eval_pixels``, stacked).

        Returns:
            (B, m, D) float32 unit-norm tokens, m = ``config.query_tokens_per_image``; "center-crop+aspect": the
            central square's m / 2 tokens, then the whole input's (``RegisEncoder.forward_with_buddies``).

        Raises:
            ConfigError: pixels not (B, 3, H, W).
        """
        from regis.models.geometry import is_aspect, is_two_framings

        if pixels.ndim != 4 or pixels.shape[1] != 3:
            raise ConfigError(f"pixels must be (B, 3, H, W), got {tuple(pixels.shape)}")
        if is_two_framings(self.config):
            square = self._framed(self.central_square(pixels), aspect=False)
            return np.concatenate([square, self._framed(pixels, aspect=True)], axis=1)
        return self._framed(pixels, aspect=is_aspect(self.config))


def read_head(path: Path) -> HeadWeights | None:
    """A bundle's head weights (None when the file is absent)."""
    if not path.is_file():
        return None
    with np.load(path) as f:
        return HeadWeights(**{k: f[k].astype(np.float32) for k in HEAD_KEYS if k in f.files})


def load_bundle(config: EncoderConfig, weights: WeightsInfo, root: Path | None = None,
                threads: int = 1) -> OnnxQueryEncoder | None:
    """The bundle of this encoder, if one was written (``query_export.write_query_bundle``) and matches.

    Returns:
        An ``OnnxQueryEncoder``, or None: no bundle, a config the numpy readout does not cover, onnxruntime not
        installed, or a bundle that does not match (another encoder, or written by another ONNX Runtime version)
        or cannot be read (logged; ``write_query_bundle`` replaces it).
    """
    if unsupported_reason(config):
        return None
    folder = bundle_dir(config, weights, root)
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        return None
    try:
        import onnxruntime
    except ImportError:
        return None
    try:
        meta = json.loads(meta_path.read_text())
        same = (meta.get("format") == BUNDLE_FORMAT and EncoderConfig(**meta["config"]) == config
                and meta.get("weights_sha256") == weights.sha256 and meta.get("head_sha256") == weights.head_sha256
                and meta.get("onnxruntime") == onnxruntime.__version__)  # its optimised graph is this version's
        if not same:
            log.warning("query encoder bundle %s does not match this encoder; not used", folder)
            return None
        return OnnxQueryEncoder(config, folder / MODEL_FILE, read_head(folder / HEAD_FILE), threads)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("query encoder bundle %s cannot be read (%s); not used", folder, exc)
        return None
