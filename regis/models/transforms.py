"""Image preprocessing: PIL RGB image -> normalised float tensor (METHODS.md section 1, evaluation transform).

Evaluation: the image becomes an ``image_size`` square as ``config.frame`` says: "center-crop" =
Resize(shorter side to ``resize_size``, bicubic) + CenterCrop(``image_size``); "squash" = Resize to
(``image_size``, ``image_size``), the whole frame, aspect ratio not kept; "pad" = the whole frame resized to fit,
aspect ratio kept, centred on the mean colour; "aspect" (CNNs) = the whole frame resized, aspect ratio kept, to
``regis.models.geometry.aspect_input_size`` (short side ``image_size``, long side at most twice that, both
multiples of 32: the tensor is not square, and images of other shapes give other shapes; ViTs: "pad"). Then the
backbone's mean/std.
Training (regis.training): RandomResizedCrop(``image_size``, scale 0.2..1) + horizontal flip + the same
normalisation.
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
        A callable PIL.Image (RGB) -> (3, image_size, image_size) float32 tensor; for the "aspect" frame of a CNN
        (3, H, W) with (W, H) = ``aspect_input_size(config, width, height)`` (batch such tensors by shape:
        ``regis.models.batching``).
    """
    from torchvision import transforms as T

    from regis.models.geometry import is_aspect

    frame = getattr(config, "frame", "center-crop")
    size, interp = config.image_size, _interp(config.interpolation)
    if frame == "aspect" and not is_aspect(config):
        frame = "pad"  # a ViT's fixed square of patches
    if is_aspect(config):  # "aspect", or "center-crop+aspect" (the encoder takes the central square itself)
        geometry = [_AspectResize(config, interp)]
    elif frame == "squash":
        geometry = [T.Resize((size, size), interpolation=interp)]
    elif frame == "pad":
        geometry = [_PadToSquare(size, config.mean, interp)]
    else:
        geometry = [T.Resize(config.resize_size, interpolation=interp), T.CenterCrop(size)]
    return T.Compose(
        [
            *geometry,
            T.ToTensor(),
            T.Normalize(config.mean, config.std),
        ]
    )


class _PadToSquare:
    """PIL image -> ``size`` x ``size`` PIL image: the whole frame scaled to fit, centred on ``mean`` (0..1)."""

    def __init__(self, size: int, mean: tuple[float, float, float], interpolation):
        self.size, self.interpolation = size, interpolation
        self.fill = tuple(round(255 * m) for m in mean)

    def __call__(self, img):
        from PIL import Image
        from torchvision.transforms import functional as TF

        w, h = img.size
        scale = self.size / max(w, h)
        nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
        resized = TF.resize(img, [nh, nw], interpolation=self.interpolation)
        canvas = Image.new("RGB", (self.size, self.size), self.fill)
        canvas.paste(resized, ((self.size - nw) // 2, (self.size - nh) // 2))
        return canvas


class _AspectResize:
    """PIL image -> PIL image of ``aspect_input_size(config, w, h)``: the whole frame, aspect ratio kept. A
    draft-reduced JPEG (``regis.images.decode``) is sized from its full w x h, the size an index records, so the
    patch grid its buddies index is the one ``regis.models.geometry.image_grids`` gives for that size."""

    def __init__(self, config: EncoderConfig, interpolation):
        self.config, self.interpolation = config, interpolation

    def __call__(self, img):
        from torchvision.transforms import functional as TF

        from regis.images.decode import FULL_SIZE_INFO
        from regis.models.geometry import aspect_input_size

        full, seen = img.info.get(FULL_SIZE_INFO, (img.size, img.size))
        w, h = aspect_input_size(self.config, *(full if tuple(seen) == img.size else img.size))
        return TF.resize(img, [h, w], interpolation=self.interpolation)


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
