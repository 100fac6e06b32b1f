"""Image preprocessing: PIL RGB image -> normalised float tensor (METHODS.md section 1, evaluation transform).

Evaluation: Resize(shorter side to ``resize_size``, bicubic) + CenterCrop(``image_size``) + the backbone's
mean/std. Training (regis.training): RandomResizedCrop(``image_size``, scale 0.2..1) + horizontal flip + the
same normalisation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from regis.models.encoder import EncoderConfig


def _interp(name: str):
    from torchvision.transforms import InterpolationMode

    return InterpolationMode(name)


def eval_transform(config: EncoderConfig):
    """The deterministic transform used for indexing and queries.

    Returns:
        A callable PIL.Image (RGB) -> (3, image_size, image_size) float32 tensor.
    """
    from torchvision import transforms as T

    return T.Compose(
        [
            T.Resize(config.resize_size, interpolation=_interp(config.interpolation)),
            T.CenterCrop(config.image_size),
            T.ToTensor(),
            T.Normalize(config.mean, config.std),
        ]
    )


def train_transform(config: EncoderConfig, scale: tuple[float, float] = (0.2, 1.0)):
    """The training augmentation: RandomResizedCrop + horizontal flip + normalisation.

    Returns:
        A callable PIL.Image (RGB) -> (3, image_size, image_size) float32 tensor.
    """
    from torchvision import transforms as T

    return T.Compose(
        [
            T.RandomResizedCrop(config.image_size, scale=scale, interpolation=_interp(config.interpolation)),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(config.mean, config.std),
        ]
    )
