"""MTP modules: lossless drafting, the modules' caches, drafting = training forward, the published layouts.

Modules are built in-process on tiny random targets and fitted for a few seconds to the target's own greedy
continuations (teacher-forced, module k on the token k + 2 ahead), so their drafts are partly accepted.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import tiny
import torch
from test_eagle_training import feature_set
from test_sampling_lossless import CONFIG, FAIL_P, PASS_P, Table, V, chi_square_p
from test_sampling_lossless import PROMPT as SAMPLING_PROMPT
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from specviz.drafters import mtp_layouts as layouts
from specviz.drafters import registry
from specviz.drafters.checkpoint_files import TargetShape, read_config, tensor_index
from specviz.drafters.mtp import FORMAT, MtpDrafter, MtpStack, build_stack, load_stack, new_stack, save_stack
from specviz.engine import accept as accept_module
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig, generate, plain_decode
from specviz.engine.metrics import acceptance_by_label
from specviz.engine.target import Target
from specviz.errors import SpecvizError
from specviz.training.batches import make_batch
from specviz.training.trainers import TrainConfig, fit, get_trainer
from specviz.training.trainers.mtp import teacher_forced

VOCAB = 64
LAYERS = 4
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]
NEW_TOKENS = 40
SHAPES = [DraftBudget(k=1), DraftBudget(k=5), DraftBudget(tree=True, width=3, depth=4, max_nodes=10)]
LAYOUT_DIR = Path(__file__).resolve().parent / "data" / "layouts"  # published configs and key names, see README.md
SETTINGS = {"stochastic_tree": False, "min_draft_prob": 0.0}


def greedy_data(net: torch.nn.Module, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token ids, hidden_states[L], the target's argmax) of the target's greedy continuations of random prompts."""
    generator = torch.Generator().manual_seed(seed)
    seqs = torch.randint(0, vocab, (16, 4), generator=generator)
    with torch.no_grad():
        for _ in range(40):
            seqs = torch.cat([seqs, net(seqs).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        out = net(seqs, output_hidden_states=True)
    return seqs, out.hidden_states[-1], out.logits.argmax(-1)


def fit_stack(stack: MtpStack, net: torch.nn.Module, steps: int = 80) -> MtpStack:
    """A stand-in for real training: module k learns the target's argmax of x[t+2+k] (teacher forced)."""
    seqs, feats, predicted = greedy_data(net, stack.spec.vocab_size)
    optimizer = torch.optim.Adam(stack.parameters(), lr=3e-3)
    stack.train()
    torch.manual_seed(0)
    for _ in range(steps):
        outs = teacher_forced(stack, feats, seqs)
        loss = sum(torch.nn.functional.cross_entropy(
            stack.logits(k, out).reshape(-1, stack.spec.vocab_size),
            predicted[:, 1 + k: 1 + k + out.shape[1]].reshape(-1)) for k, out in enumerate(outs))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return stack.eval()


def copy_stack(stack: MtpStack, model: torch.nn.Module) -> MtpStack:
    return build_stack(model, stack.spec, stack.state_dict())


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request):
    arch = request.param
    targets = tiny.both_forwards(arch, VOCAB, layers=LAYERS, scale=25)
    baselines = tiny.plain_outputs(targets, PROMPT, NEW_TOKENS)
    model = targets["hf"].model
    stacks = {n: fit_stack(new_stack(model, n, seed=1), model) for n in (1, 3)}
    return targets, baselines, stacks


@pytest.mark.parametrize("budget", SHAPES, ids=lambda b: b.describe().replace(" ", "_"))
@pytest.mark.parametrize("modules", [1, 3])
@pytest.mark.parametrize("forward", ["hf", "fast"])
def test_greedy_matches_plain(setup, forward, modules, budget):
    targets, baselines, stacks = setup
    target = targets[forward]
    drafter = MtpDrafter(copy_stack(stacks[modules], target.model), target.vocab_size)
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS), drafter, budget)
    assert run.token_ids == baselines[forward]
    assert all(r.rule == "greedy" and r.lossless for r in run.rounds)
    assert all(len(r.tokens) <= (budget.max_nodes if budget.tree else budget.k) for r in run.rounds)


@pytest.mark.parametrize("modules", [1, 3])
def test_drafts_are_partly_accepted_and_labelled_by_module(setup, modules):
    targets, _, stacks = setup
    budget = DraftBudget(tree=True, width=3, depth=5, max_nodes=10)
    run = generate(targets["hf"], PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS),
                   MtpDrafter(stacks[modules], VOCAB), budget)
    accepted, drafted = sum(len(r.accepted) for r in run.rounds), sum(len(r.tokens) for r in run.rounds)
    assert 0 < accepted < drafted
    for record in run.rounds:
        depth: list[int] = []
        for parent in record.parents:
            depth.append(1 if parent < 0 else depth[parent] + 1)
        assert record.meta["module"] == [(d - 1) % modules for d in depth]
        assert all(node["module"] == (node["depth"] - 1) % modules for node in record.meta.get("pruned", []))
    per_module = acceptance_by_label(run.rounds, "module")
    assert set(per_module) == set(range(modules)) and per_module[0].depths[1].offered == len(run.rounds)
    for k, stats in per_module.items():  # module k drafts depths k + 1, k + 1 + n, ...: offered once at each
        assert set(stats.depths) <= set(range(k + 1, budget.depth + 1, modules))
        assert stats.offered == sum(d.offered for d in stats.depths.values())


@pytest.mark.parametrize("length", [1, 2, 3])
def test_prompts_shorter_than_the_modules_chain(setup, length):
    """With fewer committed tokens than modules some rows cannot exist yet; drafting still stays lossless."""
    targets, _, stacks = setup
    target = targets["hf"]
    prompt = PROMPT[:length]
    base = plain_decode(target, prompt, GenerationConfig(max_new_tokens=10)).token_ids
    for budget in (DraftBudget(k=5), DraftBudget(tree=True, width=2, depth=5, max_nodes=8)):
        run = generate(target, prompt, GenerationConfig(max_new_tokens=10), MtpDrafter(stacks[3], VOCAB), budget)
        assert run.token_ids == base
        assert bool(run.rounds[0].tokens) == (length > 1)  # one token: no committed row yet, so no draft


def module_caches_fresh(stack: MtpStack, feats: torch.Tensor, context: list[int]) -> list[DynamicCache]:
    """Each module fed once over the committed text with fresh caches (module k at positions 0 .. N-2-k)."""
    caches, hidden = [], feats
    ids = torch.tensor([context])
    for k in range(stack.num_modules):
        span = len(context) - 1 - k
        cache = DynamicCache()
        out = stack.step(k, hidden[:, :span], ids[:, 1 + k: 1 + k + span], torch.arange(span), cache=cache)
        caches.append(cache)
        hidden = stack.feed(k, out)
    return caches


def test_module_caches_hold_exactly_the_committed_rows(setup):
    """After every round each module's cache (brought up to date) equals one pass over the committed text."""
    targets, _, stacks = setup
    target, stack = targets["hf"], stacks[3]
    drafter = MtpDrafter(stack, VOCAB, pack=False)
    run = Generation(target, PROMPT, GenerationConfig(max_new_tokens=24), drafter,
                     DraftBudget(tree=True, width=3, depth=4, max_nodes=10))
    context, checked = list(PROMPT), 0
    for record in run:
        context += record.committed
        if record.finished:
            break
        drafter.catch_up(context)
        with torch.inference_mode():
            feats = target.model(torch.tensor([context]), output_hidden_states=True).hidden_states[-1]
            fresh = module_caches_fresh(stack, feats, context)
        for ours, theirs in zip(drafter.module_caches(), fresh):
            assert ours.layers[0].keys.shape == theirs.layers[0].keys.shape
            torch.testing.assert_close(ours.layers[0].keys, theirs.layers[0].keys, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(ours.layers[0].values, theirs.layers[0].values, atol=1e-4, rtol=1e-4)
        checked += 1
    assert checked >= 3


def reference_logits(stack: MtpStack, feats: torch.Tensor, context: list[int], path: list[int]) -> torch.Tensor:
    """The distribution after ``context + path`` by plain causal forwards without caches or masks: module 0 reads
    the target feature at t <= P (P = len(context) - 2) and the last module's output n positions back beyond it
    (the self-feed drafting uses); rows are recomputed until nothing changes."""
    n, z = stack.num_modules, context + path
    base = len(context) - 2
    outs: list[dict[int, torch.Tensor]] = [{} for _ in range(n)]
    while True:
        before = sum(len(o) for o in outs)
        for k in range(n):
            hidden = []
            for t in range(len(z) - 1 - k):
                if k:
                    h = outs[k - 1].get(t)
                    h = None if h is None else stack.feed(k - 1, h)
                elif t <= base:
                    h = feats[0, t]
                else:
                    h = outs[n - 1].get(t - n)
                    h = None if h is None else stack.feed(n - 1, h)
                if h is None:
                    break
                hidden.append(h)
            if hidden:
                span = len(hidden)
                out = stack.step(k, torch.stack(hidden)[None], torch.tensor([z[1 + k: 1 + k + span]]),
                                 torch.arange(span))[0]
                outs[k] = {t: out[t] for t in range(span)}
        if sum(len(o) for o in outs) == before:
            break
    depth = len(path)
    module = depth % n
    return stack.logits(module, outs[module][base + depth - module])


@pytest.mark.parametrize("modules", [1, 3])
def test_drafting_equals_the_training_forward(setup, modules):
    """The drafted distributions are the training forward's: ``teacher_forced`` (what the trainer runs) at the
    last committed position for the first n depths, and an uncached recomputation for every node of a tree."""
    targets, _, stacks = setup
    target, stack = targets["hf"], stacks[modules]
    trees = []

    class Keeping(MtpDrafter):
        def propose(self, *args):
            trees.append(super().propose(*args))
            return trees[-1]

    for budget in (DraftBudget(k=7), DraftBudget(tree=True, width=2, depth=4, max_nodes=8)):
        run = Generation(target, PROMPT, GenerationConfig(max_new_tokens=12), Keeping(stack, VOCAB, pack=False),
                         budget)
        context = list(PROMPT)
        for index, record in enumerate(run):
            if index == 2:
                break
            context += record.committed
        tree = trees[-1]  # drafted after ``context``
        with torch.inference_mode():
            feats = target.model(torch.tensor([context]), output_hidden_states=True).hidden_states[-1]
            if tree.is_chain:
                ids = torch.tensor([context + tree.tokens])
                full = target.model(ids, output_hidden_states=True).hidden_states[-1]  # only positions <= P are read
                outs = teacher_forced(stack, full, ids)
                for depth in range(1, min(modules, len(tree)) + 1):
                    k = depth - 1
                    q = stack.logits(k, outs[k][0, len(context) - 2]).softmax(-1)
                    torch.testing.assert_close(q, tree.q_dist[depth - 1], atol=1e-5, rtol=1e-4)
            for node in [-1, *range(len(tree))]:
                if node >= 0 and not tree.children[node]:
                    continue
                path = [] if node < 0 else [tree.tokens[i] for i in tree.path_to(node)]
                q = reference_logits(stack, feats, context, path).softmax(-1)
                torch.testing.assert_close(q, tree.q_dist[node + 1], atol=1e-5, rtol=1e-4)


def test_feature_layer_is_the_final_norm_output(setup):
    """The modules read hidden_states[L] (after the final norm); the engine hands them exactly those rows."""
    targets, _, stacks = setup
    target = targets["hf"]
    assert registry.get("mtp").layers_for(30) == (30,)
    assert stacks[1].spec.feature_layer == LAYERS
    seen = {}

    class Recording(MtpDrafter):
        def observe(self, features):
            for row in range(len(features)):
                seen[features.start + row] = features.hidden[row, 0].clone()
            super().observe(features)

    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=8), Recording(stacks[1], VOCAB), DraftBudget(k=3))
    with torch.inference_mode():
        states = target.model(torch.tensor([PROMPT + run.token_ids]), output_hidden_states=True).hidden_states
    for position, row in seen.items():
        torch.testing.assert_close(row, states[LAYERS][0, position], atol=1e-5, rtol=1e-5)


# ---- sampling ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sampling_target():
    target = tiny.target("llama", V, layers=2, seed=0, scale=15)
    return target, Table(tiny.model("llama", V, layers=2, seed=0, scale=15)).joint()


def engine_counts(target, drafter, budget, samples: int) -> dict:
    counts: dict[tuple[int, int], int] = {}
    for seed in range(samples):
        config = GenerationConfig(max_new_tokens=2, sampling=CONFIG, seed=seed, detail=False, top_k_report=0)
        tokens = Generation(target, SAMPLING_PROMPT, config, drafter, budget).run().token_ids
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    return counts


@pytest.mark.parametrize("modules, budget, stochastic",
                         [(2, DraftBudget(k=2), False),
                          (1, DraftBudget(tree=True, width=2, depth=2, max_nodes=6), True)],
                         ids=["two-module-chain", "stochastic-tree"])
def test_engine_sampling_matches_target(sampling_target, modules, budget, stochastic):
    """Sampled MTP chains and stochastic trees (rejection sampling with the modules' q; the chain's second token
    from the second module) keep the target's output distribution."""
    target, exact = sampling_target
    drafter = MtpDrafter(new_stack(target.model, modules, seed=4), V, stochastic_tree=stochastic)
    counts = engine_counts(target, drafter, budget, 1_000)
    assert chi_square_p(counts, exact) > PASS_P


def test_broken_residual_is_detected(sampling_target, monkeypatch):
    """Control: correcting from p instead of the residual biases the output, and the test above would see it
    (by a wide margin, so fewer samples suffice)."""
    target, exact = sampling_target
    monkeypatch.setattr(accept_module.sampling, "residual", lambda p, q: p)
    counts = engine_counts(target, MtpDrafter(new_stack(target.model, 1, seed=4), V), DraftBudget(k=2), 500)
    assert chi_square_p(counts, exact) < FAIL_P


# ---- published layouts ------------------------------------------------------------------------------------------
LAYOUT_BUDGET = DraftBudget(tree=True, width=2, depth=4, max_nodes=8)


def drafted(stack: MtpStack, target, budget: DraftBudget = LAYOUT_BUDGET) -> list[tuple]:
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=16), MtpDrafter(stack, VOCAB), budget)
    return [(r.tokens, r.parents, [round(q, 5) for q in r.q_draft]) for r in run.rounds]


@pytest.fixture(scope="module")
def normed_stacks(setup):
    """Stacks that feed the normed output on (the Qwen3-Next and MiMo convention)."""
    targets, _, _ = setup
    model = targets["hf"].model
    return {n: fit_stack(new_stack(model, n, seed=2, feed_normed=True), model, steps=30) for n in (1, 2)}


def test_our_modules_resaved_in_each_layout_draft_identically(tmp_path, setup, normed_stacks):
    targets, _, stacks = setup
    target = targets["hf"]
    cases = [(stacks[1], "specviz"), (stacks[3], "specviz"), (stacks[1], "deepseek-v3"), (stacks[3], "deepseek-v3"),
             (normed_stacks[1], "qwen3-next"), (normed_stacks[2], "mimo"), (normed_stacks[1], "mimo")]
    for index, (stack, layout) in enumerate(cases):
        folder = save_stack(stack, tmp_path / f"{index}-{layout}", target_name="tiny", layout=layout)
        loaded = load_stack(folder, target.model)
        expected = stack.spec if layout == "specviz" else replace(stack.spec, origin="joint")
        assert loaded.spec == expected, layout
        assert drafted(loaded, target) == drafted(stack, target), layout
    with pytest.raises(SpecvizError, match="shares fc and its norms") as error:
        save_stack(normed_stacks[2], tmp_path / "shared", target_name="tiny", layout="qwen3-next")
    assert "\n" not in str(error.value)
    with pytest.raises(SpecvizError, match="feed_normed"):
        save_stack(stacks[1], tmp_path / "mimo-plain", target_name="tiny", layout="mimo")


def test_published_conventions_by_hand(tmp_path, normed_stacks):
    """MiMo's ``input_proj`` reads cat(hidden, embedding) and Qwen3-Next's RMSNorms scale by 1 + w: each layout's
    own formula on the tensors we write gives our module's projection."""
    stack = normed_stacks[1]
    layer = stack.layers[0]
    eps = stack.spec.rms_norm_eps
    emb, hid = torch.randn(3, 32), torch.randn(3, 32)

    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    with torch.no_grad():
        ours = layer.eh_proj(torch.cat([layer.enorm(emb), layer.hnorm(hid)], dim=-1))
        mimo = tensor_index(save_stack(stack, tmp_path / "mimo", target_name="t", layout="mimo"))[1](
            lambda _: True)
        p = "model.mtp_layers.0."
        by_mimo = torch.nn.functional.linear(torch.cat([rms(hid, mimo[p + "hidden_layernorm.weight"]),
                                                        rms(emb, mimo[p + "token_layernorm.weight"])], dim=-1),
                                             mimo[p + "input_proj.weight"])
        qwen = tensor_index(save_stack(stack, tmp_path / "qwen", target_name="t", layout="qwen3-next"))[1](
            lambda _: True)
        by_qwen = torch.nn.functional.linear(torch.cat([rms(emb, 1 + qwen["mtp.pre_fc_norm_embedding.weight"]),
                                                        rms(hid, 1 + qwen["mtp.pre_fc_norm_hidden.weight"])], dim=-1),
                                             qwen["mtp.fc.weight"])
    torch.testing.assert_close(by_mimo, ours, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(by_qwen, ours, atol=1e-5, rtol=1e-5)


def test_qk_norm_blocks_round_trip(tmp_path):
    """A Qwen3-shaped target gives blocks with q/k norms; they save, load and draft losslessly."""
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=False)
    net = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        net.lm_head.weight.mul_(25)
    target = Target(model=net, tokenizer=tiny.tokenizer(VOCAB), name="tiny-qwen3")
    stack = new_stack(net, 2, seed=3)
    assert stack.spec.qk_norm and not stack.spec.attention_bias
    loaded = load_stack(save_stack(stack, tmp_path / "q3", target_name="tiny", layout="deepseek-v3"), net)
    assert loaded.spec.qk_norm and drafted(loaded, target) == drafted(stack, target)
    base = plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=12)).token_ids
    assert generate(target, PROMPT, GenerationConfig(max_new_tokens=12), MtpDrafter(loaded, VOCAB),
                    DraftBudget(k=3)).token_ids == base


@pytest.mark.parametrize("layout", ["deepseek-v3", "qwen3-next"])
def test_mtp_layers_inside_the_target_checkpoint(tmp_path, setup, normed_stacks, layout):
    """A target folder whose checkpoint carries MTP layers: bare ``mtp`` uses them, and they draft exactly as the
    modules they were written from."""
    from safetensors.torch import load_file, save_file

    targets, _, stacks = setup
    stack = stacks[3] if layout == "deepseek-v3" else normed_stacks[1]
    folder = tmp_path / "target"
    targets["hf"].model.save_pretrained(str(folder))
    mtp_folder = save_stack(stack, tmp_path / "mtp", target_name="tiny", layout=layout)
    weights = {**load_file(str(folder / "model.safetensors")), **load_file(str(mtp_folder / "model.safetensors"))}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    field = "num_nextn_predict_layers" if layout == "deepseek-v3" else "mtp_num_hidden_layers"
    config[field] = stack.num_modules
    (folder / "config.json").write_text(json.dumps(config))
    model = type(targets["hf"].model).from_pretrained(str(folder)).eval()  # ignores the MTP tensors
    target = Target(model=model, tokenizer=tiny.tokenizer(VOCAB), name="tiny-with-mtp")
    drafter = registry.build("mtp", target, SETTINGS)
    assert drafter.describe()["trained"].startswith("jointly")
    assert drafted(drafter.stack, target) == drafted(stack, target)
    assert registry.build(f"mtp:{folder}", target, SETTINGS).stack.spec == drafter.stack.spec


def _key_lines(filename: str) -> list[list[str]]:
    lines = (LAYOUT_DIR / filename).read_text().splitlines()
    return [line.split("\t") for line in lines if line.strip() and not line.startswith("#")]


def test_deepseek_v3_published_config_and_keys_are_recognised_and_refused_in_one_line():
    config = json.loads((LAYOUT_DIR / "mtp_deepseek__tenstorrent__tt-metal__models_demos_deepseek_v3_reference_"
                                      "config.json").read_text())
    sixty_one = TargetShape(hidden_size=7168, num_layers=61, vocab_size=129280)
    smollm2 = TargetShape(hidden_size=576, num_layers=30, vocab_size=49152)
    assert layouts.module_count_field(config) == 1
    for shape in (sixty_one, smollm2):
        dialect, reason = FORMAT.verdict(config, shape)
        assert dialect == "deepseek-v3" and "multi-head latent attention" in reason and "\n" not in reason
    rows = _key_lines("mtp_deepseek__keys__simpx_model-inspect_README.txt")
    shapes = {name: tuple(int(x) for x in shape.strip("()").split(",") if x.strip()) for name, shape, _ in rows}
    assert FORMAT.layout_of(config, set(shapes)).name == "deepseek-v3"
    assert "multi-head latent attention" in FORMAT.verdict(config, sixty_one, shapes)[1]
    layer = {k.removeprefix("model.layers.61."): s for k, s in shapes.items() if k.startswith("model.layers.61.")}
    spec = layouts.MtpSpec(num_modules=1, hidden_size=7168, intermediate_size=18432, num_heads=128, num_kv_heads=128,
                           head_dim=56, rms_norm_eps=1e-6, vocab_size=129280, feature_layer=61)
    ours = {FORMAT["deepseek-v3"].theirs(k, {"L": 61, "k": 1}).removeprefix("model.layers.61."): s
            for k, s in FORMAT.expected_shapes(spec).items()}
    listed_own = {k: s for k, s in layer.items() if not k.startswith(("self_attn.", "mlp."))}
    shared = {"embed_tokens.weight", "shared_head.head.weight"}
    assert set(listed_own) - set(ours) == shared  # the stored copies we check, never load
    assert all(ours[k] == s for k, s in listed_own.items() if k in ours)  # eh_proj (7168, 14336) = (H, 2H)
    for name in layer:  # every listed layer-61 tensor is one of ours, or a stored copy of the target's
        mapped = FORMAT["deepseek-v3"].ours(f"model.layers.61.{name}", {"L": 61, "k": 1})
        assert mapped == [] if name in shared else set(mapped) <= set(FORMAT.expected_shapes(spec))
    negative = json.loads((LAYOUT_DIR / "mtp_deepseek__deepseek-ai__DeepSeek-V3__inference_configs_config_671B.json")
                          .read_text())
    with pytest.raises(SpecvizError, match="not an MTP checkpoint") as error:
        FORMAT.layout_of(negative)
    assert "\n" not in str(error.value)


def test_qwen3_next_published_keys_are_the_names_we_write_and_match_mimo(tmp_path, setup, normed_stacks):
    """Qwen3-Next's native ``mtp.*`` keys (speculators' converter table) are what our qwen3-next layout writes, and
    the table's MiMo-style right column lands on the same tensors of ours as our MiMo layout."""
    targets, _, _ = setup
    folder = save_stack(normed_stacks[1], tmp_path / "q", target_name="tiny", layout="qwen3-next")
    written = set(tensor_index(folder)[0])
    rows = _key_lines("mtp_qwen3next__keys__vllm-project_speculators_src_speculators_convert_mtp_converter.txt")
    assert len(rows) == 5
    for native, _, right, kind in rows:
        if kind.strip() == "(exact)":
            assert native in written
            pairs = [(native, right)]
        else:
            assert any(name.startswith(native) for name in written), native
            pairs = [(name, right + name[len(native):]) for name in written if name.startswith(native)]
        for theirs, mimo in pairs:
            env = {"L": LAYERS, "k": 1}
            assert FORMAT["qwen3-next"].ours(theirs, env) == FORMAT["mimo"].ours(f"model.{mimo}", env)
    config = read_config(folder)
    assert FORMAT.layout_of(config).name == "qwen3-next" and config["mtp_num_hidden_layers"] == 1
    real = {**config, "model_type": "qwen3_next", "num_experts": 512, "partial_rotary_factor": 0.25}
    reason = FORMAT.verdict(real, TargetShape(32, LAYERS, VOCAB))[1]
    assert "mixture-of-experts" in reason and "\n" not in reason


def broken(tmp_path: Path, stack: MtpStack, name: str, layout: str, edit) -> Path:
    from safetensors.torch import save_file

    folder = save_stack(stack, tmp_path / name, target_name="tiny", layout=layout)
    tensors = tensor_index(folder)[1](lambda _: True)
    config = read_config(folder)
    edit(tensors, config)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_bad_checkpoints_fail_in_one_line(tmp_path, setup, normed_stacks):
    targets, _, stacks = setup
    model, stack = targets["hf"].model, stacks[1]
    p = f"model.layers.{LAYERS}."
    cases = {
        "missing": (broken(tmp_path, stack, "missing", "deepseek-v3", lambda t, c: t.pop(p + "hnorm.weight")),
                    f"missing tensor {p}hnorm.weight"),
        "shape": (broken(tmp_path, stack, "shape", "deepseek-v3",
                         lambda t, c: t.update({p + "eh_proj.weight": torch.zeros(32, 32)})),
                  f"tensor {p}eh_proj.weight has shape"),
        "hidden": (broken(tmp_path, stack, "hidden", "deepseek-v3", lambda t, c: c.update({"hidden_size": 48})),
                   "hidden size mismatch"),
        "vocab": (broken(tmp_path, stack, "vocab", "deepseek-v3",
                         lambda t, c: c.update({"vocab_size": 96})), "vocabulary mismatch"),
        "depth": (broken(tmp_path, stack, "depth", "deepseek-v3", lambda t, c: c.update({"num_hidden_layers": 3})),
                  "follow 3 main layers"),
        "count": (broken(tmp_path, stack, "count", "deepseek-v3",
                         lambda t, c: c.update({"num_nextn_predict_layers": 2})), "declares 2 MTP layers"),
        "moe": (broken(tmp_path, stack, "moe", "deepseek-v3",
                       lambda t, c: t.update({p + "mlp.experts.0.up_proj.weight": torch.zeros(4, 32)})),
                "mixture-of-experts"),
        "gated": (broken(tmp_path, normed_stacks[1], "gated", "qwen3-next",
                         lambda t, c: t.update({"mtp.layers.0.self_attn.q_proj.weight": torch.zeros(64, 32)})),
                  "gated attention"),
        "other-target": (broken(tmp_path, stack, "other", "deepseek-v3", lambda t, c: t.update(
            {p + "embed_tokens.weight": torch.randn(VOCAB, 32)})), "is not this target's"),
        "unknown": (broken(tmp_path, stack, "unknown", "specviz",
                           lambda t, c: c.update({layouts.SPEC_KEY: {**c[layouts.SPEC_KEY], "extra": 1}})),
                    "unknown fields"),
    }
    for name, (folder, message) in cases.items():
        with pytest.raises(SpecvizError, match=message) as error:
            load_stack(folder, model)
        assert "\n" not in str(error.value) and str(error.value).startswith("MTP modules "), name
    other = tiny.model("llama", VOCAB, layers=LAYERS, scale=25, seed=7)
    with pytest.raises(SpecvizError, match="trained for tiny"):
        load_stack(save_stack(stack, tmp_path / "ours", target_name="tiny"), other)
    with pytest.raises(SpecvizError, match="config.json is missing"):
        load_stack(tmp_path, model)
    with pytest.raises(SpecvizError, match="no such directory, and not a hub id"):
        load_stack(tmp_path / "nowhere" / "deeper", model)
    with pytest.raises(SpecvizError, match="hub is offline") as error:
        load_stack("no-such-owner/no-such-mtp", model)
    assert "\n" not in str(error.value)


def test_bin_checkpoints_load_only_as_plain_tensors(tmp_path, setup):
    targets, _, stacks = setup
    model = targets["hf"].model
    folder = save_stack(stacks[1], tmp_path / "st", target_name="tiny", layout="deepseek-v3")
    tensors = tensor_index(folder)[1](lambda _: True)
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text((folder / "config.json").read_text())
    torch.save(tensors, binary / "pytorch_model.bin")
    for name, value in load_stack(binary, model).state_dict().items():
        torch.testing.assert_close(value, load_stack(folder, model).state_dict()[name])
    torch.save({**tensors, "x": tiny.Unpicklable()}, binary / "pytorch_model.bin")
    with pytest.raises(SpecvizError, match="weights_only=True") as error:
        load_stack(binary, model)
    assert "\n" not in str(error.value)



def test_registry_and_spec(tmp_path, setup):
    targets, _, stacks = setup
    target = targets["hf"]
    family, argument = registry.parse(f"mtp:{tmp_path}")
    assert family.name == "mtp" and argument == str(tmp_path) and family.trainer == "mtp"
    assert "post hoc" in family.description and "jointly" in family.description
    with pytest.raises(SpecvizError, match="no MTP modules are shipped for tiny-") as error:
        registry.build("mtp", target, SETTINGS)
    assert "\n" not in str(error.value)
    folder = save_stack(stacks[3], tmp_path / "m", target_name="tiny")
    drafter = registry.build(f"mtp:{folder}", target, {"stochastic_tree": True, "min_draft_prob": 0.0})
    assert isinstance(drafter, MtpDrafter) and drafter.stochastic_tree
    assert drafter.describe()["modules"] == 3 and drafter.describe()["trained"].startswith("post hoc")
    assert "not jointly with the model" in drafter.describe()["trained"]  # the app's run label shows it
    for stack in stacks.values():
        assert layouts.MtpSpec.from_dict(json.loads(json.dumps(stack.spec.to_dict()))) == stack.spec
        assert {k: tuple(v.shape) for k, v in stack.state_dict().items()} == FORMAT.expected_shapes(stack.spec)


# ---- training ---------------------------------------------------------------------------------------------------
def test_trainer_learns_and_saves_modules_that_draft(tmp_path):
    target = tiny.target("llama", VOCAB, layers=LAYERS, scale=10)
    rng = random.Random(0)
    sequences = [[rng.randrange(VOCAB) for _ in range(24)] for _ in range(16)]
    trainer = get_trainer("mtp")(target, {"layers": 2, "target_name": "tiny", "init_layers": str(LAYERS - 1)})
    data = feature_set(target.model, sequences, trainer.features().layers)
    assert trainer.features().layers == (LAYERS,)
    trainer.prepare(data)
    stack = trainer.build_student()
    source = target.model.model.layers[LAYERS - 1].mlp.up_proj.weight
    assert stack.num_modules == 2 and torch.equal(stack.layers[1].block.mlp.up_proj.weight, source)
    batch = make_batch(data, list(range(8)), 24)
    before = trainer.loss(stack, batch)[0].item()
    config = TrainConfig(steps=25, batch_size=8, seq_len=24, lr=3e-3, warmup=3, save_every=100, log_every=10)
    fit(trainer, stack, data, config, tmp_path, log=lambda line: None)
    after, stats = trainer.loss(stack, batch)
    assert after.item() < before * 0.9 and {"loss0", "loss1"} <= set(stats)
    ids = torch.tensor([sequences[0]])
    guesses = trainer.predict_argmax(stack, ids, {LAYERS: data.hidden[LAYERS][data.sequence(0)][None]})
    proposals = []

    class Keeping(MtpDrafter):
        def propose(self, *args):
            proposals.append(super().propose(*args))
            return proposals[-1]

    for j in (3, 10, 20):  # entry j (module 0 on the pair at j - 1) is the first draft after the prefix x[0..j]
        Generation(target, sequences[0][: j + 1], GenerationConfig(max_new_tokens=1), Keeping(stack, VOCAB, pack=False),
                   DraftBudget(k=1)).run()
        assert proposals[-1].tokens == [int(guesses[j])]
    trainer.save_pretrained(stack, tmp_path / "final")
    loaded = load_stack(tmp_path / "final", target.model)
    assert loaded.spec == stack.spec
    stored = tensor_index(tmp_path / "final")[0]
    assert set(stored) == set(FORMAT.expected_shapes(stack.spec))  # the borrowed embedding and head stay out


def test_a_module_step_equals_transformers_own_mtp_layer(tmp_path, setup, normed_stacks):
    """``MtpStack.step`` (then the module's norm) against transformers' own ``MtpLayer``, which implements
    DeepSeek-V3's ``eh_proj(cat(enorm(emb), hnorm(h)))`` and, with ``mtp_hidden_states_first``, the reversed order
    MiMo stores: fed our module's weights (and MiMo's ``input_proj`` as we write it), it computes what ours does."""
    import copy

    modeling_layers = pytest.importorskip("transformers.modeling_layers")
    if not hasattr(modeling_layers, "MtpModel"):
        pytest.skip("the installed transformers has no MTP layers")
    targets, _, stacks = setup
    model = copy.deepcopy(targets["hf"].model)
    model.config.num_mtp_layers = 1
    if getattr(model.config, "layer_types", None):  # Qwen2 names each layer's attention kind
        model.config.mtp_layer_types = ["full_attention"]
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, VOCAB, (1, 7), generator=generator)
    hidden = torch.randn(1, 7, model.config.hidden_size, generator=generator)
    positions = torch.arange(7)[None]
    for stack, hidden_first in ((stacks[1], False), (normed_stacks[1], True)):
        model.config.mtp_hidden_states_first = hidden_first
        theirs = modeling_layers.MtpModel(model, 1).eval()
        state = {name.replace(".block.", ".mtp_block.").replace(".norm.", ".post_norm."): value
                 for name, value in stack.state_dict().items()}
        if hidden_first:  # MiMo's input_proj, exactly as our saver writes it
            saved = tensor_index(save_stack(stack, tmp_path / "mimo", target_name="t", layout="mimo"))[1](
                lambda name: name.endswith("input_proj.weight"))
            state["layers.0.eh_proj.weight"] = saved["model.mtp_layers.0.input_proj.weight"]
        missing, unexpected = theirs.load_state_dict(state, strict=False)
        assert not unexpected and all(name.startswith(("embed_tokens", "shared_head")) for name in missing)
        with torch.no_grad():
            embeds = theirs.embed_tokens(tokens)
            expected = theirs.layers[0](embeds, hidden, theirs.rotary_emb(embeds, positions), None, positions, None)
            ours = stack.layers[0].norm(stack.step(0, hidden, tokens, positions))
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)
