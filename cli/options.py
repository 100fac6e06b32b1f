"""Command-line options shared by several commands, and the helpers that turn them into objects."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, get_args

import typer

from regis.settings_types import IndexLayoutName

Backbone = Annotated[
    str | None,
    typer.Option("--backbone", "-b", help="Backbone: efficientnet-lite0-regis or efficientnet-lite0 (offline), "
                 "dinov2-vits14-reg, vit-tiny-reg4-test, or timm:NAME. Default: the index's, else "
                 "efficientnet-lite0-regis."),
]
Weights = Annotated[
    Path | None,
    typer.Option("--weights", "-w", help="Weights: .safetensors or torch state dict, or a regis training run dir."),
]
RandomInit = Annotated[bool, typer.Option("--random-init", help="Random weights (tests only).")]
RoiSize = Annotated[
    int | None, typer.Option("--roi-size", "-N", help="ROI window side N in patches (odd; default 3 for ViTs, "
                             "1 for CNNs).")
]
RoiImageSize = Annotated[
    int | None,
    typer.Option("--roi-image-size", help="CNN backbones: side (px) of the second backbone pass the ROI tokens are "
                 "read from; 0: one pass (encoding 1.4-1.5x faster, weaker on hard cases: docs/RESULTS.md "
                 "section 4). Default: 160 px for a 224 px input."),
]
Frame = Annotated[
    str | None,
    typer.Option("--frame", help="How an image becomes the encoder's input: center-crop (the central square; "
                 "default for ViTs), pad, squash, aspect (CNNs: the whole image, aspect ratio kept; ViTs: pad), or "
                 "center-crop+aspect (default for new CNN indexes: both framings' tokens per image, each image "
                 "scored by its better framing; twice the tokens and encoder time). Recorded in the index; its "
                 "queries use it. docs/RESULTS.md, \"Framing\"."),
]
QueryLayout = Annotated[
    str | None,
    typer.Option("--query-layout", help="A query's tokens: tokens (the 10 indexed ones) or tokens+roi-cues (CNN "
                 "with a ROI pass: + the 5 cues of that pass, the default for new CNN indexes). Recorded in the "
                 "index; its queries use it."),
]
IndexLayout = Enum("IndexLayout", {name: name for name in get_args(IndexLayoutName)}, type=str)
"""The choices of ``--layout`` (an Enum: typer shows and checks them): ``regis.settings_types.IndexLayoutName``."""
Layout = Annotated[
    IndexLayout,
    typer.Option("--layout", help="How the collection's index is stored: default (~4 KB per image) or compact "
                 "(~1.1-1.2 KB, lower recall; as regis index build --compact)."),
]
CueMethod = Annotated[
    str | None, typer.Option("--cue-method", help="CNN backbones: grid (default), kmeans or attention.")
]
Device = Annotated[str, typer.Option("--device", help="torch device: cpu, cuda, cuda:1 ...")]
CollectionsRootOpt = Annotated[
    Path | None,
    typer.Option("--root", envvar="REGIS_COLLECTIONS_ROOT",
                 help="Folder holding the collections (env REGIS_COLLECTIONS_ROOT)."),
]


def collections_root(root: Path | None):
    """The ``CollectionsRoot`` of ``--root`` / REGIS_COLLECTIONS_ROOT.

    Raises:
        ConfigError: neither is given.
    """
    from regis.errors import ConfigError
    from regis.indexes.collections import CollectionsRoot

    if root is None:
        raise ConfigError("no collections root: pass --root DIR or set REGIS_COLLECTIONS_ROOT")
    return CollectionsRoot(root)


def index_dir_for(index: Path | None, collection: str | None, root: Path | None) -> Path:
    """The index directory a command works on: ``--index DIR``, or collection ``--collection NAME`` under the
    collections root.

    Raises:
        ConfigError: both or neither given, no root for a collection, an invalid collection name.
    """
    from regis.errors import ConfigError

    if (index is None) == (collection is None):
        raise ConfigError("give either --index DIR or --collection NAME (with --root or REGIS_COLLECTIONS_ROOT)")
    if index is not None:
        return index
    return collections_root(root).path(collection)
