"""The attention a forward runs is chosen per call (``specviz.engine.attention``), never by writing the model's config.

The app runs two engine threads on one cached target. When the choice was a config attribute every layer reads per
call, one thread's switch (a tree forward switched to SDPA, the draft model's incremental forwards, a benchmark's
backend) reached the other thread's forward, and the two restores could leave the wrong value behind.

Each threaded test runs two threads on ONE model object with different attention and makes their forwards overlap
layer by layer: the recording attention functions meet at a barrier on every call, so both threads' layer i runs
between the same two rendezvous. A choice leaking from one thread to the other would show in the first round: the
recorded function (and whether a mask came, which depends on the mask transformers built for the choice), and the
logits, which must equal those of the same forward run alone. A spy on the config class sees no write of the
attention implementation at all.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

import pytest
import tiny
import torch
from transformers import AttentionInterface, PreTrainedConfig
from transformers.models.llama import modeling_llama

from specviz.engine import attention
from specviz.engine import cache as kv
from specviz.engine.tree import DraftTree
from specviz.engine.verify import forward_tree, masked_forward, prefill, tree_visibility
from specviz.models import cascade_attention

cascade_attention.register()

VOCAB, ROUNDS = 64, 12
CONTEXT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17, 8]
PAST = len(CONTEXT) - 1
SHAPES = [DraftTree.chain([5, 9, 12]), DraftTree(tokens=[5, 9, 12, 7], parents=[-1, -1, 0, 1])]
CHOICES = ("sdpa", "eager", cascade_attention.NAME)


class Recorder:
    """Wraps the attention functions transformers resolves by name: records ``(function, mask given)`` per thread and,
    once ``meet`` is set, waits for the other thread at every call (one call per layer per forward)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.calls: dict[str, list[tuple[str, bool]]] = defaultdict(list)
        self.barrier = threading.Barrier(2, timeout=60)
        self.meet = False
        for name in ("sdpa", cascade_attention.NAME):
            wrapped = self._recording(name, AttentionInterface._global_mapping[name])
            monkeypatch.setitem(AttentionInterface._global_mapping, name, wrapped)
        monkeypatch.setattr(modeling_llama, "eager_attention_forward",
                            self._recording("eager", modeling_llama.eager_attention_forward))

    def _recording(self, name: str, function: Callable) -> Callable:
        def recording(module, query, key, value, attention_mask, *args, **kwargs):
            self.calls[threading.current_thread().name].append((name, attention_mask is not None))
            if self.meet:
                self.barrier.wait()
            return function(module, query, key, value, attention_mask, *args, **kwargs)

        return recording

    def take(self) -> list[tuple[str, bool]]:
        """This thread's calls since the last ``take``."""
        calls = self.calls[threading.current_thread().name]
        taken = list(calls)
        calls.clear()
        return taken

    def run_together(self, jobs: dict[str, Callable[[], None]]) -> None:
        """Each job in its own thread (named by its key), all at once; the first real failure is raised here (a failing
        thread aborts the barrier so the other one does not wait for it)."""
        errors: list[BaseException] = []

        def guarded(job: Callable[[], None]) -> None:
            try:
                job()
            except BaseException as error:  # noqa: B036 - re-raised in the main thread
                errors.append(error)
                self.barrier.abort()

        self.meet = True
        threads = [threading.Thread(target=guarded, args=(job,), name=name) for name, job in jobs.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        self.meet = False
        assert not any(thread.is_alive() for thread in threads), "a thread hung"
        if errors:
            raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    return Recorder(monkeypatch)


@pytest.fixture
def config_writes(monkeypatch) -> list[tuple[object, str, object]]:
    """``(config, attribute, value)`` for every write of an attention-implementation attribute to any config from here
    on (the property and the field behind it both go through ``__setattr__``); building a model writes some."""
    writes = []
    original = PreTrainedConfig.__setattr__

    def spy(self, key, value):
        if "attn_implementation" in key:
            writes.append((self, key, value))
        original(self, key, value)

    monkeypatch.setattr(PreTrainedConfig, "__setattr__", spy)
    return writes


def prefilled(model: torch.nn.Module, name: str):
    cache = kv.new_cache(model, 64, "tiny")
    with attention.attention_implementation(model, name):
        prefill(model, cache, CONTEXT[:-1])
    return cache


def verify_forward(model: torch.nn.Module, cache, round_index: int) -> torch.Tensor:
    """Round ``round_index``'s verify forward (a chain, then a tree, in turn), the cache rolled back after it."""
    logits = forward_tree(model, cache, SHAPES[round_index % 2], CONTEXT[-1], PAST)
    kv.crop_to(cache, PAST)
    return logits


def hidden_prefix_visibility() -> torch.Tensor:
    """The tree's visibility with one prefix column hidden from one node: a draft model's incremental tree forward,
    which the cascade does not take (``mask_capable_attention`` runs it on SDPA)."""
    visible = tree_visibility(SHAPES[1], PAST).clone()
    visible[2, 3] = False
    return visible


def draft_forward(model: torch.nn.Module, cache) -> torch.Tensor:
    tree = SHAPES[1]
    positions = [PAST + d for d in (0, *tree.depth)]
    logits = masked_forward(model, cache, [CONTEXT[-1], *tree.tokens], positions, hidden_prefix_visibility())
    kv.crop_to(cache, PAST)
    return logits


def test_two_threads_on_one_model_each_run_their_own_attention(recorder, config_writes):
    """One thread runs eager attention, the other the cascade, on the same model object at the same time, round
    after round of chains and trees: each forward runs its own thread's function with its own mask (eager gets a
    materialised causal mask for a chain, the cascade none) and gives the logits it gives alone."""
    model = tiny.model("llama", VOCAB, layers=2, scale=4)
    configured = model.config._attn_implementation
    config_writes.clear()
    choices = {"eager-thread": "eager", "cascade-thread": cascade_attention.NAME}
    caches = {thread: prefilled(model, name) for thread, name in choices.items()}
    expected = {}
    for thread, name in choices.items():
        with attention.attention_implementation(model, name):
            expected[thread] = [verify_forward(model, caches[thread], r) for r in range(2)]
    recorder.calls.clear()

    def job(thread: str) -> Callable[[], None]:
        def run() -> None:
            name = choices[thread]
            for round_index in range(ROUNDS):
                with attention.attention_implementation(model, name):
                    logits = verify_forward(model, caches[thread], round_index)
                calls = recorder.take()
                chain = round_index % 2 == 0
                mask_given = not (chain and name == cascade_attention.NAME)
                assert calls == [(name, mask_given)] * 2, f"{thread}, round {round_index}: ran {calls}"
                torch.testing.assert_close(logits, expected[thread][round_index % 2], atol=1e-5, rtol=1e-4)

        return run

    recorder.run_together({thread: job(thread) for thread in choices})
    assert config_writes == []
    assert model.config._attn_implementation == configured


def test_a_drafting_thread_switching_to_sdpa_leaves_the_verifying_thread_on_the_cascade(recorder, config_writes):
    """The target drafting for itself in one thread (incremental tree forwards, switched to SDPA per call) while the
    other thread verifies on the same model with the cascade it is configured with."""
    model = tiny.model("llama", VOCAB, layers=2, scale=4, attention=cascade_attention.NAME)
    config_writes.clear()
    caches = {thread: prefilled(model, cascade_attention.NAME) for thread in ("verify-thread", "draft-thread")}
    expected_verify = [verify_forward(model, caches["verify-thread"], r) for r in range(2)]
    with attention.attention_implementation(model, "sdpa"):
        expected_draft = draft_forward(model, caches["draft-thread"])
    recorder.calls.clear()

    def verify() -> None:
        for round_index in range(ROUNDS):
            logits = verify_forward(model, caches["verify-thread"], round_index)
            calls = recorder.take()
            assert calls == [(cascade_attention.NAME, round_index % 2 == 1)] * 2, f"round {round_index}: ran {calls}"
            torch.testing.assert_close(logits, expected_verify[round_index % 2], atol=1e-5, rtol=1e-4)

    def draft() -> None:
        for round_index in range(ROUNDS):
            logits = draft_forward(model, caches["draft-thread"])
            calls = recorder.take()
            assert calls == [("sdpa", True)] * 2, f"round {round_index}: ran {calls}"
            torch.testing.assert_close(logits, expected_draft, atol=1e-5, rtol=1e-4)

    recorder.run_together({"verify-thread": verify, "draft-thread": draft})
    assert config_writes == []
    assert model.config._attn_implementation == cascade_attention.NAME


@pytest.mark.parametrize("configured", ["sdpa", "eager"])
def test_a_choice_runs_what_a_model_configured_with_it_runs(configured, config_writes):
    """Prefill, chains and trees on a model switched per call give the logits of the same weights loaded with that
    attention (the mask transformers builds follows the choice too), and the choice stays with the model it was made
    for: a copy of it in the same block keeps its own, and ``describe`` names what runs."""
    switched = tiny.model("llama", VOCAB, layers=2, scale=4, attention=configured)
    bystander = tiny.model("llama", VOCAB, layers=2, scale=4, attention=configured)
    loaded = {name: tiny.model("llama", VOCAB, layers=2, scale=4, attention=name) for name in CHOICES}
    config_writes.clear()
    for name in CHOICES:
        cache, reference_cache = kv.new_cache(switched, 64, "tiny"), kv.new_cache(loaded[name], 64, "tiny")
        with attention.attention_implementation(switched, name):
            assert attention.implementation(switched) == name and attention.implementation(bystander) == configured
            assert attention.describe(switched) == attention.describe(loaded[name])
            prefill(switched, cache, CONTEXT[:-1])
            got = [verify_forward(switched, cache, r) for r in range(2)]
        prefill(loaded[name], reference_cache, CONTEXT[:-1])
        expected = [verify_forward(loaded[name], reference_cache, r) for r in range(2)]
        for ours, theirs in zip(got, expected, strict=True):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    assert attention.implementation(switched) == switched.config._attn_implementation == configured
    assert config_writes == []


def test_nested_choices_restore_and_unknown_names_are_refused():
    model = tiny.model("llama", VOCAB, layers=1)
    configured = model.config._attn_implementation
    with attention.attention_implementation(model, "eager"):
        with attention.attention_implementation(model, cascade_attention.NAME):
            assert attention.implementation(model) == cascade_attention.NAME
        assert attention.implementation(model) == "eager"
    assert attention.implementation(model) == configured
    with pytest.raises(ValueError, match="unknown attention implementation"):
        attention.attention_implementation(model, "no-such-attention").__enter__()
