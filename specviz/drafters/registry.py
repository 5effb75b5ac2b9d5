"""The drafter registry: one ``DrafterFamily`` record per family, registered by the family's own module.

A spec names a family and its argument: ``ngram``, ``ngram:3``, ``model:smollm2-135m-draft``. ``parse`` is the one
parser of specs; ``api.make_drafter``, the CLI's ``--drafter``, ``bench --drafters``, the UI's drafter list,
``specviz train`` and the README's drafter table (``markdown_table``) all read this registry. Every module of
``specviz.drafters`` is imported when the package is (see its ``__init__``), so adding a family is one new module
that calls ``register``, plus its tests.

Target features: ``feature_layers`` are indices into Hugging Face's ``hidden_states`` tuple (``hidden_states[0]``
is the embedding output, ``hidden_states[i]`` the output of decoder layer ``i - 1``); empty means the family needs
none, and it costs nothing extra.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specviz import settings as run_settings
from specviz.errors import SpecvizError

if TYPE_CHECKING:
    from specviz.engine.drafter import Drafter
    from specviz.engine.target import Target

#: The spec a run uses when none is given and none of ``PREFERRED_SPECS`` is ready for its target: the n-gram
#: lookup, which needs no checkpoint.
DEFAULT_SPEC = "ngram"
#: Tried first, in order, where ready for the target (its checkpoint shipped): the fastest drafter measured on the
#: reference 2-core CPU (BENCHMARKS.md), ``hybrid``: the lookup where its matches pay, else the EAGLE-3 head.
PREFERRED_SPECS = ("hybrid",)


@dataclass(frozen=True)
class DrafterFamily:
    """What a drafter family is and how to build one.

    ``name`` is the spec prefix; ``syntax`` shows the whole spec (``model:<name|dir|hub id>``). ``reads``: the
    run settings (``specviz.settings`` names) the family reads beyond the draft budget every drafter gets.
    ``build(argument, target, settings)`` makes a drafter (``settings``: checked ``specviz.settings.Values``).
    ``check(argument)`` refuses a malformed argument before any model loads (it returns the argument).
    ``plain_name`` and ``plain_line`` say what ``title`` and ``description`` say, for a newcomer and without spec
    syntax: the Playground's first screen lists drafters by them (``plain_menu``).
    ``feature_layers``: the target hidden states it reads (a tuple, or a function of the target's decoder-layer
    count), in the module docstring's numbering. ``checkpoints(target)`` lists the shipped checkpoints (spec
    arguments) that fit a target registry name; ``variants`` are ready-made specs offered besides them
    (``ngram:2``); ``default_spec`` is the spec that needs no checkpoint, if any. ``trainer``: the kind
    ``specviz train <kind>`` trains for this family.
    """

    name: str
    syntax: str
    title: str
    description: str
    build: Callable[[str, Target, Mapping[str, Any]], Drafter]
    reads: tuple[str, ...] = ()
    feature_layers: tuple[int, ...] | Callable[[int], tuple[int, ...]] = ()
    features: str = ""  # the feature layers in words, for the table (when they depend on the target's depth)
    argument_required: bool = False
    check: Callable[[str], str] | None = None
    checkpoints: Callable[[str], list[str]] | None = None
    default_spec: str | None = None
    variants: tuple[str, ...] = ()
    trainer: str | None = None
    order: int = 100
    plain_name: str = ""  # e.g. "Prompt lookup (n-gram)"; blank: the title
    plain_line: str = ""  # one line on what it does, e.g. "copies what followed the same words earlier in the text"
    #: whether the bare name can also mean the target checkpoint's own layers (MTP), so no shipped file is needed
    bare_from_target: bool = False

    def layers_for(self, num_hidden_layers: int) -> tuple[int, ...]:
        """The ``hidden_states`` indices this family reads from a target with that many decoder layers."""
        layers = self.feature_layers
        return tuple(layers(num_hidden_layers) if callable(layers) else layers)

    def spec(self, argument: str = "") -> str:
        return f"{self.name}:{argument}" if argument else self.name

    def shipped(self, target: str) -> list[str]:
        """Specs of the shipped checkpoints that fit ``target``."""
        return [self.spec(name) for name in (self.checkpoints(target) if self.checkpoints else [])]

    def ready(self, target: str) -> list[str]:
        """The specs that run as they are for ``target``: the default spec, then every shipped checkpoint."""
        return ([self.default_spec] if self.default_spec else []) + self.shipped(target)


_FAMILIES: dict[str, DrafterFamily] = {}


def register(family: DrafterFamily) -> DrafterFamily:
    """Add a family (called once by its module at import). Its settings must be declared in specviz.settings."""
    unknown = [name for name in family.reads if name not in run_settings.BY_NAME]
    if unknown:
        raise ValueError(f"drafter family {family.name!r} reads undeclared settings {unknown}")
    if ":" in family.name or not family.name:
        raise ValueError(f"a drafter family name is a non-empty word without ':', got {family.name!r}")
    _FAMILIES[family.name] = family
    return family


def families() -> list[DrafterFamily]:
    """Every registered family, in display order."""
    return sorted(_FAMILIES.values(), key=lambda f: (f.order, f.name))


def get(name: str) -> DrafterFamily:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise SpecvizError(f"unknown drafter family {name!r}; known families: {known()}") from None


def known() -> str:
    """The families as one line: ``ngram[:N] (prompt lookup), model:<name|dir|hub id> (draft model)``."""
    return ", ".join(f"{f.syntax} ({f.title})" for f in families())


def check_ready(spec: str, target: str, *, where: str = "") -> tuple[DrafterFamily, str]:
    """``parse``, and for a bare name that needs a shipped checkpoint, a one-line error when ``target`` is a registry
    name it is not shipped for: the run would otherwise load the target first and fail after it."""
    from specviz.models.registry import REGISTRY

    family, argument = parse(spec, where=where)
    needs_shipped = not argument and family.checkpoints is not None and not family.default_spec
    if needs_shipped and not family.bare_from_target and target in REGISTRY and not family.ready(target):
        syntax = family.syntax.replace("[", "").replace("]", "")
        raise SpecvizError(f"no {family.title} is shipped for {target}{where}; give {syntax}")
    return family, argument


def parse(spec: str, *, where: str = "") -> tuple[DrafterFamily, str]:
    """``(family, argument)`` of a drafter spec, or a one-line error listing the known families. No model loads, but
    the family's ``check`` refuses an argument that cannot load (a missing directory, an unknown name, a hub id that is
    neither reachable nor cached, a source the allowlist does not name), so a run fails before loading its target."""
    if spec is not None and not isinstance(spec, str):
        raise SpecvizError(f"a drafter spec is text such as 'ngram' or 'eagle3', not {spec!r}")
    spec = (spec or "").strip()
    if not spec:
        raise SpecvizError(f"no drafter given{where}; known families: {known()}")
    name, colon, argument = spec.partition(":")
    family = _FAMILIES.get(name)
    if family is None:
        raise SpecvizError(f"unknown drafter {spec!r}{where}; known families: {known()}")
    if spec.endswith(":"):  # "eagle3:", "dspark:raw:": a part left out, not the bare name
        raise SpecvizError(f"drafter {spec!r}{where} ends in an empty part after ':'; the syntax is {family.syntax}")
    if family.argument_required and not argument.strip():
        raise SpecvizError(f"drafter {spec!r}{where} needs its argument: the syntax is {family.syntax}")
    argument = argument.strip()
    if family.check is not None:
        argument = family.check(argument)
    return family, argument


def family_of(spec: str) -> DrafterFamily:
    """The family a spec names, its argument unchecked: for specs already parsed (a bench row's drafter) and for labels
    of drafters built in-process. ``parse`` checks the argument too."""
    return get(str(spec).partition(":")[0].strip())


def parse_list(text: str, option: str = "--drafters") -> list[str]:
    """``"ngram,model:x"`` -> specs, each parsed; empty entries and duplicates fail before any model loads."""
    specs = [part.strip() for part in (text or "").split(",")]
    if not any(specs):
        raise SpecvizError(f"{option} is empty; give e.g. {', '.join(f.syntax for f in families())}")
    if "" in specs:
        raise SpecvizError(f"{option} {text!r} has an empty entry")
    for spec in specs:
        parse(spec, where=f" in {option}")
    duplicates = sorted({s for s in specs if specs.count(s) > 1})
    if duplicates:
        raise SpecvizError(f"drafter {duplicates[0]!r} is listed twice in {option}")
    return specs


def build(spec: str, target: Target, settings: Mapping[str, Any]) -> Drafter:
    """The drafter for ``spec``; a setting the family reads and ``settings`` lacks takes its declared default."""
    family, argument = parse(spec)
    return family.build(argument, target, {**{name: run_settings.default(name) for name in family.reads}, **settings})


def default_for(target: str) -> str:
    """The drafter a run on ``target`` (a registry name) uses when none is given: the first of ``PREFERRED_SPECS``
    ready for it, else ``DEFAULT_SPEC``."""
    for spec in PREFERRED_SPECS:
        family, _ = parse(spec)
        if spec in family.ready(target):
            return spec
    return DEFAULT_SPEC


def default_help() -> str:
    """The default drafter in words, for help and info lines."""
    return (f"{' where its checkpoint is shipped for the target, else '.join((*PREFERRED_SPECS, DEFAULT_SPEC))}; "
            "the fastest measured on the reference 2-core CPU (BENCHMARKS.md)")


def default_specs(target: str) -> list[str]:
    """What ``bench`` runs when not told: every family's ready specs for ``target``."""
    return [spec for family in families() for spec in family.ready(target)]


def menu(target: str) -> list[tuple[str, list[str]]]:
    """(family title, specs) per family: the default spec, the variants and the shipped checkpoints for ``target``."""
    groups = []
    for family in families():
        specs = ([family.default_spec] if family.default_spec else []) + list(family.variants) + \
            family.shipped(target)
        if specs:
            groups.append((family.title, list(dict.fromkeys(specs))))
    return groups


def plain_menu(target: str) -> list[tuple[str, str]]:
    """(plain name, spec) for every drafter that runs as it is with ``target`` (its ``ready`` specs): the
    Playground's first-screen list. The variants (``ngram:2``) stay out of it, to be typed as specs; a family with
    several shipped checkpoints names each in brackets."""
    entries = []
    for family in families():
        ready = list(dict.fromkeys(family.ready(target)))
        name = family.plain_name or family.title
        entries += [(name if len(ready) == 1 else f"{name} ({spec.partition(':')[2] or spec})", spec)
                    for spec in ready]
    return entries


def plain_line(spec: str) -> str:
    """The one line on what a spec's family does, in plain words (its title where none is written; empty for a
    spec that names no family)."""
    family = _FAMILIES.get(str(spec or "").partition(":")[0].strip())
    if family is None:
        return ""
    return family.plain_line or family.title


def spec_help() -> str:
    """The ``--drafter`` help: each family's syntax and description."""
    return "; ".join(f"{f.syntax} = {f.title}: {f.description}" for f in families())


def trainers() -> dict[str, DrafterFamily]:
    """``specviz train <kind>`` kinds -> the family each trains."""
    return {f.trainer: f for f in families() if f.trainer}


def readers(setting: str) -> list[DrafterFamily]:
    """The families that read a drafter-only setting (each family declares its own ``reads``)."""
    return [f for f in families() if setting in f.reads]


def reader_titles() -> dict[str, str]:
    """Drafter-only setting -> the families that read it, as one phrase (``draft model / EAGLE-1 head``)."""
    return {s.name: " / ".join(f.title for f in readers(s.name)) for s in run_settings.SETTINGS if s.drafter_only}


def markdown_table(target: str | None = None) -> str:
    """The README's drafter table: one row per family."""
    target = target or run_settings.default("target")
    rows = ["| family | spec | what it does | settings it reads | target features | shipped for "
            f"`{target}` | trainer |", "|---|---|---|---|---|---|---|"]
    for f in families():
        layers = f.features or (", ".join(f"`hidden_states[{i}]`" for i in f.feature_layers) if not
                                callable(f.feature_layers) else "") or "none"
        reads = ", ".join(f"`--{run_settings.get(n).cli_name}`" for n in f.reads) or "the draft budget only"
        shipped = ", ".join(f"`{s}`" for s in f.shipped(target)) or "–"
        trainer = f"`specviz train {f.trainer}`" if f.trainer else "–"
        cells = [f.title, f"`{f.syntax}`", f.description, reads, layers, shipped, trainer]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)
