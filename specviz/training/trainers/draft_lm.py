"""``draft-lm``: an independent small Llama that shares the target's tokenizer, distilled from the target.

The 49152-row embedding is most of a small drafter's size and of its per-token cost (the output head), so the
hidden size is small (256 by default) with tied input/output embeddings, initialised from a PCA projection of the
target's embedding matrix: the drafter starts from the target's token geometry instead of noise.

With ``init_layers`` the drafter is instead a shallow copy of the target: the chosen decoder layers (e.g. the first
four), the final norm, and the target's own embedding and output layer, frozen and *shared* (see
``specviz.models.shared_embedding``: the exported folder leaves them out and the loader takes them from the target).
The layers start from weights trained on the target's pre-training data, which generalise far better than a small
model distilled from scratch on a few thousand answers, and the big embedding costs no disk space.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specviz.errors import SpecvizError
from specviz.models import load_model
from specviz.models.shared_embedding import CONFIG_KEY, mark_shared
from specviz.training.batches import Batch
from specviz.training.losses import distill_loss
from specviz.training.trainers.base import FeatureRequest, Trainer

#: The config entries that make two drafts the same architecture (``--init-from`` compares them); the rest is
#: bookkeeping that differs between a fresh student and a saved fp16 copy (dtype, name, transformers version).
ARCHITECTURE_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
                     "rope_parameters", "max_position_embeddings", "tie_word_embeddings", "attention_bias", "mlp_bias")

DEFAULTS = {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 4, "intermediate": 1024, "hard_weight": 0.5,
            "softmax_sample": 0}


def parse_layers(spec: str | None, num_layers: int) -> list[int]:
    """``"0,1,2,3"`` → [0, 1, 2, 3], checked against the target's ``num_layers`` (empty/None → [])."""
    if not spec:
        return []
    try:
        layers = [int(part) for part in str(spec).split(",") if part.strip()]
    except ValueError:
        raise SpecvizError(f"--init-layers takes comma-separated layer numbers, got {spec!r}") from None
    if not layers or len(set(layers)) != len(layers) or min(layers) < 0 or max(layers) >= num_layers:
        raise SpecvizError(f"--init-layers {spec!r}: need distinct layer numbers from 0 to {num_layers - 1}")
    return layers


def pca_embedding(embedding: torch.Tensor, dim: int) -> torch.Tensor:
    """Project the target's [V, H] embedding onto its top-``dim`` principal directions (uncentred, so the common
    direction that carries token frequency survives) → [V, dim]."""
    weight = embedding.detach().float()
    if dim >= weight.shape[1]:
        return weight[:, :dim].clone()
    gram = weight.T @ weight
    _eigvals, eigvecs = torch.linalg.eigh(gram)  # ascending
    basis = eigvecs[:, -dim:].flip(-1)
    return weight @ basis


def candidate_pool(top_ids: torch.Tensor, labels: torch.Tensor, vocab_size: int,
                   negatives: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sampled softmax: the batch's target top-k ids and labels plus ``negatives`` uniform random ids.

    On CPU the 49152-way output head is ~3/4 of a step; scoring only the tokens the target considers (and a random
    sample of the rest, so the others keep being pushed down) makes a step several times cheaper. Returns the pool
    and the top-k ids / labels re-indexed into it (-1 stays -1). Evaluation always uses the full head.
    """
    random_ids = torch.randint(0, vocab_size, (negatives,), device=labels.device)
    pool = torch.cat([top_ids[top_ids >= 0], labels, random_ids]).unique()
    remap = torch.full((vocab_size,), -1, dtype=torch.long, device=labels.device)
    remap[pool] = torch.arange(pool.numel(), device=labels.device)
    top_local = torch.where(top_ids >= 0, remap[top_ids.clamp(min=0)], top_ids)
    return pool, top_local, remap[labels]


class DraftLMTrainer(Trainer):
    """Distils a LlamaForCausalLM drafter from the target's top-k outputs."""

    kind = "draft-lm"
    defaults = DEFAULTS

    def features(self) -> FeatureRequest:
        return FeatureRequest(layers=(), topk=int(self.options.get("topk", 8)))

    def student_config(self) -> LlamaConfig:
        """A small Llama config with the target's vocabulary, special ids and RoPE settings."""
        opts = {**DEFAULTS, **{k: v for k, v in self.options.items() if v is not None}}
        tcfg = self.target.model.config
        rope = getattr(tcfg, "rope_parameters", None) or {"rope_type": "default",
                                                          "rope_theta": getattr(tcfg, "rope_theta", 10000.0)}
        return LlamaConfig(
            vocab_size=tcfg.vocab_size,
            hidden_size=int(opts["hidden"]),
            intermediate_size=int(opts["intermediate"]),
            num_hidden_layers=int(opts["layers"]),
            num_attention_heads=int(opts["heads"]),
            num_key_value_heads=int(opts["kv_heads"]),
            head_dim=int(opts["hidden"]) // int(opts["heads"]),
            max_position_embeddings=getattr(tcfg, "max_position_embeddings", 2048),
            rms_norm_eps=getattr(tcfg, "rms_norm_eps", 1e-5),
            rope_parameters=dict(rope),
            tie_word_embeddings=True,
            bos_token_id=tcfg.bos_token_id,
            eos_token_id=tcfg.eos_token_id,
            pad_token_id=getattr(tcfg, "pad_token_id", None),
        )

    def init_layers(self) -> list[int]:
        return parse_layers(self.options.get("init_layers"), self.target.model.config.num_hidden_layers)

    def build_student(self) -> LlamaForCausalLM:
        layers = self.init_layers()
        if layers:
            return self.build_from_target(layers)
        config = self.student_config()
        config._attn_implementation = "sdpa"
        student = LlamaForCausalLM(config)
        with torch.no_grad():
            init = pca_embedding(self.target.model.get_input_embeddings().weight, config.hidden_size)
            # match the default init's scale so the first steps are stable; directions come from the target
            init = init / init.std() * config.initializer_range * 2
            student.get_input_embeddings().weight.copy_(init)
        student.tie_weights()
        return student

    def build_from_target(self, layers: list[int]) -> LlamaForCausalLM:
        """The target's ``layers`` (renumbered 0..n-1), final norm and shared, frozen embedding/output layer."""
        source = self.target.model
        if source.config.model_type != "llama":
            raise SpecvizError(f"--init-layers needs a Llama-architecture target, got {source.config.model_type!r}")
        if self.options.get("hidden") or self.options.get("layers"):
            raise SpecvizError("--init-layers takes the target's shape: leave out --hidden and --layers")
        config = LlamaConfig.from_dict({**source.config.to_dict(), "num_hidden_layers": len(layers)})
        config._attn_implementation = "sdpa"
        student = LlamaForCausalLM(config)
        renumber = {f"model.layers.{old}.": f"model.layers.{new}." for new, old in enumerate(layers)}
        state = {}
        for name, value in source.state_dict().items():
            if name.startswith("model.layers."):
                prefix = ".".join(name.split(".")[:3]) + "."
                if prefix in renumber:
                    state[renumber[prefix] + name[len(prefix):]] = value.detach().float().clone()
            else:
                state[name] = value.detach().float().clone()
        student.load_state_dict(state, strict=False)
        student.tie_weights()
        mark_shared(student, source, self.target.name)
        return student

    def describe_student(self, student: LlamaForCausalLM) -> dict:
        config = student.config.to_dict()
        shared = config.get(CONFIG_KEY) or {}
        return {**{key: config.get(key) for key in ARCHITECTURE_KEYS},
                "shared_from": shared.get("from"), "shared_tensors": shared.get("tensors")}

    def load_exported(self, folder: Path) -> LlamaForCausalLM:
        """A draft this trainer exported (fp16, its borrowed embedding taken back from the target), loaded and
        checked by the model loader (config against weights, fingerprint of the shared tensors)."""
        try:
            model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            model_type = None
        if model_type != "llama":
            raise SpecvizError(f"--init-from {folder}: not a draft model (draft-lm exports a Llama folder; "
                               f"its model type is {model_type!r})")
        return load_model(str(folder), role="draft", device=self.target.device, dtype=torch.float32).model

    def loss(self, student: LlamaForCausalLM, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        hidden = student.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        mask = batch.loss_mask
        hidden, top_ids, labels = hidden[mask], batch.topk_ids[mask], batch.labels[mask]
        hard_weight = float(self.options.get("hard_weight") or DEFAULTS["hard_weight"])
        sample = int(self.options.get("softmax_sample") or 0)
        if sample <= 0:  # logits only where there is something to learn: the output head is most of the cost
            return distill_loss(student.lm_head(hidden), top_ids, batch.topk_probs[mask], labels,
                                hard_weight=hard_weight)
        pool, top_local, labels_local = candidate_pool(top_ids, labels, student.config.vocab_size, sample)
        logits = hidden @ student.lm_head.weight[pool].T
        return distill_loss(logits, top_local, batch.topk_probs[mask], labels_local, hard_weight=hard_weight)

    @torch.no_grad()
    def predict_argmax(self, student: LlamaForCausalLM, input_ids: torch.Tensor,
                       hidden: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        device = next(student.parameters()).device
        return student(input_ids=input_ids.to(device)).logits[0].argmax(-1).cpu()

    def save_pretrained(self, student: LlamaForCausalLM, folder: Path, *, dtype: torch.dtype = torch.float32) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        copy_ = copy.deepcopy(student).to(device="cpu", dtype=dtype)
        copy_.config.dtype = dtype
        copy_.save_pretrained(str(folder))
        self.target.tokenizer.save_pretrained(str(folder))
