"""The retrieval drafter (SuffixDecoding/REST with cache reuse): its stores find what brute force finds, its trees
follow SuffixDecoding's rules, output is exactly the target's (greedy and sampled, with a broken-rule control), and
one session's answers never reach another session."""

from __future__ import annotations

import random

import numpy as np
import pytest
import tiny
import torch
from test_ngram_schedule import CONFIG, FAIL_P, PASS_P, engine_pairs, trust_every_draft
from test_sampling_lossless import chi_square_p

from specviz import api
from specviz.drafters import retrieval
from specviz.drafters.retrieval import RetrievalDrafter, session_memory
from specviz.drafters.suffix_store import LiveText, SessionMemory, SuffixIndex, suffix_array
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig, generate, plain_decode
from specviz.engine.sampling import SamplingConfig
from specviz.errors import SpecvizError

VOCAB = 64


# ---- the stores against brute force -----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_the_suffix_array_sorts_suffixes(seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(-3, 5, size=int(rng.integers(1, 300)))
    expected = sorted(range(len(tokens)), key=lambda i: tuple(tokens[i:]))
    assert suffix_array(tokens).tolist() == expected


def brute_longest(documents: list[list[int]], context: list[int], longest: int) -> int:
    best = 0
    for doc in documents:
        for end in range(len(doc)):
            length = 0
            while length < min(longest, len(context)) and end - length >= 0 and \
                    doc[end - length] == context[-1 - length]:
                length += 1
            best = max(best, length)
    return best


def brute_continuations(documents, labels, context, length, depth) -> list[tuple]:
    found = []
    for doc, label in zip(documents, labels):
        for start in range(length, len(doc) + 1):
            if doc[start - length:start] == context[-length:] and doc[start:start + depth]:
                found.append((tuple(doc[start:start + depth]), label, start))
    return sorted(found)


@pytest.mark.parametrize("seed", range(6))
def test_the_index_finds_the_longest_match_and_what_followed_it(seed):
    rng = random.Random(seed)
    documents = [[rng.randrange(6) for _ in range(rng.randrange(0, 60))] for _ in range(rng.randrange(1, 5))]
    labels = [f"doc {i}" for i in range(len(documents))]
    index = SuffixIndex(list(zip(labels, documents)))
    for _ in range(20):
        context = [rng.randrange(6) for _ in range(rng.randrange(1, 12))]
        length = index.longest_match(context, 8)
        assert length == brute_longest(documents, context, 8)
        if length:
            got = sorted((c.tokens, c.source, c.at) for c in index.continuations(context, length, 3))
            assert got == brute_continuations(documents, labels, context, length, 3)  # never across documents


def test_the_live_text_matches_earlier_occurrences_only():
    prompt = [1, 2, 3, 9, 1, 2, 3, 4]
    live = LiveText(prompt)
    context = [*prompt, 7, 1, 2]
    live.extend(context)
    assert live.longest_match(context, 8) == 2  # "1 2" twice before; the context's own end does not count
    found = sorted((c.tokens, c.source, c.at) for c in live.continuations(context, 2, 3))
    assert found == [((3, 4, 7), "this prompt", 6), ((3, 9, 1), "this prompt", 2)]
    assert live.longest_match([5, 6], 8) == 0


def test_session_memory_is_capped_and_oldest_answers_go_first():
    memory = SessionMemory(cap=10)
    memory.add([1, 2, 3, 4])
    memory.add([5, 6, 7, 8])
    memory.add([9, 10, 11])
    assert len(memory) == 2 and memory.index().labels == ["answer 2 of this session", "answer 3 of this session"]
    assert memory.index().longest_match([1, 2], 4) == 0


# ---- the drafts ------------------------------------------------------------------------------------------------
def test_trees_follow_frequency_size_and_width():
    memory = SessionMemory()
    for answer in ([7, 8, 9, 10], [7, 8, 9, 10], [7, 8, 9, 11], [7, 8, 12, 13]):
        memory.add(answer)
    drafter = RetrievalDrafter(memory=memory, spec_factor=2.0, min_probability=0.0)
    drafter.begin([5, 7, 8])
    tree = drafter.propose([5, 7, 8], DraftBudget(tree=True, width=2, depth=3, max_nodes=8), CONFIG,
                           torch.Generator())
    # match "7 8" (length 2) in four answers: at most 2 × 2 = 4 nodes, best path score first (9 10 beats 9 11)
    assert tree.tokens == [9, 10, 12, 13] and tree.parents == [-1, 0, -1, 2]
    assert tree.confidence == [0.75, 0.5, 0.25, 0.25]
    assert tree.meta["retrieval"][0] == {"source": "answer 1 of this session", "count": 3, "of": 4,
                                         "sources": {"answer 1 of this session": 1, "answer 2 of this session": 1,
                                                     "answer 3 of this session": 1}}
    assert tree.meta["retrieved"]["length"] == 2 and tree.meta["retrieved"]["occurrences"] == 4
    chain = drafter.propose([5, 7, 8], DraftBudget(k=4), CONFIG, torch.Generator())
    assert chain.tokens == [9, 10] and chain.is_chain  # 2 × the match length, on the most frequent path


def test_rare_continuations_are_not_drafted():
    memory = SessionMemory()
    for answer in ([1, 2, 3], *[[1, 2, 4]] * 10):
        memory.add(answer)
    drafter = RetrievalDrafter(memory=memory, spec_factor=4.0)
    drafter.begin([1, 2])
    tree = drafter.propose([1, 2], DraftBudget(tree=True, width=4, depth=1, max_nodes=8), CONFIG, torch.Generator())
    assert tree.tokens == [4]  # 3 followed 1 time in 11: below SuffixDecoding's 0.1


PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17, 5, 9, 3, 17]


@pytest.fixture(scope="module")
def target():
    return tiny.target("llama", VOCAB, layers=2, scale=25)


@pytest.mark.parametrize("budget", [DraftBudget(k=4), DraftBudget(tree=True, width=3, depth=4, max_nodes=8)],
                         ids=["chain", "tree"])
def test_greedy_output_is_the_targets(target, budget):
    config = GenerationConfig(max_new_tokens=40, seed=1)
    plain = plain_decode(target, PROMPT, config).token_ids
    memory = SessionMemory()
    memory.add(plain[5:30])  # an earlier answer much like this one: reused
    memory.add([int(t) % VOCAB for t in range(100)])
    run = generate(target, PROMPT, config, RetrievalDrafter(memory=memory), budget)
    assert run.token_ids == plain
    sources = {label for r in run.rounds for label in r.meta.get("node_labels", [])}
    assert "answer 1 of this session" in sources
    assert sum(len(r.accepted) for r in run.rounds) > 10  # the reused answer was drafted and accepted


def sampled_pairs(samples: int) -> tuple[dict, dict]:
    memory = SessionMemory()
    memory.add([1, 5, 3, 3, 1, 5, 3, 4, 1, 5, 2, 2])
    counts, exact, rounds = engine_pairs(lambda: RetrievalDrafter(memory=memory, spec_factor=2.0, min_probability=0.0),
                                         DraftBudget(tree=True, width=3, depth=2, max_nodes=4), samples)
    assert all(run[0].tokens for run in rounds)  # a tree was drafted and verified
    return counts, exact


def test_sampled_output_keeps_the_target_distribution():
    counts, exact = sampled_pairs(1_500)
    assert chi_square_p(counts, exact) > PASS_P


def test_a_verifier_that_trusts_retrieved_drafts_is_detected(monkeypatch):
    trust_every_draft(monkeypatch)
    counts, exact = sampled_pairs(300)
    assert chi_square_p(counts, exact) < FAIL_P


# ---- the family ------------------------------------------------------------------------------------------------
def test_a_corpus_is_read_and_named(target, tmp_path):
    text = " ".join(f"w{i % 7}" for i in range(200))
    (tmp_path / "notes.txt").write_text(text)
    drafter = api.make_drafter(f"retrieval:{tmp_path}", target)
    assert drafter.describe()["corpus"]["name"] == tmp_path.name and drafter.describe()["corpus"]["tokens"] > 100
    ids = [int(t) for t in target.tokenizer.encode(text, add_special_tokens=False)]
    drafter.begin(ids[:3])
    tree = drafter.propose(ids[:12], DraftBudget(k=4), SamplingConfig(), torch.Generator())
    assert tree.tokens and set(tree.meta["node_labels"]) <= {"corpus: notes.txt", "this prompt"}


def test_bad_corpora_are_one_line(target, tmp_path):
    (tmp_path / "image.bin").write_bytes(b"\x00\x01")
    for spec, message in ((f"retrieval:{tmp_path / 'missing'}", "does not exist"),
                          (f"retrieval:{tmp_path}", "holds no text files")):
        with pytest.raises(SpecvizError, match=message) as error:
            api.make_drafter(spec, target)
        assert "\n" not in str(error.value)
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(SpecvizError, match="not readable UTF-8"):
        api.make_drafter(f"retrieval:{tmp_path / 'bad.txt'}", target)


def test_sessions_do_not_share_answers_unless_the_operator_says_so(monkeypatch):
    monkeypatch.delenv(retrieval.SHARED_ENV, raising=False)
    first, second = session_memory(), session_memory()
    first.add([1, 2, 3])
    assert first is not second and len(second) == 0
    monkeypatch.setenv(retrieval.SHARED_ENV, "1")
    assert session_memory() is session_memory()


def test_the_debugger_says_where_a_retrieved_node_came_from(target):
    from specviz.viz.debugger import why_proposed

    memory = SessionMemory()
    memory.add([9, 8, 7, 6])
    memory.add([9, 8, 7, 5])
    prompt = [1, 2, 9, 8]
    drafter = RetrievalDrafter(memory=memory, decode=target.decode)
    run = generate(target, prompt, GenerationConfig(max_new_tokens=1), drafter, DraftBudget(k=2))
    text = why_proposed(run.rounds[0], 0)
    assert "retrieval found the context's last 2 tokens (“w9␣w8”) 2 times in its stores" in text
    assert "2 of the 2 occurrences" in text and "answer 1 of this session 1×, answer 2 of this session 1×" in text
    assert "product of each step" in text


def test_the_bench_gives_each_prompt_the_other_prompts_answers(target):
    from specviz.bench.configs import build_specs
    from specviz.bench.prompts import BenchPrompt
    from specviz.bench.suite import run_suite

    prompts = [BenchPrompt(str(i), "writing", text) for i, text in enumerate(["w1 w2 w3", "w4 w5 w1", "w2 w2 w6"])]
    drafter = RetrievalDrafter()
    seen = []
    propose = drafter.propose

    def watched(*args):
        index = drafter.memory.index()
        seen.append(index.labels if index is not None else [])  # empty in the warm-up run
        return propose(*args)
    drafter.propose = watched
    specs = build_specs(["retrieval"], ["chain"], DraftBudget(k=3), hf=False)
    assert "never the prompt's own" in specs[0].note
    config = GenerationConfig(max_new_tokens=6)
    suite = run_suite(target, prompts, specs, {"retrieval": drafter}, config, chat=False)
    assert all(s.result.token_ids == s.reference for s in suite.samples)  # exact
    labels = {tuple(labels) for labels in seen[-3:]}  # the last prompt's rounds: the first two prompts' answers
    assert labels == {("the answer to #0 (writing)", "the answer to #1 (writing)")}
