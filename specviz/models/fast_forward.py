"""The fast CPU execution path for an unmodified Hugging Face target: every ``nn.Linear`` through oneDNN.

Speculative decoding pays off when verifying k + 1 tokens costs about what one token costs. On CPUs the default
dispatch of ``F.linear`` (MKL) picks kernels whose cost grows steeply with the number of rows and leaves one-row
products on one thread; oneDNN with weights reordered once into its blocked layout stays near the memory-bandwidth
floor for 1 to 16 rows (BENCHMARKS.md has the curve). So each linear layer keeps its module and its weights, and only
its ``forward`` is replaced by a call to the packed kernel. Sibling projections that read the same input (attention's
q/k/v, the MLP's gate/up) share one packed product over their stacked weights: one larger, better-used kernel call
in place of two or three (``fuse_siblings``). The modeling code is transformers' own. In float32 the
Llama-style RMSNorms (fp32 upcast, mean of squares, rsqrt, scale) run as one ``F.rms_norm`` call: the same result bit
for bit (tested) with one operator call instead of six. A model on transformers' SDPA attention runs
``specviz_grouped_sdpa`` instead (``specviz.models.grouped_sdpa``): the same kernel without copying every layer's cache
per forward to repeat grouped key/value heads.

``fast_copy`` leaves the loaded model as it is (transformers' reference rows, training and drafters that borrow
the target's embedding use it) and returns a structural copy that shares every parameter tensor; only the packed
weights, in oneDNN's layout, are new memory. The numbers are the same maths in another summation order, so logits agree
with transformers' forward to float tolerance, not bit for bit; the tests compare greedy output with
transformers' own ``generate``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from specviz.errors import SpecvizError
from specviz.models import grouped_sdpa

#: The name the trace header and the UI show for this path.
KERNEL = "onednn-packed-linear"
_MARK = "_specviz_fast_forward"
#: Linear children of one module that read the same input: run as one product (``fuse_siblings``).
SIBLING_PROJECTIONS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
#: RMSNorm classes computing ``weight * x * rsqrt(mean(x^2) + eps)`` exactly as ``F.rms_norm`` does in float32
#: (not Gemma's, which scales by ``1 + weight``).
PLAIN_RMS_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"})


def available(device: str, dtype: torch.dtype) -> bool:
    """True where the packed oneDNN linear runs: CPU, float32 or bfloat16 (the latter only on a CPU oneDNN has a
    bfloat16 path for: AVX-512 BW/VL/DQ or AVX-NE-CONVERT), a torch built with oneDNN."""
    ops = getattr(torch.ops, "mkldnn", None)
    if not (device.split(":", 1)[0] == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise")
            and hasattr(ops, "_reorder_linear_weight")):
        return False
    return dtype == torch.float32 or bool(getattr(ops, "_is_mkldnn_bf16_supported", lambda: False)())


def fast_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` sharing all its tensors whose linear layers run through pre-packed oneDNN kernels."""
    parameter = next(model.parameters())
    if not available(str(parameter.device), parameter.dtype):
        raise SpecvizError(f"the fast target forward needs a CPU model in float32 (bfloat16 where oneDNN has a "
                           f"bfloat16 path for the CPU) and a torch built with oneDNN; this one is {parameter.dtype} "
                           f"on {parameter.device}: use --target-forward hf")
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    fast = copy.deepcopy(model, shared)  # new modules, the same parameter and buffer tensors
    for module in list(fast.modules()):
        for names in SIBLING_PROJECTIONS:
            fuse_siblings(module, names)
    for module in fast.modules():
        if isinstance(module, nn.Linear) and "forward" not in vars(module):
            module.forward = packed_linear(module.weight, module.bias)
        elif type(module).__name__ in PLAIN_RMS_NORMS and module.weight.dtype == torch.float32:
            module.forward = fused_rms_norm(module.weight, module.variance_epsilon)
    if getattr(fast.config, "_attn_implementation", None) == "sdpa" and grouped_sdpa.supported():
        grouped_sdpa.register()
        fast.set_attn_implementation(grouped_sdpa.NAME)
    setattr(fast, _MARK, True)
    return fast


def is_fast(model: nn.Module) -> bool:
    return bool(getattr(model, _MARK, False))


def packed_linear(weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``x -> x @ weight.T + bias`` through oneDNN with ``weight`` reordered once into its blocked layout."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    bias = None if bias is None else bias.detach()
    out_features = weight.shape[0]
    linear = torch.ops.mkldnn._linear_pointwise

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if rows.dtype != packed.dtype or not rows.is_contiguous():
            rows = rows.to(packed.dtype).contiguous()
        return linear(rows, packed, bias, "none", [], "").reshape(*x.shape[:-1], out_features)

    return forward


def fuse_siblings(parent: nn.Module, names: tuple[str, ...]) -> bool:
    """Run ``parent``'s linear children ``names`` as one packed product over their stacked weights.

    The first of them called on an input computes every sibling's output and keeps the others' for that same input
    tensor object (checked by identity, so the modeling code must not modify it in place between the calls, which
    no projection does); a call on any other input computes the stacked product afresh, so every output is its own
    input's product whatever the order or pattern of calls. Returns whether the group was fused (all
    present, linear, one dtype, biases on all or none).
    """
    modules = [getattr(parent, name, None) for name in names]
    if not all(isinstance(m, nn.Linear) for m in modules):
        return False
    biased = {m.bias is not None for m in modules}
    if len(biased) > 1 or len({m.weight.dtype for m in modules}) > 1 or len({m.in_features for m in modules}) > 1:
        return False
    stacked = packed_linear(torch.cat([m.weight.detach() for m in modules]),
                            torch.cat([m.bias.detach() for m in modules]) if biased == {True} else None)
    sizes = [m.out_features for m in modules]
    kept: dict[int, torch.Tensor] = {}  # sibling index -> its output for ``kept_for[0]``
    kept_for: list[torch.Tensor | None] = [None]

    def sibling(index: int):
        def forward(x: torch.Tensor) -> torch.Tensor:
            if kept_for[0] is x and index in kept:
                output = kept.pop(index)
                if not kept:
                    kept_for[0] = None
                return output
            outputs = stacked(x).split(sizes, dim=-1)
            kept.clear()
            kept.update((i, out) for i, out in enumerate(outputs) if i != index)
            kept_for[0] = x
            return outputs[index]
        return forward

    for index, module in enumerate(modules):
        module.forward = sibling(index)
    return True


def fused_rms_norm(weight: torch.Tensor, eps: float):
    """``x -> weight * x * rsqrt(mean(x^2) + eps)`` in one ``F.rms_norm`` call (float32 models)."""
    shape = (weight.shape[0],)
    weight = weight.detach()

    def forward(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x, shape, weight, eps)

    return forward
