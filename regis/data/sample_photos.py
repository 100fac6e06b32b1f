"""The real photos that ship inside installed Python packages: the demo and test collection.

scikit-image bundles a few photographs without any download (astronaut, coffee, chelsea, rocket, ...),
scikit-learn two (``load_sample_images``: china, flower), matplotlib one (grace_hopper). Synthetic images
(chessboards, logos, phantoms, silhouettes), tiny ones and the right half of the stereo motorcycle pair (a
near-duplicate of the left) are left out, so that every photo is a distinct scene.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from regis.errors import ConfigError

SKIMAGE_PHOTOS = (
    "astronaut.png", "brick.png", "camera.png", "cell.png", "chelsea.png", "clock_motion.png", "coffee.png",
    "coins.png", "grass.png", "gravel.png", "hubble_deep_field.jpg", "ihc.png", "moon.png",
    "motorcycle_left.png", "page.png", "retina.jpg", "rocket.jpg", "text.png",
)
SKLEARN_PHOTOS = ("china.jpg", "flower.jpg")
MATPLOTLIB_PHOTOS = ("grace_hopper.jpg",)


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def sample_photo_sources() -> dict[str, Path]:
    """Name -> path of every bundled photo found in the installed packages.

    Names are prefixed by package ("skimage-astronaut.png"). Packages that are not installed contribute
    nothing.
    """
    found: dict[str, Path] = {}
    groups = (
        ("skimage", "skimage.data", "", SKIMAGE_PHOTOS),
        ("sklearn", "sklearn.datasets", "images", SKLEARN_PHOTOS),
        ("matplotlib", "matplotlib", "mpl-data/sample_data", MATPLOTLIB_PHOTOS),
    )
    for prefix, module, sub, names in groups:
        base = _package_dir(module)
        if base is None:
            continue
        for name in names:
            path = base / sub / name
            if path.is_file():
                found[f"{prefix}-{name}"] = path
    return found


def collect_sample_photos(out_dir: Path | str, min_photos: int = 10) -> list[Path]:
    """Copy the bundled photos into ``out_dir`` (created), byte for byte.

    Returns:
        The copied files, sorted.

    Raises:
        ConfigError: fewer than ``min_photos`` photos were found (install regis[photos]).
    """
    sources = sample_photo_sources()
    if len(sources) < min_photos:
        raise ConfigError(
            f"found only {len(sources)} bundled photos; install scikit-image, scikit-learn and matplotlib "
            "(pip install 'regis[photos]')"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for name, src in sorted(sources.items()):
        dst = out / name
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            shutil.copyfile(src, dst)
        copied.append(dst)
    return copied
