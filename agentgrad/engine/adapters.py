"""Several LoRA adapters on one base model, served together: one adapter per agent role.

The engine holds one peft `PeftModel` with any number of named LoRA adapters over one copy of the
base weights. Each request names its adapter (`Engine.submit(adapter=...)`; over HTTP, the agent
name the gateway forwards in `x-agentgrad-agent`, matched against each adapter's pattern); a
decode step runs rows of different adapters in one forward pass, peft applying each row's adapter
(`adapter_names=[...]`, its mixed-batch inference) on top of the shared base projections.
An agent that matches no adapter is served by the default adapter, else by the base model, and the
answer says which (`x-agentgrad-adapter`, recorded as `agentgrad.adapter.name`).

Saved adapters (a PEFT folder, or a LoRA training checkpoint `step-N`) are served by name with `load_adapters`
(`agentgrad engine serve --adapter NAME=PATH`): a request whose `model` is an adapter's name is served by it, as
vLLM serves `--lora-modules NAME=PATH`, so two checkpoints of one run are A/B-tested on one engine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgrad.engine.model import checkpoint_kind
from agentgrad.semconv import BASE_ADAPTER

PEFT_BASE = "__base__"
"""peft's name, in `adapter_names`, for a row the base model serves."""


@dataclass(frozen=True)
class Adapters:
    """The adapters an engine serves, each with the agent-name pattern (`re.search`, as `agent_match`) it serves."""

    patterns: Mapping[str, str]  # adapter name -> agent-name pattern, tried in order
    default: str | None = None  # serves agents no pattern matches; None: the base model

    def __post_init__(self) -> None:
        check_adapter_names(list(self.patterns))
        for name, pattern in self.patterns.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"adapter {name!r}: its agent pattern {pattern!r} is not a regex: {exc}") from None
        if self.default is not None and self.default not in self.patterns:
            raise ValueError(f"default adapter {self.default!r} is not one of the adapters {list(self.patterns)}")

    def resolve(self, agent: str | None) -> str:
        """The adapter serving calls of `agent`: an adapter of that exact name, the first whose pattern matches,
        else the default; `BASE_ADAPTER` when none does."""
        if agent:
            if agent in self.patterns:
                return agent
            for name, pattern in self.patterns.items():
                if re.search(pattern, agent):
                    return name
        return self.default or BASE_ADAPTER

    def check(self, adapter: str | None) -> None:
        """Refuse a request for an adapter this engine does not hold (a typo must not fall back to the base)."""
        if adapter is not None and adapter != BASE_ADAPTER and adapter not in self.patterns:
            raise ValueError(
                f"adapter {adapter!r} is not served here; this engine serves {list(self.patterns)} "
                f"and {BASE_ADAPTER!r} (the base model)"
            )


def check_adapter_names(names: Sequence[str]) -> None:
    """Adapter names are also checkpoint folder names and metric name parts: a plain word each, and not 'base'."""
    if not names:
        raise ValueError("give at least one adapter (role) name")
    for name in names:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
            raise ValueError(f"adapter (role) name {name!r}: use letters, digits, '_', '.' or '-'")
        if name == BASE_ADAPTER:
            raise ValueError(f"{BASE_ADAPTER!r} names the base model; give the adapter (role) another name")


def forward_arguments(adapters: Adapters | None, names: Sequence[str | None]) -> dict[str, Any]:
    """The extra forward arguments for rows served by these adapters (one name per row); none without adapters."""
    if adapters is None:
        return {}
    return {"adapter_names": [PEFT_BASE if n in (None, BASE_ADAPTER) else n for n in names]}


def serve_adapters(
    engine: Any,
    patterns: Mapping[str, str],
    *,
    rank: int,
    alpha: int = 16,
    targets: list[str] | str = "all-linear",
    default: str | None = None,
    init_lora_weights: bool = True,
) -> Any:
    """Wrap `engine`'s (an `Engine`'s) model in one `PeftModel` holding a LoRA adapter per name (the base is frozen and held
    once), and serve each agent by its adapter from the next request on; returns the `PeftModel`.

    `init_lora_weights=False` starts each adapter at random non-zero weights (tests); True: at the base's output.
    """
    from peft import LoraConfig, get_peft_model

    routes = Adapters(dict(patterns), default)
    if rank < 1:
        raise ValueError(f"serving several adapters needs a LoRA rank of at least 1, got {rank}")

    def config() -> LoraConfig:
        return LoraConfig(
            r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, init_lora_weights=init_lora_weights
        )

    names = list(routes.patterns)
    if engine.adapters is not None:  # a second run on the same engine: its adapters are already there
        if engine.adapters != routes:
            raise ValueError(f"this engine already serves the adapters {dict(engine.adapters.patterns)}, not {names}")
        return engine.model
    engine.freeze_base()  # on a GPU the base once, in the serving dtype, under every adapter
    with engine.weights_lock:
        model = get_peft_model(engine.model, config(), adapter_name=names[0])
        for name in names[1:]:
            model.add_adapter(name, config())
        model.set_adapter(names[0])
        engine.replace_model(model)
        engine.adapters = routes
    return model


def load_adapters(engine: Any, folders: Mapping[str, str | Path]) -> Any:
    """Serve the saved LoRA adapters in `folders` (name -> a PEFT adapter folder or a LoRA `step-N` checkpoint) over
    `engine`'s (an `Engine`'s) base, beside any it already holds; returns the `PeftModel`.

    A request selects one by its name (`Engine.submit(adapter=NAME)`; over HTTP, `model: NAME`). An adapter of
    another base, or a checkpoint of full weights, is refused with a ValueError saying what to do instead, before
    anything changes; an adapter that passes those checks but whose shapes do not fit the base fails while loading
    and leaves the engine half-changed: load into a new engine then.
    """
    from peft import PeftModel

    names = list(folders)
    check_adapter_names(names)
    held: Adapters | None = engine.adapters
    held_patterns, default = (held.patterns, held.default) if held is not None else ({}, None)
    clash = sorted(set(names) & set(held_patterns))
    if clash:
        raise ValueError(f"this engine already serves adapters named {clash}; give the saved ones other names")
    base = base_name(engine.model)
    for name, folder in folders.items():
        check_saved_adapter(name, Path(folder), base)
    with engine.weights_lock:
        model = engine.model
        try:
            for name, folder in folders.items():
                if isinstance(model, PeftModel):
                    model.load_adapter(str(folder), adapter_name=name)
                else:
                    model = PeftModel.from_pretrained(model, str(folder), adapter_name=name)
        except (RuntimeError, ValueError) as exc:  # a shape or a target module the served base does not have
            raise ValueError(f"adapter {name!r} at {folder} does not fit the served base {base!r}: {exc}") from None
        exact = {name: f"^{re.escape(name)}$" for name in names}  # by its name only: no agent falls into it
        routes = Adapters({**held_patterns, **exact}, default)
        if model is not engine.model:
            engine.replace_model(model)
        engine.adapters = routes
    return model


def base_name(model: Any) -> str:
    """The name or path the served base model was loaded from (under any peft wrapping)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return str(getattr(inner, "name_or_path", "") or inner.config._name_or_path)


def check_saved_adapter(name: str, folder: Path, base: str) -> None:
    """Refuse what is not a LoRA adapter over `base`: a missing folder, full weights, an adapter of another model.

    Bases are compared by their last path part, so a Hugging Face id and a local copy of it
    (`HuggingFaceTB/SmolLM2-135M-Instruct`, `~/.cache/agentgrad/models/SmolLM2-135M-Instruct`) are one base.
    """
    if not folder.is_dir():
        raise ValueError(
            f"adapter {name!r}: {folder} is not a folder (give a PEFT adapter folder or a step-N checkpoint)"
        )
    if checkpoint_kind(folder) == "full":
        raise ValueError(
            f"adapter {name!r}: {folder} holds full weights, not a LoRA adapter; serve it on an engine of its own "
            f"(agentgrad engine serve --checkpoint {folder}) and split between the engines"
        )
    named = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if named and Path(str(named)).name.lower() != Path(base).name.lower():
        raise ValueError(
            f"adapter {name!r} at {folder} was trained over {named!r}, but this engine serves {base!r}: "
            f"serve it on an engine of that base (agentgrad engine serve --model {named})"
        )


def adapter_parameters(model: Any, adapter: str) -> list[Any]:
    """The trainable tensors of one adapter of a `PeftModel` (its LoRA A and B matrices in every layer)."""
    marks = (f"lora_A.{adapter}.", f"lora_B.{adapter}.")
    found = [p for name, p in model.named_parameters() if any(mark in name for mark in marks)]
    if not found:
        raise ValueError(f"the model has no adapter {adapter!r}")
    return found


def save_adapter(model: Any, adapter: str, folder: Path) -> None:
    """One adapter of a `PeftModel` as a PEFT folder (`adapter_model.safetensors`, `adapter_config.json`) that
    `PeftModel.from_pretrained` and vLLM's `/v1/load_lora_adapter` both load: checkpoints and weight syncs."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    weights = get_peft_model_state_dict(model, adapter_name=adapter)
    save_file({k: v.detach().contiguous() for k, v in weights.items()}, str(folder / "adapter_model.safetensors"))
    model.peft_config[adapter].save_pretrained(str(folder))
