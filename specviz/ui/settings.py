"""The run settings panel (prompt, model, drafter, draft shape, sampling) and its conversion to a ``RunRequest``.

The Playground lays it out; Chain vs Tree reuses the same components as inputs, so both tabs always run the
same prompt, seed, target and drafter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gradio as gr

from specviz.engine.drafter import LIMITS
from specviz.drafters.quantized import DRAFT_QUANT_CHOICES
from specviz.errors import SpecvizError
from specviz.ui import examples, runner

MAX_DRAFT_VOCAB = 1 << 20
DEFAULT_DRAFT_QUANT = "off"
DEFAULT_QUESTION = "243"  # Spec-Bench summarization: input-grounded, where n-gram drafting shines


@dataclass
class Settings:
    example: gr.Dropdown
    prompt: gr.Textbox
    mode: gr.Radio
    target: gr.Dropdown
    drafter: gr.Dropdown
    shape: gr.Radio
    k: gr.Slider
    width: gr.Slider
    depth: gr.Slider
    max_nodes: gr.Slider
    temperature: gr.Slider
    top_p: gr.Slider
    seed: gr.Number
    max_new_tokens: gr.Slider
    stochastic_tree: gr.Checkbox
    min_draft_prob: gr.Slider
    draft_vocab: gr.Number
    draft_quant: gr.Radio

    @classmethod
    def build(cls) -> Settings:
        choices = examples.prompt_choices()
        default_q = DEFAULT_QUESTION if any(v == DEFAULT_QUESTION for _, v in choices) else None
        example = gr.Dropdown(choices=choices, value=default_q, label="Spec-Bench example prompt",
                              info="Spec-Bench (Apache-2.0, hemingkx/Spec-Bench)", elem_id="example")
        prompt = gr.Textbox(value=examples.prompt_text(default_q) or "Write a haiku about the sea.", lines=5,
                            max_lines=12, label="prompt", elem_id="prompt")
        mode = gr.Radio(["chat", "raw"], value="chat", label="prompt format",
                        info="chat wraps the prompt in the target's chat template", elem_id="mode")
        targets = runner.target_choices()
        target = gr.Dropdown(choices=targets, value=targets[0] if targets else None, allow_custom_value=True,
                             label="target model", info="the embedded default, or a hub id / local path if allowed",
                             elem_id="target")
        drafter = gr.Dropdown(choices=runner.drafter_choices(targets[0] if targets else ""), value="ngram",
                              allow_custom_value=True, label="drafter",
                              info="ngram[:N] prompt lookup, or model:<draft> (same tokenizer)", elem_id="drafter")
        shape = gr.Radio(["chain", "tree"], value="chain", label="draft shape", elem_id="shape")
        k = gr.Slider(1, 16, value=4, step=1, label="chain length k", elem_id="k")
        with gr.Row():
            width = gr.Slider(1, 8, value=3, step=1, label="tree width", elem_id="width")
            depth = gr.Slider(1, 12, value=4, step=1, label="tree depth", elem_id="depth")
        max_nodes = gr.Slider(1, 128, value=16, step=1, label="tree node budget", elem_id="max-nodes")
        with gr.Row():
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature (0 = greedy)",
                                    elem_id="temperature")
            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top-p", elem_id="top-p")
        with gr.Row():
            seed = gr.Number(value=0, precision=0, label="seed", elem_id="seed")
            max_new_tokens = gr.Slider(1, runner.MAX_NEW_TOKENS_UI, value=64, step=1, label="max new tokens",
                                       elem_id="max-new-tokens")
        stochastic_tree = gr.Checkbox(False, label="stochastic tree (draw children from the draft model's q)",
                                      elem_id="stochastic-tree")
        min_draft_prob = gr.Slider(0.0, 0.95, value=0.0, step=0.05, label="stop a branch below draft q",
                                   info="draft model only: a token the draft gives less than this ends its branch "
                                        "(0 = always draft k / depth)", elem_id="min-draft-prob")
        draft_vocab = gr.Number(value=0, precision=0, minimum=0, label="draft vocabulary (first N token ids)",
                                info="draft model only: cut its output layer to the first N ids, which are the "
                                     "frequent ones (0 = all)", elem_id="draft-vocab")
        draft_quant = gr.Radio(list(DRAFT_QUANT_CHOICES), value=DEFAULT_DRAFT_QUANT, label="draft model weights",
                               info="int8: a cheaper draft step on CPU (int8/fp16 weights); the target still "
                                    "verifies in full precision, so the output does not change", elem_id="draft-quant")
        settings = cls(example, prompt, mode, target, drafter, shape, k, width, depth, max_nodes, temperature, top_p,
                       seed, max_new_tokens, stochastic_tree, min_draft_prob, draft_vocab, draft_quant)
        example.input(examples.prompt_text, example, prompt, queue=False)
        target.change(lambda t: gr.Dropdown(choices=runner.drafter_choices(t or ""), value="ngram"), target, drafter,
                      queue=False)
        return settings

    @property
    def inputs(self) -> list:
        """Components in the order ``request`` takes them."""
        return [self.prompt, self.mode, self.target, self.drafter, self.shape, self.k, self.width, self.depth,
                self.max_nodes, self.temperature, self.top_p, self.seed, self.max_new_tokens, self.stochastic_tree,
                self.min_draft_prob, self.draft_vocab, self.draft_quant]


def _integer(name: str, value, low: int, high: int) -> int:
    if value is None or (isinstance(value, float) and (math.isnan(value) or not value.is_integer())):
        raise SpecvizError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    number = int(value)
    if not low <= number <= high:
        raise SpecvizError(f"{name} must be an integer in [{low}, {high}], got {number}")
    return number


def request(prompt, mode, target, drafter, shape, k, width, depth, max_nodes, temperature, top_p, seed,
            max_new_tokens, stochastic_tree, min_draft_prob=0.0, draft_vocab=0, draft_quant="off", *,
            tree: bool | None = None) -> runner.RunRequest:
    """A validated ``RunRequest`` from the panel's values; bad settings raise a one-line ``SpecvizError``."""
    if mode not in {"chat", "raw"}:
        raise SpecvizError(f"prompt format must be chat or raw, got {mode!r}")
    if shape not in {"chain", "tree"}:
        raise SpecvizError(f"draft shape must be chain or tree, got {shape!r}")
    try:
        temperature, top_p, min_draft_prob = float(temperature), float(top_p), float(min_draft_prob)
    except (TypeError, ValueError):
        raise SpecvizError("temperature, top-p and the draft stop must be numbers") from None
    built = runner.RunRequest(
        prompt=prompt or "", chat=mode == "chat", target=(target or "").strip(), drafter=(drafter or "").strip(),
        tree=(shape == "tree") if tree is None else tree,
        k=_integer("k", k, *LIMITS["k"]), width=_integer("tree width", width, *LIMITS["width"]),
        depth=_integer("tree depth", depth, *LIMITS["depth"]),
        max_nodes=_integer("tree node budget", max_nodes, *LIMITS["max_nodes"]),
        temperature=temperature, top_p=top_p, seed=_integer("seed", seed, 0, 2**63 - 1),
        max_new_tokens=_integer("max new tokens", max_new_tokens, 1, runner.MAX_NEW_TOKENS_UI),
        stochastic_tree=bool(stochastic_tree), min_draft_prob=min_draft_prob,
        draft_vocab=_integer("draft vocabulary", draft_vocab, 0, MAX_DRAFT_VOCAB), draft_quant=draft_quant,
    )
    return built.validate()
