"""The schedule: per prompt, plain decoding between every configuration (A B A C A D ... A), after a warm-up.

Each configuration's speedup is taken against the two plain runs on either side of it, so slow drift of the
machine (another process, thermal state) cancels to first order; the configuration order rotates from prompt to
prompt so no configuration always follows the same one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from specviz.bench.configs import RunSpec
from specviz.bench.prompts import BenchPrompt
from specviz.bench.runners import RunResult, run_hf, run_specviz
from specviz.drafters.retrieval import RetrievalDrafter
from specviz.drafters.suffix_store import SessionMemory
from specviz.engine.drafter import Drafter
from specviz.engine.loop import GenerationConfig
from specviz.engine.target import Target
from specviz.errors import SpecvizError

Runner = Callable[[list[int], GenerationConfig], RunResult]
WARM_UP_TOKENS = 8


@dataclass
class Sample:
    """One configuration on one prompt, with the plain runs just before and after it."""

    spec: str
    prompt: BenchPrompt
    result: RunResult
    plain: tuple[RunResult, RunResult]
    reference: list[int]  # the prompt's first plain output (greedy outputs must equal it)


@dataclass
class PromptRuns:
    prompt: BenchPrompt
    prompt_tokens: int
    plain: list[RunResult] = field(default_factory=list)


@dataclass
class SuiteResult:
    specs: list[RunSpec]
    samples: list[Sample]
    prompts: list[PromptRuns]
    wall_s: float


def make_runner(spec: RunSpec, target: Target, drafters: dict[str, Drafter], reference: Target | None = None) -> Runner:
    """The timed call for one row; transformers' rows run on ``reference`` (transformers' own forward) when given."""
    if spec.engine == "specviz":
        drafter = drafters[spec.drafter_key] if spec.drafter else None
        return lambda ids, config: run_specviz(target, ids, config, drafter, spec.budget if drafter else None)
    if spec.engine != "hf":
        raise SpecvizError(f"row {spec.name!r} runs on {spec.engine}, whose runs this suite was not given")
    target = reference or target
    if spec.drafter is None:  # plain generate, or a target drafting for itself (its MTP layers)
        return lambda ids, config: run_hf(target, ids, config, **spec.hf_kwargs)
    assistant = getattr(drafters.get(spec.drafter), "source_model", None)  # a draft LM, untrimmed (--draft-vocab is
    if assistant is not None:                                               # specviz's): assisted generation
        return lambda ids, config: run_hf(target, ids, config, assistant=assistant, assistant_settings=spec.hf_kwargs)
    return lambda ids, config: run_hf(target, ids, config, **spec.hf_kwargs)


def session_memories(target: Target, prompts: list[BenchPrompt], encoded: list[list[int]],
                     config: GenerationConfig) -> list[SessionMemory]:
    """Per prompt, a retrieval drafter's session memory: the answers of every other prompt (plain decoding with the
    run's settings, untimed), never its own, as an app session that asked those questions before would hold."""
    answers = [run_specviz(target, ids, config).token_ids for ids in encoded]
    memories = []
    for index in range(len(prompts)):
        memory = SessionMemory()
        for other, (prompt, answer) in enumerate(zip(prompts, answers)):
            if other != index:
                memory.add(answer, label=f"the answer to #{prompt.question_id} ({prompt.category})")
        memories.append(memory)
    return memories


def _check_lengths(target: Target, prompts: list[BenchPrompt], encoded: list[list[int]],
                   config: GenerationConfig) -> None:
    """Refuse up front a prompt that cannot fit the context window, rather than after minutes of runs (the engine's
    rule: drafts never reach past the last new token, so the prompt and the new tokens must fit)."""
    for prompt, ids in zip(prompts, encoded):
        if len(ids) + config.max_new_tokens > target.max_positions:
            raise SpecvizError(f"prompt #{prompt.question_id} ({prompt.category}) is {len(ids)} tokens: with "
                               f"{config.max_new_tokens} new tokens it overflows {target.name}'s "
                               f"{target.max_positions}-token context")


def run_suite(
    target: Target,
    prompts: list[BenchPrompt],
    specs: list[RunSpec],
    drafters: dict[str, Drafter],
    config: GenerationConfig,
    *,
    chat: bool,
    log: Callable[[str], None] = lambda line: None,
    reference: Target | None = None,
    given: Mapping[str, Runner] | None = None,
    plain: Runner | None = None,
) -> SuiteResult:
    """Run every configuration on every prompt, interleaved with plain decoding; warm-up runs are not recorded.

    Plain decoding and specviz's rows run on ``target``; transformers' rows on ``reference`` when given. ``given``:
    the timed call of rows specviz does not run itself (a vLLM server's), by row name; ``plain``: another engine's
    plain decoding to interleave instead of specviz's (vLLM's own speculative rows against its own plain decoding).
    """
    encoded = [target.encode_prompt(p.text, chat=chat) for p in prompts]  # fails early on a bad prompt
    _check_lengths(target, prompts, encoded, config)
    given = given or {}
    runners = {spec.name: given.get(spec.name) or make_runner(spec, target, drafters, reference) for spec in specs}
    retrievers = [d for d in drafters.values() if isinstance(d, RetrievalDrafter)]
    memories = session_memories(target, prompts, encoded, config) if retrievers else []
    if plain is None:
        plain = lambda ids, cfg: run_specviz(target, ids, cfg)  # noqa: E731
    warm = replace(config, max_new_tokens=min(WARM_UP_TOKENS, config.max_new_tokens))
    for run in (plain, *runners.values()):
        run(encoded[0], warm)
    samples: list[Sample] = []
    runs: list[PromptRuns] = []
    start = time.perf_counter()
    for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
        shift = index % len(specs) if specs else 0
        order = specs[shift:] + specs[:shift]
        for drafter in retrievers:
            drafter.memory = memories[index]
        record = PromptRuns(prompt, len(ids), [plain(ids, config)])
        for spec in order:
            result = runners[spec.name](ids, config)
            record.plain.append(plain(ids, config))
            samples.append(Sample(spec.name, prompt, result, (record.plain[-2], record.plain[-1]),
                                  record.plain[0].token_ids))
        runs.append(record)
        elapsed = time.perf_counter() - start
        eta = elapsed / (index + 1) * (len(prompts) - index - 1)
        log(f"[{index + 1}/{len(prompts)}] {prompt.category} #{prompt.question_id}: {len(ids)} prompt tokens, "
            f"{elapsed:.0f} s elapsed, ~{eta:.0f} s left")
    return SuiteResult(specs, samples, runs, time.perf_counter() - start)
