"""Every run setting, declared once: name, type, default, bounds or choices, help, CLI flags, UI hints, readers.

Everything else derives from ``SETTINGS``: the options of ``specviz generate`` and ``specviz bench``
(``add_options``), the Gradio widgets (``specviz.ui.settings``), the benchmark's reproducible command line
(``command_args``) and the validation (``check`` / ``validate``, the one place a user's value is checked).
``drafter_only`` marks the settings only some drafter families read; which ones is each family's own
declaration (its ``reads`` in ``specviz.drafters.registry``), so a new family never edits this file. The others
are read by the run itself (the draft budget every drafter gets, the sampler, the target).

One set of defaults: the draft shape is the configuration that measured fastest on the reference machine (a
2-core CPU, BENCHMARKS.md): a tree of at most 4 nodes (width 3, depth 2), or, where a chain is asked for, k = 2;
runs generate 128 new tokens through the chat template, as the benchmark does. A chain length typed without a
shape (``--k 4`` alone) asks for a chain (``from_args``). A leaf module: it imports nothing from specviz but
``specviz.errors``, so every layer (the engine included) may read it.
"""

from __future__ import annotations

import argparse
import functools
import math
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from specviz.errors import SpecvizError

#: Why the defaults are what they are (shown in the CLI's help and the UI's info text).
FASTEST = "the fastest configuration measured on the reference 2-core CPU (BENCHMARKS.md)"


@dataclass(frozen=True)
class Setting:
    """One run setting. ``flags[0]`` is the canonical CLI flag, the others are aliases (old names keep working).

    A ``bool`` setting's ``flags`` set it to True and ``off_flags`` to False. ``low``/``high`` bound numbers
    (``open_low``/``open_high`` exclude the bound; ``high=None`` is unbounded); ``choices`` restrict strings.
    ``ui`` is the widget kind (``None``: not in the UI); ``ui_low``/``ui_high`` narrow the range the UI accepts (a
    value outside it is an error there, never clamped); ``ui_step`` is a number box's arrow step; ``ui_options``
    label a bool's two values on a radio; ``ui_id`` is the element id. ``ui_basic`` puts the widget on the UI's first
    screen (a lesson's few controls; the rest go under "Advanced"), where ``ui_info`` says what it does in plain words
    instead of the CLI help.
    ``emit``: when the benchmark's reproducible command line writes it (``always``, or only when ``changed``).
    """

    name: str
    type: type
    default: Any
    help: str
    label: str
    flags: tuple[str, ...] = ()
    off_flags: tuple[str, ...] = ()
    off_help: str = ""  # a bool's off flag, when it is the one users type (default True)
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    choices: tuple[str, ...] = ()
    optional: bool = False  # None is a valid value (meaning: let the program choose)
    drafter_only: bool = False  # read only by the drafter families that list it in their ``reads``
    why: str = ""  # why this default, when it was chosen by measurement
    ui: str | None = "auto"  # "number", "checkbox", "radio", "dropdown"; None = not in the UI
    ui_low: float | None = None
    ui_high: float | None = None
    ui_step: float | None = None
    ui_options: tuple[tuple[str, Any], ...] = ()
    ui_id: str | None = None
    ui_row: str | None = None  # consecutive widgets with the same row name share a row
    ui_basic: bool = False  # on the UI's first screen, not under "Advanced"
    ui_info: str = ""  # the first screen's info line, in plain words (no flags, no spec syntax)
    group: str = "run"  # the UI's section: "prompt", "model" (the target and its forward) or "run"
    emit: str = "changed"

    @property
    def cli_name(self) -> str:
        """The name users see in messages (the flag without its dashes)."""
        return self.name.replace("_", "-")

    @property
    def elem_id(self) -> str:
        return self.ui_id or self.name.replace("_", "-")

    @property
    def widget(self) -> str | None:
        """The widget kind. A number is a number box, never a slider: Gradio's slider clamps a typed value into its
        range in the browser (k = 0 ran as k = 1), so the check never saw what the user typed."""
        if self.ui != "auto":
            return self.ui
        if self.type is bool:
            return "radio" if self.ui_options else "checkbox"
        if self.choices:
            return "radio"
        return "number"

    @property
    def ui_range(self) -> tuple[float | None, float | None]:
        """The range the UI accepts: the declared bounds, narrowed where the declaration says so for the UI."""
        return (self.low if self.ui_low is None else self.ui_low, self.high if self.ui_high is None else self.ui_high)

    def open_ends(self, low: float | None, high: float | None) -> tuple[bool, bool]:
        """Whether ``low`` / ``high`` are excluded: only the declared bounds can be open (the UI's narrower bounds,
        such as top-p's 0.05, are values the UI accepts)."""
        return self.open_low and low == self.low, self.open_high and high == self.high

    def describe_bounds(self, low: float | None, high: float | None) -> str:
        if self.type is int:
            return f"an integer in [{_num(low)}, {_num(high)}]" if high is not None else f"at least {_num(low)}"
        open_low, open_high = self.open_ends(low, high)
        left, right = "(" if open_low else "[", ")" if open_high else "]"
        return f"a number in {left}{_num(low)}, {_num(high)}{right}"

    def format(self, value) -> str:
        """``value`` as a CLI argument."""
        return str(value)


def _num(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _setting(name: str, type_: type, default, help: str, label: str, **kwargs) -> Setting:
    if "flags" not in kwargs and type_ is not bool:
        kwargs["flags"] = (f"--{name.replace('_', '-')}",)
    return Setting(name, type_, default, help, label, **kwargs)


SETTINGS: tuple[Setting, ...] = (
    # ---- the target (the UI's model section) --------------------------------------------------------------
    # the default target's one declaration: specviz.models.registry.DEFAULT_TARGET and every other default read it
    _setting("target", str, "smollm2-135m", "target model: registry name, model directory, .gguf file or hub id",
             "target model", ui="dropdown", group="model", emit="always"),
    _setting("target_forward", str, "auto",
             "fast: linear kernels for thin products over weights packed at load, and a preallocated KV cache, "
             "on CPU; hf: transformers' own forward; auto: fast where it runs", "target forward",
             choices=("auto", "fast", "hf"), group="model"),
    _setting("device", str, None, "cuda, mps or cpu (default: the best available)", "device", optional=True,
             ui=None, group="model"),
    # ---- the prompt and the draft shape ---------------------------------------------------------------------
    _setting("chat", bool, True, "wrap the prompt in the target's chat template", "prompt format",
             flags=("--chat",), off_flags=("--no-chat",), off_help="feed the prompt raw, without the chat template",
             ui_options=(("chat", True), ("raw", False)), ui_id="mode", group="prompt"),
    _setting("tree", bool, True, "draft a tree (width x depth, at most max-nodes)", "draft shape", flags=("--tree",),
             off_flags=("--chain",),
             off_help="draft a chain of k tokens (generate: also what --k typed alone asks for)",
             ui_options=(("chain", False), ("tree", True)), ui_id="shape", emit="always", ui_basic=True,
             ui_info="a chain guesses one run of tokens each round; a tree guesses several alternatives at each "
                     "step, and the model checks them all in one pass. Default: a small tree, the fastest measured",
             why="a 4-node tree (width 3, depth 2) is " + FASTEST + " for the default drafter"),
    _setting("k", int, 2, "chain length: tokens drafted per round", "draft length", low=1, high=32, ui_high=16,
             ui_basic=True, ui_info="how many tokens the drafter guesses in each round of a chain",
             why="a chain of k = 2 is the fastest chain of the default drafter on the reference 2-core CPU "
                 "(BENCHMARKS.md)", emit="always"),
    _setting("width", int, 3, "tree: children per expanded node", "tree width", low=1, high=16, ui_high=8,
             ui_row="tree", emit="always"),
    _setting("depth", int, 2, "tree: maximum depth (one chain, e.g. hybrid's lookup, may fill the node budget)",
             "tree depth", low=1, high=32, ui_high=12, ui_row="tree", emit="always"),
    _setting("max_nodes", int, 4, "tree: maximum number of drafted nodes", "node budget",
             flags=("--max-nodes", "--budget"), low=1, high=256, ui_high=128, ui_basic=True,
             ui_info="how many guessed tokens a tree may hold in all, over all its branches",
             why="a 4-node tree (width 3, depth 2) is " + FASTEST, ui_id="max-nodes", emit="always"),
    # ---- sampling and length ---------------------------------------------------------------------------------
    _setting("temperature", float, 0.0, "sampling temperature (0 = greedy)", "temperature (0 = greedy)", low=0.0,
             high=10.0, ui_high=2.0, ui_step=0.05, ui_row="sampling", emit="always", ui_basic=True,
             ui_info="0 always takes the model's most likely token; higher values pick more freely"),
    _setting("top_p", float, 1.0, "nucleus sampling: keep the smallest set of tokens with this much probability",
             "top-p", low=0.0, high=1.0, open_low=True, ui_low=0.05, ui_step=0.05, ui_row="sampling"),
    _setting("top_k", int, 0, "keep only the k most likely tokens (0 = off)", "top-k", low=0, ui=None),
    # the browser holds a number box's value as a double: above 2**53 - 1 a typed seed would arrive rounded
    _setting("seed", int, 0, "random seed of the sampler and of sampled drafts", "seed", low=0, high=2**63 - 1,
             ui_high=2**53 - 1, ui_row="length"),
    _setting("max_new_tokens", int, 128, "tokens to generate", "max new tokens", low=1, high=4096, ui_high=512,
             ui_row="length", emit="always"),
    # ---- read by draft models only ---------------------------------------------------------------------------
    _setting("stochastic_tree", bool, False,
             "tree at temperature > 0: draw children from the draft model instead of taking its top-w",
             "stochastic tree (draw children from the draft model's q)", flags=("--stochastic-tree",),
             drafter_only=True),
    _setting("min_draft_prob", float, 0.0,
             "stop a draft branch after a token the draft model gives less than this probability (transformers' "
             "assistant_confidence_threshold; 0 = always draft k / depth)", "stop a branch below draft q",
             low=0.0, high=1.0, open_high=True, ui_high=0.95, ui_step=0.05, drafter_only=True),
    _setting("draft_vocab", int, 0,
             "draft from the first N token ids only, with the output layer cut to those rows (the frequent ones; "
             "0 = the whole vocabulary)", "draft vocabulary (first N token ids)", low=0, high=1 << 20,
             drafter_only=True),
    _setting("draft_quant", str, "auto",
             "draft weights: int8 (a draft model's projections, a head's or block drafter's output layer and, "
             "through the thin kernel, its own layers; without the kernel two of a draft model's in fp16; CPU "
             "only), off (the draft's own weights), or auto: int8 where it runs (a float32 draft on CPU), else off. "
             "The target still verifies in full precision, so the output is unchanged",
             "draft weights", choices=("auto", "off", "int8"), drafter_only=True,
             why="int8 drafted faster, at about the same acceptance, for every family measured on the reference "
                 "2-core CPU (BENCHMARKS.md)"),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def get(name: str) -> Setting:
    try:
        return BY_NAME[name]
    except KeyError:
        raise SpecvizError(f"unknown setting {name!r}; known settings: {', '.join(BY_NAME)}") from None


def default(name: str):
    return get(name).default


def defaults() -> dict[str, Any]:
    return {s.name: s.default for s in SETTINGS}


# ---- validation (the one place a user's value is checked) ---------------------------------------------------------
def check(setting: Setting | str, value, *, ui: bool = False):
    """``value`` converted to the setting's type when it is one (4.0 -> 4 for an integer); a one-line
    ``SpecvizError`` naming the setting and its range otherwise: nothing is clamped or rounded (2.5 is no integer,
    NaN and inf are no numbers). ``ui=True`` applies the UI's narrower range where the declaration gives one."""
    setting = setting if isinstance(setting, Setting) else get(setting)
    if value is None and setting.optional:
        return None
    if setting.type is bool:
        if not isinstance(value, bool):
            raise SpecvizError(f"{setting.cli_name} must be true or false, got {value!r}")
        return value
    if setting.type is str:
        if not isinstance(value, str):
            raise SpecvizError(f"{setting.cli_name} must be text, got {value!r}")
        value = value.strip()
        if setting.choices and value not in setting.choices:
            raise SpecvizError(f"{setting.cli_name} must be one of {', '.join(setting.choices)}, got {value!r}")
        if not value and not setting.optional:
            raise SpecvizError(f"{setting.cli_name} is empty")
        return value
    low, high = setting.ui_range if ui else (setting.low, setting.high)
    where = " here" if ui and (low, high) != (setting.low, setting.high) else ""
    if value is None:  # a cleared number box, or one the browser could not read as a number (text, 1e400)
        raise SpecvizError(f"{setting.cli_name} is empty or not a number: give "
                           f"{setting.describe_bounds(low, high)}{where}")
    wrong = SpecvizError(f"{setting.cli_name} must be {setting.describe_bounds(low, high)}{where}, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, int | float) or (isinstance(value, float) and
                                                                         not math.isfinite(value)):
        raise wrong
    if setting.type is int:
        if isinstance(value, float) and not value.is_integer():
            raise wrong
        value = int(value)
    else:
        value = float(value)
    open_low, open_high = setting.open_ends(low, high)
    if low is not None and (value < low or (open_low and value == low)):
        raise wrong
    if high is not None and (value > high or (open_high and value == high)):
        raise wrong
    return value


def check_exact(name: str, value) -> None:
    """``check`` for the engine's own configs, which API callers build directly: an integer setting must be given
    an int (the engine counts with it: ``4.0`` is refused rather than converted), and nothing is converted."""
    setting = get(name)
    if setting.type is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise SpecvizError(f"{setting.cli_name} must be {setting.describe_bounds(setting.low, setting.high)}, "
                           f"got {value!r}")
    check(setting, value)


class Values(Mapping):
    """Every declared setting with a checked value (missing ones take their default). Built by ``validate``;
    code that receives one need not check again."""

    __slots__ = ("_values",)

    def __init__(self, values: dict, _token=None):
        if _token is not _VALIDATED:
            raise TypeError("build Values with specviz.settings.validate()")
        self._values = values

    def __getitem__(self, name: str):
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Values({self._values!r})"

    def __reduce__(self):  # picklable (the UI's requests cross processes on ZeroGPU)
        return (_rebuild, (self._values,))

    def replace(self, **changes) -> Values:
        """A copy with ``changes`` (each one checked)."""
        return Values({**self._values, **{name: check(name, value) for name, value in changes.items()}}, _VALIDATED)

    def pick(self, names: Iterable[str]) -> dict:
        return {name: self._values[name] for name in names}


_VALIDATED = object()


def _rebuild(values: dict) -> Values:
    return Values(values, _VALIDATED)


def check_all(values: Mapping[str, Any], declared: Iterable[Setting], *, ui: bool = False) -> dict[str, Any]:
    """Every setting of ``declared`` checked (missing ones take their default); an unknown name is an error."""
    declared = list(declared)
    names = {s.name for s in declared}
    unknown = [name for name in values if name not in names]
    if unknown:
        raise SpecvizError(f"unknown setting {unknown[0]!r}; known settings: {', '.join(names)}")
    return {s.name: check(s, values[s.name], ui=ui) if s.name in values else s.default for s in declared}


def validate(values: Mapping[str, Any] | None = None, *, ui: bool = False) -> Values:
    """The run settings, each checked once; unknown names are an error, missing ones take their default."""
    if isinstance(values, Values) and not ui:
        return values
    return Values(check_all(values or {}, SETTINGS, ui=ui), _VALIDATED)


def _number(setting: Setting, text: str):
    """``text`` as a number when it reads as a finite one (``4``, ``4.0``, ``2.5``; else unchanged, so a message
    quotes ``'1e400'`` as typed): ``check`` then refuses what the setting does not take, in its own words, with its
    range (argparse's "invalid int value" gave neither, and ``int()`` would not say that 2.5 is no integer)."""
    if setting.type not in (int, float) or not isinstance(text, str):
        return text
    for kind in (setting.type, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        return value if math.isfinite(value) else text
    return text


def split(name: str, text: str) -> list:
    """A comma list of one setting's values (``--draft-quant off,int8`` in the benchmark), each checked."""
    setting = get(name)
    parts = [part.strip() for part in (text or "").split(",")]
    if any(parts) and "" in parts:
        raise SpecvizError(f"--{setting.cli_name} {text!r} has an empty entry")
    values = [check(setting, _number(setting, part)) for part in parts if part]
    if not values:
        options = " or ".join([*setting.choices, ",".join(setting.choices)]) if setting.choices else \
            setting.describe_bounds(setting.low, setting.high) if setting.type in (int, float) else "a value"
        raise SpecvizError(f"--{setting.cli_name} is empty; give {options}")
    return list(dict.fromkeys(values))


# ---- the command line --------------------------------------------------------------------------------------
GIVEN = "_given"  # the Namespace attribute naming the options given on the command line


def given(args: argparse.Namespace) -> set[str]:
    """Names of the declared options that were typed (the rest hold their defaults)."""
    return set(getattr(args, GIVEN, ()))


def _mark(namespace: argparse.Namespace, dest: str) -> None:
    marked = set(getattr(namespace, GIVEN, ()))
    marked.add(dest)
    setattr(namespace, GIVEN, marked)


class _Store(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        _mark(namespace, self.dest)


class _Const(argparse.Action):
    def __init__(self, option_strings, dest, const=None, default=None, help=None):
        super().__init__(option_strings, dest, nargs=0, const=const, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const)
        _mark(namespace, self.dest)


def help_text(setting: Setting, *, readers: str = "", listed: bool = False) -> str:
    """The CLI help: what it does, who reads it (``readers``: the drafter families), the default and why."""
    text = setting.help
    if readers:
        text += f" [{readers} only]"
    if listed:
        text += "; a comma list runs each value"
    if setting.type is not bool and setting.default is not None:
        text += f" (default: {setting.default}" + (f"; {setting.why}" if setting.why else "") + ")"
    return text.replace("%", "%%")


def add_options(parser: argparse.ArgumentParser, declared: Iterable[Setting] = SETTINGS, *,
                lists: Iterable[str] = (), readers: Mapping[str, str] | None = None) -> None:
    """One argparse option per declared setting (canonical flag + aliases), defaulting to the declaration.

    Values are checked by ``validate`` after parsing (one place, one-line messages naming the range), not by
    argparse, which only reads a number where the text is one (``_number``); names in
    ``lists`` take a comma list (see ``split``); ``readers`` names, per drafter-only setting, the families that
    read it (``specviz.drafters.registry.reader_titles``).
    """
    lists, readers = set(lists), dict(readers or {})
    for setting in declared:
        help = help_text(setting, readers=readers.get(setting.name, ""), listed=setting.name in lists)
        if setting.type is bool:
            if setting.flags:
                on_help = help if not setting.default else f"{help} (the default)"
                parser.add_argument(*setting.flags, dest=setting.name, action=_Const, const=True,
                                    default=setting.default, help=on_help)
            if setting.off_flags:
                off_help = setting.off_help or f"turn off: {setting.help}"
                parser.add_argument(*setting.off_flags, dest=setting.name, action=_Const, const=False,
                                    default=setting.default, help=off_help.replace("%", "%%"))
            continue
        kind = str if setting.name in lists or setting.type not in (int, float) else \
            functools.partial(_number, setting)
        metavar = "{" + ",".join(setting.choices) + "}" if setting.choices and setting.name not in lists else \
            setting.name.upper()
        parser.add_argument(*setting.flags, dest=setting.name, action=_Store, type=kind, default=setting.default,
                            metavar=metavar, help=help)


def from_args(args: argparse.Namespace, **overrides) -> Values:
    """The run settings of a parsed command line, checked (``overrides`` replace parsed values). A chain length
    typed without ``--tree`` or ``--chain`` asks for a chain: ``--k 4`` alone never drafts the default tree."""
    values = {s.name: getattr(args, s.name) for s in SETTINGS if hasattr(args, s.name)}
    typed = given(args)
    if "k" in typed and "tree" not in typed and "tree" in values:
        values["tree"] = False
    return validate({**values, **overrides})


def command_args(values: Mapping[str, Any], declared: Iterable[Setting] = SETTINGS) -> list[str]:
    """The CLI arguments that reproduce ``values``: the ``always`` settings, and the others where they differ
    from the default. A list-valued entry (e.g. a benchmark's precisions) is written as a comma list."""
    parts: list[str] = []
    for setting in declared:
        if setting.name not in values:
            continue
        value = values[setting.name]
        if isinstance(value, list | tuple):
            value = ",".join(setting.format(v) for v in value)
            changed = value != setting.format(setting.default)
        else:
            changed = value != setting.default
        if setting.type is bool:
            if changed or setting.emit == "always":
                parts.append(setting.flags[0] if value else setting.off_flags[0])
            continue
        if value is None or not (changed or setting.emit == "always"):
            continue
        parts += [setting.flags[0], setting.format(value)]
    return parts


def command_line(words: Iterable[str]) -> str:
    return shlex.join(list(words))
