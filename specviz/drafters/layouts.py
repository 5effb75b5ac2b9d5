"""Published checkpoint layouts as declarations, read by one generic load, save and "same target" check.

A family declares each format it loads as a ``Layout``: how a folder in it is recognised (its config.json and, when
known, its tensor names), how its config is read into the family's spec and written from it, and a table of tensor
names, ours <-> theirs, in a small pattern language:

- ``{k}`` (one lower-case letter) is a number, ``{rest}`` (a longer lower-case word) any text, even none; ``{L}``
  (upper case) is a constant of the environment the family gives for a spec (``Format.env``: L = the target's main
  layers) and ``{k+L}`` a number offset by one;
- loading, the first pair whose theirs-pattern matches names ours; a variable of ours that theirs leaves unbound is
  expanded over its range (the environment's lower-case entry: Qwen3-Next's one ``mtp.fc.weight`` fills every
  module's ``eh_proj``, vLLM Medusa's one ``lm_head.weight`` every head's output layer);
- saving, the first pair whose ours-pattern matches names theirs; several of ours on one name of theirs must hold
  equal tensors, else the layout refuses in one line.

A third element of a pair converts values (``Convert``: MiMo's swapped halves, Qwen3-Next's zero-centred norms).
``carried`` names copies of target tensors a format stores (checked to be this target's, never loaded; written from
the target on save unless ``writes_carried`` is False), ``ignored`` names buffers, ``refused`` names tensors that
mean the checkpoint is something we do not run.

A format's config fields are a table too (``Field``: our spec field, where the format keeps it, its default, its
layer-id numbering), read by ``read_fields`` and written by ``write_fields``; ``check_layers`` refuses, in one line,
published decoder layers our ``DecoderLayer`` does not build. A family's ``Format`` gathers its layouts with its
tensor shapes (read from its network itself: ``network_shapes``), and loads, saves and judges any of them:
supporting a new published format is one more ``Layout`` and a test that re-saves a drafter in it.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from specviz.drafters import checkpoint_files
from specviz.drafters.borrowed import check_same_target
from specviz.drafters.checkpoint_files import TargetShape, rope_of, spec_from_dict
from specviz.drafters.head_parts import target_parts
from specviz.errors import SpecvizError

Env = dict[str, int]
_FIELD = re.compile(r"\{([a-z]+|[A-Z]+)(?:\+([A-Z]+))?\}")


# ---- the name patterns --------------------------------------------------------------------------------------------
@functools.cache
def _parsed(pattern: str) -> tuple[re.Pattern, tuple[tuple[str, str | None], ...]]:
    """The pattern as a regex, and its fields (name, offset constant) in order."""
    regex, parts, end = [], [], 0
    for found in _FIELD.finditer(pattern):
        name = found.group(1)
        regex += [re.escape(pattern[end:found.start()]), "(.*)" if len(name) > 1 and name.islower() else r"(\d+)"]
        parts.append((name, found.group(2)))
        end = found.end()
    return re.compile("".join(regex) + re.escape(pattern[end:])), tuple(parts)


def match(pattern: str, name: str, env: Env) -> dict[str, int | str] | None:
    """The variables ``pattern`` binds on ``name`` (numbers less their offset), or None when it does not match."""
    regex, parts = _parsed(pattern)
    found = regex.fullmatch(name)
    if found is None:
        return None
    bound: dict[str, int | str] = {}
    for (var, offset), text in zip(parts, found.groups()):
        if var.isupper():
            if int(text) != env[var]:
                return None
            continue
        value = text if len(var) > 1 else int(text) - (env[offset] if offset else 0)
        if (isinstance(value, int) and value < 0) or bound.setdefault(var, value) != value:
            return None
    return bound


def fill(pattern: str, bound: dict, env: Env) -> str:
    """``pattern`` with its variables and constants written in."""
    def field(found: re.Match) -> str:
        name, offset = found.groups()
        value = env[name] if name.isupper() else bound[name]
        return str(value + env[offset] if offset else value)
    return _FIELD.sub(field, pattern)


def expand(pattern: str, bound: dict, env: Env) -> list[str]:
    """``pattern`` filled for every value of the variables ``bound`` leaves free (each over ``range(env[name])``)."""
    free = sorted({name for name, _ in _parsed(pattern)[1] if name.islower() and name not in bound})
    return [fill(pattern, {**bound, **dict(zip(free, values))}, env)
            for values in itertools.product(*(range(env[name]) for name in free))]


def _first(patterns, name: str, env: Env):
    return next((entry for entry in patterns if match(entry[0] if isinstance(entry, tuple) else entry, name, env)
                 is not None), None)


# ---- a layout, a family's formats ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Convert:
    """How a format stores a tensor of ours: ``load`` turns theirs into ours, ``save`` ours into theirs."""

    load: Callable[[torch.Tensor], torch.Tensor]
    save: Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Layout:
    """One checkpoint format of a family (see the module's docstring for ``names`` and the rest).

    ``recognise(config, keys)``: whether a folder is in this format (``keys`` None: the config alone is known);
    ``read(config, target, shapes)``: its spec (one-line errors); ``write(spec, target_name)``: its config.json,
    refusing in one line what the format cannot express. ``prefixes`` are stripped on load (a drafter stored inside
    a bigger checkpoint); ``shares`` words the refusal when tensors it stores once differ; ``borrows`` (our own
    layout): the target tensors the drafter borrows, recorded with the embedding's fingerprint, never stored;
    ``extras(spec, drafter)``: tensors the format stores beyond our state, in its names (FasterDecoding's copies of
    the borrowed output layer per head, EAGLE-3's ``lm_head`` and ``t2d``)."""

    name: str
    recognise: Callable[[dict, set[str] | None], bool]
    read: Callable[[dict, TargetShape, dict | None], Any]
    write: Callable[[Any, str], dict]
    names: tuple[tuple, ...] = (("{rest}", "{rest}"),)
    prefixes: tuple[str, ...] = ()
    carried: tuple[tuple[str, str], ...] = ()  # (theirs, "embedding" | "output")
    writes_carried: bool = True  # False: copies are tolerated (and checked) on load, not written
    ignored: tuple[str, ...] = ("{rest}rotary_emb.inv_freq",)
    refused: tuple[tuple[str, str], ...] = ()  # (theirs, the reason; "{name}" is the tensor's name)
    shares: str = ""
    borrows: Callable[[Any], list[str]] | None = None
    extras: Callable[[Any, nn.Module], dict[str, torch.Tensor]] | None = None
    filename: str = "model.safetensors"

    def rename(self, name: str, env: Env, saving: bool = False) -> tuple[list[str], Convert | None] | None:
        """(names, conversion) of a tensor: ours -> theirs when ``saving`` (one name), else theirs -> ours (several
        where the format stores one tensor for many of ours); None when no pair matches."""
        for pair in self.names:
            source, goal = (pair[0], pair[1]) if saving else (pair[1], pair[0])
            bound = match(source, name, env)
            if bound is not None:
                return expand(goal, bound, env), pair[2] if len(pair) > 2 else None
        return None

    def strip(self, name: str) -> str:
        prefix = next((p for p in self.prefixes if name.startswith(p)), "")
        return name[len(prefix):]

    def ours(self, name: str, env: Env) -> list[str] | None:
        """Our names for a checkpoint tensor; [] for carried copies and ignored buffers, None for no match."""
        name = self.strip(name)
        if _first(self.carried, name, env) or _first(self.ignored, name, env):
            return []
        renamed = self.rename(name, env)
        return None if renamed is None else renamed[0]

    def theirs(self, name: str, env: Env) -> str:
        """The checkpoint's name of a tensor of ours (ours itself where no pair matches)."""
        renamed = self.rename(name, env, saving=True)
        return name if renamed is None else renamed[0][0]

    @staticmethod
    def own(spec_type, architecture: str, borrows: Callable[[Any], list[str]]) -> Layout:
        """Our folder: the spec under ``spec_type.KEY`` in config.json, tensors in our names, the borrowed target
        tensors recorded (``borrows(spec)``) with the embedding's fingerprint, never stored."""
        key = spec_type.KEY
        return Layout("specviz", recognise=lambda config, keys: key in config,
                      read=lambda config, target, shapes: spec_type.from_dict(config[key]),
                      write=lambda spec, target_name: {"architectures": [architecture],
                                                       "model_type": key.replace("_", "-"), key: spec.to_dict()},
                      borrows=borrows)


@dataclass(frozen=True)
class Format:
    """A family's layouts, read and written by one generic path.

    ``what`` names the drafter in errors ("Medusa heads"); ``unknown`` is the one line for a folder no layout
    recognises (formatted with ``architectures`` and ``model_type``); ``expected_shapes(spec)``: our names and
    shapes (``network_shapes``); ``check_fits(spec, target)``: the spec against the target; ``env(spec)``: the
    names' constants and ranges. Hooks: ``select(config, shapes)`` keeps the drafter's tensors of a bigger
    checkpoint; ``prepare(state, spec)`` applies a family's rules to the renamed state before it is checked.
    ``pickles``: the ``.bin`` / ``.pt`` files read (through ``torch.load(weights_only=True)``) when there are no
    safetensors; ``choose_files``: which files of a hub repository to fetch (``checkpoint_files.resolve_source``)."""

    what: str
    layouts: tuple[Layout, ...]
    expected_shapes: Callable[[Any], dict[str, tuple[int, ...]]]
    check_fits: Callable[[Any, TargetShape], None]
    unknown: str
    env: Callable[[Any], Env] = lambda spec: {}
    select: Callable[[dict, dict], dict] | None = None
    prepare: Callable[[dict, Any], None] | None = None
    pickles: tuple[str, ...] = ("pytorch_model.bin",)
    choose_files: Callable[[Path], list[str]] | None = None
    plural: bool = False  # errors call the drafter "they"
    fingerprint_required: bool = True  # False: a record without a fingerprint (exported without the target) passes

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(layout.name for layout in self.layouts)

    def __getitem__(self, name: str) -> Layout:
        found = next((layout for layout in self.layouts if layout.name == name), None)
        if found is None:
            raise SpecvizError(f"unknown {self.what} layout {name!r}; known: {', '.join(self.names)}")
        return found

    def layout_of(self, config: dict, keys: set[str] | None = None) -> Layout:
        """The layout of a folder: the tensor names decide where they can, else the config; one line if none."""
        for known in (keys, None) if keys is not None else (None,):
            found = next((layout for layout in self.layouts if layout.recognise(config, known)), None)
            if found is not None:
                return found
        raise SpecvizError(self.unknown.format(architectures=config.get("architectures") or "missing",
                                               model_type=config.get("model_type") or "missing"))

    def spec_of(self, config: dict, target: TargetShape, shapes: dict[str, tuple[int, ...]] | None = None,
                layout: Layout | None = None):
        """The spec of a folder's config (and tensor shapes, when known), checked against ``target``."""
        layout = layout or self.layout_of(config, None if shapes is None else set(shapes))
        spec = layout.read(config, target, shapes)
        self.check_fits(spec, target)
        return spec

    def verdict(self, config: dict, target: TargetShape, shapes: dict | None = None) -> tuple[str, str | None]:
        """(layout, None) when the drafter fits ``target``, else (layout, the reason); unknown layouts raise."""
        layout = self.layout_of(config, None if shapes is None else set(shapes))
        try:
            self.spec_of(config, target, shapes, layout)
        except SpecvizError as error:
            return layout.name, str(error)
        return layout.name, None

    def to_state(self, tensors: dict[str, torch.Tensor], spec, layout: Layout
                 ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, str]]]:
        """(our state, the carried copies: name -> (tensor, "embedding" | "output")) of a checkpoint's tensors,
        checked for refused, unexpected, missing and misshapen entries (named as the checkpoint names them)."""
        env, shapes = self.env(spec), self.expected_shapes(spec)
        state: dict[str, torch.Tensor] = {}
        source: dict[str, str] = {}
        carried: dict[str, tuple[torch.Tensor, str]] = {}
        unexpected = []
        for name, value in tensors.items():
            bare = layout.strip(name)
            refused = _first(layout.refused, bare, env)
            if refused:
                raise SpecvizError(refused[1].format(name=name))
            copy = _first(layout.carried, bare, env)
            if copy or _first(layout.ignored, bare, env):
                carried.update({name: (value, copy[1])} if copy else {})
                continue
            renamed = layout.rename(bare, env)
            for ours in (renamed[0] if renamed else [None]):
                if ours is None or source.setdefault(ours, name) != name:
                    unexpected.append(name)
                    continue
                state[ours] = renamed[1].load(value) if renamed[1] else value
        if self.prepare is not None:
            self.prepare(state, spec)
        unexpected += [source[k] for k in state if k not in shapes]
        if unexpected:
            raise SpecvizError(f"unexpected tensors for this config in the {layout.name} layout: "
                               f"{', '.join(sorted(set(unexpected))[:3])}")
        missing = [k for k in shapes if k not in state]
        if missing:
            raise SpecvizError(f"missing tensor {layout.theirs(missing[0], env)}"
                               + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        for name, shape in shapes.items():
            if tuple(state[name].shape) != shape:
                raise SpecvizError(f"tensor {source.get(name) or layout.theirs(name, env)} has shape "
                                   f"{list(state[name].shape)}, expected {list(shape)} for this config")
        return state, carried

    def from_state(self, state: dict[str, torch.Tensor], spec, layout: Layout) -> dict[str, torch.Tensor]:
        """Our state in the layout's names; tensors it stores once for several of ours must be equal."""
        env, out = self.env(spec), {}
        for name, value in state.items():
            renamed = layout.rename(name, env, saving=True)
            if renamed is None:
                raise SpecvizError(f"the {layout.name} layout has no place for {name}")
            (theirs,), convert = renamed
            value = (convert.save(value) if convert else value).detach().cpu().contiguous()
            if theirs in out and not torch.equal(out[theirs], value):
                raise SpecvizError(f"the {layout.name} layout shares {layout.shares or theirs}; these differ")
            out[theirs] = value
        return out

    def load(self, source: str | Path, model: nn.Module, finish: Callable[[Any, dict, dict], Any]):
        """A folder or hub id in any of the layouts, checked against the target ``model`` (its shape, the tensors'
        names and shapes, and that it is the target the drafter was made for), then ``finish(spec, state, config)``
        (the family builds its module); every error is one line naming the source."""
        folder, name = checkpoint_files.resolve_source(source, self.what, ("*.safetensors", "*.safetensors.index.json",
                                                                           *self.pickles), self.choose_files)
        try:
            shape, embedding, output = target_parts(model)
            config = checkpoint_files.read_config(folder)
            shapes, read = checkpoint_files.tensor_index(folder, self.pickles)
            shapes = self.select(config, shapes) if self.select else shapes
            layout = self.layout_of(config, set(shapes))
            spec = self.spec_of(config, shape, shapes, layout)
            state, carried = self.to_state(read(lambda n: n in shapes), spec, layout)
            mine = {"embedding": embedding, "output": output.weight}
            check_same_target(config, embedding, {n: (value, mine[which]) for n, (value, which) in carried.items()},
                              plural=self.plural, fingerprint_required=self.fingerprint_required)
            return finish(spec, state, config)
        except SpecvizError as error:
            raise SpecvizError(f"{self.what} {name}: {error}") from None

    def save(self, drafter: nn.Module, folder: Path, layout: str, *, target_name: str,
             dtype: torch.dtype | None = None, spec=None, state: dict | None = None, config: dict | None = None,
             tensors: dict | None = None) -> Path:
        """Write ``drafter`` (its ``spec`` and ``state`` unless given) as a loadable folder in ``layout``: the
        layout's config plus ``config``, its tensors plus ``tensors`` (in its names) in ``dtype``, the target's own
        where the layout carries copies (our layout records them with the embedding's fingerprint instead)."""
        from specviz.models.shared_embedding import CONFIG_KEY, fingerprint

        chosen, spec = self[layout], spec or drafter.spec
        dtype = dtype or next(drafter.parameters(), torch.empty(0)).dtype
        state = drafter.state_dict() if state is None else state
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        written = {**chosen.write(spec, target_name), **(config or {})}
        embedding, output = drafter.borrowed.embedding, drafter.borrowed.output
        if chosen.borrows is not None:
            written[CONFIG_KEY] = {"from": target_name, "tensors": chosen.borrows(spec),
                                   "fingerprint": [] if embedding is None else fingerprint(embedding)}
        out = self.from_state(state, spec, chosen)
        for pattern, which in chosen.carried if chosen.writes_carried else ():
            mine = embedding if which == "embedding" else output.weight
            out.update({name: mine for name in expand(pattern, {}, self.env(spec))})
        out.update(chosen.extras(spec, drafter) if chosen.extras else {})
        out = {k: v.detach().to(dtype) if v.is_floating_point() else v.detach()
               for k, v in {**out, **(tensors or {})}.items()}
        return checkpoint_files.write(Path(folder), written, out, chosen.filename)


def network_shapes(network: Callable[..., nn.Module]) -> Callable[[Any], dict[str, tuple[int, ...]]]:
    """A ``Format.expected_shapes``: our tensor names and shapes for a spec, read from the family's network itself
    (``network(spec, embedding=, output=)``) built on the meta device (no memory) around stand-ins for the borrowed
    target tensors, so the names a layout maps and the module that loads them cannot part."""
    def shapes(spec) -> dict[str, tuple[int, ...]]:
        with torch.device("meta"):
            module = network(spec, embedding=torch.empty(spec.vocab_size, spec.hidden_size),
                             output=nn.Linear(spec.hidden_size, spec.vocab_size, bias=False))
        return {name: tuple(value.shape) for name, value in module.state_dict().items()}
    return shapes


def build(module_type, model: nn.Module, spec, state: dict[str, torch.Tensor] | None = None):
    """``module_type(spec, embedding=, output=)`` on the target ``model``'s device, borrowing its embedding and output
    layer (noting whether that is the fast path's pre-packed one); ``state`` (our names) loads its weights, floats
    in float32."""
    from specviz.models import fast_forward

    _, embedding, output = target_parts(model)
    module = module_type(spec, embedding=embedding, output=output).to(embedding.device)
    module.borrowed.output_packed = fast_forward.is_fast(model)
    if state is not None:
        module.load_state_dict({k: v.to(embedding.device, torch.float32 if v.is_floating_point() else v.dtype)
                                for k, v in state.items()}, strict=True)
    return module


# ---- specs, and the decoder layers most families share --------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """A family's spec, as our config.json records it under ``KEY`` (tuples as lists; unknown fields refused)."""

    KEY: ClassVar[str] = ""

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict):
        tuples = tuple(f.name for f in fields(cls) if str(f.type).startswith("tuple"))
        return spec_from_dict(cls, data, cls.KEY, tuples)


@dataclass(frozen=True, kw_only=True)
class DecoderSpec(Spec):
    """The decoder-layer fields of a drafter shaped like its target's layers, read from a published config
    (``fields_from``) or a target (``fields_like``) and written back (``decoder_config``)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    rope: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    max_position_embeddings: int = 8192

    @staticmethod
    def fields_from(config: dict, what: str) -> dict:
        """The fields from a Llama/Qwen-style config (``what`` names the layer in errors)."""
        require(config, "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
        rope, head_dim, max_positions = rope_of(config, what)
        heads = int(config["num_attention_heads"])
        return dict(hidden_size=int(config["hidden_size"]), intermediate_size=int(config["intermediate_size"]),
                    num_heads=heads, num_kv_heads=int(config.get("num_key_value_heads") or heads),
                    head_dim=head_dim, rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                    vocab_size=int(config["vocab_size"]), rope=rope, max_position_embeddings=max_positions)

    @staticmethod
    def fields_like(model: nn.Module) -> dict:
        """The fields of a drafter of ours shaped like the target ``model``'s decoder layers."""
        shape, _, _ = target_parts(model)
        config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else \
            model.config
        heads = int(config.num_attention_heads)
        rope = dict(getattr(config, "rope_parameters", None) or {"rope_type": "default",
                                                                  "rope_theta": getattr(config, "rope_theta", 10000.0)})
        return dict(hidden_size=shape.hidden_size, intermediate_size=int(config.intermediate_size), num_heads=heads,
                    num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
                    head_dim=int(getattr(config, "head_dim", None) or shape.hidden_size // heads),
                    rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)), vocab_size=shape.vocab_size,
                    rope=rope, max_position_embeddings=int(getattr(config, "max_position_embeddings", 8192) or 8192))

    def decoder_config(self, model_type: str, layers: int) -> dict:
        """A published config's decoder fields (``layers`` decoder layers of ``model_type``)."""
        scaling = {k: v for k, v in self.rope.items() if k != "rope_theta"}
        return {"model_type": model_type, "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size, "num_hidden_layers": layers,
                "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
                "head_dim": self.head_dim, "hidden_act": "silu", "rms_norm_eps": self.rms_norm_eps,
                "vocab_size": self.vocab_size, "max_position_embeddings": self.max_position_embeddings,
                "tie_word_embeddings": False, "rope_theta": self.rope.get("rope_theta", 10000.0),
                "rope_scaling": None if scaling.get("rope_type", "default") == "default" else scaling}


def fits(spec, target: TargetShape, who: str, layers: tuple[int, ...], raw: bool = False) -> None:
    """``spec``'s width and vocabulary against ``target``'s, and the ``hidden_states`` it reads against its depth
    (``raw``: layer outputs only, never the final norm's); ``who`` names it ("the heads are"). One-line errors."""
    if spec.hidden_size != target.hidden_size:
        raise SpecvizError(f"hidden size mismatch: {who} for hidden size {spec.hidden_size}, the target has "
                           f"{target.hidden_size}")
    if spec.vocab_size != target.vocab_size:
        raise SpecvizError(f"vocabulary mismatch: {who} for a {spec.vocab_size}-token vocabulary, the target has "
                           f"{target.vocab_size}")
    last = target.num_layers
    final = f"hidden_states[{last}] is after the final norm"
    bad = [i for i in layers if not 0 <= i <= last]
    if bad:
        raise SpecvizError(f"it reads hidden_states{bad}, but the target has hidden_states[0..{last}] "
                           + (f"({final})" if raw else f"({last} decoder layers)"))
    if raw and last in layers:
        raise SpecvizError(f"it reads raw layer outputs; {final} (a layer-numbering mistake?)")


def named(config: dict, *architectures: str) -> bool:
    """Whether config.json's ``architectures`` names any of ``architectures``."""
    return any(str(name) in architectures for name in config.get("architectures") or [])


def require(config: dict, *names: str) -> None:
    """One line naming the fields config.json lacks."""
    missing = [n for n in names if config.get(n) is None]
    if missing:
        raise SpecvizError(f"config.json lacks {', '.join(missing)}")


#: The decoder-layer styles ``DecoderLayer`` builds, by published ``model_type``.
STYLES = {"llama": "Llama", "qwen3": "Qwen3"}


def check_layers(config: dict, who: str, *, style: str = "", count: int | None = None,
                 target_hidden: int | None = None) -> None:
    """Refuse in one line the decoder layers of a published config that ours do not build: another ``model_type``
    than ``style`` (where the family requires one), another number than ``count`` (where it requires one), an
    activation other than silu, attention or MLP biases, sliding windows, or another width than the target features
    they read (``target_hidden``, the config's ``target_hidden_size``). ``who`` names the drafter ("the head")."""
    model_type = config.get("model_type", style)
    if style and model_type != style:
        raise SpecvizError(f"{who}'s layers of model_type {model_type!r} are not supported; only {STYLES[style]}-style "
                           f"layers are")
    if count is not None and int(config.get("num_hidden_layers", count)) != count:
        raise SpecvizError(f"{who} has {config['num_hidden_layers']} decoder layers; only {count} is supported")
    if config.get("hidden_act", "silu") != "silu":
        raise SpecvizError(f"{who}'s activation is {config.get('hidden_act')!r}; only silu is supported")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise SpecvizError(f"{who} has attention or MLP biases, which are not supported")
    if config.get("use_sliding_window") or set(config.get("layer_types") or ["full_attention"]) != {"full_attention"}:
        raise SpecvizError(f"{who} has sliding-window layers, which are not supported; only full attention is")
    if target_hidden is not None and int(target_hidden) != int(config["hidden_size"]):
        raise SpecvizError(f"{who} is {config['hidden_size']} wide over {target_hidden}-wide target features "
                           f"(target_hidden_size); drafters of another width than their target are not supported")


def check_draft_ids(ids: torch.Tensor, vocab_size: int) -> None:
    """The target ids of a reduced draft vocabulary (EAGLE-3's ``d2t``, vLLM Medusa's ``token_map``): inside the
    target's vocabulary, none twice (one line each)."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise SpecvizError(f"the draft vocabulary maps to ids outside the target's [0, {vocab_size})")
    if ids.unique().numel() != ids.numel():
        raise SpecvizError("the draft vocabulary maps two draft ids to the same target id")


# ---- config fields as declarations ----------------------------------------------------------------------------------
#: A ``Field`` default: the config must hold the field (or the family give a value for it).
REQUIRED = object()


@dataclass(frozen=True)
class Field:
    """A spec field as a layout's config.json holds it, read by ``read_fields`` and written by ``write_fields``.

    ``theirs``: where it is written (dotted for nested: ``eagle_config.norm_output``; blank: our name), ``also``:
    other places it is read from (the first present wins); ``default`` when none is (``REQUIRED``: refused in one
    line unless the family gives one); ``shift``: a list of layer ids there names ``hidden_states[id + shift]``
    (SGLang and DFlash count "output of layer id": 1). The spec's own annotation says how a value is checked."""

    ours: str
    theirs: str = ""
    default: Any = REQUIRED
    also: tuple[str, ...] = ()
    shift: int = 0

    @property
    def places(self) -> tuple[str, ...]:
        return (self.theirs or self.ours, *self.also)


def lookup(config: dict, path: str):
    """The value at a dotted ``path`` of ``config``, None where any step is missing or not a dict."""
    for step in path.split("."):
        config = config.get(step) if isinstance(config, dict) else None
    return config


_SCALARS = {"bool": bool, "float": float, "str": str}


def _checked(value, kind: str, place: str, shift: int):
    """``value`` (found at ``place``) as a spec field annotated ``kind`` holds it; one line when it cannot."""
    if kind in _SCALARS:
        try:
            return _SCALARS[kind](value)
        except (TypeError, ValueError):
            raise SpecvizError(f"{place} must be a {kind}, got {value!r}") from None
    many = kind.startswith("tuple")
    ints = value if many else [value]
    if not isinstance(ints, list) or not ints or any(isinstance(i, bool) or not isinstance(i, int) for i in ints):
        raise SpecvizError(f"{place} must be {'a non-empty list of integers' if many else 'an integer'}, got "
                           f"{value!r}")
    return tuple(i + shift for i in ints) if many else value


def read_fields(config: dict, table: tuple[Field, ...], spec_type, **defaults) -> dict:
    """The spec fields ``table`` declares, as ``config`` holds them, each checked by ``spec_type``'s annotation;
    ``defaults``: values that depend on the target, for fields a config leaves out or a layout never names."""
    kinds = {f.name: str(f.type) for f in fields(spec_type)}
    out = dict(defaults)
    for entry in table:
        place = next((p for p in entry.places if lookup(config, p) is not None), None)
        if place is not None:
            out[entry.ours] = _checked(lookup(config, place), kinds[entry.ours], place, entry.shift)
        elif entry.ours not in defaults:
            if entry.default is REQUIRED:
                name = entry.places[0].rsplit(".", 1)[-1]
                where = "" if entry.places == (name,) else f" ({' / '.join(entry.places)})"
                raise SpecvizError(f"config.json lacks {name}{where}")
            out[entry.ours] = entry.default
    return out


def write_fields(spec, table: tuple[Field, ...], config: dict) -> dict:
    """``config`` with ``table``'s fields of ``spec`` written in where the table says (nested entries merged)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    for entry in table:
        value = getattr(spec, entry.ours)
        *parents, last = entry.places[0].split(".")
        node = out
        for parent in parents:
            node = node.setdefault(parent, {})
        node[last] = [i - entry.shift for i in value] if isinstance(value, tuple) else value
    return out
