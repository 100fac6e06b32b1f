"""Unfreezing the backbone's last stage(s) for the token head (issue 22: "then try unfreezing the last stage(s)").

Caching the backbone's final tokens (``training.photos.features``) freezes all of it. To train its last S stages
too while keeping training on 2 CPU cores, the cache holds instead the activations at the *input* of those stages,
of both passes the tokens are read from (the 224 px pass and the 160 px ROI pass: ``RegisEncoder.roi_input``):
(P, C) per image, the main pass's h x w positions then the ROI pass's h' x w' (row-major), float16. Training runs
only the tail (the last S stages of timm's ``blocks``, ``conv_head``, ``bn2``), the encoder's token readout
(``RegisEncoder.parts_from_map``, ``query_readout``: cues, ROI tokens, ROI cues; differentiable) and the head.

For EfficientNet-Lite0, S = 1 is one inverted-residual block (192 -> 320 channels at 7 x 7) plus the 1x1 conv to
1280: 1.0 M parameters, 192 x (49 + 25) activations per image. BatchNorm statistics stay frozen (the tail is
always in eval mode; its affine parameters train).
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from regis.errors import ConfigError
from regis.models.encoder import RegisEncoder


def _check(encoder: RegisEncoder, stages: int) -> None:
    bb = encoder.backbone
    if encoder.config.kind != "cnn" or not all(hasattr(bb, a) for a in ("conv_stem", "blocks", "conv_head")):
        raise ConfigError(f"unfreezing the last stages needs a timm EfficientNet-like CNN, not "
                          f"{encoder.config.backbone}")
    if encoder.head is not None:
        raise ConfigError("the tail is taken from the untrained encoder (no token head)")
    if not 1 <= stages <= len(bb.blocks):
        raise ConfigError(f"stages must be in 1..{len(bb.blocks)}, got {stages}")
    if encoder.config.frame != "center-crop":
        raise ConfigError(f"the tail cache needs fixed-size inputs (frame center-crop), not {encoder.config.frame}")


@torch.inference_mode()
def pre_tail(encoder: RegisEncoder, images: torch.Tensor, stages: int) -> tuple[torch.Tensor, list[list[int]]]:
    """Activations at the input of the backbone's last ``stages`` stages, of the main pass and the ROI pass.

    Args:
        images: (B, 3, H, W) float, the encoder's evaluation transform's output.

    Returns:
        (B, P, C) float32 (P = h w + h' w': the main pass's positions, then the ROI pass's, row-major) and the
        grids [[h, w], [h', w']] (one grid when the encoder has no ROI pass).

    Raises:
        ConfigError: not a timm EfficientNet-like CNN, ``stages`` out of range, a head on the encoder, or a frame
            other than center-crop.
    """
    _check(encoder, stages)
    bb = encoder.backbone
    out, grids = [], []
    for x in (images, encoder.roi_input(images, aspect=False)):
        if x is None:
            continue
        a = bb.blocks[: len(bb.blocks) - stages](bb.bn1(bb.conv_stem(x)))
        grids.append([a.shape[-2], a.shape[-1]])
        out.append(a.flatten(2).transpose(1, 2))
    return torch.cat(out, 1), grids


class TailReadout(nn.Module):
    """The backbone's last ``stages`` stages + the encoder's query readout: cached pre-tail activations
    (..., P, C) -> (..., m, F) unit-norm float32 query tokens (``RegisEncoder.query_readout``'s; the first T are
    the index's). At its start (the pretrained weights) it gives the frozen encoder's tokens."""

    def __init__(self, encoder: RegisEncoder, stages: int, grids: list[list[int]]):
        super().__init__()
        _check(encoder, stages)
        bb = encoder.backbone
        self.stages, self.grids = stages, [tuple(int(v) for v in g) for g in grids]
        self.tail = nn.Sequential(*copy.deepcopy(list(bb.blocks[len(bb.blocks) - stages :])),
                                  copy.deepcopy(bb.conv_head), copy.deepcopy(bb.bn2))
        # the readout without the backbone (its methods read the config only; no parameters)
        self.readout = RegisEncoder(nn.Identity(), encoder.spec, encoder.config, encoder.weights_info)
        self.eval()

    def train(self, mode: bool = True) -> TailReadout:
        """Always eval mode: the BatchNorm statistics stay the pretrained ones (``mode`` is recorded only)."""
        super().train(False)
        self.training = mode
        return self

    def forward(self, acts: torch.Tensor) -> torch.Tensor:
        sizes = [h * w for h, w in self.grids]
        if acts.shape[-2] != sum(sizes):
            raise ConfigError(f"expected {sum(sizes)} cached positions (grids {self.grids}), got {acts.shape[-2]}")
        lead = acts.shape[:-2]
        flat = acts.reshape(-1, *acts.shape[-2:]).float()
        parts = []
        for (h, w), a in zip(self.grids, flat.split(sizes, dim=1), strict=True):
            fmap = self.tail(a.transpose(1, 2).reshape(len(a), -1, h, w))
            parts.append(self.readout.parts_from_map(fmap))
        tokens = self.readout.query_readout(*parts[0], roi_parts=parts[1] if len(parts) > 1 else None)
        return tokens.reshape(*lead, *tokens.shape[1:])


class TailHead(nn.Module):
    """``TailReadout`` then a ``regis.models.head.TokenHead``: (..., P, C) activations -> (..., m, D')."""

    def __init__(self, tail: TailReadout, head: nn.Module):
        super().__init__()
        self.tail, self.head = tail, head

    def forward(self, acts: torch.Tensor) -> torch.Tensor:
        return self.head(self.tail(acts))


def cached_tail(config: dict) -> dict:
    """The ``{"stages": S, "grids": [[h, w], ...]}`` an ``InstanceCache``'s config records (S = 0, no grids: a
    token cache; a concatenated cache's parts must agree).

    Raises:
        ConfigError: the parts of a concatenated cache were made differently.
    """
    found = [cached_tail(c) for c in config["parts"]] if "parts" in config else [
        config.get("tail") or {"stages": 0, "grids": None}]
    if any(f != found[0] for f in found):
        raise ConfigError(f"the cache's parts hold different things: {found}")
    return found[0]


@torch.no_grad()
def tail_tokens(cache, tail: TailReadout, batch: int = 128):
    """The ``InstanceCache`` of tokens (float16, as ``features.encode_tokens`` caches them) read from ``cache``'s
    pre-tail activations through ``tail`` (the frozen arm of a comparison trains on these); the other fields
    are ``cache``'s."""

    def run(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, *x.shape[-2:])
        out = torch.cat([tail(flat[i : i + batch]).to(torch.float16) for i in range(0, len(flat), batch)])
        return out.reshape(*x.shape[:-2], *out.shape[1:])

    return dataclasses.replace(cache, clean=run(cache.clean), views=run(cache.views),
                               config={**cache.config, "tokens_from_tail": tail.stages})
