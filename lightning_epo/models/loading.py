"""Tokenizer, actor, critic and frozen reference from the ``model`` config, through one ``from_pretrained`` path.

The tiny model and the Qwen2.5 models load the same way; a hub id goes straight to ``from_pretrained``
(the Hugging Face cache under ``HF_HOME``, or a download where the network allows it).

``model`` keys read here:

- ``name_or_path``: a model directory or a hub id (``Qwen/Qwen2.5-7B-Instruct``).
- ``build_if_missing``: tiny model only: build it at ``name_or_path`` on first use (a relative path is
  taken from the repository root), with the ``build_tiny_model`` arguments in ``tiny`` (optional).
- ``dtype``: ``float32`` | ``bfloat16`` | ``float16`` | ``auto`` (the checkpoint's own dtype).
- ``attn_implementation``: e.g. ``sdpa``, ``flash_attention_2``; null for the transformers default.
- ``trust_remote_code``: off unless the config turns it on (DESIGN.md, Safety).
- ``gradient_checkpointing``: recompute activations in the backward pass (actor and critic).
- ``revision``: a hub branch, tag or commit (ignored for local directories).
- ``token``: a hub access token (ignored for local directories; without it the hub's own ``HF_TOKEN`` / login),
  e.g. ``+model.token='${oc.env:MY_HF_TOKEN}'``; kept out of saved configs, checkpoints and logs (secrets.py).
- ``padding_side``: ``left`` (default, as generation needs) or ``right``.
- ``lora``: LoRA adapters on the actor (and with ``lora.critic`` the critic's backbone), see lightning_epo/models/lora.py.
- ``critic_layers``: the critic's backbone keeps the first N decoder layers of the model (null: all): a critic at
  about N / num_hidden_layers of the cost of a whole one (docs/design.md, "A smaller critic").

Weights load from safetensors only (``use_safetensors=True``).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import try_to_load_from_cache
from peft import PeftModel
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from lightning_epo.core.errors import UserError
from lightning_epo.models.critic import ValueModel
from lightning_epo.models.lora import add_lora, lora_settings
from lightning_epo.models.tiny import RECORDED_BUILD_SETTINGS, REPO_ROOT, build_tiny_model

DTYPES: dict[str, torch.dtype | str] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "auto": "auto",
}
PADDING_SIDES = ("left", "right")
Loaded = TypeVar("Loaded")


class ModelLoadError(UserError):
    """A model or tokenizer that cannot be loaded; the message names the fix."""


def _looks_like_path(name: str) -> bool:
    """A filesystem path rather than a hub id (``org/name``): an explicit prefix, or a first part that exists."""
    if name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
        return True
    return Path(name.split("/")[0]).expanduser().exists()


def _hub_id(model_cfg: Mapping[str, Any]) -> str | None:
    """``model.name_or_path`` when it names a hub model (not a tiny model to build, not a path), else None."""
    if not model_cfg.get("name_or_path"):
        raise ModelLoadError("model.name_or_path is not set: give a model directory or a hub id (or use model=tiny)")
    name = str(model_cfg["name_or_path"])
    return None if model_cfg.get("build_if_missing") or _looks_like_path(name) else name


def model_source(model_cfg: Mapping[str, Any]) -> tuple[str, bool]:
    """``(source, is_local)``: the model directory (building the tiny model there if configured) or the hub id."""
    hub_id = _hub_id(model_cfg)
    if hub_id is not None:
        return hub_id, False
    name = str(model_cfg["name_or_path"])
    if model_cfg.get("build_if_missing"):
        path = Path(name).expanduser()
        path = path if path.is_absolute() else REPO_ROOT / path
        tiny = dict(model_cfg.get("tiny") or {})
        if not path.exists():
            build_tiny_model(path, **tiny)
        _check_model_dir(path, name, "or delete it to let model.build_if_missing rebuild the tiny model there")
        _check_tiny_shape(path, name, tiny)
        return str(path), True
    path = Path(name).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model path '{name}' does not exist: set model.name_or_path to a model directory or a hub id"
        )
    _check_model_dir(path, name, "or a hub id")
    return str(path), True


def _check_model_dir(path: Path, name: str, alternative: str) -> None:
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"model path '{name}' holds no model (no config.json): set model.name_or_path to a directory "
            f"saved with save_pretrained, {alternative}"
        )


# ``model.tiny`` keys -> the config.json fields the built model records them in
TINY_SHAPE_FIELDS = {
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
    "init_std": "initializer_range",
}


def _check_tiny_shape(path: Path, name: str, tiny: Mapping[str, Any]) -> None:
    """A tiny model built earlier with other ``model.tiny`` settings (e.g. before a default changed) is refused:
    its shape as config.json gives it, the seed and vocabulary bound as the build recorded them there (a copy
    built before they were recorded was built with the builder's defaults)."""
    config = json.loads((path / "config.json").read_text())
    built = {key: config.get(field) for key, field in TINY_SHAPE_FIELDS.items()}
    built |= RECORDED_BUILD_SETTINGS | config.get("tiny_build", {})
    stale = [f"{key}={built[key]} (config: {tiny[key]})" for key in built if key in tiny and built[key] != tiny[key]]
    if stale:
        raise ModelLoadError(
            f"the tiny model at '{name}' was built with other settings ({', '.join(stale)}): delete that directory "
            "to let model.build_if_missing rebuild it"
        )


HUB_PROBE_TIMEOUT_S = 5.0


def _unreachable(url: str) -> str | None:
    """Why nothing answers at ``url``'s host and port within :data:`HUB_PROBE_TIMEOUT_S` (name lookup included),
    or None when a connection opens."""
    parts = urlsplit(url)
    address = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection(address, timeout=HUB_PROBE_TIMEOUT_S).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(str(exc) or type(exc).__name__)

    probe = threading.Thread(target=connect, daemon=True)  # a name lookup that hangs is left behind, not waited for
    probe.start()
    probe.join(HUB_PROBE_TIMEOUT_S)
    return outcome[0] if outcome else f"no answer within {HUB_PROBE_TIMEOUT_S:g} s"


def check_hub_access(model_cfg: Mapping[str, Any]) -> None:
    """A hub id that is neither in the Hugging Face cache nor reachable is refused at once, in one line (the hub
    client would retry for about 50 s before failing); a local model, or a cached or reachable one, passes."""
    hub_id = _hub_id(model_cfg)
    if hub_id is None or isinstance(try_to_load_from_cache(hub_id, "config.json", revision=model_cfg.get("revision")),
                                    str):
        return
    why = "HF_HUB_OFFLINE is set" if hub_constants.HF_HUB_OFFLINE else None
    if why is None and (reason := _unreachable(hub_constants.ENDPOINT)) is not None:
        why = f"{hub_constants.ENDPOINT} cannot be reached ({reason})"
    if why is not None:
        raise ModelLoadError(
            f"model.name_or_path={hub_id} is not in the Hugging Face cache and {why}: download it where the network "
            f"allows (`huggingface-cli download {hub_id} --local-dir DIR`) and set model.name_or_path=DIR, or set "
            f"HF_HOME to a cache that holds it (the cache now: {hub_constants.HF_HUB_CACHE})"
        )


def _dtype(model_cfg: Mapping[str, Any]) -> torch.dtype | str:
    name = model_cfg.get("dtype") or "float32"
    if name not in DTYPES:
        raise ModelLoadError(f"model.dtype={name!r} is not valid; choose one of: {', '.join(DTYPES)}")
    return DTYPES[name]


def _from_pretrained(
    what: str, loader: Callable[..., Loaded], model_cfg: Mapping[str, Any], *, weights: bool
) -> Loaded:
    """``loader(source, ...)`` with the configured options; a failure to read the files becomes one clear line.

    ``weights``: a model (dtype, safetensors only, attention implementation) rather than a tokenizer.
    """
    kwargs: dict[str, Any] = {"trust_remote_code": bool(model_cfg.get("trust_remote_code", False))}
    if weights:
        kwargs.update(dtype=_dtype(model_cfg), use_safetensors=True)
        if model_cfg.get("attn_implementation"):
            kwargs["attn_implementation"] = model_cfg["attn_implementation"]
    source, is_local = model_source(model_cfg)
    if not is_local:
        kwargs.update({key: model_cfg[key] for key in ("revision", "token") if model_cfg.get(key)})
    try:
        return loader(source, **kwargs)
    except OSError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if is_local:
            raise ModelLoadError(
                f"could not load the {what} from '{source}' ({reason}): point model.name_or_path at a directory "
                "saved with save_pretrained (weights as safetensors)"
            ) from exc
        raise ModelLoadError(
            f"could not load the {what} of hub model '{source}' ({reason}): download it ahead with "
            f"`huggingface-cli download {source} --local-dir DIR` and set model.name_or_path=DIR, or set HF_HOME "
            f"to a cache that holds it (the cache now: {hub_constants.HF_HUB_CACHE})"
        ) from exc


def load_tokenizer(model_cfg: Mapping[str, Any]) -> PreTrainedTokenizerBase:
    """The model's tokenizer with a pad token (eos when it has none) and ``padding_side`` (default left)."""
    padding_side = model_cfg.get("padding_side") or "left"
    if padding_side not in PADDING_SIDES:
        raise ModelLoadError(
            f"model.padding_side={padding_side!r} is not valid; choose one of: {', '.join(PADDING_SIDES)}"
        )
    tokenizer = _from_pretrained("tokenizer", AutoTokenizer.from_pretrained, model_cfg, weights=False)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(
                f"the tokenizer of '{model_cfg['name_or_path']}' has neither a pad nor an eos token: use a chat model"
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def _enable_checkpointing(model: PreTrainedModel | ValueModel, model_cfg: Mapping[str, Any]) -> None:
    if model_cfg.get("gradient_checkpointing"):
        model.gradient_checkpointing_enable()


def load_actor(model_cfg: Mapping[str, Any]) -> PreTrainedModel | PeftModel:
    """The policy: ``AutoModelForCausalLM`` (in eval mode, as ``from_pretrained`` returns it; Lightning sets train),
    with LoRA adapters when ``model.lora.r`` is set (a ``PeftModel`` whose base is frozen)."""
    actor = _from_pretrained("actor", AutoModelForCausalLM.from_pretrained, model_cfg, weights=True)
    _enable_checkpointing(actor, model_cfg)
    lora = lora_settings(model_cfg)
    return add_lora(actor, lora, task_type="CAUSAL_LM") if lora is not None else actor


def load_critic(model_cfg: Mapping[str, Any]) -> ValueModel:
    """The PPO critic: a value head on its own ``AutoModel`` backbone, loaded from the same weights as the actor
    (with LoRA adapters on the backbone when ``model.lora.r`` is set and ``model.lora.critic`` is true)."""
    backbone = _from_pretrained("critic", AutoModel.from_pretrained, model_cfg, weights=True)
    if model_cfg.get("critic_layers") is not None:
        _keep_layers(backbone, int(model_cfg["critic_layers"]))
    lora = lora_settings(model_cfg)
    if lora is not None and lora["critic"]:
        backbone = add_lora(backbone, lora, task_type=None)
    critic = ValueModel(backbone)
    _enable_checkpointing(critic, model_cfg)
    return critic


def _keep_layers(backbone: PreTrainedModel, layers: int) -> None:
    """Keep the first ``layers`` decoder layers of ``backbone`` (its final norm stays: the value head reads the normed
    hidden state of layer ``layers``, as a whole critic reads the last layer's)."""
    if not 1 <= layers <= backbone.config.num_hidden_layers:
        raise UserError(f"model.critic_layers={layers}: the model has {backbone.config.num_hidden_layers} decoder "
                        "layers; give a number from 1 to that (or null for all)")
    backbone.layers = backbone.layers[:layers]
    backbone.config.num_hidden_layers = layers
    if getattr(backbone.config, "layer_types", None):  # Qwen2's per-layer attention kinds
        backbone.config.layer_types = backbone.config.layer_types[:layers]


def uses_reference(model_cfg: Mapping[str, Any], kl_coef: float) -> bool:
    """Whether a run keeps a frozen reference model: with a KL term (``kl_coef > 0``), unless LoRA is on (the actor's
    adapter-free base is then the reference)."""
    return kl_coef > 0 and lora_settings(model_cfg) is None


def load_reference(model_cfg: Mapping[str, Any]) -> PreTrainedModel:
    """A frozen copy of the initial policy for the KL term: eval mode, ``requires_grad=False`` everywhere."""
    reference = _from_pretrained("reference model", AutoModelForCausalLM.from_pretrained, model_cfg, weights=True)
    return reference.eval().requires_grad_(False)


def load_models(
    model_cfg: Mapping[str, Any], critic: bool, kl_coef: float
) -> tuple[PreTrainedModel | PeftModel, ValueModel | None, PreTrainedModel | None]:
    """A run's models: the actor (train mode), with ``critic`` (PPO) a critic (train mode), and with a KL term
    (``kl_coef > 0``) a frozen reference, unless LoRA is on (then the reference is the actor's adapter-free base)."""
    actor = load_actor(model_cfg).train()  # in this order: the adapters' and the value head's initialisation draw
    value_model = load_critic(model_cfg).train() if critic else None  # from the seeded random state one after another
    return actor, value_model, load_reference(model_cfg) if uses_reference(model_cfg, kl_coef) else None
