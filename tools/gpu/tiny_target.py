"""A tiny random target and draft built in-process, so the GPU check's dry run exercises every step in seconds.

Nothing is downloaded or read from disk: a two-layer Llama with grouped-query attention (the shape of the embedded
default, shrunk) and a word-level tokenizer over ``w0 … w{n-1}``. The draft is the target's first layer, so it agrees
with the target only sometimes, and rounds see both acceptances and rejections.
"""

from __future__ import annotations

import copy

import torch

from specviz.engine.target import Target
from specviz.models import cascade_attention
from specviz.models.device import CASCADE

VOCAB = 64


def tokenizer(vocab_size: int = VOCAB):
    """Words ``w0 … w{n-1}`` with ids 0 … n-1; anything else is ``w0``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel(vocab={f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")


def model(device: str, dtype: torch.dtype, attention: str, *, layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """A random Llama (4 query heads over 2 key/value heads), its output layer scaled so distributions are peaked."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if attention == CASCADE:
        cascade_attention.register()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                         attn_implementation=attention)
    net = LlamaForCausalLM(config)
    net.generation_config.eos_token_id = None
    with torch.no_grad():
        net.lm_head.weight.mul_(25)
    return net.to(device=device, dtype=dtype).eval().requires_grad_(False)


def target(device: str, dtype: torch.dtype, attention: str) -> Target:
    return Target(model=model(device, dtype, attention), tokenizer=tokenizer(), name="tiny-llama (dry run)",
                  source="built in-process")


def draft(target_model: torch.nn.Module) -> torch.nn.Module:
    """The target's first layer alone, sharing nothing with it."""
    short = copy.deepcopy(target_model)
    short.model.layers = short.model.layers[:1]
    short.config.num_hidden_layers = 1
    if getattr(short.config, "layer_types", None):
        short.config.layer_types = short.config.layer_types[:1]
    return short


#: a chat template in the tiny vocabulary: ``w1`` opens a turn, ``w2`` ends it (and is the end token)
CHAT_TEMPLATE = ("{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
                 "{% if add_generation_prompt %}w1 {% endif %}")


def save_chat_model(folder, *, layers: int = 4) -> str:
    """The tiny target written as a model directory with a chat template, for commands that load a ``--target``
    (the training pipeline's dry run); returns the directory."""
    net = model("cpu", torch.float32, "sdpa", layers=layers)
    net.config.eos_token_id = net.generation_config.eos_token_id = 2
    words = tokenizer()
    words.eos_token = "w2"
    words.mask_token = "w3"  # the block drafters' mask (DFlash, DSpark)
    words.chat_template = CHAT_TEMPLATE
    net.save_pretrained(str(folder))
    words.save_pretrained(str(folder))
    return str(folder)
