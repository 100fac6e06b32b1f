"""Run-directory files: the encoder weights (safetensors + encoder config) and the trainer state.

``RUN_DIR/encoder.safetensors``: the backbone's state dict (timm key names) with safetensors metadata
``{"regis.encoder_config": <EncoderConfig JSON>}``, so ``build_encoder(weights=RUN_DIR)`` rebuilds the same
encoder (``regis.models.weights``). ``RUN_DIR/trainer_state.pt``: step, optimizer, scheduler, sampler and RNG
states plus the SHA-256 of the weights they belong to (``regis.models.weights.state_dict_sha256``).
Both are written to a temporary file and renamed, so a crash never leaves a half-written file.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from regis.models.weights import CONFIG_METADATA_KEY, ENCODER_WEIGHTS_FILE, state_dict_sha256
from training.errors import CheckpointError

TRAINER_STATE_FILE = "trainer_state.pt"


def _atomic(path: Path, write) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save_encoder(encoder, run_dir: Path) -> str:
    """Write ``run_dir/encoder.safetensors`` from a ``RegisEncoder``.

    Returns:
        The SHA-256 of the saved backbone state (``state_dict_sha256``), for the trainer state.
    """
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in encoder.backbone.state_dict().items()}
    meta = {CONFIG_METADATA_KEY: encoder.config.model_dump_json()}
    _atomic(Path(run_dir) / ENCODER_WEIGHTS_FILE, lambda p: save_file(tensors, str(p), metadata=meta))
    return state_dict_sha256(encoder.backbone)


def save_trainer_state(run_dir: Path, state: dict) -> None:
    """Write ``run_dir/trainer_state.pt`` (tensors, numbers, strings, lists and dicts only)."""
    _atomic(Path(run_dir) / TRAINER_STATE_FILE, lambda p: torch.save(state, p))


def load_trainer_state(run_dir: Path) -> dict:
    """Read ``run_dir/trainer_state.pt`` (``weights_only`` unpickling).

    Raises:
        CheckpointError: missing or unreadable (names the file).
    """
    path = Path(run_dir) / TRAINER_STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"{run_dir} has no {TRAINER_STATE_FILE}: not a resumable regis training run")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read {path} ({type(exc).__name__}: {exc})") from exc
