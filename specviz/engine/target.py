"""The verifying model: an unmodified Hugging Face causal LM plus what the loop needs to know about it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specviz.errors import SpecvizError

#: What a decoder shows for bytes that are not (yet) a whole UTF-8 character.
REPLACEMENT = "\ufffd"
#: How many earlier tokens a token's display text may depend on: the run of tokens since the last one that decodes
#: cleanly on its own (a few emoji or CJK characters in a row), at most this many.
PIECE_CONTEXT = 8
#: A plain sentence: whether its tokens, decoded one by one, join into it says how the tokenizer decodes.
JOIN_PROBE = "The quick brown fox jumps over the lazy dog."
#: Contextual display texts kept per target (cleared when full: each costs two short decodes to rebuild).
PIECES_AFTER_CACHE = 65536


@dataclass
class Target:
    """A causal LM and its tokenizer, with cached token texts for the trace.

    ``model`` must accept ``input_ids``, ``position_ids``, ``attention_mask`` (4D additive for trees) and ``cache``.
    ``forward`` says how it runs: ``hf`` (transformers' own forward, ``DynamicCache``) or ``fast`` (the same modeling
    code with its linear products through the declared backend, ``specviz.models.fast_forward``, and a preallocated
    KV cache whose rollback is a length change).
    """

    model: torch.nn.Module
    tokenizer: object
    name: str = "target"
    source: str = ""
    forward: str = "hf"
    _pieces: dict[int, str] = field(default_factory=dict, repr=False)
    _pieces_after: dict[tuple[int, ...], str] = field(default_factory=dict, repr=False)
    _joins_alone: bool | None = field(default=None, repr=False)
    _partial: dict[int, bool] = field(default_factory=dict, repr=False)

    @classmethod
    def from_loaded(cls, loaded, model: torch.nn.Module | None = None, forward: str = "hf") -> Target:
        """Wrap a ``specviz.models.LoadedModel`` (``model``: a faster copy of its model, run as ``forward``)."""
        return cls(model=model if model is not None else loaded.model, tokenizer=loaded.tokenizer, name=loaded.name,
                   source=str(loaded.source), forward=forward)

    @property
    def preallocated_cache(self) -> bool:
        """The fast path keeps KV in preallocated buffers (no concatenation per step)."""
        return self.forward == "fast"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def config(self):
        return self.model.config

    @property
    def vocab_size(self) -> int:
        """Width of the logits (may exceed the tokenizer's vocabulary when padded)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def max_positions(self) -> int:
        config = self.config.get_text_config(decoder=True) if hasattr(self.config, "get_text_config") else self.config
        return int(getattr(config, "max_position_embeddings", 0) or 1 << 20)

    @property
    def eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    def piece(self, token_id: int) -> str:
        """Display text of one token on its own, cached (decoding is hot in the trace)."""
        text = self._pieces.get(token_id)
        if text is None:
            text = self._decode_raw([token_id])
            self._pieces[token_id] = text
        return text

    def piece_after(self, before: Sequence[int], token_id: int) -> str:
        """Display text of ``token_id`` where it follows ``before``, so the pieces of a text join into its decoded text.

        Byte-level tokenizers (and SentencePiece's byte fallback) split an emoji or a CJK character over several tokens,
        and each part decodes to U+FFFD on its own: here the parts show "" and the token completing the character shows
        all of it (as a streamer holds back an incomplete character). SentencePiece tokenizers (Llama 2, Vicuna,
        Mistral) drop a token's leading space when it is decoded alone: here it keeps the space it has in the text."""
        alone = self.piece(token_id)
        partial, joins = self.partial(token_id), self.joins_alone()
        if not partial and (joins or not before):
            return alone
        recent = [int(t) for t in before[-PIECE_CONTEXT:]]
        run: list[int] = []  # the parts of characters right before this token
        while recent and self.partial(recent[-1]):
            run.insert(0, recent.pop())
        anchor = recent[-1:] if not (partial or run) else []  # SentencePiece: what the token's leading space follows
        key = (*anchor, -1, *run, int(token_id))
        text = self._pieces_after.get(key)
        if text is None:
            text = self._text_after(anchor, run, int(token_id), partial)
            if len(self._pieces_after) >= PIECES_AFTER_CACHE:
                self._pieces_after.clear()
            self._pieces_after[key] = text
        return text

    def _text_after(self, anchor: list[int], run: list[int], token_id: int, partial: bool) -> str:
        """What ``token_id`` adds to the text after ``anchor`` (a whole token) and ``run`` (parts of characters)."""
        # the run may end whole characters before the one in progress: split it after the last that does
        cut = next((b for b in range(len(run), 0, -1) if REPLACEMENT not in self._decode_raw(run[:b])), 0)
        clean, pending = run[:cut], run[cut:]
        if partial:  # bytes join bytes: the character in progress is all it needs (byte fallback decodes a run of
            clean = []  # byte tokens as a whole, so whole characters before it must stay out)
        elif not run:
            clean = anchor
        keep = len(self._decode_raw(clean))  # whole characters: nothing of theirs is held back
        held = self._shown([*clean, *pending], keep)
        grown = self._shown([*clean, *pending, token_id], keep if partial else None)
        return grown[len(held):] if grown.startswith(held) else self.piece(token_id)

    def _shown(self, token_ids: list[int], keep: int | None) -> str:
        """``token_ids`` decoded, less the U+FFFD of a character still in progress at the end (past the first
        ``keep`` characters, which are whole); ``keep`` None: nothing held back."""
        text = self._decode_raw(token_ids)
        if keep is None:
            return text
        return max(text.rstrip(REPLACEMENT), text[:keep], key=len)

    def partial(self, token_id: int) -> bool:
        """Whether the token holds part of a character (it decodes to U+FFFD alone), as opposed to a token that is the
        U+FFFD character itself (web text has it: its text encodes back to the token)."""
        found = self._partial.get(token_id)
        if found is None:
            alone = self.piece(token_id)
            found = REPLACEMENT in alone and list(self.tokenizer.encode(alone, add_special_tokens=False)) != [token_id]
            self._partial[token_id] = found
        return found

    def joins_alone(self) -> bool:
        """Whether tokens decoded one by one join into the text decoded at once (byte-level BPE: yes, apart from
        split characters; SentencePiece and word-level tokenizers: no), probed once on a plain sentence."""
        if self._joins_alone is None:
            ids = list(self.tokenizer.encode(JOIN_PROBE, add_special_tokens=False))
            self._joins_alone = "".join(self._decode_raw([i]) for i in ids) == self._decode_raw(ids)
        return self._joins_alone

    def pieces(self, token_ids: list[int], before: Sequence[int] = ()) -> list[str]:
        """Display texts of ``token_ids`` in a row, following ``before`` (``piece_after`` each)."""
        context, out = list(before[-PIECE_CONTEXT:]), []
        for token in token_ids:
            out.append(self.piece_after(context, token))
            context = [*context, token][-PIECE_CONTEXT:]
        return out

    def _decode_raw(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def encode_prompt(self, prompt: str, *, chat: bool) -> list[int]:
        """Token ids of a prompt, through the chat template when ``chat`` is set."""
        if not isinstance(prompt, str):
            raise SpecvizError(f"the prompt must be text, not {type(prompt).__name__}")
        if not prompt or not prompt.strip():
            raise SpecvizError("the prompt is empty")
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as error:  # lone surrogates: bytes that were not UTF-8 (a shell's or file's)
            raise SpecvizError(f"the prompt is not valid UTF-8 text (at character {error.start})") from None
        if chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise SpecvizError(f"{self.name} has no chat template; run with --no-chat (raw prompt)")
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
                ids = ids["input_ids"]
        else:
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        ids = [int(t) for t in (ids[0] if ids and isinstance(ids[0], list) else ids)]
        if not ids:
            raise SpecvizError("the prompt encodes to no tokens")
        return ids

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)
