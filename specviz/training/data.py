"""Build (and cache) the training data every trainer shares: the target's own chat answers (to generated prompts
and to prompt files) and corpus text annotated with the target's outputs. Each stage is cached in shards, so an
interrupted run resumes where it stopped.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from specviz.errors import SpecvizError
from specviz.training.features import FeatureSet, cache_key, extract_features
from specviz.training.floor import describe_rates, faster_dtype, stage_rate
from specviz.training.generate import MAX_PROMPT_TOKENS, self_distill
from specviz.training.prompts import Prompt, build_prompts, file_prompts
from specviz.training.self_prompts import self_written_prompts
from specviz.training.text_sources import Document, iter_documents

#: prompts per cached shard: enough to keep the decoder's slots full between shards, few enough to resume often
SHARD_PROMPTS = 512
#: ``--gen-dtype`` choices: the dtype answers are decoded in (None: the target's own); labels are always the target's
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "target": None}
#: ``--gen-dtype auto`` (the default): bfloat16 where this machine runs its products fast, else float32
AUTO_DTYPE = "auto"
#: Prompt files hold real requests (summaries of whole articles): answer them from their full text, not a tail.
FILE_PROMPT_TOKENS = 2048


@dataclass
class DataPlan:
    """What to build: sources, how many prompts to answer (and hold out), how much corpus text to annotate."""

    sources: list[str]
    prompts: int = 1200
    eval_prompts: int = 64
    extra_prompts: int = 0
    #: train on the extra prompts from this one on only (the base prompts and earlier extra ones left out): the next
    #: window of the set for a drafter that continues (``--init-from``) one trained on those before it; a multiple of
    #: ``SHARD_PROMPTS``, so its shards are the full set's own cached ones
    extra_from: int = 0
    #: training-only prompts the target writes itself (``self_prompts``: user turns it samples), answered like the rest
    self_prompts: int = 0
    #: train on the self-written prompts from this draw on only (``extra_from``'s rule, for ``self_prompts``)
    self_from: int = 0
    gen_tokens: int = 144
    gen_batch: int = 128
    gen_dtype: str = "bfloat16"
    corpus_tokens: int = 100_000
    seq_len: int = 256
    topk: int = 8
    layers: tuple[int, ...] = ()
    #: more hidden_states indices cached alongside ``layers``, so one extraction serves several families
    extra_layers: tuple[int, ...] = ()
    stdlib_files: int = 400
    seed: int = 0
    prompt_files: tuple[str, ...] = ()
    prompt_file_holdout: int = 2
    sampled_answers: int = 0
    sample_temperature: float = 0.8
    prompt_file_repeat: int = 1
    #: the training sequences' hidden states are computed as they are trained on (``live_featurizer``), not cached:
    #: the whole data set then costs its answers' disk and memory only (held-out sets stay cached)
    live_features: bool = False
    #: False: every shard's hidden states are cached and let go, not returned (``specviz data``, which trains nothing):
    #: a build then holds one shard's hidden states at a time, not the whole set's twice over
    keep_hidden: bool = True

    @property
    def cached_layers(self) -> tuple[int, ...]:
        """The layers a new feature file holds: the trainer's and the extra ones."""
        return tuple(sorted(set(self.layers) | set(self.extra_layers))) if self.layers else ()


@dataclass
class TrainingData:
    """What a trainer gets: the training set, held-out answers to generated prompts and, when prompt files were
    given, held-out answers to their first prompts per category (the benchmark's own kind of request)."""

    train: FeatureSet
    heldout: FeatureSet
    heldout_files: FeatureSet | None = None


def split_prompts(prompts: list[Prompt], eval_count: int, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """Seeded train / held-out split of the generated prompts."""
    order = list(range(len(prompts)))
    random.Random(seed + 1).shuffle(order)
    held = sorted(order[:eval_count])
    train = sorted(order[eval_count:])
    return [prompts[i] for i in train], [prompts[i] for i in held]


def positions_subset(data: FeatureSet, positions: int, seed: int) -> FeatureSet:
    """A seeded subset of ``data``'s sequences holding at least ``positions`` trained positions (all of it when it
    holds fewer): a prefix of one seeded order, so a smaller subset is part of every larger one."""
    order = list(range(data.num_sequences))
    random.Random(seed + 3).shuffle(order)
    kept, total = [], 0
    for i in order:
        if total >= positions:
            break
        kept.append(i)
        total += int(data.loss_mask[data.sequence(i)].sum())
    return data.subset(sorted(kept))


def answers(target, prompts: list[Prompt], plan: DataPlan, cache: Path, tag: str, log=print, *,
            temperature: float = 0.0, seed: int = 0, max_prompt_tokens: int = MAX_PROMPT_TOKENS) -> FeatureSet:
    """The target's answers to ``prompts`` with top-k (greedy, or sampled at ``temperature``), in cached shards;
    with ``plan.layers``, the target's hidden states over each answered sequence, cached per shard too (so more
    prompts later cost only their own shards, plus the last shard again when it was not full)."""
    settings = (plan.gen_tokens, plan.gen_dtype, temperature, seed, max_prompt_tokens)
    name = f"{tag}-hidden"
    shards = []
    for start in range(0, len(prompts), SHARD_PROMPTS):
        chunk = prompts[start:start + SHARD_PROMPTS]
        texts = [p.text for p in chunk]
        hidden_parts = ("answer-hidden", target.source, texts, *settings)
        if plan.layers and (found := cached_hidden(cache, name, hidden_parts, plan)) is not None:
            shards.append(found)
            continue
        key = cache_key("answers", target.source, plan.topk, texts, *settings)
        path = cache / "features" / f"{tag}-{key}.safetensors"
        if path.is_file():
            shard = FeatureSet.load(path)
        else:
            log(f"{tag}: answering prompts {start}..{start + len(chunk)} of {len(prompts)}")
            began = time.perf_counter()
            shard = self_distill(target.model, target.tokenizer, texts, categories=[p.category for p in chunk],
                                 max_new_tokens=plan.gen_tokens, batch_size=plan.gen_batch, topk=plan.topk,
                                 max_prompt_tokens=max_prompt_tokens, temperature=temperature, seed=seed + start,
                                 decode_dtype=DTYPES[plan.gen_dtype], layers=plan.cached_layers)
            log(f"{tag}: {answer_rate(target, shard, time.perf_counter() - began, plan.gen_dtype)}")
            replace(shard, hidden={}).save(path, {"kind": "answers", "target": target.source})
        if plan.layers:  # hidden-state trainers need the target's hidden states over the full sequences
            if not shard.hidden:
                log(f"{tag}: target features over the answers to prompts {start}..{start + len(chunk)}")
                shard = hidden_states_over(target, shard, plan)
            save_hidden(shard, cache, name, hidden_parts, plan, {"kind": "answers+hidden", "target": target.source})
            shard = cached_hidden(cache, name, hidden_parts, plan)  # as stored: a rerun trains on the same numbers
        shards.append(shard)
    return FeatureSet.concat(shards)


def resolve_gen_dtype(name: str, device: str, log=print) -> str:
    """``name``, or for ``auto`` the decoding dtype this machine runs faster (``floor.faster_dtype``): where
    bfloat16 is emulated, decoding in it is two orders of magnitude slower than float32. Logged; the cache keys
    and the card see the dtype chosen."""
    if name != AUTO_DTYPE:
        return name
    dtype, rates = faster_dtype(device)
    chosen = str(dtype).removeprefix("torch.")
    log(f"answers decode in {chosen} (--gen-dtype {AUTO_DTYPE}): {describe_rates(rates)}")
    return chosen


def answer_rate(target, shard: FeatureSet, seconds: float, gen_dtype: str) -> str:
    """How fast ``shard`` was answered and labelled (its teacher-forced pass included), against this machine's
    floor in the decoding dtype."""
    dtype = DTYPES[gen_dtype] or target.dtype
    return stage_rate(target.model, tokens=shard.num_tokens, generated=int(shard.loss_mask.sum()), seconds=seconds,
                      dtype=dtype, device=target.device).describe(dtype)


def hidden_states_over(target, answered: FeatureSet, plan: DataPlan, *, layers: tuple[int, ...] | None = None,
                       desc: str | None = "target features") -> FeatureSet:
    """``answered``'s sequences again through the target, keeping the hidden states of ``layers`` (default
    ``plan.cached_layers``) and relabelling every position with the target's own top-k."""
    seqs = [answered.input_ids[answered.sequence(i)].tolist() for i in range(answered.num_sequences)]
    masks = [answered.loss_mask[answered.sequence(i)].tolist() for i in range(answered.num_sequences)]
    return extract_features(target.model, seqs, topk=plan.topk, layers=plan.cached_layers if layers is None else layers,
                            loss_masks=masks, categories=answered.categories, desc=desc)


def live_featurizer(target, plan: DataPlan) -> Callable[[FeatureSet], FeatureSet]:
    """``--live-features``: what turns a drawn batch's sequences into training ones, by the same pass that caches
    features (so the numbers are the cached path's); only the trainer's own layers are kept."""
    return lambda chosen: hidden_states_over(target, chosen, plan, layers=plan.layers, desc=None)


#: The shortest corpus window worth training on (tokens); ``--seq-len`` may not go below it.
MIN_WINDOW = 32


def corpus_windows(target, documents: list[Document], plan: DataPlan) -> tuple[list[list[int]], list[str]]:
    """Non-overlapping ``seq_len`` token windows from the documents, a seeded sample of ``corpus_tokens`` tokens."""
    windows, kinds = [], []
    for doc in documents:
        ids = target.tokenizer(doc.text, add_special_tokens=False)["input_ids"]
        for start in range(0, max(1, len(ids) - MIN_WINDOW), plan.seq_len):
            piece = ids[start:start + plan.seq_len]
            if len(piece) >= MIN_WINDOW:
                windows.append(piece)
                kinds.append(doc.kind)
    if not windows:
        raise SpecvizError(f"the training text ({len(documents)} document(s)) holds no window of {MIN_WINDOW} tokens "
                           f"or more: give more text with --data, or --corpus-tokens 0 to train on answers alone")
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
    parts = ("corpus", target.source, plan.topk, windows)
    if (found := cached_hidden(cache, "corpus", parts, plan)) is not None:
        return found
    log(f"corpus: target features for {sum(map(len, windows))} tokens in {len(windows)} windows")
    result = extract_features(target.model, windows, topk=plan.topk, layers=plan.cached_layers, categories=kinds)
    save_hidden(result, cache, "corpus", parts, plan, {"kind": "corpus", "target": target.source})
    return cached_hidden(cache, "corpus", parts, plan)  # as stored: a rerun trains on the same numbers


#: where the layers sit in each kind's cache key (as before extra layers existed, so older caches keep their names)
LAYERS_AT = {"answer-hidden": 2, "corpus": 3}


def feature_path(cache: Path, name: str, parts: tuple, layers: tuple[int, ...]) -> Path:
    """The file of ``parts`` (a cache key without layers) holding exactly ``layers``."""
    at = LAYERS_AT[parts[0]]
    return cache / "features" / f"{name}-{cache_key(*parts[:at], layers, *parts[at:])}.safetensors"


def cached_hidden(cache: Path, name: str, parts: tuple, plan: DataPlan) -> FeatureSet | None:
    """A cached feature file for ``parts`` holding at least ``plan.layers`` (its own or a superset's), or None."""
    for layers in (plan.layers, plan.cached_layers):  # the usual files first: a scan reads every header
        exact = feature_path(cache, name, parts, layers)
        if exact.is_file():
            return FeatureSet.load(exact, layers=_kept(plan))
    base = cache_key(*parts)
    for path in sorted((cache / "features").glob(f"{name}-*.safetensors")):
        meta = FeatureSet.read_meta(path)
        if meta.get("base") == base and set(plan.layers) <= set(meta.get("layers", ())):
            return FeatureSet.load(path, layers=_kept(plan))
    return None


def _kept(plan: DataPlan) -> tuple[int, ...]:
    """The hidden states a cached feature file is read with: the trainer's layers, or none (``keep_hidden``)."""
    return plan.layers if plan.keep_hidden else ()


def save_hidden(result: FeatureSet, cache: Path, name: str, parts: tuple, plan: DataPlan, meta: dict) -> None:
    """Write ``result`` (with every cached layer) where ``cached_hidden`` finds it for any subset of its layers."""
    meta = {**meta, "base": cache_key(*parts), "layers": list(plan.cached_layers)}
    result.save(feature_path(cache, name, parts, plan.cached_layers), meta)


def prompt_file_answers(target, plan: DataPlan, cache: Path, log=print, *,
                        train_plan: DataPlan | None = None) -> tuple[list[FeatureSet], FeatureSet | None]:
    """(training parts, held-out answers) from the prompt files: one greedy answer per training prompt plus
    ``sampled_answers`` sampled ones, the whole repeated ``prompt_file_repeat`` times (a mixture weight). The
    training parts are built by ``train_plan`` (default ``plan``), the held-out ones by ``plan``."""
    train_plan = train_plan or plan
    if not plan.prompt_files:
        return [], None
    train: list[Prompt] = []
    held: list[Prompt] = []
    for path in plan.prompt_files:
        more_train, more_held = file_prompts(path, plan.prompt_file_holdout)
        train += more_train
        held += more_held
    log(f"prompt files: {len(train)} training prompts, {len(held)} held out "
        f"(the first {plan.prompt_file_holdout} per category)")
    options = {"max_prompt_tokens": FILE_PROMPT_TOKENS}
    parts = [answers(target, train, train_plan, cache, "file-answers", log, **options)] if train else []
    for sample in range(plan.sampled_answers):
        parts.append(answers(target, train, train_plan, cache, "file-sampled", log,
                             temperature=plan.sample_temperature, seed=plan.seed + 1000 * (sample + 1), **options))
    heldout = answers(target, held, plan, cache, "file-heldout", log, **options) if held else None
    return parts * max(1, plan.prompt_file_repeat), heldout


def build_data(target, plan: DataPlan, cache: Path, log=print) -> TrainingData:
    """Training set and held-out sets; held-out = target answers to prompts never trained on."""
    documents = list(iter_documents(plan.sources, stdlib_limit=plan.stdlib_files, seed=plan.seed))
    base = plan.prompts + plan.eval_prompts
    # build_prompts is prefix-stable, so extra prompts extend the training set without moving the held-out split
    prompts = build_prompts(documents, base + plan.extra_prompts, seed=plan.seed)
    train_prompts, eval_prompts = split_prompts(prompts[:base], plan.eval_prompts, plan.seed)
    held = answers(target, eval_prompts, plan, cache, "heldout", log)
    # live features: the training parts are answers and labels only; the trainer's pass adds the hidden states
    train_plan = replace(plan, layers=(), extra_layers=()) if plan.live_features else plan
    train_parts = [] if plan.extra_from else [answers(target, train_prompts, train_plan, cache, "answers", log)]
    if plan.extra_prompts > plan.extra_from:
        train_parts.append(answers(target, prompts[base + plan.extra_from:], train_plan, cache, "answers", log))
    if plan.self_prompts:
        written = self_written_prompts(target, plan.self_prompts, cache=cache, seed=plan.seed, shard=SHARD_PROMPTS,
                                       start=plan.self_from, batch_size=plan.gen_batch,
                                       decode_dtype=DTYPES[plan.gen_dtype], log=log)
        if written:  # none usable (a target that never ends a user turn): the log said so
            train_parts.append(answers(target, written, train_plan, cache, "self-answers", log))
    file_parts, held_files = prompt_file_answers(target, plan, cache, log, train_plan=train_plan)
    train_parts += file_parts
    corpus = corpus_features(target, documents, train_plan, cache, log)
    if corpus is not None:
        train_parts.append(corpus)
    return TrainingData(FeatureSet.concat(train_parts), held, held_files)
