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


def test_sentencepiece_tokens_keep_their_leading_space():
    """A Metaspace (SentencePiece, as Llama 2 / Vicuna / Mistral) decoder drops a token's leading space when it is
    decoded alone: in context the token keeps it, so the text panel does not read "Thequickbrownfox"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog."]
    model = Tokenizer(models.WordLevel(vocab={"<unk>": 0, **{f"▁{w}": i + 1 for i, w in enumerate(words)}},
                                       unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    model.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>")
    target = Target(model=tiny.model(vocab_size=len(words) + 1, hidden=16, layers=1), tokenizer=tokenizer)
    ids = tokenizer.encode("The quick brown fox", add_special_tokens=False)
    assert target.piece(ids[1]) == "quick" and not target.joins_alone()  # the case: alone, the space is gone
    assert target.pieces(ids) == ["The", " quick", " brown", " fox"]
    assert target.piece_after(ids[:2], ids[2]) == " brown"


def test_byte_fallback_runs_and_a_literal_replacement_character(target):
    """SentencePiece's byte fallback decodes a run of byte tokens as a whole (an incomplete run is all U+FFFD), and a
    token can be the U+FFFD character itself: neither may lose or repeat a character."""
    from tokenizers import Tokenizer, decoders, normalizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "▁": 1, **{f"<0x{b:02X}>": 2 + b for b in range(256)}}
    model = Tokenizer(BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    model.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    model.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                       decoders.Strip(" ", 1, 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>")
    fallback = Target(model=tiny.model(vocab_size=len(vocab), hidden=16, layers=1), tokenizer=tokenizer)
    for text in ("中中中", "😀😀"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert "".join(fallback.pieces(ids)) == text
    ids = target.tokenizer.encode("\ufffd😀 a", add_special_tokens=False)  # SmolLM2 has a token for U+FFFD itself
    assert target.pieces(ids)[0] == "\ufffd" and "".join(target.pieces(ids)) == "\ufffd😀 a"
