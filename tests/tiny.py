"""Tiny randomly initialised models and word-level tokenizers, built in-process (no hub, no files shipped).

``tokenizer`` / ``model`` / ``target``: in-memory targets for engine tests. ``tiny_tokenizer`` / ``save_tiny_model``: a
tokenizer with specials and a chat template, and a model directory on disk, for loading and training tests.

The GPU check (``python tools/gpu/check.py``) runs the lossless tests on another device, dtype and attention backend
through ``SPECVIZ_TEST_DEVICE`` (default ``cpu``), ``SPECVIZ_TEST_DTYPE`` (default float32) and
``SPECVIZ_TEST_ATTENTION`` (default ``sdpa``; e.g. ``specviz_cascade``); ``model`` and ``target`` follow them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specviz.engine.loop import GenerationConfig, plain_decode
from specviz.engine.target import Target
from specviz.models import cascade_attention, fast_forward
from specviz.models.device import choose_dtype
from tools.gpu import near_ties

DEVICE = os.environ.get("SPECVIZ_TEST_DEVICE", "cpu")
DTYPE = choose_dtype(DEVICE, os.environ.get("SPECVIZ_TEST_DTYPE", "float32"))
ATTENTION = os.environ.get("SPECVIZ_TEST_ATTENTION", "sdpa")
if ATTENTION == cascade_attention.NAME:
    cascade_attention.register()
#: assert_close tolerances per dtype, for activations and cache entries
TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 1e-4}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}
#: in bf16 a wider verify forward rounds differently from a one-token step, so greedy outputs may part where the two
#: best logits are within a few bf16 steps (2**-7 relative) of each other: a near tie, not a wrong token
NEAR_TIE_STEPS = 4


def assert_same_or_near_tie(target: Target, prompt: list[int], expected: list[int], got: list[int],
                            dtype: torch.dtype = DTYPE) -> None:
    """float32: ``got`` equals ``expected``. Lower precision: equal, or parting at a near tie (the expected run's
    logits there rank the two tokens within ``NEAR_TIE_STEPS`` rounding steps of each other); a wrong token ranks
    far below and fails."""
    if got == expected:
        return
    assert dtype != torch.float32, f"greedy output parts from plain decoding: {got} != {expected}"
    parted = near_ties.divergence(target, prompt, expected, got)
    assert parted["gap"] is not None, f"lengths differ: {len(got)} vs {len(expected)} tokens"
    logits = near_ties.next_logits(target, prompt + expected[: parted["position"]])
    scale = float(logits[[parted["reference_token"], parted["other_token"]]].abs().max())
    assert abs(parted["gap"]) <= NEAR_TIE_STEPS * 2**-7 * max(scale, 1.0), f"not a near tie: {parted}"


def tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Words ``w0 … w{n-1}`` with ids 0 … n-1."""
    return tokenizer_from({f"w{i}": i for i in range(vocab_size)})


def tokenizer_from(vocab: dict[str, int]) -> PreTrainedTokenizerFast:
    unk = min(vocab, key=vocab.get)
    model = Tokenizer(WordLevel(vocab=vocab, unk_token=unk))
    model.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=model, unk_token=unk)


def model(arch: str = "llama", vocab_size: int = 64, layers: int = 2, hidden: int = 32, seed: int = 0,
          scale: float = 1.0, max_positions: int = 1024, dtype: torch.dtype | None = None,
          attention: str | None = None) -> torch.nn.Module:
    """A random causal LM on ``DEVICE``; ``scale`` multiplies the output layer so next-token distributions are peaked
    (> 1). ``dtype`` and ``attention`` default to ``DTYPE`` and ``ATTENTION``."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                  initializer_range=0.02, eos_token_id=None, bos_token_id=None, pad_token_id=None,
                  tie_word_embeddings=False, attn_implementation=attention or ATTENTION)
    if arch == "llama":
        net = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        net = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(arch)
    net.generation_config.eos_token_id = None
    with torch.no_grad():
        net.lm_head.weight.mul_(scale)
    return net.to(device=DEVICE, dtype=dtype or DTYPE).eval()


def target(arch: str = "llama", vocab_size: int = 64, forward: str = "hf", **kwargs) -> Target:
    """A tiny target run through transformers' forward (``hf``) or the fast path's packed-kernel copy (``fast``)."""
    if forward == "fast" and DEVICE != "cpu":
        pytest.skip("the fast forward runs on the CPU only")
    net = model(arch, vocab_size, **kwargs)
    if forward == "fast":
        net = fast_forward.fast_copy(net)
    return Target(model=net, tokenizer=tokenizer(vocab_size), name=f"tiny-{arch}", forward=forward)


def both_forwards(arch: str = "llama", vocab_size: int = 64, **kwargs) -> dict[str, Target]:
    """The same tiny model behind transformers' forward and the fast path, keyed ``hf`` / ``fast``: each drafter's
    lossless tests run on both."""
    return {forward: target(arch, vocab_size, forward=forward, **kwargs) for forward in ("hf", "fast")}


def plain_outputs(targets: dict[str, Target], prompt: list[int], new_tokens: int) -> dict[str, list[int]]:
    """Plain greedy decoding of ``prompt`` on each of ``targets``: what every lossless configuration must reproduce."""
    return {forward: plain_decode(t, prompt, GenerationConfig(max_new_tokens=new_tokens)).token_ids
            for forward, t in targets.items()}


class Unpicklable:
    """An object ``torch.load(weights_only=True)`` must refuse to unpickle: put in a ``.bin``/``.pt`` checkpoint, it
    proves a loader reads legacy files only that way."""


def truncated(net: torch.nn.Module, layers: int) -> torch.nn.Module:
    """A shallower copy of ``net`` (its first ``layers`` blocks): a draft that agrees with the target only sometimes."""
    import copy

    short = copy.deepcopy(net)
    short.model.layers = short.model.layers[:layers]
    short.config.num_hidden_layers = layers
    if getattr(short.config, "layer_types", None):
        short.config.layer_types = short.config.layer_types[:layers]
    return short


SPECIALS = ("<unk>", "<|im_start|>", "<|im_end|>", "<pad>")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")
WORDS = ("the a cat dog sat ran on under mat tree and then it was happy sad big small red blue one two three four "
         "five is are what why how write tell story about explain code def return x y + = . , ? ! summarize "
         "translate answer question text user assistant system").split()


def tiny_tokenizer(extra_words: tuple[str, ...] = (), *, shuffle_seed: int | None = None) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with a chat template (specials first, then ``WORDS``); ``shuffle_seed`` permutes ids."""
    words = list(dict.fromkeys([*WORDS, *extra_words]))
    if shuffle_seed is not None:
        generator = torch.Generator().manual_seed(shuffle_seed)
        words = [words[i] for i in torch.randperm(len(words), generator=generator).tolist()]
    vocab = {token: i for i, token in enumerate([*SPECIALS, *words])}
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<|im_start|>",
                                  eos_token="<|im_end|>", pad_token="<pad>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_llama(vocab_size: int, *, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               seed: int = 0, eos_token_id: int = 2, pad_token_id: int = 3) -> LlamaForCausalLM:
    """A random LlamaForCausalLM with tied embeddings and ``tiny_tokenizer``'s special ids."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=1,
                         eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    return LlamaForCausalLM(config).eval()


def save_tiny_model(folder: Path, *, seed: int = 0, vocab_pad: int = 0, tokenizer=None, **kwargs) -> Path:
    """Write a tiny model directory (config.json + model.safetensors + tokenizer) and return it."""
    tokenizer = tokenizer or tiny_tokenizer()
    net = tiny_llama(len(tokenizer) + vocab_pad, seed=seed, **kwargs)
    folder.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder
