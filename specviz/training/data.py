"""Build (and cache) the training data every trainer shares: the target's own chat answers and corpus text
annotated with the target's outputs. Each stage is cached in shards, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from specviz.training.features import FeatureSet, cache_key, extract_features
from specviz.training.generate import self_distill
from specviz.training.prompts import Prompt, build_prompts
from specviz.training.text_sources import Document, iter_documents

SHARD_PROMPTS = 96


@dataclass
class DataPlan:
    """What to build: sources, how many prompts to answer (and hold out), how much corpus text to annotate."""

    sources: list[str]
    prompts: int = 1200
    eval_prompts: int = 64
    extra_prompts: int = 0
    gen_tokens: int = 144
    gen_batch: int = 16
    corpus_tokens: int = 100_000
    seq_len: int = 256
    topk: int = 8
    layers: tuple[int, ...] = ()
    stdlib_files: int = 400
    seed: int = 0


def split_prompts(prompts: list[Prompt], eval_count: int, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """Seeded train / held-out split of the generated prompts."""
    order = list(range(len(prompts)))
    random.Random(seed + 1).shuffle(order)
    held = sorted(order[:eval_count])
    train = sorted(order[eval_count:])
    return [prompts[i] for i in train], [prompts[i] for i in held]


def answers(target, prompts: list[Prompt], plan: DataPlan, cache: Path, tag: str, log=print) -> FeatureSet:
    """The target's greedy answers to ``prompts`` with top-k, generated in cached shards."""
    shards = []
    for start in range(0, len(prompts), SHARD_PROMPTS):
        chunk = prompts[start:start + SHARD_PROMPTS]
        key = cache_key("answers", target.source, plan.gen_tokens, plan.topk, [p.text for p in chunk])
        path = cache / "features" / f"{tag}-{key}.safetensors"
        if path.is_file():
            shards.append(FeatureSet.load(path))
            continue
        log(f"{tag}: answering prompts {start}..{start + len(chunk)} of {len(prompts)}")
        shard = self_distill(target.model, target.tokenizer, [p.text for p in chunk],
                             categories=[p.category for p in chunk], max_new_tokens=plan.gen_tokens,
                             batch_size=plan.gen_batch, topk=plan.topk)
        shard.save(path, {"kind": "answers", "target": target.source})
        shards.append(shard)
    result = FeatureSet.concat(shards)
    if plan.layers:  # hidden-state trainers need a forward pass over the full sequences
        key = cache_key("answer-hidden", target.source, plan.layers, [p.text for p in prompts], plan.gen_tokens)
        path = cache / "features" / f"{tag}-hidden-{key}.safetensors"
        if path.is_file():
            return FeatureSet.load(path)
        seqs = [result.input_ids[result.sequence(i)].tolist() for i in range(result.num_sequences)]
        masks = [result.loss_mask[result.sequence(i)].tolist() for i in range(result.num_sequences)]
        result = extract_features(target.model, seqs, topk=plan.topk, layers=plan.layers, loss_masks=masks,
                                  categories=result.categories)
        result.save(path, {"kind": "answers+hidden", "target": target.source})
    return result


def corpus_windows(target, documents: list[Document], plan: DataPlan) -> tuple[list[list[int]], list[str]]:
    """Non-overlapping ``seq_len`` token windows from the documents, a seeded sample of ``corpus_tokens`` tokens."""
    windows, kinds = [], []
    for doc in documents:
        ids = target.tokenizer(doc.text, add_special_tokens=False)["input_ids"]
        for start in range(0, max(1, len(ids) - 32), plan.seq_len):
            piece = ids[start:start + plan.seq_len]
            if len(piece) >= 32:
                windows.append(piece)
                kinds.append(doc.kind)
    order = list(range(len(windows)))
    random.Random(plan.seed + 2).shuffle(order)
    chosen, total = [], 0
    for i in order:
        if total >= plan.corpus_tokens:
            break
        chosen.append(i)
        total += len(windows[i])
    return [windows[i] for i in chosen], [kinds[i] for i in chosen]


def corpus_features(target, documents: list[Document], plan: DataPlan, cache: Path, log=print) -> FeatureSet | None:
    """Corpus windows annotated with the target's top-k (and hidden states when requested), cached."""
    if plan.corpus_tokens <= 0:
        return None
    windows, kinds = corpus_windows(target, documents, plan)
    key = cache_key("corpus", target.source, plan.topk, plan.layers, windows)
    path = cache / "features" / f"corpus-{key}.safetensors"
    if path.is_file():
        return FeatureSet.load(path)
    log(f"corpus: target features for {sum(map(len, windows))} tokens in {len(windows)} windows")
    result = extract_features(target.model, windows, topk=plan.topk, layers=plan.layers, categories=kinds)
    result.save(path, {"kind": "corpus", "target": target.source})
    return result


def build_data(target, plan: DataPlan, cache: Path, log=print) -> tuple[FeatureSet, FeatureSet]:
    """(train, held-out) feature sets; held-out = target answers to prompts never trained on."""
    documents = list(iter_documents(plan.sources, stdlib_limit=plan.stdlib_files, seed=plan.seed))
    base = plan.prompts + plan.eval_prompts
    # build_prompts is prefix-stable, so extra prompts extend the training set without moving the held-out split
    prompts = build_prompts(documents, base + plan.extra_prompts, seed=plan.seed)
    train_prompts, eval_prompts = split_prompts(prompts[:base], plan.eval_prompts, plan.seed)
    held = answers(target, eval_prompts, plan, cache, "heldout", log)
    train_parts = [answers(target, train_prompts, plan, cache, "answers", log)]
    if plan.extra_prompts:
        train_parts.append(answers(target, prompts[base:], plan, cache, "answers", log))
    corpus = corpus_features(target, documents, plan, cache, log)
    if corpus is not None:
        train_parts.append(corpus)
    return FeatureSet.concat(train_parts), held
