"""What an encoder is, as data: ``EncoderConfig`` (everything that decides which tokens an image gets) and
``WeightsInfo`` (where its weights came from, their checksum), with the constants their validators need. Kept
free of torch and timm so that reading an index manifest (``regis.indexes.manifest``) and the torch-free query
path (``regis.models.onnx_query``) import neither; ``regis.models.encoder`` re-exports every name.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from regis.errors import ConfigError

CUE_METHODS = ("kmeans", "attention", "grid")  # regis.models.cues
CUE_POOLINGS = ("mean", "gem")
BORDER_MODES = ("clip", "shift")  # regis.models.roi
GEM_P = 3.0  # regis.models.cues: generalised-mean pooling's power
GEM_EPS = 1e-6  # features are clamped to this before the power (GeM needs non-negative inputs)


def check_roi_size(n: int) -> int:
    """Validate the ROI window size N.

    Raises:
        ConfigError: N is not an odd integer >= 1.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1 or n % 2 == 0:
        raise ConfigError(f"ROI size N must be an odd integer >= 1 (1, 3, 5, ...), got {n!r}")
    return n


TOKEN_SETS = ("cls", "cls+reg", "cls+reg+roi")
DEFAULT_CUE_METHOD = "grid"  # chosen by measurement: README, "Measured"
# CNN defaults chosen on the hard real-photo set (docs/RESULTS.md, "Hard cases"); a manifest or training run
# without these fields keeps the earlier behaviour (mean pooling; its stored roi_size).
DEFAULT_CUE_POOLING = "gem"
DEFAULT_CNN_ROI_SIZE = 1
# New CNN encoders read their ROI tokens from a second backbone pass at 1/sqrt(2) of the input side (rounded to
# the CNN's stride of 32: 224 -> 160 px, a 5 x 5 map); docs/RESULTS.md, "Hard cases". Manifests without the
# field read their ROI tokens from the one pass, as before.
DEFAULT_CNN_ROI_SCALE = 1 / math.sqrt(2)
DEFAULT_ROI_SIZE = 3  # ViTs, as in METHODS.md
FRAMES = ("center-crop", "squash", "pad", "aspect", "center-crop+aspect")
TWO_FRAMINGS = "center-crop+aspect"  # CNNs: every image indexed with the tokens of both framings (docs/RESULTS.md 6)
# Query-token layouts (``EncoderConfig.query_layout``): "tokens", the T tokens an image is indexed with;
# "tokens+roi-cues", those plus the R + 1 cue tokens of the CNN's ROI pass (already run for the ROI tokens, so no
# extra encoder time): 2(R + 1) + R + 1 = 15 query tokens against the 10 indexed ones. docs/RESULTS.md, "Hard
# cases", fourth round. A manifest or run config without the field means "tokens".
QUERY_LAYOUTS = ("tokens", "tokens+roi-cues")
DEFAULT_CNN_QUERY_LAYOUT = "tokens+roi-cues"
DEFAULT_FRAME = "center-crop"  # build_encoder's default; a manifest without the field means "center-crop"
# New CNN indexes and collections (``regis.index_encoder.encoder_for``): both framings, scored apart ("best");
# chosen by measurement, docs/RESULTS.md section 6. ViTs keep ``DEFAULT_FRAME``.
DEFAULT_CNN_INDEX_FRAME = "center-crop+aspect"
# How MaxSim scores an image of two framings (``EncoderConfig.framing_score``): "union", one MaxSim of all the
# query's tokens over all the image's (what "center-crop+aspect" indexes built before the field used; a manifest
# without it means "union"); "best", each framing's query tokens against the image's tokens of the same framing,
# the image's score the better of the two (METHODS.md section 1; docs/RESULTS.md section 6). New two-framing
# encoders: "best".
FRAMING_SCORES = ("union", "best")
DEFAULT_FRAMING_SCORE = "best"


class EncoderConfig(BaseModel):
    """Everything that decides which tokens an image gets; saved in index manifests and checkpoints.

    Attributes:
        backbone: registry name (``regis.models.registry``).
        kind: "vit" or "cnn".
        num_registers: R (ViT: the backbone's register tokens; CNN: part tokens).
        dim: D, the token width.
        roi_size: N, the ROI window side in patches (odd, >= 1).
        border: "clip" or "shift" (window at the grid border).
        token_set: which tokens the encoder returns ("cls", "cls+reg", "cls+reg+roi").
        cue_method: CNN only: how part tokens are made ("kmeans", "attention", "grid").
        cue_pooling: CNN only: how the global token and the grid cells pool ("mean", "gem";
            ``regis.models.cues``). "mean" for ViTs and for indexes written before the field existed.
        image_size: square input side, pixels.
        roi_image_size: CNN only: the side, pixels, of a second backbone pass (the input downscaled from
            ``image_size``) that the buddy patches and ROI tokens are read from; the global and part tokens
            come from the ``image_size`` pass. None: one pass for all tokens (ViTs, and every index written
            before the field existed).
        resize_size: shorter side before the centre crop, pixels ("center-crop" frame only).
        frame: how an image becomes the square input (``regis.models.transforms``): "center-crop" (shorter
            side to ``resize_size``, then the central square: what indexes without this field used),
            "squash" (the whole frame resized to the square, aspect ratio not kept) or "pad" (the whole frame,
            aspect ratio kept, padded with the mean colour) or "aspect" (CNNs: the whole frame, aspect ratio kept,
            short side ``image_size``, long side at most 2x, no square: ``regis.models.geometry``; ViTs: "pad")
            or "center-crop+aspect" (CNNs only: both framings per image, the central square of the "aspect"
            input and the whole "aspect" input, their tokens one after the other: ``framings`` = 2).
        interpolation: torchvision interpolation mode name.
        mean, std: per-channel normalisation.
        query_layout: which tokens a query gets (the index's tokens are the same either way): "tokens" (the
            T tokens above; every index written before the field existed) or "tokens+roi-cues" (CNN with a ROI
            pass and every token: the T tokens plus the R + 1 cue tokens of the ROI pass, in that order).
        framing_score: two framings ("center-crop+aspect") only: "union" (one MaxSim of the m query tokens over the
            T image tokens; manifests without the field) or "best" (per framing: its m / 2 query tokens against the
            image's T / 2 tokens of the same framing; the image's score is the larger of the two; new encoders).
            Must be "union" for one framing.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backbone: str
    kind: Literal["vit", "cnn"]
    num_registers: int
    dim: int
    roi_size: int = 3
    border: Literal["clip", "shift"] = "clip"
    token_set: Literal["cls", "cls+reg", "cls+reg+roi"] = "cls+reg+roi"
    cue_method: str | None = None
    cue_pooling: Literal["mean", "gem"] = "mean"
    image_size: int = 224
    roi_image_size: int | None = None
    resize_size: int = 224
    frame: Literal["center-crop", "squash", "pad", "aspect", "center-crop+aspect"] = "center-crop"
    interpolation: str = "bicubic"
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    query_layout: Literal["tokens", "tokens+roi-cues"] = "tokens"
    framing_score: Literal["union", "best"] = "union"

    @field_validator("roi_size")
    @classmethod
    def _odd_roi(cls, v: int) -> int:
        return check_roi_size(v)

    @field_validator("cue_method")
    @classmethod
    def _known_cue(cls, v: str | None) -> str | None:
        if v is not None and v not in CUE_METHODS:
            raise ValueError(f"unknown cue method {v!r}; choose one of {CUE_METHODS}")
        return v

    @property
    def token_positions(self) -> list[int]:
        """Positions in the full 2(R + 1) layout that ``token_set`` keeps."""
        r = self.num_registers
        count = {"cls": 1, "cls+reg": r + 1, "cls+reg+roi": 2 * (r + 1)}[self.token_set]
        return list(range(count))

    @model_validator(mode="after")
    def _query_layout_needs_roi_pass(self) -> EncoderConfig:
        if self.query_layout != "tokens" and (self.kind != "cnn" or self.roi_image_size is None
                                              or self.token_set != "cls+reg+roi"):
            raise ValueError(f"query layout {self.query_layout!r} needs a CNN with a ROI pass (roi_image_size) "
                             "and the cls+reg+roi token set")
        return self

    @model_validator(mode="after")
    def _two_framings_need_a_cnn(self) -> EncoderConfig:
        if self.frame == TWO_FRAMINGS and self.kind != "cnn":
            raise ValueError(f"frame {TWO_FRAMINGS!r} needs a CNN backbone (its aspect framing feeds non-square "
                             f"inputs), not {self.kind} ({self.backbone})")
        return self

    @model_validator(mode="after")
    def _best_framing_needs_two(self) -> EncoderConfig:
        if self.framing_score == "best" and self.frame != TWO_FRAMINGS:
            raise ValueError(f"framing score 'best' needs two framings per image (frame {TWO_FRAMINGS!r}), not "
                             f"frame {self.frame!r}")
        return self

    def differences(self, other: EncoderConfig) -> dict[str, tuple]:
        """{field: (this value, ``other``'s)} for every field in which the two configs differ (empty: equal)."""
        mine, theirs = self.model_dump(), other.model_dump()
        return {k: (mine[k], theirs.get(k)) for k in mine if mine[k] != theirs.get(k)}

    @property
    def score_framings(self) -> int:
        """Framings MaxSim scores apart (``framing_score`` "best": ``framings``, each framing's query tokens
        against the image's tokens of that framing, the better score kept), else 1 (one MaxSim over all tokens).
        The scorers take it as ``framings`` (``regis.scores.maxsim.maxsim_gemm``)."""
        return self.framings if self.framing_score == "best" else 1

    @property
    def framings(self) -> int:
        """How many framings each image is encoded with: 2 for "center-crop+aspect", else 1."""
        return 2 if self.frame == TWO_FRAMINGS else 1

    @property
    def tokens_per_framing(self) -> int:
        """The tokens one framing gives an image (``token_set``): 1, R + 1 or 2(R + 1)."""
        return len(self.token_positions)

    @property
    def tokens_per_image(self) -> int:
        """T, the number of tokens per image the encoder returns (``tokens_per_framing`` x ``framings``)."""
        return self.tokens_per_framing * self.framings

    @property
    def query_tokens_per_framing(self) -> int:
        """A query's tokens per framing (``query_layout``): ``tokens_per_framing``, or that + R + 1."""
        return self.tokens_per_framing + (self.num_registers + 1 if self.query_layout == "tokens+roi-cues" else 0)

    @property
    def query_tokens_per_image(self) -> int:
        """m, the number of tokens a query gets: ``query_tokens_per_framing`` x ``framings`` (T, or T + R + 1 with
        one framing)."""
        return self.query_tokens_per_framing * self.framings

    @property
    def buddies_per_image(self) -> int:
        """The buddy patches stored per image: R + 1 per framing (one per cue; ``regis.models.roi``)."""
        return (self.num_registers + 1) * self.framings


class WeightsInfo(BaseModel):
    """Where the weights came from and their checksum (``state_dict_sha256``; with a token head: of the backbone and
    the head together).

    Attributes:
        head_source, head_sha256: the token head's file (``package:<file>`` for the head shipped in regis, or
            ``file:/path``) and the SHA-256 of its bytes; None without a head (and in manifests written before).
    """

    model_config = ConfigDict(frozen=True)

    source: str
    sha256: str
    head_source: str | None = None
    head_sha256: str | None = None
