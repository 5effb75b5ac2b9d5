"""Tiny randomly initialised models and a word-level tokenizer, built in-process (no hub, no files)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specviz.engine.target import Target
from specviz.models import fast_forward


def tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Words ``w0 … w{n-1}`` with ids 0 … n-1."""
    return tokenizer_from({f"w{i}": i for i in range(vocab_size)})


def tokenizer_from(vocab: dict[str, int]) -> PreTrainedTokenizerFast:
    unk = min(vocab, key=vocab.get)
    model = Tokenizer(WordLevel(vocab=vocab, unk_token=unk))
    model.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=model, unk_token=unk)


def model(arch: str = "llama", vocab_size: int = 64, layers: int = 2, hidden: int = 32, seed: int = 0,
          scale: float = 1.0, max_positions: int = 1024, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A random causal LM; ``scale`` multiplies the output layer so next-token distributions are peaked (> 1)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                  initializer_range=0.02, eos_token_id=None, bos_token_id=None, pad_token_id=None,
                  tie_word_embeddings=False, attn_implementation="sdpa")
    if arch == "llama":
        net = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        net = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(arch)
    net.generation_config.eos_token_id = None
    with torch.no_grad():
        net.lm_head.weight.mul_(scale)
    return net.to(dtype).eval()


def target(arch: str = "llama", vocab_size: int = 64, forward: str = "hf", **kwargs) -> Target:
    """A tiny target run through transformers' forward (``hf``) or the fast path's packed-kernel copy (``fast``)."""
    net = model(arch, vocab_size, **kwargs)
    if forward == "fast":
        net = fast_forward.fast_copy(net)
    return Target(model=net, tokenizer=tokenizer(vocab_size), name=f"tiny-{arch}", forward=forward)


def truncated(net: torch.nn.Module, layers: int) -> torch.nn.Module:
    """A shallower copy of ``net`` (its first ``layers`` blocks): a draft that agrees with the target only sometimes."""
    import copy

    short = copy.deepcopy(net)
    short.model.layers = short.model.layers[:layers]
    short.config.num_hidden_layers = layers
    if getattr(short.config, "layer_types", None):
        short.config.layer_types = short.config.layer_types[:layers]
    return short
