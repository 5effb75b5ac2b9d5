"""EAGLE heads: lossless drafting, the head's cache, the feature-layer numbering, and the published layouts.

Heads are built in-process on tiny random targets and fitted for a few seconds to the target's own greedy
continuations (teacher-forced cross-entropy), so their drafts are partly accepted: a random head is almost never
right, which would leave the accept paths untested.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import tiny
import torch
from test_sampling_lossless import CONFIG, FAIL_P, PASS_P, Table, V, chi_square_p
from test_sampling_lossless import PROMPT as SAMPLING_PROMPT
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from specviz.drafters import eagle_layouts as layouts
from specviz.drafters import registry
from specviz.drafters.checkpoint_files import TargetShape, read_config, read_tensors
from specviz.drafters.eagle import (
    FORMAT,
    EagleDrafter,
    EagleHead,
    build_head,
    load_head,
    new_head,
    save_head,
)
from specviz.engine import accept as accept_module
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig, generate
from specviz.engine.sampling import SamplingConfig
from specviz.engine.target import Target
from specviz.errors import SpecvizError
from specviz.training.trainers.eagle import draft_ids_from_counts, unroll_steps

VOCAB = 64
LAYERS = 8  # EAGLE-3's default feature layers (2, L//2, L-3) = (2, 4, 5)
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]
NEW_TOKENS = 48
SHAPES = [DraftBudget(k=1), DraftBudget(k=4), DraftBudget(tree=True, width=2, depth=3, max_nodes=6),
          DraftBudget(tree=True, width=4, depth=5, max_nodes=24)]
LAYOUT_DIR = Path(__file__).resolve().parent / "data" / "layouts"  # published configs and key names, see README.md
SMOLLM2 = TargetShape(hidden_size=576, num_layers=30, vocab_size=49152)


def fit(head: EagleHead, net: torch.nn.Module, steps: int = 100, seed: int = 0, unrolled: int = 2) -> EagleHead:
    """A stand-in for real training that makes drafts partly right: the training-time test (``unroll_steps``, step i
    weighted 0.8^i) on the target's greedy continuations of random prompts, labels = the target's argmax."""
    generator = torch.Generator().manual_seed(seed)
    vocab = head.spec.vocab_size
    seqs = torch.randint(0, vocab, (16, 4), generator=generator)
    with torch.no_grad():
        for _ in range(44):
            seqs = torch.cat([seqs, net(seqs).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        out = net(seqs, output_hidden_states=True)
    length = seqs.shape[1] - unrolled
    feats = torch.cat([out.hidden_states[i] for i in head.feature_layers], dim=-1)[:, :length]
    tokens, predicted = seqs[:, 1: length + unrolled], out.logits.argmax(-1)
    to_draft = torch.arange(vocab)
    if head.draft_ids() is not None:  # labels outside the draft vocabulary cannot be learnt: ignore them
        to_draft = torch.full((vocab,), -100, dtype=torch.long)
        to_draft[head.draft_ids()] = torch.arange(head.spec.draft_vocab_size)
    labels = [to_draft[predicted[:, 1 + i: 1 + i + length]] for i in range(unrolled)]
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    head.train()
    torch.manual_seed(seed)
    for _ in range(steps):
        loss = sum(0.8 ** i * torch.nn.functional.cross_entropy(
            head.logits(output).reshape(-1, head.spec.draft_vocab_size), labels[i].reshape(-1), ignore_index=-100)
            for i, output in enumerate(unroll_steps(head, feats, tokens, unrolled)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


def copy_head(head: EagleHead, model: torch.nn.Module) -> EagleHead:
    """The same weights on another target object (e.g. the fast path's copy of the same model)."""
    return build_head(model, head.spec, head.state_dict())


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request):
    arch = request.param
    targets = tiny.both_forwards(arch, VOCAB, layers=LAYERS, scale=25)
    baselines = tiny.plain_outputs(targets, PROMPT, NEW_TOKENS)
    model = targets["hf"].model
    counts = torch.arange(VOCAB, 0, -1).float()  # a reduced draft vocabulary: the first 56 ids, as frequent tokens
    heads = {"eagle": fit(new_head(model, "eagle", seed=1), model),
             "eagle3": fit(new_head(model, "eagle3", seed=1, draft_ids=draft_ids_from_counts(counts, 56)), model)}
    return targets, baselines, heads


@pytest.mark.parametrize("budget", SHAPES, ids=lambda b: b.describe().replace(" ", "_"))
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("forward", ["hf", "fast"])
def test_greedy_matches_plain(setup, forward, kind, budget):
    targets, baselines, heads = setup
    target = targets[forward]
    drafter = EagleDrafter(copy_head(heads[kind], target.model), target.vocab_size)
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS), drafter, budget)
    assert run.token_ids == baselines[forward]
    assert all(r.rule == "greedy" and r.lossless for r in run.rounds)
    assert all(len(r.tokens) <= (budget.max_nodes if budget.tree else budget.k) for r in run.rounds)
    assert any(len(r.accepted) < len(r.tokens) for r in run.rounds)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_drafts_are_partly_accepted(setup, kind):
    targets, _, heads = setup
    target = targets["hf"]
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS), EagleDrafter(heads[kind], VOCAB),
                   DraftBudget(tree=True, width=4, depth=5, max_nodes=24))
    accepted, drafted = sum(len(r.accepted) for r in run.rounds), sum(len(r.tokens) for r in run.rounds)
    assert 0 < accepted < drafted
    assert run.rounds[0].meta["pruned"], "a w4 d5 tree drafts more than 24 nodes: the rerank must prune some"


def test_tree_records_confidence_pruned_nodes_and_draft_vocab(setup):
    targets, _, heads = setup
    target, head = targets["hf"], heads["eagle3"]
    outside = sorted(set(range(VOCAB)) - set(head.draft_ids().tolist()))
    trees = []

    class Keeping(EagleDrafter):
        def propose(self, *args):
            trees.append(super().propose(*args))
            return trees[-1]

    run = Generation(target, PROMPT, GenerationConfig(max_new_tokens=16), Keeping(head, VOCAB),
                     DraftBudget(tree=True, width=3, depth=4, max_nodes=8))
    for record in run:
        tree = trees[-1]
        assert tree.q_dist is not None and float(tree.q_dist[:, outside].abs().max()) == 0.0  # q = 0 off the vocab
        for node, parent in enumerate(tree.parents):
            expected = tree.q_token[node] * (1.0 if parent < 0 else tree.confidence[parent])
            assert tree.confidence[node] == pytest.approx(expected, rel=1e-5)  # path product of draft probabilities
            if parent >= 0:
                assert tree.q_dist[parent + 1][tree.tokens[node]] == pytest.approx(tree.q_token[node])
        pruned = tree.meta["pruned"]
        assert pruned or len(tree) < 8  # fewer candidates than the budget only when the depth was capped at the end
        assert not pruned or min(tree.confidence) >= max(p["confidence"] for p in pruned) - 1e-9  # kept the best
        for index, p in enumerate(pruned):
            assert (p["parent"] is None) != (p["pruned_parent"] is None)
            assert p["parent"] is None or -1 <= p["parent"] < len(tree)
            assert p["pruned_parent"] is None or p["pruned_parent"] < index
        json.dumps(record.meta)  # the round record holds plain JSON
        assert record.confidence == tree.confidence


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_head_cache_equals_a_fresh_feed_of_the_committed_pairs(setup, kind):
    """After every round the head's cache (brought up to date) holds exactly the committed pairs (f[t], x[t+1])
    fed once with the target's real features: what one forward over the whole text gives."""
    targets, _, heads = setup
    target, head = targets["hf"], heads[kind]
    drafter = EagleDrafter(head, VOCAB, pack=False)
    run = Generation(target, PROMPT, GenerationConfig(max_new_tokens=30), drafter,
                     DraftBudget(tree=True, width=3, depth=4, max_nodes=12))
    context = list(PROMPT)
    checked = 0
    for record in run:
        context += record.committed
        if record.finished:
            break
        drafter.catch_up(context)
        with torch.inference_mode():
            states = target.model(torch.tensor([context]), output_hidden_states=True).hidden_states
            feats = torch.cat([states[i][:, : len(context) - 1] for i in head.feature_layers], dim=-1)
            fresh = DynamicCache()
            out = head(feats, torch.tensor([context[1:]]), torch.arange(len(context) - 1), cache=fresh)
        ours = drafter.head_cache.layers[0]
        assert ours.keys.shape == fresh.layers[0].keys.shape
        torch.testing.assert_close(ours.keys, fresh.layers[0].keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours.values, fresh.layers[0].values, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(drafter.last_output(0, len(context)), out[0, -1], atol=1e-4, rtol=1e-4)
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_training_time_test_unroll_reproduces_the_drafted_chain(setup, kind):
    """``unroll_steps`` (what a trainer runs) computes, at the last committed position, the same steps the
    drafter runs for a chain: same tokens, same draft distributions."""
    targets, _, heads = setup
    target, head = targets["hf"], heads[kind]
    trees = []

    class Keeping(EagleDrafter):
        def propose(self, *args):
            trees.append(super().propose(*args))
            return trees[-1]

    run = Generation(target, PROMPT, GenerationConfig(max_new_tokens=12), Keeping(head, VOCAB, pack=False),
                     DraftBudget(k=3))
    context = list(PROMPT)
    for index, record in enumerate(run):
        if index == 2:
            break
        context += record.committed
    tree = trees[-1]  # drafted after ``context``
    assert tree.is_chain and len(tree) == 3
    sequence = context + tree.tokens[:-1]  # the last drafted token is only predicted, never fed
    with torch.inference_mode():
        states = target.model(torch.tensor([context]), output_hidden_states=True).hidden_states
        feats = torch.cat([states[i][:, : len(context) - 1] for i in head.feature_layers], dim=-1)
        outputs = unroll_steps(head, feats, torch.tensor([sequence[1:]]), steps=3)
        ids = head.draft_ids()  # the draft vocabulary's logits spread over the target's, -inf elsewhere
        logits = [head.logits(out[0, -1]).float() for out in outputs]
        drafts = [torch.softmax(row if ids is None else head.widen(row, ids, VOCAB), dim=-1) for row in logits]
    for step, q in enumerate(drafts):
        torch.testing.assert_close(q, tree.q_dist[step], atol=1e-5, rtol=1e-4)
        assert int(q.argmax()) == tree.tokens[step]


# ---- feature-layer numbering ------------------------------------------------------------------------------------
def thirty_layer_target():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=30,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    net = LlamaForCausalLM(config).eval()
    return Target(model=net, tokenizer=tiny.tokenizer(VOCAB), name="tiny-30")


def test_feature_layers_for_a_thirty_layer_target():
    """SmolLM2-135M's depth: EAGLE-3 reads hidden_states[2], [15], [27] (the inputs of layers 2, 15, 27), and
    the engine hands it exactly those rows."""
    target = thirty_layer_target()
    assert new_head(target.model, "eagle3").feature_layers == (2, 15, 27)
    assert new_head(target.model, "eagle").feature_layers == (30,)  # the final norm's output
    assert layouts.default_feature_layers("eagle3", SMOLLM2.num_layers) == (2, 15, 27)

    seen = {}

    class Recording(EagleDrafter):
        def observe(self, features):
            for row in range(len(features)):
                seen[features.start + row] = features.hidden[row].clone()
            super().observe(features)

    drafter = Recording(new_head(target.model, "eagle3", seed=0), VOCAB)
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=6), drafter, DraftBudget(k=2))
    full = PROMPT + run.token_ids
    with torch.inference_mode():
        states = target.model(torch.tensor([full]), output_hidden_states=True).hidden_states
    for position, rows in seen.items():
        expected = torch.stack([states[i][0, position] for i in (2, 15, 27)])
        torch.testing.assert_close(rows, expected, atol=1e-5, rtol=1e-5)


def test_layer_id_conventions_of_the_dialects():
    """SpecForge/SGLang ids are output-of-layer (hidden_states[id + 1]); speculators/vLLM ids are hidden_states
    indices; with no ids every dialect reads EAGLE-3's default."""
    base = {**_adapted_llama(SMOLLM2), "draft_vocab_size": 4096}
    specforge = {**base, "architectures": ["LlamaForCausalLMEagle3"],
                 "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26], "use_aux_hidden_state": True}}
    assert FORMAT.spec_of(specforge, SMOLLM2).feature_layers == (2, 15, 27)
    top_level = {**base, "architectures": ["LlamaForCausalLMEagle3"], "eagle_aux_hidden_state_layer_ids": [1, 14, 26]}
    assert FORMAT.spec_of(top_level, SMOLLM2).feature_layers == (2, 15, 27)
    speculators = _speculators_config(base, ids=[2, 15, 27])
    assert FORMAT.spec_of(speculators, SMOLLM2).feature_layers == (2, 15, 27)
    official = {**base, "architectures": ["LlamaForCausalLM"]}
    assert FORMAT.spec_of(official, SMOLLM2).feature_layers == (2, 15, 27)
    with pytest.raises(SpecvizError, match="ambiguous"):
        FORMAT.spec_of({**official, "eagle_aux_hidden_state_layer_ids": [2, 15, 27]}, SMOLLM2)
    with pytest.raises(SpecvizError, match=r"hidden_states\[30\] is after the final norm"):
        FORMAT.spec_of(_speculators_config(base, ids=[2, 15, 30]), SMOLLM2)


# ---- sampling: the output distribution is the target's -----------------------------------------------------------
def sampling_head(target, kind: str, draft_ids=None) -> EagleHead:
    """A random head for the V-token sampling target: its q is far from the target's peaked p."""
    layers = (0, 1, 1) if kind == "eagle3" else None  # the 2-layer target has no (2, L//2, L-3)
    return new_head(target.model, kind, seed=4, feature_layers=layers, draft_ids=draft_ids)


def engine_counts(target, drafter, budget, samples: int = 1_000) -> dict:
    counts: dict[tuple[int, int], int] = {}
    for seed in range(samples):
        config = GenerationConfig(max_new_tokens=2, sampling=CONFIG, seed=seed, detail=False, top_k_report=0)
        tokens = Generation(target, SAMPLING_PROMPT, config, drafter, budget).run().token_ids
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    return counts


@pytest.fixture(scope="module")
def sampling_target():
    target = tiny.target("llama", V, layers=2, seed=0, scale=15)
    exact = Table(tiny.model("llama", V, layers=2, seed=0, scale=15)).joint()
    return target, exact


@pytest.mark.parametrize(
    "kind, budget, stochastic, reduced",
    [("eagle", DraftBudget(k=2), False, False),
     ("eagle3", DraftBudget(k=2), False, True),
     ("eagle3", DraftBudget(tree=True, width=2, depth=2, max_nodes=6), True, False)],
    ids=["eagle-chain", "eagle3-chain-half-vocab", "eagle3-stochastic-tree"],
)
def test_engine_sampling_matches_target(sampling_target, kind, budget, stochastic, reduced):
    """Sampled chains and stochastic trees (rejection sampling) keep the target's distribution; with half the
    vocabulary outside the draft vocabulary (q = 0) the target's mass there comes back through the residual."""
    target, exact = sampling_target
    head = sampling_head(target, kind, draft_ids=torch.arange(V // 2) if reduced else None)
    drafter = EagleDrafter(head, V, stochastic_tree=stochastic)
    counts = engine_counts(target, drafter, budget)
    assert chi_square_p(counts, exact) > PASS_P


@pytest.mark.parametrize("budget, stochastic", [(DraftBudget(k=2), False),
                                                (DraftBudget(tree=True, width=2, depth=2, max_nodes=6), True)],
                         ids=["chain", "stochastic-tree"])
def test_broken_residual_is_detected(sampling_target, budget, stochastic, monkeypatch):
    """Control: correcting from p instead of the residual biases the output, and the test above would see it
    (at these settings by a wide margin, so half the samples suffice)."""
    target, exact = sampling_target
    monkeypatch.setattr(accept_module.sampling, "residual", lambda p, q: p)
    drafter = EagleDrafter(sampling_head(target, "eagle3"), V, stochastic_tree=stochastic)
    counts = engine_counts(target, drafter, budget, samples=600)
    assert chi_square_p(counts, exact) < FAIL_P


def test_rounds_use_rejection_sampling_with_the_head_distribution(sampling_target):
    target, _ = sampling_target
    drafter = EagleDrafter(sampling_head(target, "eagle"), V)
    config = GenerationConfig(max_new_tokens=8, sampling=SamplingConfig(temperature=1.0), seed=3)
    run = Generation(target, SAMPLING_PROMPT, config, drafter, DraftBudget(k=3)).run()
    assert all(r.rule == "rejection-sampling" and r.sampled for r in run.rounds if r.tokens)


# ---- published layouts ------------------------------------------------------------------------------------------
EXPECTED_DIALECT = {
    "eagle1__SafeAILab__EAGLE__eagle_train_EAGLE-LLaMA3-Instruct-8B": "eagle1-official",
    "eagle1__SafeAILab__EAGLE__eagle_train_Mixtral_8x7B_config.json": "eagle1-official",
    "eagle1__SafeAILab__EAGLE__eagle_train_llama_2_chat_7B_config.json": "eagle1-official",
    "eagle1__SafeAILab__EAGLE__eagle_train_vicuna_13B_config.json": "eagle1-official",
    "eagle1__SafeAILab__EAGLE__eagle_train_vicuna_7B_config.json": "eagle1-official",
    "eagle3__SafeAILab__EAGLE__eagle_traineagle3_config.json": "eagle3-official",
    "eagle3__sgl-project__SpecForge__configs_deepseek-v3-671b-eagle3.json": "eagle3-specforge",
    "eagle3__sgl-project__SpecForge__configs_llama3-70B-ealge3.json": "eagle3-specforge",
    "eagle3__sgl-project__SpecForge__configs_llama3-8B-eagle3.json": "eagle3-specforge",
    "eagle3__sgl-project__SpecForge__configs_qwen3-30B-A3B-eagle3.1.json": "eagle3-specforge",
    "eagle3__sgl-project__SpecForge__configs_qwen3-8b-eagle3.json": "eagle3-specforge",
}
TINY = TargetShape(hidden_size=32, num_layers=LAYERS, vocab_size=VOCAB)


def published_configs() -> list[Path]:
    return sorted(p for p in LAYOUT_DIR.glob("eagle*") if "__keys__" not in p.name)


def test_every_published_eagle_config_is_recognised_and_judged():
    files = published_configs()
    assert {p.name for p in files} == set(EXPECTED_DIALECT), "a layout file was added or renamed: list it here"
    for path in files:
        config = json.loads(path.read_text())
        for shape in (TINY, SMOLLM2):
            dialect, reason = FORMAT.verdict(config, shape)
            assert dialect == EXPECTED_DIALECT[path.name]
            assert reason is not None and reason.startswith("hidden size mismatch") and "\n" not in reason, reason
        # the same config reshaped for the tiny target is accepted, and its dialect's fields are read
        adapted = _reshaped(config, TINY)
        assert FORMAT.verdict(adapted, TINY) == (EXPECTED_DIALECT[path.name], None)
        spec = FORMAT.spec_of(adapted, TINY)
        if spec.kind == "eagle":
            assert spec.fc_bias == config.get("bias", True)  # EAGLE-1's loader: bias on unless the config says no
            assert spec.feature_layers == (TINY.num_layers,) and not spec.logits_norm
        else:
            assert spec.fc_norm == config.get("fc_norm", False)
            assert spec.own_lm_head and spec.draft_vocab_size == adapted["draft_vocab_size"]
    deepseek = json.loads((LAYOUT_DIR / "eagle3__sgl-project__SpecForge__configs_deepseek-v3-671b-eagle3.json")
                          .read_text())
    sixty_one = TargetShape(hidden_size=deepseek["hidden_size"], num_layers=61,
                                    vocab_size=deepseek["vocab_size"])
    spec = FORMAT.spec_of(deepseek, sixty_one)  # its nested ids [1, 29, 57] are EAGLE's default for 61 layers
    assert spec.feature_layers == (2, 30, 58) == layouts.default_feature_layers("eagle3", 61)
    llama70 = json.loads((LAYOUT_DIR / "eagle3__sgl-project__SpecForge__configs_llama3-70B-ealge3.json").read_text())
    spec70 = FORMAT.spec_of(llama70, TargetShape(8192, 80, 128256))
    assert spec70.rope["rope_type"] == "llama3" and spec70.rope["rope_theta"] == 500000.0
    assert spec70.head_dim == 128 and spec70.draft_vocab_size == 32000


def test_published_configs_refused_for_vocab_and_depth():
    config = _reshaped(json.loads((LAYOUT_DIR / "eagle3__sgl-project__SpecForge__configs_llama3-8B-eagle3.json")
                                  .read_text()), TINY)
    _, reason = FORMAT.verdict(config, replace(TINY, vocab_size=VOCAB + 8))
    assert reason.startswith("vocabulary mismatch")
    nested = {**config, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}}
    _, reason = FORMAT.verdict(nested, replace(TINY, num_layers=3))
    assert "hidden_states[0..3]" in reason and "\n" not in reason
    hass = _reshaped(json.loads((LAYOUT_DIR / "eagle1__SafeAILab__EAGLE__eagle_train_vicuna_7B_config.json")
                                .read_text()), TINY)
    assert FORMAT.verdict({**hass, "num_hidden_layers": 2}, TINY)[1].startswith("the head has 2 decoder layers")


def test_published_key_lists_are_the_names_we_read_and_write(tmp_path, setup):
    """The EAGLE-1 and official EAGLE-3 key lists (speculators' converter fixtures) name tensors our layouts
    write; HASS's extra layernorms are refused in one line."""
    targets, _, heads = setup
    model = targets["hf"].model
    written = {}
    for kind, layout in (("eagle", "eagle1-official"), ("eagle3", "eagle3-official")):
        folder = save_head(heads[kind], tmp_path / layout, target_name="tiny", layout=layout)
        written[layout] = set(read_tensors(folder))
    eagle1_keys = _key_names("eagle1__keys__vllm-project_speculators_tests_unit_convert_test_eagle_utils.txt")
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight"} <= written["eagle1-official"]
    assert eagle1_keys - written["eagle1-official"] == {"embed_layernorm.weight", "post_embedding_layernorm.weight"}
    eagle3_keys = _key_names("eagle3__keys__vllm-project_speculators_tests_unit_convert_test_eagle3_converter.txt")
    assert eagle3_keys <= written["eagle3-official"]
    tensors = read_tensors(tmp_path / "eagle1-official")
    tensors["embed_layernorm.weight"] = torch.ones(32)
    spec = heads["eagle"].spec
    eagle1 = FORMAT["eagle1-official"]
    with pytest.raises(SpecvizError, match="HASS"):
        FORMAT.to_state(tensors, spec, eagle1)
    assert build_head(model, spec, FORMAT.to_state(read_tensors(tmp_path / "eagle1-official"), spec,
                                                           eagle1)[0])


def test_eagle1_bias_follows_config_then_weights(tmp_path, setup):
    """EAGLE's loader: ``bias`` absent means a bias; a checkpoint without ``fc.bias`` and without the key has none."""
    targets, _, heads = setup
    model = targets["hf"].model
    no_bias = build_head(model, replace(heads["eagle"].spec, fc_bias=False))
    for head, expected in ((heads["eagle"], True), (no_bias, False)):
        folder = save_head(head, tmp_path / str(expected), target_name="tiny", layout="eagle1-official")
        config = read_config(folder)
        assert config["bias"] is expected
        del config["bias"]
        (folder / "config.json").write_text(json.dumps(config))
        assert FORMAT.spec_of(config, TINY).fc_bias  # config alone: EAGLE's default
        assert load_head(folder, model).spec.fc_bias is expected  # with the weights: what they hold


def variants(heads, model) -> list[tuple[EagleHead, str]]:
    """(head, layout) pairs: our fitted heads in every layout that can hold them, plus heads with each flag."""
    out = [(heads["eagle"], layout) for layout in ("specviz", "eagle1-official")]
    out += [(heads["eagle3"], layout) for layout in ("specviz", "eagle3-official", "eagle3-specforge",
                                                      "eagle3-speculators")]
    base = heads["eagle3"].spec
    flags = [(dict(fc_norm=True, logits_norm=False), "eagle3-specforge"),  # SpecForge's "EAGLE 3.1" switches
             (dict(norm_before_residual=True, feed_normed=True, norm_before_fc=True), "eagle3-speculators"),
             (dict(fc_norm=True, norm_before_residual=True), "eagle3-speculators")]
    for changes, layout in flags:
        head = fit(build_head(model, replace(base, **changes)), model, steps=30)
        out.append((head, layout))
    return out


def drafted(head: EagleHead, target, budget: DraftBudget) -> list[tuple]:
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=20), EagleDrafter(head, VOCAB), budget)
    return [(r.tokens, r.parents, [round(q, 6) for q in r.q_draft]) for r in run.rounds]


def test_our_heads_resaved_in_each_layout_draft_identically(tmp_path, setup):
    targets, _, heads = setup
    target = targets["hf"]
    budget = DraftBudget(tree=True, width=3, depth=3, max_nodes=10)
    for index, (head, layout) in enumerate(variants(heads, target.model)):
        folder = save_head(head, tmp_path / f"{index}-{layout}", target_name="tiny", layout=layout)
        assert FORMAT.layout_of(read_config(folder), set(read_tensors(folder))).name == layout
        loaded = load_head(folder, target.model)
        assert loaded.spec == (head.spec if layout == "specviz" or head.spec.kind == "eagle"
                               else replace(head.spec, own_lm_head=True)), layout
        assert drafted(loaded, target, budget) == drafted(head, target, budget), layout


def test_bin_checkpoints_load_only_as_plain_tensors(tmp_path, setup):
    targets, _, heads = setup
    model = targets["hf"].model
    folder = save_head(heads["eagle3"], tmp_path / "st", target_name="tiny", layout="eagle3-specforge")
    tensors = read_tensors(folder)
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text((folder / "config.json").read_text())
    torch.save(tensors, binary / "pytorch_model.bin")
    loaded = load_head(binary, model)
    for name, value in loaded.state_dict().items():
        torch.testing.assert_close(value, load_head(folder, model).state_dict()[name])
    torch.save({**tensors, "fc.weight": tiny.Unpicklable()}, binary / "pytorch_model.bin")
    with pytest.raises(SpecvizError, match="weights_only=True") as error:
        load_head(binary, model)
    assert "\n" not in str(error.value)



def test_bad_checkpoints_fail_in_one_line(tmp_path, setup):
    from safetensors.torch import save_file

    targets, _, heads = setup
    model = targets["hf"].model
    head = heads["eagle3"]

    def broken(name: str, layout: str, edit) -> Path:
        folder = save_head(head, tmp_path / name, target_name="tiny", layout=layout)
        tensors = read_tensors(folder)
        config = read_config(folder)
        edit(tensors, config)
        save_file(tensors, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    cases = {
        "missing": (broken("missing", "eagle3-official", lambda t, c: t.pop("midlayer.hidden_norm.weight")),
                    "missing tensor midlayer.hidden_norm.weight"),
        "shape": (broken("shape", "eagle3-speculators",
                         lambda t, c: t.update({"fc.weight": torch.zeros(32, 64)})), "tensor fc.weight has shape"),
        "hidden": (broken("hidden", "eagle3-specforge", lambda t, c: c.update({"hidden_size": 48})),
                   "hidden size mismatch"),
        "vocab": (broken("vocab", "eagle3-official", lambda t, c: c.update({"vocab_size": 96})),
                  "vocabulary mismatch"),
        "kind": (save_head(heads["eagle"], tmp_path / "kind", target_name="tiny"), "not an EAGLE-3 head"),
        "nan": (broken("nan", "eagle3-official", lambda t, c: t["fc.weight"].fill_(float("nan"))),
                "fc.weight holds NaN or infinite values"),  # once loaded and drafted nothing (τ 1.00), in silence
        "int": (broken("int", "eagle3-speculators", lambda t, c: t.update({"fc.weight": t["fc.weight"].int()})),
                "fc.weight is int32, not a float tensor"),
    }
    for name, (folder, message) in cases.items():
        with pytest.raises(SpecvizError, match=message) as error:
            load_head(folder, model, kind="eagle3")
        assert "\n" not in str(error.value) and str(error.value).startswith("EAGLE head "), name
    with pytest.raises(SpecvizError, match="config.json is missing"):
        load_head(tmp_path, model)
    with pytest.raises(SpecvizError, match="no such directory, and not a hub id"):
        load_head(tmp_path / "nowhere" / "deeper", model)
    with pytest.raises(SpecvizError, match="hub is offline") as error:  # conftest keeps the hub off
        load_head("no-such-owner/no-such-eagle-head", model)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("layout", ["specviz", "eagle3-speculators"])
def test_a_different_target_is_refused(tmp_path, setup, layout):
    """Same shapes, other weights: the recorded (ours) or stored (published) embedding does not match."""
    targets, _, heads = setup
    folder = save_head(heads["eagle3"], tmp_path / layout, target_name="tiny", layout=layout)
    other = tiny.model("llama", VOCAB, layers=LAYERS, scale=25, seed=7)
    with pytest.raises(SpecvizError, match="trained for") as error:
        load_head(folder, other)
    assert "\n" not in str(error.value)


def test_rope_frequencies_survive_a_half_precision_round_trip(setup):
    """Trainers save with ``head.to(float16)`` then go on in float32: the RoPE frequencies must not be rounded."""
    targets, _, heads = setup
    head = copy_head(heads["eagle3"], targets["hf"].model)
    before = head._rope[0].clone()
    head.to(torch.float16).float()
    assert torch.equal(head._rope[0], before) and head._rope[0].dtype == torch.float32


def test_spec_round_trip_and_state_names(setup):
    targets, _, heads = setup
    for head in heads.values():
        spec = head.spec
        assert layouts.HeadSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
        assert {k: tuple(v.shape) for k, v in head.state_dict().items()} == FORMAT.expected_shapes(spec)


def test_registry_specs(tmp_path, setup):
    targets, _, heads = setup
    family, argument = registry.parse(f"eagle3:{tmp_path}")
    assert family.name == "eagle3" and argument == str(tmp_path)
    assert registry.parse("eagle")[0].name == "eagle"
    target = targets["hf"]
    with pytest.raises(SpecvizError, match="no EAGLE-3 head is shipped for tiny-"):
        registry.build("eagle3", target, {"stochastic_tree": False, "min_draft_prob": 0.0})
    folder = save_head(heads["eagle3"], tmp_path / "head", target_name="tiny")
    drafter = registry.build(f"eagle3:{folder}", target, {"stochastic_tree": True, "min_draft_prob": 0.0})
    assert isinstance(drafter, EagleDrafter) and drafter.stochastic_tree
    assert drafter.describe()["feature_layers"] == [2, 4, 5]
    with pytest.raises(SpecvizError, match="not an EAGLE-1 head"):
        registry.build(f"eagle:{folder}", target, {"stochastic_tree": False, "min_draft_prob": 0.0})
    assert registry.get("eagle3").shipped("no-such-target") == []


# ---- helpers ----------------------------------------------------------------------------------------------------
def _adapted_llama(shape: TargetShape) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": shape.hidden_size, "intermediate_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": shape.vocab_size,
            "rms_norm_eps": 1e-5, "hidden_act": "silu", "max_position_embeddings": 256}


def _speculators_config(base: dict, ids: list[int]) -> dict:
    layer = {k: v for k, v in base.items() if k not in ("architectures", "draft_vocab_size")}
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "transformer_layer_config": {**layer, "model_type": "llama"}, "draft_vocab_size": base["draft_vocab_size"],
            "eagle_aux_hidden_state_layer_ids": ids, "norm_before_residual": True}


def _reshaped(config: dict, shape: TargetShape) -> dict:
    """A published config with its sizes replaced by ``shape``'s (every other field, flag and nesting kept)."""
    out = {**config, "hidden_size": shape.hidden_size, "intermediate_size": 2 * shape.hidden_size,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": shape.vocab_size,
           "max_position_embeddings": 256}
    out.pop("head_dim", None)
    if out.get("rope_scaling"):
        out["rope_scaling"] = {**out["rope_scaling"], "original_max_position_embeddings": 128}
    if "draft_vocab_size" in out:
        out["draft_vocab_size"] = shape.vocab_size // 2
    if isinstance(out.get("eagle_config"), dict):  # SGLang numbering: output-of-layer ids
        ids = layouts.default_feature_layers("eagle3", shape.num_layers)
        out["eagle_config"] = {**out["eagle_config"], "eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids]}
    return out


def _key_names(filename: str) -> set[str]:
    lines = (LAYOUT_DIR / filename).read_text().splitlines()
    return {line.split("\t")[0].strip() for line in lines if line.strip() and not line.startswith("#")}
