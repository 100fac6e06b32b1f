"""The encoder that works on an index: the one its manifest records, or the one the options describe."""

from __future__ import annotations

from pathlib import Path


def encoder_for(
    index_dir: Path | None,
    backbone: str | None,
    weights: Path | None,
    random_init: bool,
    roi_size: int | None,
    cue_method: str | None,
    device: str,
    roi_image_size: int | None = None,
    frame: str | None = None,
    query_layout: str | None = None,
    new_cnn_frame: str | None = None,
):
    """The encoder a command should use.

    With no encoder option given and an existing index: the index's own encoder (rebuilt from its manifest and
    checked against its weights checksum; a sharded collection's: its first shard with a version). Otherwise:
    the encoder the options describe (``regis.models.encoder.build_encoder``; ``roi_image_size`` 0 means one
    backbone pass; ``frame`` and ``query_layout``: ``EncoderConfig``'s, e.g. "aspect" and "tokens"; without
    ``frame`` a new index of a CNN gets ``DEFAULT_CNN_INDEX_FRAME``, both framings scored apart, and a ViT the
    centre crop; ``new_cnn_frame``: another frame for that case, e.g. the square inputs of a Ray build). An index
    keeps the frame and query layout its manifest records: its queries are encoded with them; a two-framing index
    also keeps its ``framing_score`` (e.g. "union", written before "best" became the default).
    """
    from regis.errors import IndexFormatError
    from regis.indexes.layout import VERSIONS_DIR, read_current
    from regis.indexes.manifest import read_manifest
    from regis.indexes.weights_copy import stored_weights
    from regis.models.config import DEFAULT_CNN_INDEX_FRAME, DEFAULT_FRAMING_SCORE
    from regis.models.encoder import build_encoder, encoder_from_manifest
    from regis.sharding.layout import first_versioned_shard, is_sharded

    if index_dir is not None and is_sharded(index_dir):
        try:
            index_dir = first_versioned_shard(index_dir)
        except IndexFormatError:  # no shard written yet: the options' encoder
            index_dir = None

    no_options = (backbone is None and weights is None and not random_init and roi_size is None
                  and cue_method is None and roi_image_size is None and frame is None and query_layout is None)
    current = read_current(index_dir) if index_dir is not None and index_dir.is_dir() else None
    if current is not None and (no_options or (weights is not None and backbone is None and roi_size is None
                                                   and roi_image_size is None and frame is None
                                                   and query_layout is None)):
        manifest = read_manifest(index_dir / VERSIONS_DIR / current)
        stored = stored_weights(index_dir, manifest.weights)
        return encoder_from_manifest(manifest.encoder, manifest.weights, str(weights) if weights else None, device,
                                     stored=str(stored) if stored else None)
    # a new index of a CNN: both framings (DEFAULT_CNN_INDEX_FRAME); an existing index keeps the frame it was built
    # with, and its framing score when that is not build_encoder's default for two framings ("union": a two-framing
    # index built before "best" became the default; "union" is valid with any frame, so this never raises)
    cnn_frame, framing_score = new_cnn_frame or DEFAULT_CNN_INDEX_FRAME, None
    if current is not None:
        built = read_manifest(index_dir / VERSIONS_DIR / current).encoder
        cnn_frame = built.frame
        if built.framing_score != DEFAULT_FRAMING_SCORE:
            framing_score = built.framing_score
    return build_encoder(
        backbone=backbone, weights=str(weights) if weights else None, random_init=random_init, roi_size=roi_size,
        cue_method=cue_method, device=device, roi_image_size=roi_image_size, frame=frame, query_layout=query_layout,
        cnn_frame=cnn_frame, framing_score=framing_score,
    )
