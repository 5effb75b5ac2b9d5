"""Multi-token prediction (MTP) modules, DeepSeek-V3 style, drafting from the target's own hidden states.

Module k computes ``h' = Block(eh_proj(cat(enorm(emb(x[t+1+k])), hnorm(g[t]))))`` (MiMo's checkpoints
concatenate the other way round; its loader swaps the projection's column halves) and predicts x[t+2+k] with
``logits = head(norm(h'))``; ``emb`` and ``head`` are the target's own embedding and output layer, borrowed
(passed in, never copied into our weights or files). ``g`` is the target
feature ``hidden_states[L]`` for module 0 and module k-1's output at the same position for module k: the
sequential chain of DeepSeek-V3's MTP, trained teacher-forced (``specviz.training.trainers.mtp.teacher_forced``).

**Drafting.** With n modules, draft depth d uses module (d-1) mod n. Think of module k as having a row at every
position t whose inputs exist (a hidden state g[t] and the token x[t+1+k]); each row attends causally to module
k's rows at earlier positions. Committed text gives every module its rows with real inputs; a draft node at depth d
adds one row per module at position P+d-k (P = the pending token's position - 1, the last position with a target
feature), whose hidden input is the parent's row of module k-1 (k = 0: of module n-1, which predicts the same next
token a target feature at this position would). So the first n depths are exactly DeepSeek's sequential modules
at the last position, and deeper steps continue them with their own outputs, as vLLM reuses DeepSeek-V3's single
module (n = 1 is EAGLE's scheme). Rows are computed only when a prediction needs them, one forward per module per
wave, with a tree mask; each module's KV cache keeps its committed rows between rounds and drops draft rows after
every round (EAGLE's ``stable_kv``). ``DraftTree.meta["module"]`` says which module drafted each node.

Loaders for the published layouts are in ``specviz.drafters.mtp_layouts``. Our own modules are trained post hoc
on a frozen target (``specviz train mtp``); published MTP layers are trained jointly with their model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from specviz.drafters import checkpoint_files, dynamic_tree
from specviz.drafters import mtp_layouts as layouts
from specviz.drafters.feature_drafter import CommittedRowsDrafter
from specviz.drafters.head_layer import DecoderLayer, DraftNetwork
from specviz.drafters.head_parts import fresh, target_parts
from specviz.drafters.layouts import Format, build, fits, network_shapes
from specviz.drafters.mtp_layouts import MtpSpec
from specviz.engine.drafter import DraftBudget
from specviz.engine.sampling import SamplingConfig
from specviz.engine.tree import ROOT, DraftTree
from specviz.errors import SpecvizError

TITLE = "MTP modules"


# ---- the modules ------------------------------------------------------------------------------------------------
class MtpModule(nn.Module):
    """One MTP module: the two input norms, the projection, a decoder layer and the final norm."""

    def __init__(self, spec: MtpSpec):
        super().__init__()
        self.enorm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.hnorm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * spec.hidden_size, spec.hidden_size, bias=False)
        self.block = DecoderLayer(spec, bias=spec.attention_bias, qk_norm=spec.qk_norm)  # Llama, Qwen2 or Qwen3
        self.norm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)


class MtpStack(DraftNetwork):
    """n MTP modules over a target (its embedding and output layer borrowed: not parameters, never saved)."""

    def __init__(self, spec: MtpSpec, embedding: torch.Tensor, output: nn.Module):
        super().__init__(spec, embedding, output)
        self.layers = nn.ModuleList(MtpModule(spec) for _ in range(spec.num_modules))

    @property
    def num_modules(self) -> int:
        return self.spec.num_modules

    def step(self, k: int, hidden: torch.Tensor, token_ids: torch.Tensor, position_ids: torch.Tensor, *,
             cache=None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Module k over ``[B, T]`` rows: ``hidden`` g[t] ``[B, T, H]``, ``token_ids`` x[t+1+k], RoPE positions t;
        returns h' ``[B, T, H]`` (before ``norm``). ``cache``: a ``DynamicCache`` (layer 0) or anything with
        ``update``; ``mask``: bool, True = attend, broadcastable to ``[B, heads, T, S]`` (None: causal)."""
        layer = self.layers[k]
        emb = layer.enorm(self.embed(token_ids))
        hid = layer.hnorm(hidden.to(self.dtype))
        x = layer.eh_proj(torch.cat([emb, hid], dim=-1))
        return layer.block(x, self.rotation(position_ids, x), cache=cache, mask=mask)

    def feed(self, k: int, out: torch.Tensor) -> torch.Tensor:
        """What the next step reads from module k's output: h', or norm(h') for the layouts that feed it normed."""
        return self.layers[k].norm(out) if self.spec.feed_normed else out

    def logits(self, k: int, out: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits of module k's outputs (float32): the target's output layer on norm(h')."""
        return self.project_out(self.layers[k].norm(out)).float()

#: The modules' checkpoint formats (``mtp_layouts``), their tensors named and shaped as ``MtpStack`` holds them.
FORMAT = Format(what="MTP modules", layouts=layouts.LAYOUTS, expected_shapes=network_shapes(MtpStack),
                check_fits=lambda spec, target: fits(spec, target, "the MTP modules are", (spec.feature_layer,)),
                env=lambda spec: {"L": spec.feature_layer, "k": spec.num_modules}, unknown=layouts.UNKNOWN,
                select=layouts.mtp_only, choose_files=layouts.mtp_shards, plural=True)


# ---- building, saving and loading -------------------------------------------------------------------------------
def spec_for(model: nn.Module, num_modules: int = 1, *, feed_normed: bool = False) -> MtpSpec:
    """The spec of MTP modules of ours for ``model``: blocks shaped like the target's decoder layers, reading
    ``hidden_states[L]`` (after the final norm, as the published layers are fed)."""
    fields = MtpSpec.fields_like(model)
    fields["rope"].pop("partial_rotary_factor", None)
    first = model.get_decoder().layers[0].self_attn
    return MtpSpec(num_modules=num_modules, feature_layer=target_parts(model)[0].num_layers,
                   attention_bias=first.q_proj.bias is not None, qk_norm=hasattr(first, "q_norm"),
                   feed_normed=feed_normed, **fields)


def build_stack(model: nn.Module, spec: MtpSpec, state: dict[str, torch.Tensor] | None = None) -> MtpStack:
    """Modules for ``spec`` on ``model``'s device, borrowing its embedding and output layer; ``state`` loads them."""
    return build(MtpStack, model, spec, state)


def new_stack(model: nn.Module, num_modules: int = 1, *, seed: int | None = None, feed_normed: bool = False,
              dtype: torch.dtype = torch.float32) -> MtpStack:
    """Freshly initialised modules of ours for the target ``model`` (norms at one, projections N(0, 0.02))."""
    spec = spec_for(model, num_modules, feed_normed=feed_normed)
    stack = fresh(lambda: build_stack(model, spec), seed)
    return stack.to(dtype=dtype)


def save_stack(stack: MtpStack, folder: Path, *, target_name: str, layout: str = "specviz",
               dtype: torch.dtype | None = None) -> Path:
    """Write ``stack`` as a loadable folder: our layout (borrowed tensors recorded with the embedding's
    fingerprint, not stored) or a published one (``mtp_layouts.DIALECTS``), for interop and tests."""
    return FORMAT.save(stack, folder, layout, target_name=target_name, dtype=dtype or stack.dtype)


def load_stack(source: str | Path, model: nn.Module) -> MtpStack:
    """MTP modules from a folder (ours, a published layout, or a target checkpoint carrying its own MTP layers)
    or a hub id, checked against the target ``model``; every error is one line naming the source."""
    return FORMAT.load(source, model, lambda spec, state, config: build_stack(model, spec, state))


def own_mtp_source(model: nn.Module) -> str | None:
    """Where the target's own MTP layers are (its checkpoint folder or hub id), when its config declares some
    (``num_nextn_predict_layers`` / ``mtp_num_hidden_layers``); None otherwise."""
    name = str(getattr(model.config, "_name_or_path", "") or "")
    return name if name and layouts.module_count_field(model.config.to_dict()) else None


# ---- the drafter ------------------------------------------------------------------------------------------------
class MtpDrafter(CommittedRowsDrafter):
    """Drafts with MTP modules from the target features the engine hands it (``observe``).

    ``stochastic_tree``: at temperature > 0 draw tree children from q (verified by rejection sampling) instead of
    taking the top-w. ``pack``: run the modules through pre-packed CPU kernels (a copy; ``stack`` stays trainable).
    ``draft_quant="int8"``: the output layer in int8 for drafting (``head_parts.output_projection``).
    """

    what = "MTP modules"

    def __init__(self, stack: MtpStack, vocab_size: int, name: str | None = None, stochastic_tree: bool = False,
                 pack: bool = True, draft_quant: str = "off"):
        self.stack = self.adopt(stack, stack.spec.vocab_size, vocab_size, pack=pack, draft_quant=draft_quant)
        self.name = name or "mtp"
        self.stochastic_tree = stochastic_tree
        super().__init__((stack.spec.feature_layer,), stack.device, stack.dtype)
        self.steps = stack.num_modules  # module k is step k
        self.begin([])

    def describe(self) -> dict:
        spec = self.stack.spec
        return {**super().describe(), "modules": spec.num_modules,
                "trained": "post hoc on a frozen target by specviz, not jointly with the model as published MTP "
                "layers are" if spec.origin == "post-hoc" else "jointly with the model (published MTP layers)",
                "stochastic_tree": self.stochastic_tree}

    def module_caches(self) -> list[DynamicCache]:
        return self._caches

    def step_committed(self, k: int, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                       cache: DynamicCache) -> torch.Tensor:
        return self.runner.step(k, hidden, tokens, positions, cache=cache)

    def feed(self, k: int, out: torch.Tensor) -> torch.Tensor:
        return self.runner.feed(k, out)

    @torch.inference_mode()
    def propose(self, context: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator) -> DraftTree:
        self.catch_up(context)
        if self.last_output(0, len(context)) is None:  # a one-token prompt: no committed row yet
            return DraftTree.empty()
        rows = _DraftRows(self, len(context))

        def expand(frontier: list[int], candidates: list[dynamic_tree.Candidate]) -> torch.Tensor:
            want = [(candidates[v].depth % rows.n, v) for v in frontier]
            rows.compute(want, candidates)
            return torch.cat([self.runner.logits(k, rows.out[(k, v)][None]) for k, v in want])

        root = self.runner.logits(0, rows.committed(0)[None])
        grown = dynamic_tree.grow(root, expand, budget, sampling, generator, self.vocab_size, self.stochastic_tree)
        tree = grown.tree
        tree.meta["module"] = [(depth - 1) % rows.n for depth in tree.depth]
        for node in tree.meta.get("pruned", []):
            node["module"] = (node["depth"] - 1) % rows.n
        return tree


class _DraftRows:
    """One round's draft rows: module k's row of node v sits at position P + depth(v) - k (P = len(context) - 2),
    reads v's token and, as hidden state, the parent's row of module k - 1 (k = 0: module n - 1; the parent of a
    depth-1 node is the committed text, whose rows the modules already hold)."""

    def __init__(self, drafter: MtpDrafter, length: int):
        self.drafter, self.runner = drafter, drafter.runner
        self.n = drafter.stack.num_modules
        self.base = length - 2  # P: the last position with a target feature
        self.out: dict[tuple[int, int], torch.Tensor] = {}
        self.slots: list[dict[int, int]] = [{} for _ in range(self.n)]  # module k: node -> its row's cache entry

    def committed(self, k: int) -> torch.Tensor | None:
        """Module k's last committed output (position P - k), None when it has no row yet."""
        return self.drafter.last_output(k, self.base + 2)

    def _source(self, k: int) -> int:
        return k - 1 if k else self.n - 1

    def _valid(self, row: tuple[int, int], candidates: list[dynamic_tree.Candidate]) -> bool:
        k, v = row
        if self.base + candidates[v].depth - k < 0:
            return False
        parent = candidates[v].parent
        source = self._source(k)
        return self.committed(source) is not None if parent == ROOT else self._valid((source, parent), candidates)

    def compute(self, want: list[tuple[int, int]], candidates: list[dynamic_tree.Candidate]) -> None:
        """Compute ``want`` and every row they need (hidden inputs, and the module's rows of their ancestors)."""
        needed: dict[tuple[int, int], None] = {}
        stack = list(want)
        while stack:
            row = stack.pop()
            if row in self.out or row in needed or not self._valid(row, candidates):
                continue
            needed[row] = None
            k, v = row
            parent = candidates[v].parent
            if parent != ROOT:
                stack.append((self._source(k), parent))
            ancestor = parent
            while ancestor != ROOT:
                stack.append((k, ancestor))
                ancestor = candidates[ancestor].parent
        while needed:  # a row is ready once its hidden input is computed; its ancestors' rows are then ready too
            ready = [r for r in needed if self._hidden(r, candidates) is not None]
            if not ready:
                raise SpecvizError("MTP draft rows depend on each other in a cycle (a bug)")
            for k in range(self.n):
                batch = sorted((r for r in ready if r[0] == k), key=lambda r: candidates[r[1]].depth)
                if batch:
                    self._forward(k, batch, candidates)
            for row in ready:
                del needed[row]

    def _hidden(self, row: tuple[int, int], candidates: list[dynamic_tree.Candidate]) -> torch.Tensor | None:
        k, v = row
        parent, source = candidates[v].parent, self._source(row[0])
        found = self.committed(source) if parent == ROOT else self.out.get((source, parent))
        return None if found is None else self.runner.feed(source, found)

    def _forward(self, k: int, batch: list[tuple[int, int]], candidates: list[dynamic_tree.Candidate]) -> None:
        cache, mask, tokens, positions = self.drafter.draft_inputs(k, [v for _, v in batch], candidates,
                                                                   self.slots[k], self.base + 2)
        hidden = torch.stack([self._hidden(row, candidates) for row in batch])
        out = self.runner.step(k, hidden[None], tokens, positions, cache=cache, mask=mask)[0]
        for index, row in enumerate(batch):
            self.out[row] = out[index]


# ---- the family -------------------------------------------------------------------------------------------------
def _load(source: str | Path, target, settings, name: str) -> MtpDrafter:
    return MtpDrafter(load_stack(source, target.model), target.vocab_size, name=name,
                      stochastic_tree=bool(settings["stochastic_tree"]), draft_quant=settings["draft_quant"])


FAMILY = checkpoint_files.checkpoint_family(
    "mtp", "MTP modules", load=_load, own=own_mtp_source, plural=True,
    title=TITLE,
    plain_name="Multi-token prediction (MTP)",
    plain_line="small modules on the model's last layer predict the words after the next one",
    description=("DeepSeek-V3-style multi-token prediction modules on the target's last hidden state, draft step d "
                 "by module (d-1) mod n (EAGLE-2's dynamic tree, or a chain with --chain); loads DeepSeek-V3/GLM-4.5, "
                 "Qwen3-Next and MiMo MTP layers, or the target checkpoint's own; bare name: the target's own MTP "
                 "layers, else the modules shipped for it. Ours are trained post hoc on a frozen target, unlike "
                 "real MTP layers, which are trained jointly with their model"),
    reads=("stochastic_tree", "min_draft_prob", "draft_quant"),
    feature_layers=lambda num_layers: (num_layers,),
    features="`hidden_states[L]` (after the final norm, as published MTP layers are fed)",
    order=33,  # trained by specviz.training.trainers.mtp
)
