"""The slot decoder (continuous batching for training data) and the compute floor it is measured against."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from specviz.training.floor import Rate, flops_per_token, matmul_gflops
from specviz.training.generate import greedy_batch, relabel, self_distill
from specviz.training.slot_decoder import SlotDecoder, unsupported

SHAPE = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}
MODELS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE)),
    "qwen2 (q/k/v biases)": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE)),
    "qwen3 (q/k norms)": lambda: Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16)),
}


def _prompts(count: int, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (count,), generator=generator)
    return [torch.randint(0, 300, (int(n),), generator=generator).tolist() for n in lengths]


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_greedy_answers_are_transformers_own_whatever_the_slots(make):
    """Fewer slots than prompts (so finished answers hand their slots on), an end token that stops some answers
    early: every answer and its top-k equal transformers' batched greedy decoding of the same prompts."""
    torch.manual_seed(0)
    model = make().eval()
    prompts = _prompts(19)
    end = {greedy_batch(model, prompts[:1], max_new_tokens=3, eos=set(), pad_id=0)[0][0][2]}  # a token it says
    reference = greedy_batch(model, prompts, max_new_tokens=10, eos=end, pad_id=0, topk=4)
    assert any(len(ids) < 10 for ids, _, _ in reference)  # the end token does end some answers
    for slots in (3, 32):
        answers = SlotDecoder(model, slots=slots).answer(prompts, max_new_tokens=10, eos=end, topk=4)
        for (ids, top_ids, top_probs), answer in zip(reference, answers):
            assert answer.ids == ids
            assert torch.equal(torch.stack(answer.top_ids), top_ids)
            torch.testing.assert_close(torch.stack(answer.top_probs), top_probs, atol=1e-5, rtol=1e-4)


def test_a_sampled_answer_does_not_depend_on_its_batch():
    torch.manual_seed(0)
    model = MODELS["llama"]().eval()
    prompts = _prompts(9)
    alone = [SlotDecoder(model, slots=1).answer([p], max_new_tokens=8, eos=set(), temperature=1.0, seed=5 + i)[0].ids
             for i, p in enumerate(prompts)]
    together = SlotDecoder(model, slots=4).answer(prompts, max_new_tokens=8, eos=set(), temperature=1.0, seed=5)
    assert [a.ids for a in together] == alone
    greedy = SlotDecoder(model, slots=4).answer(prompts, max_new_tokens=8, eos=set())
    assert [a.ids for a in together] != [a.ids for a in greedy]  # it did sample


def test_other_architectures_are_named_and_keep_the_padded_batches(tmp_path):
    model = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=1, n_head=2)).eval()
    assert "gpt2" in unsupported(model)
    with pytest.raises(ValueError, match="cannot run this model: model type 'gpt2'"):
        SlotDecoder(model)


def test_the_feature_pass_gives_answers_decoded_in_bfloat16_the_float32_targets_labels(tmp_path):
    """With hidden states asked for, bfloat16 decoding only chooses the contexts: every label is the float32
    target's, from the teacher-forced pass (the same numbers ``relabel`` gives) that gives the hidden states."""
    from tiny import save_tiny_model

    from specviz.models import load_model

    target = load_model(str(save_tiny_model(tmp_path / "target", hidden=32, layers=2)))
    prompts = ["the cat sat", "a dog ran far away", "why"]
    fast = self_distill(target.model, target.tokenizer, prompts, max_new_tokens=6, batch_size=2, topk=3,
                        decode_dtype=torch.bfloat16, layers=(1,))
    exact = relabel(target.model, fast, 3)
    assert torch.equal(fast.topk_ids, exact.topk_ids) and torch.equal(fast.topk_probs, exact.topk_probs)
    assert set(fast.hidden) == {1} and fast.hidden[1].shape == (fast.num_tokens, 32)
    assert (fast.topk_ids >= 0).all() and torch.equal(fast.loss_mask, exact.loss_mask)
    plain = self_distill(target.model, target.tokenizer, prompts, max_new_tokens=6, batch_size=2, topk=3)
    again = relabel(target.model, plain, 3)  # decoded in its own dtype: the decoding's logits are the labels
    answer = plain.loss_mask
    assert not plain.hidden and torch.equal(plain.topk_ids[answer], again.topk_ids[answer])
    torch.testing.assert_close(plain.topk_probs[answer], again.topk_probs[answer], atol=1e-5, rtol=1e-4)
    assert (plain.topk_ids[~answer] == -1).all()  # labels only where it decoded


def test_the_floor_is_the_matrix_rate_over_two_flops_a_weight():
    model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert flops_per_token(model) == 2 * weights
    rate = Rate(tokens=600, answer_tokens=200, seconds=2.0, gflops=100.0, flops_per_token=1e8)
    assert rate.floor == 1000 and rate.fraction == pytest.approx(0.3)
    assert "100 answer tokens/s, 300 forward tokens/s = 30% of the floor (1000 tokens/s" in rate.describe(
        torch.bfloat16)
    assert matmul_gflops(side=256, repeats=1) > 0


def test_an_emulated_dtype_is_timed_on_a_small_product(monkeypatch):
    """Where a dtype runs emulated, its rate comes from the small product alone (a large one would take a minute)."""
    from specviz.training import floor

    sides = []
    rate = {torch.float32: 100.0, torch.bfloat16: 0.6}
    monkeypatch.setattr(floor, "_timed_gflops", lambda dtype, side, repeats, device: sides.append(side) or rate[dtype])
    assert floor.matmul_gflops(torch.bfloat16) == 0.6 and sides == [floor.EMULATED_SIDE, floor.EMULATED_SIDE]
    sides.clear()
    assert floor.matmul_gflops(torch.float32) == 100.0 and sides == [floor.EMULATED_SIDE, floor.SIDE]


def test_the_data_builds_floor_is_the_best_rate_it_measured(monkeypatch):
    """Measured again at every shard, the best kept: a floor first measured on a busy machine rises when the machine
    is quiet, and one busy moment later does not lower it."""
    from specviz.training import floor

    measured = iter([100.0, 400.0, 200.0])
    monkeypatch.setattr(floor, "matmul_gflops", lambda dtype, device: next(measured))
    monkeypatch.setattr(floor, "_BEST_GFLOPS", {})
    assert [floor.best_gflops(torch.bfloat16, "cpu") for _ in range(3)] == [100.0, 400.0, 400.0]


@pytest.mark.parametrize(("bf16_gflops", "chosen"), [(0.6, "float32"), (34.0, "float32"), (35.0, "bfloat16"),
                                                     (900.0, "bfloat16")])
def test_auto_decodes_in_bfloat16_only_where_its_products_run_at_least_half_as_fast(monkeypatch, bf16_gflops, chosen):
    """Where bfloat16 is emulated (0.6 GFLOP/s against float32's 70 on a CPU with neither AMX nor AVX-512 BF16) the
    answers decode in float32; the choice and both rates are logged, an explicit dtype is kept as given."""
    from specviz.training import data, floor

    rates = {torch.float32: 70.0, torch.bfloat16: bf16_gflops}
    monkeypatch.setattr(floor, "matmul_gflops", lambda dtype, device: rates[dtype])
    lines = []
    assert data.resolve_gen_dtype("auto", "cpu", lines.append) == chosen
    assert lines == [f"answers decode in {chosen} (--gen-dtype auto): float32 products 70 GFLOP/s, bfloat16 "
                     f"{bf16_gflops:.3g} GFLOP/s"]
    assert [data.resolve_gen_dtype(name, "cpu", lines.append) for name in data.DTYPES] == list(data.DTYPES)
    assert len(lines) == 1


def test_auto_measures_this_machine_and_the_cli_defaults_to_it():
    from specviz.training.arguments import build_parser
    from specviz.training.floor import faster_dtype

    chosen, rates = faster_dtype()  # this machine's own products, both dtypes timed
    assert set(rates) == {torch.float32, torch.bfloat16} and min(rates.values()) > 0
    assert (chosen == torch.bfloat16) == (rates[torch.bfloat16] >= rates[torch.float32] / 2)
    args = build_parser().parse_args(["eagle3", "--data", "x", "--out", "o"])
    assert args.gen_dtype == "auto"


@pytest.mark.parametrize(("faster", "warned"), [(torch.float32, True), (torch.bfloat16, False)])
def test_autocast_bf16_is_warned_of_where_bfloat16_runs_slower(monkeypatch, faster, warned):
    from specviz.training import cli

    monkeypatch.setattr(cli, "faster_dtype", lambda device: (faster, {torch.float32: 70.0, torch.bfloat16: 0.6}))
    lines = []
    cli._check_autocast("cpu", lines.append)
    assert lines == (["warning: --autocast bf16 trains slower than float32 on this machine (float32 products 70 "
                      "GFLOP/s, bfloat16 0.6 GFLOP/s): leave it out here"] if warned else [])
