"""Write an encoder's torch-free query bundle (``regis.models.query_bundle``): export the backbone to ONNX, save
the head's weights, check the bundle's tokens against the encoder's, then publish the folder with one rename.
Needs torch (and the ``onnx`` package for the export); done once per encoder, by the first ``regis search`` that
finds no bundle.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import torch

from regis.errors import ConfigError
from regis.models.encoder import RegisEncoder
from regis.models.inference import MAX_ABS_DIFF, export_backbone_onnx
from regis.models.np_readout import HeadWeights, unsupported_reason
from regis.models.query_bundle import (
    BUNDLE_FORMAT,
    HEAD_FILE,
    META_FILE,
    MODEL_FILE,
    OnnxQueryEncoder,
    bundle_dir,
    load_bundle,
    read_head,
)


def head_weights(encoder: RegisEncoder) -> HeadWeights | None:
    """The encoder's token head as float32 numpy arrays (None without a head)."""
    head = encoder.head
    if head is None:
        return None
    arr = {name: p.detach().float().cpu().numpy() for name, p in head.state_dict().items()}
    parts = {"lin_w": arr["lin.weight"], "lin_b": arr["lin.bias"]}
    if getattr(head, "hidden", 0):
        parts.update(fc1_w=arr["fc1.weight"], fc1_b=arr["fc1.bias"], fc2_w=arr["fc2.weight"], fc2_b=arr["fc2.bias"])
    return HeadWeights(**parts)


def check_shapes(encoder: RegisEncoder) -> list[tuple[int, int]]:
    """(H, W) inputs the check encodes: the square, and for the "aspect" frame a 3:2 landscape too; for
    "center-crop+aspect" also a 3:1 panorama (its central square is resized to ``image_size``)."""
    from regis.models.geometry import aspect_input_size, is_aspect, is_two_framings

    size = encoder.config.image_size
    shapes = [(size, size)]
    if is_aspect(encoder.config):
        w, h = aspect_input_size(encoder.config, 3 * size, 2 * size)
        shapes.append((h, w))
    if is_two_framings(encoder.config):
        w, h = aspect_input_size(encoder.config, 3 * size, size)
        shapes.append((h, w))
    return shapes


def token_gap(fast: OnnxQueryEncoder, encoder: RegisEncoder) -> float:
    """Max abs difference between the bundle's and the encoder's query tokens on seeded random batches
    (``check_shapes``; two images each)."""
    gen = torch.Generator().manual_seed(0)
    gap = 0.0
    for h, w in check_shapes(encoder):
        x = torch.randn(2, 3, h, w, generator=gen)
        want = encoder.encode_query(x).float().cpu().numpy()
        got = fast.encode_query(x.numpy())
        gap = max(gap, float(np.abs(got - want).max()))
    return gap


def save_optimized(model: bytes, path: Path) -> None:
    """Write ``model`` as ONNX Runtime's portable graph optimisations (ORT_ENABLE_EXTENDED: constant folding,
    fusions; not the CPU-specific layouts of ORT_ENABLE_ALL, which a session adds when it starts) leave it."""
    import onnxruntime as ort

    from regis.models.ort import ort_session_options

    opts = ort_session_options(1)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(path)
    ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
    if not path.is_file():
        raise OSError(f"ONNX Runtime did not write the optimised model to {path}")


def write_query_bundle(encoder: RegisEncoder, root: Path | None = None) -> Path:
    """Make the encoder's bundle (``query_bundle.bundle_dir``) unless a usable one is there (``load_bundle``; one
    it rejects is replaced); returns its folder.

    Raises:
        ConfigError: an encoder the numpy readout does not cover, an encoder not on the CPU, or a bundle whose
            tokens differ from the encoder's by more than ``MAX_ABS_DIFF`` (nothing is written).
        ImportError: onnx or onnxruntime is not installed.
        OSError: the cache folder cannot be written.
    """
    reason = unsupported_reason(encoder.config)
    if reason:
        raise ConfigError(reason)
    if next(encoder.parameters()).device.type != "cpu":
        raise ConfigError("the query bundle is exported from an encoder on the CPU")
    final = bundle_dir(encoder.config, encoder.weights_info, root)
    if (final / META_FILE).is_file():
        if load_bundle(encoder.config, encoder.weights_info, root) is not None:
            return final
        stale = final.parent / f".stale-{final.name}-{uuid.uuid4().hex[:8]}"
        final.rename(stale)  # out of readers' way in one step, then removed
        shutil.rmtree(stale, ignore_errors=True)
    import onnxruntime  # noqa: F401  (missing: fail before the export)

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        t0 = time.perf_counter()
        save_optimized(export_backbone_onnx(encoder.backbone.eval(), encoder.config.image_size), tmp / MODEL_FILE)
        head = head_weights(encoder)
        if head is not None:
            np.savez(tmp / HEAD_FILE, **{k: v for k, v in vars(head).items() if v is not None})
        fast = OnnxQueryEncoder(encoder.config, tmp / MODEL_FILE, read_head(tmp / HEAD_FILE))
        gap = token_gap(fast, encoder)
        if not gap <= MAX_ABS_DIFF:
            raise ConfigError(f"the ONNX + numpy query encoder differs from the encoder by {gap:.2e} "
                              f"(> {MAX_ABS_DIFF}); not kept")
        import onnxruntime

        meta = {"format": BUNDLE_FORMAT, "config": encoder.config.model_dump(mode="json"),
                "weights_sha256": encoder.weights_info.sha256, "head_sha256": encoder.weights_info.head_sha256,
                "weights_source": encoder.weights_info.source, "token_gap": gap,
                "export_s": round(time.perf_counter() - t0, 2), "torch": torch.__version__,
                "onnxruntime": onnxruntime.__version__}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        try:
            tmp.rename(final)
        except OSError:
            if not (final / META_FILE).is_file():  # not another process's bundle: a real failure
                raise
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
