"""The verifying model: an unmodified Hugging Face causal LM plus what the loop needs to know about it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specviz.errors import SpecvizError


@dataclass
class Target:
    """A causal LM and its tokenizer, with cached token texts for the trace.

    ``model`` must accept ``input_ids``, ``position_ids``, ``attention_mask`` (4D additive for trees) and ``cache``.
    ``forward`` says how it runs: ``hf`` (transformers' own forward, ``DynamicCache``) or ``fast`` (the same modeling
    code with pre-packed linear kernels, ``specviz.models.fast_forward``, and a preallocated KV cache whose
    rollback is a length change).
    """

    model: torch.nn.Module
    tokenizer: object
    name: str = "target"
    source: str = ""
    forward: str = "hf"
    _pieces: dict[int, str] = field(default_factory=dict, repr=False)

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
        """Display text of one token, cached (decoding is hot in the trace)."""
        text = self._pieces.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            self._pieces[token_id] = text
        return text

    def pieces(self, token_ids: list[int]) -> list[str]:
        return [self.piece(t) for t in token_ids]

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
