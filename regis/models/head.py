"""A learned per-token head: each of an encoder's unit-norm tokens (F wide) -> a D'-wide token (issue 22).

    h(x) = W_lin x + b [+ W_2 GELU(W_1 x)]    x: (..., F) unit norm; W_lin: D' x F, W_1: H x F, W_2: D' x H

The shipped head (``efficientnet-lite0-regis``) is the linear map alone (H = 0): the MLP branch (H = 512) made
a training step about 4x as long on the shared 2-core machine and was not trained to a validation figure in the
time there was (docs/TRAINING.md).

The same map for every token (cue, ROI or query-only token) and every position, so it does not depend on the
input's size or framing: it sees tokens, never pixels. The encoder L2-normalises its output
(``RegisEncoder.readout``). ``W_lin`` starts as the PCA projection of training tokens and ``W_2`` at zero, so an
untrained head is PCA to D' dimensions (``training.photos.train``).

Stored as safetensors (float16 tensors ``lin.weight``, ``lin.bias``, and with an MLP branch ``fc1.*``, ``fc2.*``)
with its shape and how it was trained in one metadata entry (``HEAD_METADATA_KEY``: in_dim, out_dim, hidden,
training).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn

from regis.errors import WeightsError

HEAD_METADATA_KEY = "regis.token_head"


class TokenHead(nn.Module):
    """Per-token projection F -> D' (module docstring).

    Args:
        in_dim: F, the backbone token width (1280 for EfficientNet-Lite0).
        out_dim: D', the stored token width.
        hidden: H, the MLP branch's width (0: the linear map alone, as shipped).
    """

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 512):
        super().__init__()
        self.in_dim, self.out_dim, self.hidden = in_dim, out_dim, hidden
        self.lin = nn.Linear(in_dim, out_dim)
        if hidden:
            self.fc1 = nn.Linear(in_dim, hidden)
            self.fc2 = nn.Linear(hidden, out_dim)
            nn.init.zeros_(self.fc2.weight)
            nn.init.zeros_(self.fc2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., F) float -> (..., D') float, not normalised."""
        out = self.lin(x)
        if self.hidden:
            out = out + self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        return out

    def shape_metadata(self) -> dict:
        return {"in_dim": self.in_dim, "out_dim": self.out_dim, "hidden": self.hidden}


def save_head(head: TokenHead, path: Path, extra: dict | None = None) -> str:
    """Write ``head`` as float16 safetensors (``extra``: more metadata, e.g. how it was trained); returns the file's
    SHA-256 (hex)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in head.state_dict().items()}
    # one metadata entry: safetensors writes several in a varying order, and the file's SHA-256 must not vary
    meta = {HEAD_METADATA_KEY: json.dumps({**head.shape_metadata(), **({"training": extra} if extra else {})})}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.chmod(0o644)  # package data: readable by everyone
    tmp.replace(path)
    return file_sha256(path)


def load_head(path: Path) -> TokenHead:
    """Read a head written by ``save_head`` (weights back to float32: float16 values, exactly).

    Raises:
        WeightsError: the file is missing, not safetensors, or not a regis token head.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"token head {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:
        raise WeightsError(f"cannot read the token head {path}: {type(exc).__name__}") from exc
    if HEAD_METADATA_KEY not in meta:
        raise WeightsError(f"{path} is not a regis token head (no {HEAD_METADATA_KEY} metadata)")
    shape = json.loads(meta[HEAD_METADATA_KEY])
    head = TokenHead(shape["in_dim"], shape["out_dim"], shape["hidden"])
    try:
        head.load_state_dict({k: v.float() for k, v in tensors.items()})
    except RuntimeError as exc:
        raise WeightsError(f"{path}: the tensors do not fit the head's recorded shape") from exc
    return head.eval()


def file_sha256(path: Path) -> str:
    """SHA-256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
