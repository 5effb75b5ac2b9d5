"""Target and drafter must share token ids, or accepted draft tokens would mean different text."""

from __future__ import annotations

from specviz.errors import SpecvizError


def check_same_tokenizer(target, draft) -> None:
    """Raise a one-line error naming both models when their vocabularies differ.

    A padded vocabulary (extra unused rows, or extra added tokens past the shared range) is fine as long as every
    token both tokenizers know maps to the same id and the special tokens agree.
    """
    t_vocab, d_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    shared = min(len(t_vocab), len(d_vocab))
    t_by_id = {i: tok for tok, i in t_vocab.items() if i < shared}
    d_by_id = {i: tok for tok, i in d_vocab.items() if i < shared}
    mismatched = [i for i in range(shared) if t_by_id.get(i) != d_by_id.get(i)]
    if mismatched:
        i = mismatched[0]
        raise SpecvizError(f"tokenizers differ: target {target.name!r} and drafter {draft.name!r} disagree on "
                           f"{len(mismatched)} of {shared} token ids (e.g. id {i}: {t_by_id.get(i)!r} vs "
                           f"{d_by_id.get(i)!r})")
    for attr in ("eos_token_id", "bos_token_id"):
        t_id, d_id = getattr(target.tokenizer, attr, None), getattr(draft.tokenizer, attr, None)
        if t_id is not None and d_id is not None and t_id != d_id:
            raise SpecvizError(f"tokenizers differ: target {target.name!r} has {attr}={t_id} but drafter "
                               f"{draft.name!r} has {d_id}")
    t_rows, d_rows = target.model.config.vocab_size, draft.model.config.vocab_size
    if min(t_rows, d_rows) < min(len(t_vocab), len(d_vocab)):
        raise SpecvizError(f"model {target.name!r} ({t_rows} logits) or {draft.name!r} ({d_rows} logits) has fewer "
                           f"output rows than its tokenizer has tokens")
