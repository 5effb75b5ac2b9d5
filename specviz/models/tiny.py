"""Tiny random models with a real tokenizer and chat template, built in-process (no hub, no files shipped).

For tests and demos of code paths that need *a* causal LM (loading, tree verification, training) in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ("<unk>", "<|im_start|>", "<|im_end|>", "<pad>")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")
WORDS = ("the a cat dog sat ran on under mat tree and then it was happy sad big small red blue one two three four "
         "five is are what why how write tell story about explain code def return x y + = . , ? ! summarize "
         "translate answer question text user assistant system").split()


def tiny_tokenizer(extra_words: tuple[str, ...] = (), *, shuffle_seed: int | None = None):
    """A word-level fast tokenizer (specials first, then ``WORDS``); ``shuffle_seed`` permutes word ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(dict.fromkeys([*WORDS, *extra_words]))
    if shuffle_seed is not None:
        generator = torch.Generator().manual_seed(shuffle_seed)
        words = [words[i] for i in torch.randperm(len(words), generator=generator).tolist()]
    vocab = {token: i for i, token in enumerate([*SPECIALS, *words])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<|im_start|>",
                                        eos_token="<|im_end|>", pad_token="<pad>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_llama(vocab_size: int, *, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               seed: int = 0, eos_token_id: int = 2, pad_token_id: int = 3):
    """A random LlamaForCausalLM small enough to run a forward pass in a millisecond."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=1,
                         eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    return LlamaForCausalLM(config).eval()


def save_tiny_model(folder: Path, *, seed: int = 0, vocab_pad: int = 0, tokenizer=None, **kwargs) -> Path:
    """Write a tiny model directory (config.json + model.safetensors + tokenizer) and return it."""
    tokenizer = tokenizer or tiny_tokenizer()
    model = tiny_llama(len(tokenizer) + vocab_pad, seed=seed, **kwargs)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder
