"""The regis encoder: an image batch -> 2(R + 1) unit-norm tokens per image (METHODS.md section 1).

Token order, fixed so that a token's index tells its type:
    [CLS, reg_1..reg_R, ROI_cls, ROI_reg_1..ROI_reg_R]
With R = 4 that is 10 tokens. ``token_set`` selects a prefix of this layout for ablations:
``cls`` (1 token), ``cls+reg`` (R + 1), ``cls+reg+roi`` (2(R + 1), the default).
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from regis.errors import ConfigError, IndexMismatchError, WeightsError
from regis.models.config import (  # noqa: F401  (re-exported: the names' historical home)
    CUE_METHODS,
    CUE_POOLINGS,
    DEFAULT_CNN_QUERY_LAYOUT,
    DEFAULT_CNN_ROI_SCALE,
    DEFAULT_CNN_ROI_SIZE,
    DEFAULT_CUE_METHOD,
    DEFAULT_CUE_POOLING,
    DEFAULT_FRAME,
    DEFAULT_FRAMING_SCORE,
    DEFAULT_ROI_SIZE,
    FRAMES,
    FRAMING_SCORES,
    QUERY_LAYOUTS,
    TOKEN_SETS,
    TWO_FRAMINGS,
    EncoderConfig,
    WeightsInfo,
)
from regis.models.cues import cnn_cues
from regis.models.geometry import CNN_STRIDE, central_square, is_aspect, is_two_framings, roi_input_size
from regis.models.registry import BackboneSpec, get_backbone_spec
from regis.models.roi import BORDER_MODES, buddy_patches, check_roi_size, roi_tokens
from regis.models.weights import (
    LoadedWeights,
    create_timm_model,
    hub_model,
    load_into,
    package_weights,
    read_weights_file,
    state_dict_sha256,
)


class RegisEncoder(nn.Module):
    """Backbone + cue tokens + ROI pooling -> unit-norm multi-vector embeddings.

    The one model contract: ``forward(images)`` takes a (B, 3, H, W) float batch normalised with
    ``config.mean``/``config.std`` and returns (B, T, D) float tokens, each of unit L2 norm, in the order
    [CLS, reg_1..reg_R, ROI_cls, ROI_reg_1..ROI_reg_R] (truncated by ``config.token_set``).
    """

    def __init__(self, backbone: nn.Module, spec: BackboneSpec, config: EncoderConfig, weights: WeightsInfo,
                 head: nn.Module | None = None):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.spec = spec
        self.config = config
        self.weights_info = weights

    def project(self, tokens: torch.Tensor) -> torch.Tensor:
        """(..., F) backbone tokens -> (..., D) unit-norm float32 tokens: L2-normalised, then through the token head
        (``regis.models.head``, when the backbone has one: F -> D') and normalised again."""
        out = F.normalize(tokens.float(), dim=-1)
        if self.head is not None:
            out = F.normalize(self.head(out), dim=-1)
        return out

    def forward_parts(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """The backbone's cue tokens and patch tokens.

        Args:
            images: (B, 3, H, W) float.

        Returns:
            cues (B, R + 1, D), patches (B, P, D) row-major on the grid, and the grid (h, w).
        """
        if images.ndim != 4 or images.shape[1] != 3:
            raise ConfigError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
        if self.config.kind == "vit":
            tokens = self.backbone.forward_features(images)
            prefix = self.backbone.num_prefix_tokens
            pe = self.backbone.patch_embed
            if hasattr(pe, "dynamic_feat_size"):
                grid = tuple(pe.dynamic_feat_size(images.shape[-2:]))
            else:
                grid = tuple(pe.grid_size)
            return tokens[:, :prefix], tokens[:, prefix:], (int(grid[0]), int(grid[1]))
        return self.parts_from_map(self.backbone.forward_features(images))

    def parts_from_map(self, fmap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """A CNN's ``forward_parts`` from its final feature map (B, D, h, w) float: cues (B, R + 1, D), patches
        (B, h w, D), grid (h, w). Differentiable (training a backbone's last stage reads tokens through it,
        ``training.photos.tail``)."""
        grid = (fmap.shape[-2], fmap.shape[-1])
        patches = fmap.flatten(2).transpose(1, 2)
        cues = cnn_cues(patches, grid, self.config.num_registers, self.config.cue_method or DEFAULT_CUE_METHOD,
                        self.config.cue_pooling)
        return cues, patches, grid

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) float -> (B, T, D) unit-norm tokens (see class docstring)."""
        return self.forward_with_buddies(images)[0]

    def forward_with_buddies(self, images: torch.Tensor, query: bool = False
                             ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """The tokens of ``forward`` and where each ROI token's window sits on the patch grid.

        Args:
            images: (B, 3, H, W) float.
            query: the query's tokens (``config.query_layout``, ``query_readout``) instead of the index's.

        Returns:
            tokens (B, T, D) float unit-norm (exactly ``forward``'s; with ``query``: (B, m, D), m =
            ``config.query_tokens_per_image``, whose first T are those), buddies (B, R + 1) int64: the buddy
            patch of each cue (row-major index on the grid; the ROI token of cue c is the N x N window centred
            there, ``regis.models.roi.window_bounds``), and the patch grid (h, w). "center-crop+aspect": per
            framing, the central square's first (tokens T / 2 or m / 2, buddies R + 1 on the square ROI grid),
            then the whole input's (on its own grid, the one returned).
        """
        if is_two_framings(self.config):  # the central square's tokens, then the whole input's
            square = self._framed(self.central_square(images), query, aspect=False)
            whole = self._framed(images, query, aspect=True)
            return torch.cat([square[0], whole[0]], 1), torch.cat([square[1], whole[1]], 1), whole[2]
        return self._framed(images, query, aspect=is_aspect(self.config))

    def _framed(self, images: torch.Tensor, query: bool, aspect: bool
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """``forward_with_buddies`` of one framing (``aspect``: the input is non-square, its ROI pass sized by
        ``regis.models.geometry.roi_input_size``)."""
        parts = self.forward_parts(images)
        roi_parts = self.forward_roi_parts(images, aspect=aspect)
        rcues, rpatches, rgrid = roi_parts or parts
        buddies = buddy_patches(rcues, rpatches)
        readout = self.query_readout if query else self.readout
        return readout(*parts, roi_parts=roi_parts), buddies, rgrid

    def central_square(self, images: torch.Tensor) -> torch.Tensor:
        """The centre-crop framing of "center-crop+aspect": the central square of a (B, 3, H, W) "aspect" input,
        resized (bicubic, antialiased) to ``image_size`` when its side is not that (panoramas past 2:1), ->
        (B, 3, image_size, image_size). Its place in the image: ``regis.models.geometry.crop_region``."""
        left, top, side = central_square(images.shape[-1], images.shape[-2])
        square = images[..., top : top + side, left : left + side]
        size = self.config.image_size
        if side != size:
            square = F.interpolate(square, size=(size, size), mode="bicubic", align_corners=False, antialias=True)
        return square

    def forward_roi_parts(self, images: torch.Tensor, aspect: bool | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]] | None:
        """The second, smaller backbone pass the ROI tokens are read from (``config.roi_image_size``), or None
        when the ROI tokens come from the main pass (no ``roi_image_size``, or no ROI tokens).

        Args:
            images: (B, 3, H, W) float, the ``image_size`` input; it is resized by
                ``config.roi_image_size / config.image_size`` (bicubic, antialiased); "aspect" frame: each side
                rounded to a multiple of 32 px (``regis.models.geometry.roi_input_size``).
            aspect: whether ``images`` is an "aspect" input (default: ``is_aspect(config)``; "center-crop+aspect"
                passes False for its central square).

        Returns:
            ``forward_parts`` of the resized batch: cues (B, R + 1, D), patches (B, P', D), grid (h', w').
        """
        small = self.roi_input(images, aspect)
        return None if small is None else self.forward_parts(small)

    def roi_input(self, images: torch.Tensor, aspect: bool | None = None) -> torch.Tensor | None:
        """The input of the ROI pass (``forward_roi_parts``): ``images`` (B, 3, H, W) resized, (B, 3, H', W')
        float; None when the encoder has no ROI pass."""
        size = self.config.roi_image_size
        if size is None or self.config.token_set != "cls+reg+roi":
            return None
        if is_aspect(self.config) if aspect is None else aspect:
            rw, rh = roi_input_size(self.config, images.shape[-1], images.shape[-2])
            out = (rh, rw)
        else:
            ratio = size / self.config.image_size
            out = (max(1, round(images.shape[-2] * ratio)), max(1, round(images.shape[-1] * ratio)))
        return F.interpolate(images, size=out, mode="bicubic", align_corners=False, antialias=True)

    def readout(self, cues: torch.Tensor, patches: torch.Tensor, grid: tuple[int, int],
                roi_parts: tuple[torch.Tensor, torch.Tensor, tuple[int, int]] | None = None) -> torch.Tensor:
        """``forward_parts``' output -> (B, T, D) unit-norm tokens: cues, then the ROI tokens (METHODS.md
        section 1). Split from ``forward`` so that evaluations can score other readouts of one backbone pass.

        ``roi_parts``: ``forward_roi_parts``' output, where the ROI tokens come from (None: from ``cues`` and
        ``patches``).

        Raises:
            ConfigError: the config reads ROI tokens from a second pass (``roi_image_size``) and none is given.
        """
        if self.config.token_set == "cls+reg+roi":
            if roi_parts is None and self.config.roi_image_size is not None:
                raise ConfigError("this encoder reads its ROI tokens from a second pass: pass roi_parts "
                                  "(forward_roi_parts)")
            rcues, rpatches, rgrid = roi_parts or (cues, patches, grid)
            rois = roi_tokens(rcues, rpatches, rgrid, self.config.roi_size, self.config.border)
            tokens = torch.cat([cues, rois.to(cues.dtype)], 1)
        else:
            tokens = cues[:, : self.config.tokens_per_framing]
        return self.project(tokens)

    def query_readout(self, cues: torch.Tensor, patches: torch.Tensor, grid: tuple[int, int],
                      roi_parts: tuple[torch.Tensor, torch.Tensor, tuple[int, int]] | None = None) -> torch.Tensor:
        """A query's (B, m, D) unit-norm tokens (``config.query_layout``): ``readout``'s T tokens, followed for
        "tokens+roi-cues" by the R + 1 cue tokens of the ROI pass (``roi_parts``)."""
        tokens = self.readout(cues, patches, grid, roi_parts=roi_parts)
        if self.config.query_layout == "tokens":
            return tokens
        if roi_parts is None:
            raise ConfigError("this encoder's queries read cue tokens from a second pass: pass roi_parts")
        return torch.cat([tokens, self.project(roi_parts[0])], 1)

    @torch.inference_mode()
    def encode_query(self, images: torch.Tensor, autocast: bool = True) -> torch.Tensor:
        """Query encoding: as ``encode``, but (B, m, D) tokens in ``config.query_layout`` (m =
        ``config.query_tokens_per_image``; the first T are ``encode``'s). What searches score against the index's
        T tokens per image with MaxSim."""
        return self.encode_query_with_buddies(images, autocast)[0]

    @torch.inference_mode()
    def encode_query_with_buddies(
        self, images: torch.Tensor, autocast: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """``encode_with_buddies`` of a query: tokens (B, m, D) as ``encode_query``, buddies, grid."""
        images = images.to(next(self.parameters()).device)
        use_amp = autocast and images.device.type == "cuda"
        with torch.autocast(device_type=images.device.type, dtype=torch.bfloat16, enabled=use_amp):
            tokens, buddies, grid = self.forward_with_buddies(images, query=True)
        return F.normalize(tokens.float(), dim=-1), buddies, grid

    @torch.inference_mode()
    def encode(self, images: torch.Tensor, autocast: bool = True) -> torch.Tensor:
        """Inference: (B, 3, H, W) float on any device -> (B, T, D) float32 unit-norm tokens on that device.

        Uses bf16 autocast on CUDA when ``autocast``; fp32 on CPU.
        """
        images = images.to(next(self.parameters()).device)
        use_amp = autocast and images.device.type == "cuda"
        with torch.autocast(device_type=images.device.type, dtype=torch.bfloat16, enabled=use_amp):
            out = self(images)
        return F.normalize(out.float(), dim=-1)

    @torch.inference_mode()
    def encode_with_buddies(
        self, images: torch.Tensor, autocast: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """Inference as ``encode``, plus each cue's buddy patch (what match explanations draw).

        Returns:
            tokens (B, T, D) float32 unit-norm on the input's device (the same as ``encode``), buddies
            (B, R + 1) int64 on that device, and the patch grid (h, w). See ``forward_with_buddies``.
        """
        images = images.to(next(self.parameters()).device)
        use_amp = autocast and images.device.type == "cuda"
        with torch.autocast(device_type=images.device.type, dtype=torch.bfloat16, enabled=use_amp):
            tokens, buddies, grid = self.forward_with_buddies(images)
        return F.normalize(tokens.float(), dim=-1), buddies, grid


_RANDOM_INIT_LOCK = threading.Lock()


def _random_model(spec: BackboneSpec, seed: int) -> nn.Module:
    """A randomly initialised backbone, the same for the same seed whatever other threads do: timm initialises from
    torch's global generator, so two builds at once in one process (the service opening a collection while a job
    builds its encoder) drew from each other's sequence and got other weights than ``random:SEED`` means (the
    index then refused the encoder that served it: 503 ``index_unavailable``, found by scripts/soak.py). One build at
    a time (the global generator is left seeded and drawn from, as before)."""
    with _RANDOM_INIT_LOCK:
        torch.manual_seed(seed)
        return create_timm_model(spec, pretrained=False)


def _resolve_weights(
    spec: BackboneSpec, weights: str | None, random_init: bool, seed: int, loaded: LoadedWeights | None
) -> tuple[nn.Module, str]:
    if random_init:
        return _random_model(spec, seed), f"random:{seed}"
    if loaded is not None:
        model = create_timm_model(spec, pretrained=False)
        load_into(model, loaded.state_dict, spec, loaded.source)
        return model, loaded.source
    if spec.default_weights == "package":
        pkg = package_weights(spec)
        model = create_timm_model(spec, pretrained=False)
        load_into(model, pkg.state_dict, spec, pkg.source)
        return model, pkg.source
    if spec.default_weights == "hub":
        return hub_model(spec), f"hub:{spec.timm_name}"
    raise WeightsError(
        f"backbone {spec.name} has no pretrained weights; pass --weights PATH, or --random-init for tests"
    )


def build_encoder(
    backbone: str | None = None,
    weights: str | None = None,
    random_init: bool = False,
    seed: int = 0,
    roi_size: int | None = None,
    border: str | None = None,
    token_set: str | None = None,
    cue_method: str | None = None,
    device: str | torch.device = "cpu",
    image_size: int | None = None,
    frame: str | None = None,
    cue_pooling: str | None = None,
    roi_image_size: int | None = None,
    query_layout: str | None = None,
    framing_score: str | None = None,
    cnn_frame: str | None = None,
) -> RegisEncoder:
    """Build an encoder from the registry, loading weights as asked.

    Args:
        backbone: registry name or ``timm:NAME``; when None, taken from the config stored with ``weights``
            (a training run), else ``efficientnet-lite0``.
        weights: path to weights (safetensors, torch state dict, or a run directory with encoder.safetensors).
        random_init: random weights (seeded with ``seed``); for tests only.
        roi_size, border, token_set, cue_method, cue_pooling: override the defaults (or the stored run
            config). Defaults for a new encoder: N = ``DEFAULT_ROI_SIZE`` (ViT) or ``DEFAULT_CNN_ROI_SIZE``
            (CNN), cue pooling ``DEFAULT_CUE_POOLING`` (CNN; a stored run without the field: "mean").
        device: where to put the model; it is returned in eval mode.
        image_size: input side in pixels (crop and resize), CNN backbones only; default: the stored run
            config's, else the registry's (224 for the real backbones).
        frame: "center-crop", "squash", "pad", "aspect" or "center-crop+aspect" (CNNs; ``EncoderConfig.frame``);
            default: the stored run config's, else ``cnn_frame`` for a CNN when given, else ``DEFAULT_FRAME``.
        roi_image_size: CNN only: side (px) of the second pass the ROI tokens are read from
            (``EncoderConfig.roi_image_size``); 0: one pass. Default: the stored run config's (a run without
            the field: one pass), else ``default_roi_image_size(image_size)`` (224 -> 160 px).
        query_layout: "tokens" or "tokens+roi-cues" (``EncoderConfig.query_layout``). Default: the stored run
            config's (a run without the field: "tokens"), else ``DEFAULT_CNN_QUERY_LAYOUT`` for a CNN with a ROI
            pass and every token, "tokens" otherwise.
        framing_score: "union" or "best" (``EncoderConfig.framing_score``), two framings only. Default: the stored
            run config's (a run of two framings), else ``DEFAULT_FRAMING_SCORE`` ("best") with two framings,
            "union" with one.
        cnn_frame: a CNN's frame when neither ``frame`` nor the stored run config names one (new indexes:
            ``DEFAULT_CNN_INDEX_FRAME``, ``regis.index_encoder.encoder_for``); ignored for ViTs.

    Returns:
        A ``RegisEncoder`` whose ``config`` and ``weights_info`` describe it fully.

    Raises:
        ConfigError: unknown backbone, bad ROI size, a ViT without register tokens, bad combination.
        WeightsError: weights missing, unreadable, of the wrong architecture, or not downloadable.
    """
    if random_init and weights:
        raise ConfigError("give either --weights or --random-init, not both")
    head_weights = None
    if weights and (is_head_file(weights) or (backbone is not None and get_backbone_spec(backbone).head)):
        # a backbone with a token head: --weights names another head (a file or a `regis train head` run)
        head_weights, weights = weights, None
        backbone = backbone or head_backbone(head_weights)
    loaded = read_weights_file(weights) if weights else None
    stored = (loaded.encoder_config or {}) if loaded else {}
    if backbone is None:
        from regis.models.registry import DEFAULT_BACKBONE

        backbone = stored.get("backbone", DEFAULT_BACKBONE)
    elif stored.get("backbone") not in (None, backbone):
        raise WeightsError(f"{weights} holds a {stored['backbone']} encoder, not {backbone}")
    spec = get_backbone_spec(backbone)
    if roi_size is not None:
        check_roi_size(roi_size)
    if border is not None and border not in BORDER_MODES:
        raise ConfigError(f"border must be one of {BORDER_MODES}, got {border!r}")
    if token_set is not None and token_set not in TOKEN_SETS:
        raise ConfigError(f"token set must be one of {TOKEN_SETS}, got {token_set!r}")
    if cue_method is not None and spec.kind != "cnn":
        raise ConfigError(f"--cue-method applies to CNN backbones only, not {spec.name}")
    if cue_pooling is not None and cue_pooling not in CUE_POOLINGS:
        raise ConfigError(f"cue pooling must be one of {CUE_POOLINGS}, got {cue_pooling!r}")
    if cue_pooling not in (None, "mean") and spec.kind != "cnn":
        raise ConfigError(f"cue pooling {cue_pooling!r} applies to CNN backbones only, not {spec.name}")
    size = image_size if image_size is not None else int(stored.get("image_size", spec.image_size))
    if size != spec.image_size and spec.kind != "cnn":
        raise ConfigError(f"{spec.name} takes {spec.image_size} px inputs; image size {size} applies to CNNs only")
    if frame is not None and frame not in FRAMES:
        raise ConfigError(f"frame must be one of {FRAMES}, got {frame!r}")
    if framing_score is not None and framing_score not in FRAMING_SCORES:
        raise ConfigError(f"framing score must be one of {FRAMING_SCORES}, got {framing_score!r}")
    if cnn_frame is not None and cnn_frame not in FRAMES:
        raise ConfigError(f"frame must be one of {FRAMES}, got {cnn_frame!r}")
    frame = frame or stored.get("frame") or (cnn_frame if cnn_frame and spec.kind == "cnn" else DEFAULT_FRAME)
    if frame == TWO_FRAMINGS and spec.kind != "cnn":
        raise ConfigError(f"frame {TWO_FRAMINGS!r} needs a CNN backbone (its aspect framing feeds non-square "
                          f"inputs), not {spec.name}")
    two = frame == TWO_FRAMINGS
    kept = stored.get("framing_score") if stored.get("frame") == TWO_FRAMINGS else None  # a two-framing run's
    framings_scored = framing_score or kept or (DEFAULT_FRAMING_SCORE if two else "union")
    if framings_scored == "best" and not two:
        raise ConfigError(f"framing score 'best' needs two framings per image (frame {TWO_FRAMINGS!r})")
    if size < 32:
        raise ConfigError(f"image size must be at least 32 px, got {size}")
    resize = size if image_size is not None else int(stored.get("resize_size", size))
    roi_pass = _resolve_roi_image_size(roi_image_size, stored, spec.kind, size)
    tokens = token_set or stored.get("token_set", "cls+reg+roi")
    layout = _resolve_query_layout(query_layout, stored, spec.kind, roi_pass, tokens)
    model, source = _resolve_weights(spec, weights, random_init, seed, loaded)
    model.eval()
    head, head_source, head_sha = _resolve_head(spec, head_weights)
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if spec.kind == "vit":
        r = int(getattr(model, "num_reg_tokens", 0))
        if r < 1 or getattr(model, "cls_token", None) is None:
            raise ConfigError(f"{spec.name} is not a ViT with a CLS token and register tokens (R = {r})")
        dim = int(model.embed_dim)
    else:
        r = spec.num_parts
        dim = int(model.num_features)
    if head is not None:
        if head.in_dim != dim:
            raise WeightsError(f"the token head {head_source} takes {head.in_dim}-d tokens, {spec.name} gives {dim}")
        dim = head.out_dim
    config = EncoderConfig(
        backbone=spec.name,
        kind=spec.kind,
        num_registers=r,
        dim=dim,
        roi_size=roi_size if roi_size is not None else stored.get(
            "roi_size", DEFAULT_CNN_ROI_SIZE if spec.kind == "cnn" else DEFAULT_ROI_SIZE
        ),
        border=border or stored.get("border", "clip"),
        token_set=tokens,
        cue_method=(cue_method or stored.get("cue_method") or DEFAULT_CUE_METHOD) if spec.kind == "cnn" else None,
        cue_pooling=(cue_pooling or stored.get("cue_pooling", "mean" if stored else DEFAULT_CUE_POOLING))
        if spec.kind == "cnn" else "mean",
        image_size=size,
        roi_image_size=roi_pass,
        resize_size=resize,
        frame=frame,
        mean=tuple(cfg.get("mean", (0.485, 0.456, 0.406))),
        std=tuple(cfg.get("std", (0.229, 0.224, 0.225))),
        query_layout=layout,
        framing_score=framings_scored,
    )
    hashed = model if head is None else nn.ModuleDict({"backbone": model, "head": head})
    info = WeightsInfo(source=source, sha256=state_dict_sha256(hashed), head_source=head_source, head_sha256=head_sha)
    return RegisEncoder(model, spec, config, info, head).to(device).eval()


def is_head_file(weights: str | Path) -> bool:
    """True when ``weights`` is a token head (``regis.models.head``): a ``regis train head`` run directory or a
    .safetensors file carrying the head's metadata."""
    from regis.models.head import HEAD_METADATA_KEY
    from regis.models.weights import HEAD_RUN_FILE

    path = Path(weights).expanduser()
    if path.is_dir():
        return (path / HEAD_RUN_FILE).is_file()
    if path.suffix != ".safetensors" or not path.is_file():
        return False
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return HEAD_METADATA_KEY in (f.metadata() or {})
    except Exception:
        return False


def head_backbone(weights: str | Path) -> str:
    """The registered backbone a token head file belongs to (the first whose head takes its input width)."""
    from regis.models.registry import list_backbones

    for spec in list_backbones():
        if spec.head:
            return spec.name
    raise ConfigError(f"no registered backbone takes the token head {weights}")


def _resolve_head(spec: BackboneSpec, head_weights: str | None):
    """(head module or None, its source, the SHA-256 of its file) for ``spec`` (``head_weights``: another head
    file or run directory instead of the shipped one)."""
    from regis.models.head import file_sha256, load_head
    from regis.models.registry import HEADS_DIR
    from regis.models.weights import HEAD_RUN_FILE

    if spec.head is None:
        if head_weights:
            raise ConfigError(f"{head_weights} is a token head; backbone {spec.name} takes none "
                              "(use --backbone efficientnet-lite0-regis)")
        return None, None, None
    if head_weights:
        path = Path(head_weights).expanduser().resolve()
        if path.is_dir():
            path = path / HEAD_RUN_FILE
        source = f"file:{path}"
    else:
        path = Path(__file__).parent / HEADS_DIR / spec.head
        source = f"package:{spec.head}"
        if not path.is_file():
            raise WeightsError(f"the token head {spec.head} of {spec.name} is missing from this regis install "
                               f"({path}); reinstall regis, or pass --weights HEAD.safetensors")
    return load_head(path), source, file_sha256(path)


def default_roi_image_size(image_size: int) -> int:
    """The ROI pass of a new CNN encoder: ``image_size`` / sqrt(2) rounded to a multiple of 32 px (224 -> 160)."""
    return max(CNN_STRIDE, CNN_STRIDE * round(image_size * DEFAULT_CNN_ROI_SCALE / CNN_STRIDE))


def _resolve_roi_image_size(value: int | None, stored: dict, kind: str, image_size: int) -> int | None:
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or (value != 0 and value < CNN_STRIDE):
            raise ConfigError(f"ROI image size must be 0 (one pass) or at least {CNN_STRIDE} px, got {value!r}")
        if value and kind != "cnn":
            raise ConfigError("a second ROI pass (roi_image_size) applies to CNN backbones only")
        return value or None
    if kind != "cnn":
        return None
    if stored:
        return stored.get("roi_image_size")
    return default_roi_image_size(image_size)


def _resolve_query_layout(value: str | None, stored: dict, kind: str, roi_pass: int | None, token_set: str) -> str:
    can = kind == "cnn" and roi_pass is not None and token_set == "cls+reg+roi"
    if value is not None:
        if value not in QUERY_LAYOUTS:
            raise ConfigError(f"query layout must be one of {QUERY_LAYOUTS}, got {value!r}")
        if value != "tokens" and not can:
            raise ConfigError(f"query layout {value!r} needs a CNN with a ROI pass and the cls+reg+roi token set")
        return value
    if stored:
        return stored.get("query_layout", "tokens") if can else "tokens"
    return DEFAULT_CNN_QUERY_LAYOUT if can else "tokens"


def encoder_from_manifest(
    config: EncoderConfig, weights: WeightsInfo, weights_override: str | None = None, device: str = "cpu",
    stored: str | None = None,
) -> RegisEncoder:
    """Rebuild the encoder an index was made with, and check it is the same one.

    Args:
        config, weights: as stored in the index manifest.
        weights_override: a path to use instead of the stored ``file:`` source (a moved file, say).
        device: where to put the model.
        stored: the index's own copy of ``file:`` weights (``regis.indexes.weights_copy``), used when there is
            no override.

    Raises:
        IndexMismatchError: the rebuilt encoder's config or weights checksum differs from the manifest.
        WeightsError: the weights cannot be loaded; for ``file:`` weights the message names the missing file and
            ``--weights`` (never another backbone: the index's tokens come from these weights).
    """
    kind, _, rest = weights.source.partition(":")
    head_kind, _, head_path = (weights.head_source or "").partition(":")
    if not weights_override and head_kind == "file":
        weights_override = head_path  # the head is the file; the backbone's weights come from the package
    if not weights_override and kind == "file":
        weights_override = stored
        if weights_override is None and not Path(rest).exists():
            raise WeightsError(
                f"the index was built with the weights {rest} (sha256 {weights.sha256[:12]}), which are no longer "
                "there and the index keeps no copy of them: pass --weights PATH (or REGIS_WEIGHTS) naming where "
                "they are now; their checksum is checked"
            )
    kwargs = dict(
        backbone=config.backbone, roi_size=config.roi_size, border=config.border, token_set=config.token_set,
        cue_method=config.cue_method, device=device, frame=config.frame, cue_pooling=config.cue_pooling,
        roi_image_size=config.roi_image_size or 0, query_layout=config.query_layout,
        framing_score=config.framing_score,
    )
    if config.kind == "cnn":
        kwargs["image_size"] = config.image_size
    if weights_override:
        encoder = build_encoder(weights=weights_override, **kwargs)
    elif kind == "random":
        encoder = build_encoder(random_init=True, seed=int(rest), **kwargs)
    elif kind == "file":
        encoder = build_encoder(weights=rest, **kwargs)
    else:  # hub or package: the registry's default source
        encoder = build_encoder(**kwargs)
    check_encoder_matches(encoder, config, weights)
    return encoder


def check_encoder_matches(encoder: RegisEncoder, config: EncoderConfig, weights: WeightsInfo) -> None:
    """Raise ``IndexMismatchError`` unless ``encoder`` has exactly this config and weights checksum."""
    if encoder.config != config:
        raise IndexMismatchError(f"encoder does not match the index (encoder vs index): "
                                 f"{encoder.config.differences(config)}")
    if encoder.weights_info.sha256 != weights.sha256:
        raise IndexMismatchError(
            f"encoder weights ({encoder.weights_info.source}, sha256 {encoder.weights_info.sha256[:12]}) "
            f"differ from the weights the index was built with ({weights.source}, sha256 {weights.sha256[:12]})"
        )
