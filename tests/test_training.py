"""Training pipeline on tiny in-process targets: data, features, generation, trainer, checkpoints and the CLI."""

from __future__ import annotations

import json
import random
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny import WORDS, save_tiny_model

from specviz.errors import SpecvizError
from specviz.models import check_same_tokenizer, clear_cache, load_model
from specviz.training.batches import make_batch
from specviz.training.cli import main
from specviz.training.data import positions_subset, split_prompts
from specviz.training.evaluate import chain_tau, evaluate_agreement
from specviz.training.export import _self_prompt_data
from specviz.training.export import main as export_main
from specviz.training.features import FeatureSet, extract_features
from specviz.training.generate import chat_ids, greedy_batch, self_distill
from specviz.training.prompts import build_prompts
from specviz.training.text_sources import Document, clean_text, iter_documents
from specviz.training.trainers import TrainConfig, fit, get_trainer


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def tiny_target(tmp_path):
    return load_model(str(save_tiny_model(tmp_path / "target", hidden=32, layers=2)))


def count_calls(monkeypatch, module, name: str) -> dict[str, int]:
    """``module.name`` wrapped so that ``result["n"]`` counts its calls (which stages ran, which came from a cache)."""
    calls = {"n": 0}
    real = getattr(module, name)

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def story(seed: int, words: int = 400) -> str:
    rng = random.Random(seed)
    sentences = []
    for _ in range(words // 8):
        sentences.append(" ".join(rng.choice(WORDS[:24]) for _ in range(7)) + " .")
        if rng.random() < 0.2:
            sentences.append("\n\n")
    return " ".join(sentences)


def test_clean_text_strips_gutenberg_wrapping():
    raw = ("\ufeffThe Project Gutenberg eBook\r\n*** START OF THE PROJECT GUTENBERG EBOOK ALICE ***\r\n"
           "Alice was here.\r\n\r\nThe end.\r\n*** END OF THE PROJECT GUTENBERG EBOOK ALICE ***\r\nLicence text")
    assert clean_text(raw) == "Alice was here.\n\nThe end.\n"


def test_data_sources_resolve_and_reject(tmp_path):
    (tmp_path / "a.txt").write_text("hello\r\nworld")
    docs = list(iter_documents([str(tmp_path / "*.txt"), "stdlib"], stdlib_limit=2))
    assert docs[0].text == "hello\nworld\n" and sum(d.kind == "code" for d in docs) == 2
    with pytest.raises(SpecvizError, match="no such file"):
        list(iter_documents([str(tmp_path / "missing-*.txt")]))


def test_prompts_are_seeded_distinct_and_varied():
    docs = [Document("s", story(i, 600)) for i in range(3)]
    docs.append(Document("c", "def f(x):\n" + "".join(f"    y{i} = x + {i}\n" for i in range(8)) + "    return x\n",
                         kind="code"))
    first, again = build_prompts(docs, 60, seed=1), build_prompts(docs, 60, seed=1)
    assert [p.text for p in first] == [p.text for p in again]
    assert len({p.text for p in first}) == 60
    assert {"summarization", "math_reasoning", "coding"} <= {p.category for p in first}


def test_extra_prompts_extend_training_without_moving_the_held_out_split():
    docs = [Document("s", story(i, 600)) for i in range(3)]
    base, more = build_prompts(docs, 40, seed=2), build_prompts(docs, 90, seed=2)
    assert more[:40] == base and len({p.text for p in more}) == 90  # prefix-stable, still distinct
    train, held = split_prompts(more[:40], 8, seed=2)
    assert (train, held) == split_prompts(base, 8, seed=2)
    assert not {p.text for p in held} & {p.text for p in more[40:]}


def test_more_prompts_later_answer_and_extract_only_their_own_shards(tiny_target, tmp_path, monkeypatch):
    """Answers and their hidden states are cached per shard: a longer prompt list reuses every shard it shares with
    an earlier one, and gives the same features for them (fresh ones as stored, so a rerun sees the same numbers).
    A fresh shard gets its hidden states from the pass that labels it; cached answers read with layers no feature
    file holds get one feature pass, and no new answers."""
    from specviz.training import data

    monkeypatch.setattr(data, "SHARD_PROMPTS", 2)
    calls = {"answer": 0, "hidden": 0}
    real_distill, real_hidden = data.self_distill, data.hidden_states_over

    def counting(kind, function):
        def wrapped(*args, **kwargs):
            calls[kind] += 1
            return function(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(data, "self_distill", counting("answer", real_distill))
    monkeypatch.setattr(data, "hidden_states_over", counting("hidden", real_hidden))
    prompts = build_prompts([Document("s", story(i, 600)) for i in range(3)], 5, seed=1)
    plan = data.DataPlan(sources=[], gen_tokens=4, gen_batch=4, layers=(1,), extra_layers=(2,))
    first = data.answers(tiny_target, prompts[:4], plan, tmp_path, "answers", log=lambda _: None)
    assert calls == {"answer": 2, "hidden": 0} and set(first.hidden) == {1}
    more = data.answers(tiny_target, prompts, plan, tmp_path, "answers", log=lambda _: None)
    assert calls == {"answer": 3, "hidden": 0}  # only the new shard (the fifth prompt)
    same = more.subset(list(range(4)))
    assert torch.equal(same.input_ids, first.input_ids) and torch.equal(same.hidden[1], first.hidden[1])
    again = data.answers(tiny_target, prompts, plan, tmp_path, "answers", log=lambda _: None)
    assert calls == {"answer": 3, "hidden": 0} and torch.equal(again.hidden[1], more.hidden[1])
    other = data.answers(tiny_target, prompts, data.DataPlan(sources=[], gen_tokens=4, gen_batch=4, layers=(0,)),
                         tmp_path, "answers", log=lambda _: None)
    assert calls == {"answer": 3, "hidden": 3} and other.input_ids.tolist() == more.input_ids.tolist()


def test_a_window_of_extra_prompts_trains_on_the_full_sets_own_shards(tiny_target, tmp_path, monkeypatch, capsys):
    """``--extra-prompts-from N``: the training set is the extra prompts from N on, the very sequences the full set
    holds for them (read from its cached shards, nothing answered again), with the same held-out answers; a start
    off a shard boundary, or past the extra prompts, is a one-line error before anything loads."""
    from dataclasses import replace

    from specviz.training import data

    monkeypatch.setattr(data, "SHARD_PROMPTS", 2)
    for i in range(3):
        (tmp_path / f"s{i}.txt").write_text(story(i, 600))
    calls = count_calls(monkeypatch, data, "self_distill")
    plan = data.DataPlan(sources=[str(tmp_path / "*.txt")], prompts=4, eval_prompts=2, extra_prompts=6,
                         corpus_tokens=0, gen_tokens=4, gen_batch=4)
    full = data.build_data(tiny_target, plan, tmp_path / "cache", log=lambda _: None)
    answered = calls["n"]
    window = data.build_data(tiny_target, replace(plan, extra_from=2), tmp_path / "cache", log=lambda _: None)
    assert calls["n"] == answered
    assert window.train.num_sequences == 4  # extra prompts 2..5; the base 4 and extra 0..1 left out
    assert window.train.input_ids.tolist() == full.train.subset(list(range(6, 10))).input_ids.tolist()
    assert window.heldout.input_ids.tolist() == full.heldout.input_ids.tolist()
    for start in ("100", "1024"):
        assert main(["eagle3", "--target", "no-such-model", "--data", "stdlib", "--extra-prompts", "1024",
                     "--extra-prompts-from", start, "--out", str(tmp_path / "run")]) == 2
        assert "--extra-prompts-from must be a multiple of 512 below --extra-prompts (1024)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_build_that_only_caches_lets_each_shards_hidden_states_go(tiny_target, tmp_path, monkeypatch):
    """``keep_hidden=False`` (``specviz data``): every shard, the corpus and the held-out answers are cached with their
    hidden states, and the build returns none of them (it held one shard's at a time); a training build then reads
    those states, answering and extracting nothing again."""
    from dataclasses import replace

    from specviz.training import data

    monkeypatch.setattr(data, "SHARD_PROMPTS", 2)
    for i in range(3):
        (tmp_path / f"s{i}.txt").write_text(story(i, 600))
    answered = count_calls(monkeypatch, data, "self_distill")
    extracted = count_calls(monkeypatch, data, "extract_features")
    plan = data.DataPlan(sources=[str(tmp_path / "*.txt")], prompts=4, eval_prompts=2, extra_prompts=2,
                         corpus_tokens=200, seq_len=64, gen_tokens=4, gen_batch=4, layers=(1,), extra_layers=(2,),
                         keep_hidden=False)
    cached = data.build_data(tiny_target, plan, tmp_path / "cache", log=lambda _: None)
    assert cached.train.hidden == {} and cached.heldout.hidden == {}
    built = (answered["n"], extracted["n"])
    trained = data.build_data(tiny_target, replace(plan, keep_hidden=True), tmp_path / "cache", log=lambda _: None)
    assert (answered["n"], extracted["n"]) == built
    assert set(trained.train.hidden) == {1} and set(trained.heldout.hidden) == {1}
    assert trained.train.hidden[1].shape[0] == trained.train.num_tokens
    assert trained.train.input_ids.tolist() == cached.train.input_ids.tolist()


def test_the_target_writes_prompts_of_its_own(tiny_target, tmp_path, monkeypatch, capsys):
    """--self-prompts: user turns sampled after the target's own chat template opens a user turn (seeded, cached,
    filtered; a larger count extends the list, and a window of it leaves out what earlier draws wrote), answered and
    trained on like any prompt, and with them a window may leave every generated prompt out; a tokenizer without a
    chat template is a one-line error."""
    from dataclasses import replace

    from specviz.training import data, self_prompts

    monkeypatch.setattr(data, "SHARD_PROMPTS", 8)
    tokenizer = tiny_target.tokenizer
    opening = self_prompts.user_turn_opening(tokenizer)
    asked = chat_ids(tokenizer, "tell a story")
    assert len(opening) < len(asked) and asked[:len(opening)] == opening  # up to the user's text
    sampled = count_calls(monkeypatch, self_prompts, "continue_ids")
    logged = []
    options = {"cache": tmp_path / "cache", "seed": 0, "shard": 8, "batch_size": 4, "decode_dtype": None,
               "log": logged.append}
    few = self_prompts.self_written_prompts(tiny_target, 8, **options)
    more = self_prompts.self_written_prompts(tiny_target, 24, **options)
    assert sampled["n"] == 1 + 2  # the first shard came from the cache the second time
    assert more[:len(few)] == few and len(more) > len(few)
    texts = [p.text for p in more]
    assert len(set(texts)) == len(texts) and {p.category for p in more} == {self_prompts.CATEGORY}
    assert all(len(text.split()) >= self_prompts.MIN_WORDS and "<|im_end|>" not in text for text in texts)
    assert self_prompts.self_written_prompts(tiny_target, 24, **options) == more and sampled["n"] == 3
    later = self_prompts.self_written_prompts(tiny_target, 24, start=8, **options)  # the window after the first shard
    assert later == more[len(few):] and sampled["n"] == 3
    rates = [line for line in logged if "sampled tokens/s" in line and "of the floor" in line]
    assert len(rates) == 3  # each shard sampled says how near the machine's floor it ran

    (tmp_path / "s.txt").write_text(story(0, 600))
    plan = data.DataPlan(sources=[str(tmp_path / "s.txt")], prompts=4, eval_prompts=2, extra_prompts=2, extra_from=2,
                         self_prompts=24, corpus_tokens=0, gen_tokens=4, gen_batch=4)
    built = data.build_data(tiny_target, plan, tmp_path / "cache", log=lambda _: None)
    assert built.train.num_sequences == len(more) and set(built.train.categories) == {self_prompts.CATEGORY}
    first = chat_ids(tokenizer, more[0].text)
    assert built.train.input_ids[built.train.sequence(0)].tolist()[:len(first)] == first
    assert data.build_data(tiny_target, replace(plan, self_prompts=0, extra_from=0),
                           tmp_path / "cache", log=lambda _: None).train.num_sequences == 4 + 2

    assert main(["eagle3", "--target", "no-such-model", "--data", "stdlib", "--extra-prompts", "1024",
                 "--extra-prompts-from", "1024", "--self-prompts", "512", "--out", str(tmp_path / "run")]) == 2
    assert "--extra-prompts-from" not in capsys.readouterr().err  # allowed with self-written prompts: fails later
    assert main(["eagle3", "--target", "no-such-model", "--data", "stdlib", "--self-prompts", "512",
                 "--self-prompts-from", "512", "--out", str(tmp_path / "run")]) == 2
    assert "--self-prompts-from must be a multiple of 512 below --self-prompts (512)" in capsys.readouterr().err
    tokenizer.chat_template = None
    with pytest.raises(SpecvizError, match="cannot write its own prompts"):
        self_prompts.user_turn_opening(tokenizer)


def test_the_data_stages_run_the_kernel_their_probe_times_faster(tiny_target):
    """The data stages' forward is the fast path on whichever kernel a timed probe pass found faster (logged with
    both times where the thin kernel builds), and it computes the target's own hidden states."""
    from specviz.training.cli import _inference_view

    messages = []
    view = _inference_view(tiny_target, messages.append)
    if tiny_target.fast_model().kernel_choice["wide"] == "thin":
        assert len(messages) == 1 and "s on torch's kernel" in messages[0] and "s on the thin kernel" in messages[0]
        chosen = messages[0].split("data stages on ")[1].split(":")[0]
        expected_thin = chosen == "the thin kernel"
        assert (view.model is tiny_target.fast_model()) == expected_thin
    else:
        assert messages == []
    sequences = [[(3 + 5 * i) % tiny_target.vocab_size for i in range(24)] for _ in range(2)]
    ours = extract_features(view.model, sequences, layers=(1,), desc=None)
    reference = extract_features(tiny_target.model, sequences, layers=(1,), desc=None)
    assert torch.allclose(ours.hidden[1].float(), reference.hidden[1].float(), atol=1e-4)


def test_a_positions_subset_is_seeded_nested_and_big_enough():
    """A data-scaling curve's sizes: each subset holds at least the asked positions, the smaller one is part of the
    larger, the same seed picks the same sequences, and asking for more than there is keeps everything."""
    lengths = [5, 9, 3, 12, 7, 4, 8, 6, 10, 2]
    sequences = [list(range(n)) for n in lengths]
    data = FeatureSet(torch.cat([torch.tensor(s) for s in sequences]),
                      torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]),
                      torch.ones(sum(lengths), dtype=torch.bool), torch.zeros(sum(lengths), 2, dtype=torch.long),
                      torch.ones(sum(lengths), 2) / 2, categories=[f"c{i}" for i in range(len(lengths))])
    small, large = positions_subset(data, 15, seed=0), positions_subset(data, 40, seed=0)
    assert 15 <= int(small.loss_mask.sum()) < 15 + max(lengths) and int(large.loss_mask.sum()) >= 40
    assert set(small.categories) < set(large.categories)
    assert positions_subset(data, 15, seed=0).categories == small.categories
    assert positions_subset(data, 15, seed=1).categories != small.categories
    assert positions_subset(data, 10_000, seed=0).num_sequences == data.num_sequences


def test_chain_tau_counts_the_bonus_token():
    assert chain_tau([False] * 6, k=4) == 1.0
    assert chain_tau([True] * 10, k=4) == 5.0
    # rounds: accept 2 then reject (3 tokens), accept 0 (1 token) -> 4 tokens in 2 rounds
    assert chain_tau([True, True, False, False], k=4) == 2.0


def test_batched_greedy_matches_one_at_a_time(tiny_target):
    model, tok = tiny_target.model, tiny_target.tokenizer
    prompts = [chat_ids(tok, text) for text in ("the cat sat", "tell story about a big red dog and a cat", "why")]

    def single(prompt, steps, eos):
        ids, out = torch.tensor([prompt]), []
        for _ in range(steps):
            nxt = int(model(input_ids=ids).logits[0, -1].argmax())
            out.append(nxt)
            if nxt in eos:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
        return out

    free_run = single(prompts[0], 8, set())
    eos = {free_run[2]}  # makes the first prompt stop early, so rows leave the batch mid-way
    results = greedy_batch(model, prompts, max_new_tokens=8, eos=eos, pad_id=3, topk=4)
    for prompt, (answer, top_i, top_p) in zip(prompts, results):
        assert answer == single(prompt, 8, eos)
        assert top_i.shape == (len(answer), 4) and torch.all(top_i[:, 0] == torch.tensor(answer))
        assert torch.all(top_p[:, :-1] >= top_p[:, 1:])


def test_feature_extraction_layers_and_topk(tiny_target, tmp_path):
    model = tiny_target.model
    seqs = [[1, 5, 6, 7, 8, 9], [1, 10, 11]]
    features = extract_features(model, seqs, topk=3, layers=(0, 1, 2))
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([seqs[0]]), output_hidden_states=True)
    span = features.sequence(0)
    probs = torch.softmax(ref.logits[0], -1)
    assert torch.allclose(features.topk_probs[span], probs.topk(3).values, atol=1e-5)
    for layer in (0, 1, 2):  # hidden_states index convention: i = output of decoder layer i-1
        assert torch.allclose(features.hidden[layer][span], ref.hidden_states[layer][0], atol=1e-5)
    features.save(tmp_path / "f.safetensors", {"why": "test"})
    loaded = FeatureSet.load(tmp_path / "f.safetensors")
    assert loaded.input_ids.tolist() == features.input_ids.tolist() and loaded.categories == features.categories
    assert not loaded.loss_mask[span][-1] and loaded.subset([1]).input_ids.tolist() == seqs[1]
    both = FeatureSet.concat([loaded, loaded.subset([1])])
    assert both.num_sequences == 3 and both.sequence(2) == slice(9, 12)


def test_self_distill_marks_answer_positions(tiny_target):
    tok = tiny_target.tokenizer
    fs = self_distill(tiny_target.model, tok, ["the cat", "a dog ran"], max_new_tokens=5, batch_size=2, topk=2)
    for i in range(2):
        span = fs.sequence(i)
        mask, ids, top = fs.loss_mask[span], fs.input_ids[span], fs.topk_ids[span]
        prompt_len = len(chat_ids(tok, ["the cat", "a dog ran"][i]))
        assert mask.nonzero()[0].item() == prompt_len - 1  # the position that predicts the first answer token
        assert torch.equal(top[mask][:, 0], ids[1:][mask[:-1]])  # greedy: top-1 is the next token


def _tiny_data(target, n_prompts=24):
    docs = [Document("s", story(i, 300)) for i in range(4)]
    prompts = [p.text for p in build_prompts(docs, n_prompts, seed=0)]
    answers = self_distill(target.model, target.tokenizer, prompts, max_new_tokens=12, batch_size=12, topk=4)
    windows = [target.tokenizer(story(10 + i, 60))["input_ids"][:48] for i in range(8)]
    corpus = extract_features(target.model, windows, topk=4)
    return FeatureSet.concat([answers, corpus])


@pytest.mark.parametrize("softmax_sample", [0, 8])
def test_draft_lm_loss_falls_and_checkpoint_loads_back(tiny_target, tmp_path, softmax_sample):
    trainer = get_trainer("draft-lm")(tiny_target, {"hidden": 16, "layers": 1, "heads": 2, "kv_heads": 1,
                                                    "intermediate": 32, "topk": 4, "softmax_sample": softmax_sample})
    data = _tiny_data(tiny_target)
    torch.manual_seed(0)
    student = trainer.build_student()
    config = TrainConfig(steps=40, batch_size=8, seq_len=64, lr=1e-2, warmup=4, save_every=20, log_every=1)
    history = fit(trainer, student, data, config, tmp_path / "run", log=lambda _m: None)["history"]
    first = sum(h["loss"] for h in history[:5]) / 5
    last = sum(h["loss"] for h in history[-5:]) / 5
    assert last < 0.8 * first, (first, last)
    predict = lambda ids, hidden: trainer.predict_argmax(student, ids, hidden)  # noqa: E731
    metrics = evaluate_agreement(predict, data.subset(list(range(4))))
    assert 0.0 <= metrics["top1_agreement"] <= 1.0 and metrics["positions"] > 0
    trainer.save_pretrained(student, tmp_path / "saved")
    draft = load_model(str(tmp_path / "saved"), role="draft")
    check_same_tokenizer(tiny_target, draft)
    batch = make_batch(data, [0], 64)
    with torch.no_grad():
        expected = student(input_ids=batch.input_ids).logits
        assert torch.allclose(draft.model(input_ids=batch.input_ids).logits, expected, atol=1e-4)


def test_resume_continues_from_the_latest_checkpoint(tiny_target, tmp_path):
    trainer = get_trainer("draft-lm")(tiny_target, {"hidden": 16, "layers": 1, "heads": 2, "kv_heads": 1,
                                                    "intermediate": 32, "topk": 4})
    data = _tiny_data(tiny_target, n_prompts=8)
    run = tmp_path / "run"

    def train(steps, resume):
        torch.manual_seed(0)
        student = trainer.build_student()
        config = TrainConfig(steps=steps, batch_size=4, seq_len=48, lr=5e-3, warmup=2, save_every=3, log_every=1,
                             resume=resume)
        messages = []
        return student, fit(trainer, student, data, config, run, log=messages.append)["history"], messages

    _, history, _ = train(6, resume=False)
    student, resumed, messages = train(8, resume=True)
    assert any("resumed" in m and "step 6" in m for m in messages)
    assert [h["step"] for h in resumed] == list(range(1, 9))
    assert resumed[:6] == history[:6]


def test_candidate_pool_reindexes_targets():
    from specviz.training.trainers.draft_lm import candidate_pool

    top = torch.tensor([[5, 9, -1], [9, 2, 7]])
    labels = torch.tensor([5, 40])
    pool, top_local, labels_local = candidate_pool(top, labels, vocab_size=50, negatives=3)
    assert {2, 5, 7, 9, 40} <= set(pool.tolist())
    assert torch.equal(torch.where(top_local >= 0, pool[top_local.clamp(min=0)], -1), top)
    assert torch.equal(pool[labels_local], labels)


def test_unknown_trainer_kind():
    with pytest.raises(SpecvizError, match="draft-lm"):
        get_trainer("medusa-9")


def test_cli_end_to_end_exports_a_loadable_fp16_drafter(tmp_path):
    target_dir = save_tiny_model(tmp_path / "target", hidden=32, layers=2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\ufeff" + story(1, 800).replace("\n", "\r\n"))
    export = tmp_path / "export"
    code = main(["draft-lm", "--target", str(target_dir), "--data", str(corpus), "--out", str(tmp_path / "run"),
                 "--steps", "4", "--batch-size", "4", "--seq-len", "64", "--prompts", "6", "--eval-prompts", "2",
                 "--gen-tokens", "6", "--gen-batch", "4", "--corpus-tokens", "200", "--hidden", "16", "--layers", "1",
                 "--save-every", "2", "--log-every", "1", "--cache-dir", str(tmp_path / "cache"),
                 "--export", str(export), "--name", "tiny-draft"])
    assert code == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["steps"] == 4 and "top1_agreement" in metrics["heldout"]
    card = (export / "README.md").read_text()
    assert "tiny-draft" in card and "--steps 4" in card and "No benchmark prompt was trained on" in card
    assert "templates over corpus passages (" in card and "stdlib" not in card  # only the sources it was given
    clear_cache()
    draft = load_model(str(export), role="draft")
    assert json.loads((export / "config.json").read_text())["dtype"] == "float16"
    assert draft.model.config.num_hidden_layers == 1
    assert list(Path(tmp_path / "cache" / "features").glob("*.safetensors"))  # features cached for reuse
    benches = []  # re-export with two bench runs: one table each, since each run's speedups have their own baseline
    for i, tau in enumerate((1.5, 1.75)):
        row = f"model:tiny-draft chain k={i + 2}"
        table = {row: {"overall": {"tau": tau, "speedup": {"median": 0.9}, "prompts": 1}}}
        path = tmp_path / f"bench{i}.json"
        path.write_text(json.dumps({"summary": {"rows": ["plain (specviz)", row], "table": table},
                                    "command": f"bench run {i}"}))
        benches.append(str(path))
    assert export_main(["--run", str(tmp_path / "run"), "--dest", str(tmp_path / "again"), "--name", "tiny-draft",
                        "--bench", *benches]) == 0
    card = (tmp_path / "again" / "README.md").read_text()
    assert card.count("Measured with the specviz engine") == 2 and "`bench run 1`" in card
    assert "| model:tiny-draft chain k=3 | 1.75 | 0.90× |" in card


@pytest.mark.parametrize("argv, says", [
    (["--data", ""], "--data has an empty entry"),  # "" once meant "." and read the whole tree
    (["--threads", "0"], "--threads must be 1 or more"),
    (["--threads", "-1"], "--threads must be 1 or more"),
    (["--steps", "-1"], "--steps must be 0 or more"),
    (["--train-positions", "-5"], "--train-positions must be 0 or more"),
    (["--batch-size", "-3"], "--batch-size must be 1 or more"),
    (["--lr", "nan"], "--lr must be a positive number"),
    (["--out", "{file}/run"], "--out"),
    (["--out", "{file}"], "is a file, not a folder"),
    (["--out", ""], "--out is empty"),  # once Path("") = ".": a run into the current folder
    (["--out", " "], "--out is empty"),
    (["--seq-len", "16"], "--seq-len must be 32 or more"),  # shorter windows are dropped: no data, a traceback
    (["--export", "{file}"], "--export"),  # once refused only after the whole run had trained
    (["--out", "{run}"], "holds an earlier run (final, metrics.json, step-000050): add --resume"),
])
def test_train_options_are_checked_before_any_data_stage(tmp_path, capsys, argv, says):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    run = tmp_path / "earlier-run"
    (run / "final").mkdir(parents=True)
    (run / "step-000050").mkdir()
    (run / "metrics.json").write_text("{}")
    argv = [part.format(file=a_file, run=run) for part in argv]
    base = {"--data": str(tmp_path), "--out": str(tmp_path / "r")}
    for flag in ("--data", "--out"):
        if flag not in argv:
            argv += [flag, base[flag]]
    code = main(["draft-lm", "--target", "no-such-model", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and says in err[-1], err


def test_training_text_too_short_for_a_window_is_one_line(tiny_target):
    from specviz.training.data import DataPlan, corpus_windows
    from specviz.training.text_sources import Document

    with pytest.raises(SpecvizError, match="holds no window of 32 tokens or more"):
        corpus_windows(tiny_target, [Document("short.txt", "one short sentence .")], DataPlan(sources=["x"]))


def test_cli_reports_user_errors_in_one_line(tmp_path, capsys):
    code = main(["draft-lm", "--target", "no-such-model", "--data", str(tmp_path), "--out", str(tmp_path / "r")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[-1]] and err[-1].startswith("error: unknown model")
    assert not (tmp_path / "r").exists()  # refused before the run folder and its log were made


def _write_prompt_file(path: Path, per_category: int = 4) -> Path:
    rows = [{"question_id": f"{c}{i}", "category": c, "turns": [f"{c} question {i} about the cat", "second turn"]}
            for i in range(per_category) for c in ("writing", "qa")]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_prompt_file_holds_out_exactly_what_the_bench_evaluates(tmp_path):
    from specviz.bench.prompts import load_prompts, select
    from specviz.training.prompts import file_prompts

    path = _write_prompt_file(tmp_path / "q.jsonl")
    train, held = file_prompts(str(path), 2)
    benched = select(load_prompts(path), limit_per_category=2)
    assert sorted((p.category, p.text) for p in held) == sorted((p.category, p.text) for p in benched)
    assert len(train) == 4 and not {p.text for p in train} & {p.text for p in held}
    assert all("second turn" not in p.text for p in train)  # first turns only, like the bench
    assert file_prompts(str(path), 0)[1] == [] and file_prompts(str(path), 9)[0] == []
    with pytest.raises(SpecvizError, match="holdout"):
        file_prompts(str(path), -1)
    (tmp_path / "bad.jsonl").write_text('{"category": "qa"}\n')
    with pytest.raises(SpecvizError, match="bad.jsonl:1"):
        file_prompts(str(tmp_path / "bad.jsonl"), 1)


def test_sampled_answers_follow_the_tempered_distribution_and_keep_true_top_k(tiny_target):
    model, tok = tiny_target.model, tiny_target.tokenizer
    with torch.no_grad():  # a peaked distribution (top token ~0.73 at T=1, ~0.36 at T=1.5) so T visibly matters
        model.lm_head.weight.mul_(8)
    prompt = chat_ids(tok, "the cat sat")
    logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    temperature, draws = 1.5, 600
    generator = torch.Generator().manual_seed(0)
    results = greedy_batch(model, [prompt] * draws, max_new_tokens=1, eos=set(), pad_id=3, topk=4,
                           temperature=temperature, generator=generator)
    firsts = torch.tensor([answer[0] for answer, _, _ in results])
    expected = torch.softmax(logits / temperature, dim=-1)
    true_p, true_i = torch.softmax(logits, dim=-1).topk(4)
    for token in expected.topk(3).indices:  # each frequent token within 4.5 standard errors of its probability
        p = float(expected[token])
        observed = float((firsts == token).float().mean())
        assert abs(observed - p) < 4.5 * (p * (1 - p) / draws) ** 0.5, (int(token), observed, p)
    assert len(set(firsts.tolist())) > 1  # really sampled, not argmax
    _, top_i, top_p = results[0]
    assert torch.equal(top_i[0], true_i) and torch.allclose(top_p[0], true_p, atol=1e-5)  # temperature-1 labels
    again = greedy_batch(model, [prompt] * 8, max_new_tokens=4, eos=set(), pad_id=3, topk=4, temperature=temperature,
                         generator=torch.Generator().manual_seed(7))
    same = greedy_batch(model, [prompt] * 8, max_new_tokens=4, eos=set(), pad_id=3, topk=4, temperature=temperature,
                        generator=torch.Generator().manual_seed(7))
    assert [a for a, _, _ in again] == [a for a, _, _ in same]  # seeded


def test_checkpoints_are_pruned_to_the_newest(tmp_path):
    from specviz.training.checkpoint import latest_checkpoint, save_checkpoint

    student = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(student.parameters())
    student(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    for step in (2, 4, 6, 8, 10):
        save_checkpoint(tmp_path / f"step-{step:06d}", step, student, optimizer, {}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000008", "step-000010"]
    assert latest_checkpoint(tmp_path).name == "step-000010"
    (tmp_path / "latest").unlink()  # a checkpoint copied in from another run, without its pointer
    (tmp_path / "step-000010" / "state.json").unlink()  # and an incomplete newer one
    assert latest_checkpoint(tmp_path).name == "step-000008"
    assert latest_checkpoint(tmp_path / "empty") is None


def test_cli_trains_on_a_prompt_file_and_reports_its_held_out_part(tmp_path, capsys):
    target_dir = save_tiny_model(tmp_path / "target", hidden=32, layers=2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(story(3, 600))
    prompts = _write_prompt_file(tmp_path / "q.jsonl", per_category=3)
    common = ["draft-lm", "--target", str(target_dir), "--data", str(corpus), "--out", str(tmp_path / "run"),
              "--steps", "2", "--batch-size", "2", "--seq-len", "48", "--prompts", "4", "--eval-prompts", "2",
              "--gen-tokens", "5", "--gen-batch", "4", "--corpus-tokens", "100", "--hidden", "16", "--layers", "1",
              "--cache-dir", str(tmp_path / "cache")]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, "--prompt-file", str(prompts), "--prompt-file-holdout", "1", "--sampled-answers", "1",
                 "--prompt-file-repeat", "2", "--export", str(tmp_path / "export")]) == 0
    plain = json.loads((tmp_path / "plain" / "metrics.json").read_text())
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert plain["heldout_prompt_files"] is None
    assert metrics["heldout_prompt_files"]["sequences"] == 2  # the first prompt of each of the 2 categories
    # 2 training prompts per category x 2 categories, one greedy + one sampled answer each, repeated twice
    assert metrics["train_sequences"] - plain["train_sequences"] == 4 * 2 * 2
    card = (tmp_path / "export" / "README.md").read_text()
    assert "except the first 1 prompts of each category" in card and "Held-out prompt-file prompts" in card
    cached = {p.name.split("-")[0] + "-" + p.name.split("-")[1] for p in (tmp_path / "cache" / "features").iterdir()}
    assert {"file-answers", "file-sampled", "file-heldout"} <= cached
    for bad, message in ((["--prompt-file", str(tmp_path / "none.jsonl")], "does not exist"),
                         (["--prompt-file", str(prompts), "--sampled-answers", "-1"], "0 or more"),
                         (["--prompt-file", str(prompts), "--sampled-answers", "1", "--sample-temperature", "0"],
                          "above 0")):
        capsys.readouterr()
        assert main([*common, "--out", str(tmp_path / "refused"), *bad]) == 2  # a new folder: "run" holds a run
        assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_one_feature_extraction_serves_every_family_that_reads_a_subset_of_its_layers(tmp_path, capsys):
    """``--feature-layers`` caches a superset; a second family reading some of those layers builds no new file, and
    its features equal a fresh extraction of just its own layers (so reuse changes nothing it trains on)."""
    target_dir = save_tiny_model(tmp_path / "target", hidden=32, layers=2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(story(5, 600))
    common = ["--target", str(target_dir), "--data", str(corpus), "--steps", "2", "--batch-size", "2",
              "--seq-len", "48", "--prompts", "4", "--eval-prompts", "2", "--gen-tokens", "5", "--gen-batch", "4",
              "--corpus-tokens", "100", "--save-every", "2"]
    shared = tmp_path / "shared"
    assert main(["mtp", *common, "--out", str(tmp_path / "mtp"), "--cache-dir", str(shared),
                 "--feature-layers", "0,1,2", "--export", str(tmp_path / "mtp-card")]) == 0
    card = (tmp_path / "mtp-card" / "README.md").read_text()
    assert "**Trained post hoc**" in card and "averaged over modules" in card and "`hidden_states[2]`" in card
    files = sorted(p.name for p in (shared / "features").iterdir())
    hidden_files = [name for name in files if "hidden" in name or name.startswith("corpus")]
    assert {tuple(FeatureSet.read_meta(shared / "features" / n)["layers"]) for n in hidden_files} == {(0, 1, 2)}
    assert main(["medusa", *common, "--out", str(tmp_path / "medusa"), "--cache-dir", str(shared),
                 "--set", "medusa_heads=2", "--export", str(tmp_path / "medusa-card")]) == 0
    assert "2 heads on the target's last hidden state" in (tmp_path / "medusa-card" / "README.md").read_text()
    assert sorted(p.name for p in (shared / "features").iterdir()) == files  # nothing new was extracted
    assert main(["medusa", *common, "--out", str(tmp_path / "alone"), "--cache-dir", str(tmp_path / "own"),
                 "--set", "medusa_heads=2"]) == 0
    reused = json.loads((tmp_path / "medusa" / "metrics.json").read_text())
    alone = json.loads((tmp_path / "alone" / "metrics.json").read_text())
    assert reused["trainer_options"]["medusa_heads"] == 2
    assert reused["heldout"] == alone["heldout"]
    assert reused["final_loss"] == pytest.approx(alone["final_loss"], rel=1e-4)
    capsys.readouterr()
    assert main(["medusa", *common, "--out", str(tmp_path / "bad"), "--set", "heads=2"]) == 2
    assert "expected KEY=VALUE with KEY one of" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # refused before the run folder (and its log) is made


@pytest.mark.parametrize("kind", ["dflash", "dspark", "eagle", "eagle3", "mtp", "medusa"])
def test_init_from_continues_an_exported_drafter(tmp_path, capsys, kind):
    """``--init-from`` starts the student at an exported drafter's weights (fp16, as shipped: a run of zero steps
    saves exactly them, not a fresh initialisation); another family's folder, or the same family built with other
    settings, gets a one-line error."""
    target_dir = save_tiny_model(tmp_path / "target", hidden=32, layers=4)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(story(7, 600))
    common = ["--target", str(target_dir), "--data", str(corpus), "--batch-size", "2", "--seq-len", "48",
              "--prompts", "4", "--eval-prompts", "2", "--gen-tokens", "5", "--gen-batch", "4", "--corpus-tokens",
              "100", "--save-every", "2", "--cache-dir", str(tmp_path / "cache"), "--seed", "1"]
    mask = ["--set", "mask_token_id=1"]  # the tiny tokenizer has no mask token: the block families need one named
    blocks = ("dflash", "dspark")
    own = [*common, *(mask if kind in blocks else [])]
    shipped = tmp_path / "shipped"
    assert main([kind, *own, "--out", str(tmp_path / "first"), "--steps", "3", "--lr", "0.05",
                 "--export", str(shipped)]) == 0
    assert main([kind, *own, "--out", str(tmp_path / "warm"), "--steps", "0", "--init-from", str(shipped)]) == 0
    assert main([kind, *own, "--out", str(tmp_path / "cold"), "--steps", "0"]) == 0
    exported, warm, cold = (load_file(str(next(folder.glob("*.safetensors"))))
                            for folder in (shipped, tmp_path / "warm" / "final", tmp_path / "cold" / "final"))
    assert exported.keys() == warm.keys() and exported[next(iter(exported))].dtype == torch.float16
    for key in exported:
        torch.testing.assert_close(warm[key], exported[key].to(warm[key].dtype), rtol=0, atol=0)
    assert any(not torch.equal(cold[key], warm[key]) for key in warm)
    metrics = json.loads((tmp_path / "warm" / "metrics.json").read_text())
    assert metrics["init_from"] == str(shipped)
    other = {"dflash": "dspark", "dspark": "dflash", "eagle": "eagle3", "eagle3": "eagle", "mtp": "medusa",
             "medusa": "mtp"}[kind]
    capsys.readouterr()
    assert main([other, *common, *(mask if other in blocks else []), "--out", str(tmp_path / "wrong"),
                 "--steps", "0", "--init-from", str(shipped)]) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert str(shipped.name) in message and ("not a" in message or "not this student's" in message
                                             or "config" in message or "layout" in message), message
    if kind in blocks:  # the same family, another block size: refused by name, not silently retrained
        assert main([kind, *own, "--set", "block_size=5", "--out", str(tmp_path / "other"), "--steps", "0",
                     "--init-from", str(shipped)]) == 2
        assert "its block_size is" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("shape, other, depths", [
    (["--init-layers", "0,2"], ["--init-layers", "0"], (2, 1)),  # built from the target's layers, as shipped
    (["--hidden", "16", "--layers", "1"], ["--hidden", "16", "--layers", "2"], (1, 2)),  # a small Llama from scratch
], ids=["target-layers", "scratch"])
def test_init_from_continues_an_exported_draft_model(tmp_path, capsys, shape, other, depths):
    """The draft model continues from its exported fp16 folder (which, built from the target's layers, borrows the
    embedding): a zero-step run saves exactly its weights; a draft of another depth, or another family's folder, is
    refused in one line before any data is built."""
    target_dir = save_tiny_model(tmp_path / "target", hidden=32, layers=3)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(story(7, 600))
    common = ["draft-lm", "--target", str(target_dir), "--data", str(corpus), "--batch-size", "2", "--seq-len", "48",
              "--prompts", "4", "--eval-prompts", "2", "--gen-tokens", "5", "--gen-batch", "4", "--corpus-tokens",
              "100", "--save-every", "2", "--cache-dir", str(tmp_path / "cache"), "--seed", "1"]
    shipped = tmp_path / "shipped"
    assert main([*common, *shape, "--out", str(tmp_path / "first"), "--steps", "3", "--lr", "0.05",
                 "--export", str(shipped)]) == 0
    assert main([*common, *shape, "--out", str(tmp_path / "warm"), "--steps", "0", "--init-from", str(shipped)]) == 0
    assert main([*common, *shape, "--out", str(tmp_path / "cold"), "--steps", "0"]) == 0
    exported, warm, cold = (load_file(str(folder / "model.safetensors"))
                            for folder in (shipped, tmp_path / "warm" / "final", tmp_path / "cold" / "final"))
    assert exported["model.norm.weight"].dtype == torch.float16
    assert ("model.embed_tokens.weight" in exported) == ("--hidden" in shape)  # borrowed, not shipped, if built
    for key in exported:
        torch.testing.assert_close(warm[key], exported[key].float(), rtol=0, atol=0)
    assert any(not torch.equal(cold[key], warm[key]) for key in exported)
    assert json.loads((tmp_path / "warm" / "metrics.json").read_text())["init_from"] == str(shipped)
    capsys.readouterr()
    assert main([*common, *other, "--out", str(tmp_path / "deeper"), "--steps", "0",
                 "--init-from", str(shipped)]) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"its num_hidden_layers is {depths[0]}, the student's {depths[1]}" in message, message
    assert main(["mtp", *common[1:], "--out", str(tmp_path / "mtp"), "--steps", "1", "--export",
                 str(tmp_path / "mtp-export")]) == 0
    capsys.readouterr()
    assert main([*common, *shape, "--out", str(tmp_path / "wrong"), "--steps", "0",
                 "--cache-dir", str(tmp_path / "fresh"), "--init-from", str(tmp_path / "mtp-export")]) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "mtp-export" in message and "not a draft model" in message, message
    assert not (tmp_path / "fresh").exists()  # refused before any data was built


def test_the_data_command_builds_the_cache_train_then_reads(tmp_path, capsys):
    """``specviz data`` answers and annotates (logging its rate against the floor) without training; ``train`` with
    the same data options then answers nothing again."""
    from specviz.cli import main as specviz_main

    target_dir = save_tiny_model(tmp_path / "target", hidden=32, layers=2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(story(1, 800))
    data_options = ["--target", str(target_dir), "--data", str(corpus), "--prompts", "6", "--eval-prompts", "2",
                    "--gen-tokens", "6", "--gen-batch", "4", "--corpus-tokens", "200", "--seq-len", "64",
                    "--cache-dir", str(tmp_path / "cache")]
    assert specviz_main(["data", *data_options, "--feature-layers", "0,1,2"]) == 0
    said = capsys.readouterr().err
    assert "answering prompts 0..6 of 6" in said and "of the floor" in said and "6 training sequences" not in said
    assert "training sequences" in said and not (tmp_path / "run").exists()
    assert specviz_main(["train", "mtp", *data_options, "--out", str(tmp_path / "run"), "--steps", "1",
                         "--batch-size", "2"]) == 0
    said = capsys.readouterr().err
    assert "answering prompts" not in said and "target features" not in said  # all read from the cache
    assert (tmp_path / "run" / "final").is_dir()
    assert specviz_main(["data", *data_options, "--gen-batch", "0"]) == 2
    assert "--gen-batch must be 1 or more" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_live_features_train_what_cached_features_train(tmp_path, capsys, kind):
    """``--live-features`` computes each batch's hidden states as it is drawn instead of caching the training set's:
    the same losses and held-out figures as the cached run (the same pass, over fewer sequences at a time), no
    training feature file on disk, and a resumed live run continues where it stopped. A family that reads no hidden
    states refuses the option in one line."""
    target_dir = save_tiny_model(tmp_path / "target", hidden=32, layers=4)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(story(3, 600))
    common = ["--target", str(target_dir), "--data", str(corpus), "--batch-size", "2", "--seq-len", "48",
              "--prompts", "6", "--eval-prompts", "2", "--gen-tokens", "6", "--gen-batch", "4", "--gen-dtype",
              "target", "--corpus-tokens", "100", "--save-every", "2", "--seed", "2"]
    runs = {}
    for mode in ("cached", "live"):
        live = ["--live-features"] if mode == "live" else []
        cache = tmp_path / f"cache-{mode}"
        assert main([kind, *common, *live, "--steps", "4", "--out", str(tmp_path / mode),
                     "--cache-dir", str(cache)]) == 0
        runs[mode] = json.loads((tmp_path / mode / "metrics.json").read_text())
        hidden_files = sorted(p.name.split("-")[0] for p in (cache / "features").iterdir()
                              if FeatureSet.read_meta(p).get("layers"))
        assert hidden_files == (["answers", "corpus", "heldout"] if mode == "cached" else ["heldout"])
    assert "live features: each batch's target hidden states" in capsys.readouterr().err
    cached, live = runs["cached"], runs["live"]
    assert [h["step"] for h in live["history"]] == [h["step"] for h in cached["history"]]
    for a, b in zip(cached["history"], live["history"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
    assert live["heldout"]["top1_agreement"] == cached["heldout"]["top1_agreement"]
    assert live["train_positions"] == cached["train_positions"]
    assert main([kind, *common, "--live-features", "--steps", "6", "--out", str(tmp_path / "live"),
                 "--cache-dir", str(tmp_path / "cache-live"), "--resume"]) == 0
    assert "resumed from" in capsys.readouterr().err
    assert main(["draft-lm", *common, "--live-features", "--steps", "1", "--hidden", "16", "--layers", "1",
                 "--out", str(tmp_path / "lm"), "--cache-dir", str(tmp_path / "cache-live")]) == 2
    assert "--live-features: draft-lm reads no hidden states" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_cards_line_on_self_written_prompts_names_their_window_in_one_aside():
    """A continued run (``--self-prompts-from``) says which draws it read; the card's line holds one parenthesis, not
    two side by side."""
    window = _self_prompt_data(Namespace(self_prompts=10240, self_from=5120))
    assert "among draws 5120..10240 of those it sampled (`--self-prompts-from`" in window
    first = _self_prompt_data(Namespace(self_prompts=5120, self_from=0))
    assert "among 5120 it sampled (`--self-prompts`:" in first
    for line in (window, first):
        assert line.count("(") == line.count(")") == 1 and line.endswith("distinct).")
    assert _self_prompt_data(Namespace(self_prompts=0)) == ""


def test_a_card_without_corpus_text_says_so(tmp_path):
    """``--corpus-tokens 0``: the card says the data options only supplied the prompts' passages, not "0 tokens of
    corpus text annotated"."""
    target_dir = save_tiny_model(tmp_path / "target", hidden=32, layers=2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(story(4, 600))
    assert main(["mtp", "--target", str(target_dir), "--data", str(corpus), "--steps", "1", "--batch-size", "2",
                 "--seq-len", "48", "--prompts", "4", "--eval-prompts", "2", "--gen-tokens", "5", "--gen-batch", "4",
                 "--corpus-tokens", "0", "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"),
                 "--export", str(tmp_path / "card")]) == 0
    card = (tmp_path / "card" / "README.md").read_text()
    assert "No corpus text of its own (`--corpus-tokens 0`)" in card and "tokens of corpus text" not in card
