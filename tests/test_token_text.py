"""Token display texts: a byte-level tokenizer splits emoji and CJK characters over several tokens, and the trace's
texts must still join into the decoded text (no U+FFFD where the text has a character)."""

import pytest
import tiny
import torch
from transformers import AutoTokenizer

from specviz.engine.accept import accept
from specviz.engine.loop import GenerationConfig
from specviz.engine.record import Step, build_round
from specviz.engine.sampling import SamplingConfig, make_generator
from specviz.engine.target import REPLACEMENT, Target
from specviz.engine.tree import DraftTree
from specviz.models.registry import ASSETS_MODELS

TEXT = "Trees 🌳🚀 and 漢字テスト, café! 👩‍💻"


@pytest.fixture(scope="module")
def target():
    """SmolLM2's byte-level tokenizer (shipped beside the draft model) over a small random model of its vocabulary."""
    tokenizer = AutoTokenizer.from_pretrained(ASSETS_MODELS / "smollm2-135m-draft")
    return Target(model=tiny.model(vocab_size=len(tokenizer), hidden=16, layers=1), tokenizer=tokenizer, name="t")


def test_split_characters_show_on_the_token_that_completes_them(target):
    ids = target.tokenizer.encode(TEXT)
    alone = [target.piece(i) for i in ids]
    assert sum(REPLACEMENT in piece for piece in alone) >= 6  # the case this is about: parts decode to U+FFFD
    pieces = target.pieces(ids)
    assert "".join(pieces) == target.decode(ids) == TEXT
    assert not any(REPLACEMENT in piece for piece in pieces)
    assert "🚀" in pieces and "漢" in pieces and "" in pieces  # whole characters; parts show nothing
    start = pieces.index("🚀")
    assert target.pieces(ids[start - 2: start + 1], before=ids[: start - 2])[-1] == "🚀"  # the same in context


def test_a_round_of_split_characters_records_whole_ones(target):
    ids = target.tokenizer.encode(TEXT)
    start = target.pieces(ids).index(" and") + 1  # the draft covers " 漢字" and more
    before, drafted, bonus = ids[:start], ids[start:start + 4], ids[start + 4]
    tree = DraftTree.chain(drafted)
    logits = torch.zeros(len(drafted) + 1, len(target.tokenizer))
    for row, token in enumerate([*drafted, bonus]):  # a target that agrees with every draft, then adds the bonus
        logits[row, token] = 10.0
    acceptance = accept(tree, logits, SamplingConfig(), make_generator(0), None)
    step = Step(tree, logits, None, acceptance, [*drafted, bonus], False, 0.0, 0.0, 0.0, before=before[-8:])
    round_ = build_round(target, GenerationConfig(), step, index=0, start=0)
    expected = target.decode(ids[start:start + 5]).rstrip(REPLACEMENT)  # a character cut at the end waits
    assert "".join(round_.committed_text) == "".join(round_.text) + round_.extra_text == expected
    assert not any(REPLACEMENT in text for text in round_.committed_text)
    chosen = [row[0].text for row in round_.target_top]  # the target's top choice at each row, in context too
    assert chosen == [*round_.text, round_.extra_text]
