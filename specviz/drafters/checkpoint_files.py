"""Where drafter checkpoints live and how their files are read: one place for every family's loader.

A checkpoint is a folder with ``config.json`` and its weights, local or fetched from the hub. Weights are
safetensors (single file, sharded index or any ``*.safetensors``); a ``.bin`` / ``.pt`` file is read only through
``torch.load(weights_only=True)``, which refuses pickled code. Shipped checkpoints sit at
``specviz/assets/models/<target>-<family>``. Errors are one line naming the file.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from specviz.errors import SpecvizError

#: Files fetched from the hub for a drafter checkpoint besides config.json.
DEFAULT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model.bin")


@dataclass(frozen=True)
class TargetShape:
    """What a head must agree with: the target's hidden size, decoder layer count and vocabulary (logits width)."""

    hidden_size: int
    num_layers: int
    vocab_size: int

    @classmethod
    def of(cls, config, vocab_size: int | None = None) -> TargetShape:
        """From a transformers config (or a dict); ``vocab_size`` overrides the config's (a padded logits width)."""
        get = config.get if isinstance(config, dict) else lambda name, default=None: getattr(config, name, default)
        return cls(int(get("hidden_size")), int(get("num_hidden_layers")), int(vocab_size or get("vocab_size")))


def shipped_dir(target: str, kind: str) -> Path:
    """Where the drafter of family ``kind`` trained for a target registry name is shipped."""
    from specviz.models.registry import ASSETS_MODELS

    return ASSETS_MODELS / f"{target}-{kind}"


def shipped(kind: str) -> Callable[[str], list[str]]:
    """A registry ``checkpoints`` function: the bare spec (argument "") when ``kind`` is shipped for the target."""
    def checkpoints(target: str) -> list[str]:
        return [""] if (shipped_dir(target, kind) / "config.json").is_file() else []
    return checkpoints


def source_of(argument: str, target: str, kind: str, missing: str) -> str | Path:
    """The checkpoint a ``kind[:<dir|hub id>]`` spec names: its argument, or for the bare name the one shipped for
    the target registry name ``target``; ``missing`` is the one-line error when none is."""
    if argument:
        return argument
    if not (shipped_dir(target, kind) / "config.json").is_file():
        raise SpecvizError(missing)
    return shipped_dir(target, kind)


def checkpoint_family(kind: str, what: str, *, load: Callable, own: Callable | None = None, plural: bool = False,
                      modes: tuple[str, ...] = (), **fields):
    """Register a family whose drafters load a checkpoint (``registry.DrafterFamily``, ``fields`` the rest): the spec
    ``kind[:<dir|hub id>]``, ``specviz train <kind>`` its trainer, arguments checked as loadable ``what``.

    ``load(source, target, settings, name)`` makes the drafter from the argument's checkpoint or, for the bare name,
    the target checkpoint's own (``own(model)``, where a family reads one) or the one shipped for the target, refused
    in one line where there is none (the title is ``plural``: "are shipped"). An argument may begin with one of
    ``modes`` (``dspark:fixed:<dir>``), a variant passed on to ``load`` as ``mode`` (None without one)."""
    from specviz.drafters.registry import DrafterFamily, register

    def split(argument: str) -> tuple[str, str | None]:
        mode = next((m for m in modes if argument == m or argument.startswith(m + ":")), None)
        return (argument, None) if mode is None else (argument[len(mode) + 1:], mode)

    def build(argument: str, target, settings):
        chosen, mode = split(argument)
        missing = (f"no {fields['title']} {'are' if plural else 'is'} shipped for {target.name} yet"
                   f"{'' if own is None else ', and its checkpoint carries none'}; give {kind}:<dir or hub id>")
        source = chosen or (own(target.model) if own else None) or source_of("", target.name, kind, missing)
        return load(source, target, settings, f"{kind}:{argument}" if argument else kind,
                    **({"mode": mode} if modes else {}))

    def check(argument: str) -> str:
        check_source(split(argument)[0])
        return argument

    check_source = argument_check(what)
    return register(DrafterFamily(name=kind, syntax=f"{kind}[:<dir|hub id>]", checkpoints=shipped(kind), trainer=kind,
                                  build=build, check=check, bare_from_target=own is not None, **fields))


def read_config(folder: Path, what: str = "drafter") -> dict:
    """``config.json`` of a checkpoint folder, as a dict (one-line errors for a missing or malformed file)."""
    path = folder / "config.json"
    if not path.is_file():
        raise SpecvizError(f"{folder} is not a {what} directory: config.json is missing")
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise SpecvizError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise SpecvizError(f"{path} is not a JSON object")
    return config


def load_pickle(path: Path) -> dict[str, torch.Tensor]:
    """A ``.bin`` / ``.pt`` checkpoint through ``torch.load(weights_only=True)`` only (no pickled code runs)."""
    try:
        with warnings.catch_warnings():  # e.g. "pickle protocol 4": noise before the one line below
            warnings.simplefilter("ignore")
            loaded = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch raises many types for unsafe or corrupt pickles
        raise SpecvizError(f"{path} is not a plain tensor checkpoint: torch.load(weights_only=True) refused it "
                           f"({_unpickler_reason(error)})") from None
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise SpecvizError(f"{path} does not hold a flat name -> tensor dict")
    return loaded


def _unpickler_reason(error: Exception) -> str:
    """The actual reason in torch's long refusal: the line after "WeightsUnpickler error:" (older torch), else the
    line naming the blocked global or type; never its advice to re-run with ``weights_only=False``."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    _, marker, after = text.partition("WeightsUnpickler error:")
    detail = next((line.strip() for line in after.splitlines() if line.strip()), "") if marker else ""
    detail = detail or next((line for line in lines if "unsupported" in line.lower() or "blocked" in line.lower()), "")
    if detail:
        return f"the unpickler says: {detail}"[:200]
    first = lines[0] if lines else type(error).__name__
    return first.split(". ")[0][:160] if "weights_only" in first else first[:160]


def checked_weights(tensors: dict[str, torch.Tensor], source: Path) -> dict[str, torch.Tensor]:
    """``tensors`` when every weight and bias is a float tensor of finite values: a head stored as integers or holding
    NaN would otherwise load and draft nothing useful, in silence."""
    for name, tensor in tensors.items():
        if name.rsplit(".", 1)[-1] in ("weight", "bias") and not tensor.is_floating_point():
            raise SpecvizError(f"{source}: {name} is {str(tensor.dtype).replace('torch.', '')}, not a float tensor")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise SpecvizError(f"{source}: {name} holds NaN or infinite values")
    return tensors


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder: safetensors preferred, else ``pytorch_model.bin`` via ``load_pickle``."""
    from safetensors.torch import load_file

    from specviz.models.safetensors_check import validate_safetensors

    weight_map = _weight_map(folder)
    if weight_map is not None:
        files = [folder / f for f in sorted(set(weight_map.values()))]
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if files:
        tensors: dict[str, torch.Tensor] = {}
        for file in files:
            validate_safetensors(file)
            tensors.update(checked_weights(load_file(str(file), device="cpu"), file))
        return tensors
    binary = folder / "pytorch_model.bin"
    if not binary.is_file():
        raise SpecvizError(f"no model.safetensors or pytorch_model.bin in {folder}")
    return checked_weights(load_pickle(binary), binary)


def _weight_map(folder: Path) -> dict[str, str] | None:
    """Tensor name -> shard file of a sharded checkpoint's index, or None when it has none."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        return dict(json.loads(index.read_text())["weight_map"])
    except (ValueError, KeyError, TypeError) as error:
        raise SpecvizError(f"{index} is not a valid safetensors index ({error})") from None


def _safetensors_files(folder: Path) -> dict[Path, list[str]] | None:
    """Safetensors file -> its tensor names (from the headers or the index), or None when there are none."""
    from specviz.models.safetensors_check import tensor_shapes

    weight_map = _weight_map(folder)
    if weight_map is not None:
        files: dict[Path, list[str]] = {}
        for name, file in weight_map.items():
            files.setdefault(folder / file, []).append(name)
        return files
    found = sorted(folder.glob("*.safetensors"))
    return {file: list(tensor_shapes(file)) for file in found} or None


def _pickle_file(folder: Path, names: tuple[str, ...]) -> Path | None:
    return next((folder / n for n in names if (folder / n).is_file()), None)


def tensor_index(folder: Path, pickles: tuple[str, ...] = ("pytorch_model.bin",)
                 ) -> tuple[dict[str, tuple[int, ...]], Callable[[Callable[[str], bool]], dict[str, torch.Tensor]]]:
    """(name -> shape of every tensor, ``read(keep)``) for a folder's weights, reading headers only until
    ``read`` loads the tensors whose names ``keep`` accepts (only the shards that hold them).

    Safetensors are preferred (single file, sharded index or any ``*.safetensors``); ``pickles`` (e.g.
    ``pytorch_model.bin``) load only through ``torch.load(weights_only=True)``.
    """
    from safetensors import safe_open

    from specviz.models.safetensors_check import tensor_shapes

    files = _safetensors_files(folder)
    if files:
        shapes: dict[str, tuple[int, ...]] = {}
        for file, names in files.items():
            header = tensor_shapes(file)
            missing = [n for n in names if n not in header]
            if missing:
                raise SpecvizError(f"{file.name} lacks {missing[0]}, which the index says it holds")
            shapes.update({n: tuple(header[n]) for n in names})

        def read(keep: Callable[[str], bool]) -> dict[str, torch.Tensor]:
            out: dict[str, torch.Tensor] = {}
            for file, names in files.items():
                wanted = [n for n in names if keep(n)]
                if wanted:
                    with safe_open(str(file), framework="pt") as handle:
                        out.update(checked_weights({n: handle.get_tensor(n) for n in wanted}, file))
            return out
        return shapes, read
    pickle = _pickle_file(folder, pickles)
    if pickle is None:
        raise SpecvizError(f"no safetensors weights (or {' / '.join(pickles)}) in {folder}")
    loaded = load_pickle(pickle)
    return ({k: tuple(v.shape) for k, v in loaded.items()},
            lambda keep: checked_weights({k: v for k, v in loaded.items() if keep(k)}, pickle))


def write(folder: Path, config: dict, tensors: dict[str, torch.Tensor], filename: str = "model.safetensors") -> Path:
    """config.json plus one safetensors file, every family's layouts. A target with tied embeddings lends one tensor
    as both embedding and output layer: each is written as its own copy (safetensors refuses tensors sharing memory).
    Both files are written beside their final names and moved into place once complete, so a failed write leaves no
    half-written folder (a folder it created is removed again)."""
    from safetensors.torch import save_file

    tensors = _unshared(tensors)
    text = json.dumps(config, indent=2) + "\n"
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    finals = (folder / filename, folder / "config.json")
    partials = [path.with_name(f".{path.name}.partial") for path in finals]
    try:
        save_file(tensors, str(partials[0]))
        partials[1].write_text(text)
        for partial, final in zip(partials, finals):
            partial.replace(final)
    except BaseException:
        for partial in partials:
            partial.unlink(missing_ok=True)
        if created:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors, each owning its memory: a tensor whose storage an earlier one already uses
    (a tied target's embedding and output layer) is copied."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        value = value.detach().contiguous().cpu()
        if value.untyped_storage().data_ptr() in seen:
            value = value.clone()
        seen.add(value.untyped_storage().data_ptr())
        out[name] = value
    return out


def check_source(text: str, what: str) -> str:
    """``text`` when it names a checkpoint directory or a hub id that can be fetched, checked before any model loads;
    a one-line error otherwise."""
    from specviz.models import hub

    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise SpecvizError(f"{what} {text}: not a directory")
        return text
    if not hub.looks_like_hub_id(text):
        raise SpecvizError(f"{what} {text!r}: no such directory, and not a hub id (owner/name)")
    hub.check_fetchable(text)
    return text


def argument_check(what: str) -> Callable[[str], str]:
    """A registry ``check`` for a ``family[:<dir|hub id>]`` argument: the empty one (the shipped checkpoint) passes;
    a directory or hub id must be loadable and, when the operator set an allowlist, named by it."""
    def check(argument: str) -> str:
        from specviz.models import policy

        if argument:
            check_source(argument, what)
            path = Path(argument).expanduser()
            if path.exists():
                policy.check_allowed_path(argument, path)
            else:
                policy.check_allowed(argument)
        return argument
    return check


def resolve_source(source: str | Path, what: str, patterns: tuple[str, ...] = DEFAULT_PATTERNS,
                   choose_files: Callable[[Path], list[str]] | None = None) -> tuple[Path, str]:
    """(local folder, display name) of a checkpoint directory or a hub id, downloaded with the hub helpers' errors.

    ``patterns``: the weight files to fetch. ``choose_files(folder)``, when given, sees the fetched config and
    index first and names the files actually needed (e.g. only the shards of a big target that hold MTP layers).
    """
    from specviz.models import hub

    text = check_source(str(source), what)
    path = Path(text).expanduser()
    if path.is_dir():
        return path, text
    from huggingface_hub import snapshot_download

    repo, revision = hub.split_revision(text)
    local = hub.local_only()
    fetch = lambda files: snapshot_download(repo, revision=revision, local_files_only=local,  # noqa: E731
                                            allow_patterns=["config.json", *files])
    try:
        if choose_files is None:
            folder = fetch(patterns)
        else:
            folder = fetch(["*.index.json"])
            folder = fetch(["*.index.json", *(choose_files(Path(folder)) or patterns)])
    except SpecvizError:
        raise
    except Exception as error:  # noqa: BLE001 - hub errors come in many types; hub_error words them
        raise hub.hub_error(text, error) from None
    return Path(folder), f"hub:{text}"


def spec_from_dict(cls, data: dict, key: str, tuple_fields: tuple[str, ...] = ()):
    """A family's spec dataclass from its config record ``key``; unknown or malformed fields are one-line errors.
    ``tuple_fields`` hold integer lists in JSON and tuples in the spec."""
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise SpecvizError(f"{key} has unknown fields {unknown}")
    try:
        return cls(**{**data, **{name: tuple(int(i) for i in data[name]) for name in tuple_fields}})
    except (TypeError, KeyError, ValueError) as error:
        raise SpecvizError(f"{key} is malformed: {error}") from None


def rope_of(config: dict, what: str = "the drafter's") -> tuple[dict, int, int]:
    """(RoPE parameters, head_dim, max positions) as transformers resolves them from a Llama/Qwen-style config dict;
    RoPE that changes with the sequence length is refused in one line."""
    from transformers import LlamaConfig
    from transformers.utils import logging as hf_logging

    known = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling",
             "rope_parameters", "max_position_embeddings")
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # llama3-scaled configs warn about their own max_position_embeddings
    try:
        resolved = LlamaConfig(**{k: config[k] for k in known if config.get(k) is not None})
    except (TypeError, ValueError, KeyError) as error:
        raise SpecvizError(f"cannot read {what} attention/RoPE settings: {error}") from None
    finally:
        hf_logging.set_verbosity(previous)
    rope = dict(resolved.rope_parameters)
    if rope.get("rope_type", "default") in ("dynamic", "longrope"):
        raise SpecvizError(f"{rope['rope_type']} RoPE scaling (it changes with the sequence length) is not supported")
    return rope, int(resolved.head_dim), int(resolved.max_position_embeddings)
