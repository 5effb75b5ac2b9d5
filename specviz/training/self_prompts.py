"""Prompts the target writes itself: its chat template opened at a user turn, and the user's text sampled.

An instruction-tuned target learned what users ask from its own fine-tuning conversations, so sampling the turn it
expects a user to write (the Magpie recipe, Xu et al. 2024) gives requests of that distribution: many more kinds of
request than templates over a few books, closer to real chat benchmarks, and with no benchmark text. The drafter
then learns the target's answers to them, as it does for every other prompt. The samples are seeded (each draws
from its own generator), cached in shards of the data set's shard size, and filtered the same way every time, so a
larger count extends the list without changing its start.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from specviz.errors import SpecvizError
from specviz.training.features import cache_key
from specviz.training.floor import stage_rate
from specviz.training.generate import continue_ids, stop_ids
from specviz.training.prompts import Prompt

#: the category these prompts report under in per-category agreement
CATEGORY = "self-written"
#: sampling temperature of the user turns (Magpie samples at the model's own distribution)
TEMPERATURE = 1.0
#: longest user turn kept: one that has not ended by then is dropped as a ramble
MAX_TOKENS = 128
#: shortest user turn kept, in words
MIN_WORDS = 4
_MARK = "\x00specviz-user-text\x00"


def user_turn_opening(tokenizer) -> list[int]:
    """The token ids of the target's chat template up to where a user's text starts (system turn included)."""
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    except (ValueError, AttributeError, TypeError) as error:
        raise SpecvizError(f"the target cannot write its own prompts: it has no usable chat template ({error})") \
            from None
    if not isinstance(text, str) or _MARK not in text:
        raise SpecvizError("the target cannot write its own prompts: its chat template does not place the user's text")
    ids = tokenizer(text[:text.index(_MARK)], add_special_tokens=False)["input_ids"]
    if not ids:
        raise SpecvizError("the target cannot write its own prompts: its chat template opens a user turn with nothing")
    return [int(t) for t in ids]


def usable(text: str | None) -> bool:
    """A sampled user turn worth answering: it ended on its own (``None``: cut at ``MAX_TOKENS``) and says
    something."""
    return text is not None and len(text.split()) >= MIN_WORDS


def self_written_prompts(target, count: int, *, cache: Path, seed: int, shard: int, batch_size: int, decode_dtype,
                         start: int = 0, log=print) -> list[Prompt]:
    """The usable, distinct user turns among ``count`` sampled by ``target``, in cached shards of ``shard`` draws
    (the usable ones are fewer: see ``usable``); with ``start``, only those drawn from there on that no earlier
    draw wrote (the window after the ones a continued drafter trained on)."""
    tokenizer, model = target.tokenizer, target.model
    opening = user_turn_opening(tokenizer)
    eos = stop_ids(tokenizer, model)
    seen: set[str] = set()
    out: list[Prompt] = []
    for first in range(0, count, shard):
        draws = min(shard, count - first)
        key = cache_key("self-prompts", target.source, opening, draws, seed + first, TEMPERATURE, MAX_TOKENS,
                        str(decode_dtype))
        path = cache / "features" / f"self-prompts-{key}.json"
        if path.is_file():
            texts = json.loads(path.read_text())
        else:
            log(f"self-written prompts: sampling user turns {first}..{first + draws} of {count}")
            began = time.perf_counter()
            results = continue_ids(model, tokenizer, [opening] * draws, max_new_tokens=MAX_TOKENS,
                                   batch_size=batch_size, topk=1, temperature=TEMPERATURE, seed=seed + first,
                                   decode_dtype=decode_dtype)
            sampled = sum(len(ids) for ids, _, _ in results)
            dtype = decode_dtype or next(model.parameters()).dtype
            rate = stage_rate(model, tokens=draws * len(opening) + sampled, generated=sampled,
                              seconds=time.perf_counter() - began, dtype=dtype, device=target.device)
            log(f"self-written prompts: {rate.describe(dtype, generated='sampled')}")
            texts = [tokenizer.decode(ids[:-1], skip_special_tokens=True).strip() if ids and ids[-1] in eos else None
                     for ids, _, _ in results]
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps(texts))
            partial.replace(path)  # whole or absent: an interrupted build samples the shard again
        for text in texts:
            if usable(text) and text not in seen:
                seen.add(text)
                if first >= start:
                    out.append(Prompt(CATEGORY, text))
    window = f" (draws {start}..{count})" if start else ""
    log(f"self-written prompts: {len(out)} usable of {count - start} sampled{window}")
    return out
