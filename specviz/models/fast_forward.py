"""The fast CPU execution path for an unmodified Hugging Face target: its linear layers through a declared kernel.

Speculative decoding pays off when verifying k + 1 tokens costs about what one token costs. On CPUs the default
dispatch of ``F.linear`` picks kernels whose cost grows with the number of rows, so ``fast_copy`` runs each linear
layer through the kernel declared for the device and the product's row count (``specviz.models.linear_backend``):
specviz's thin kernel, a registered torch operator (``specviz.models.linear_ops``) that streams each weight once
whatever the number of rows and computes each row bit for bit as a one-row product would, or torch's own
``F.linear``. BENCHMARKS.md has the curves. The choice is declared, not timed, so it is the same at every load;
``kernel_choice`` on the copy records it for the trace header.

Sibling projections that read the same input (attention's q/k/v, the MLP's gate/up) are stacked once at load into
one kernel module on their parent (``qkv_proj``, ``gate_up_proj``): the parent's forward is handed that one product
in place of its input and each projection takes its columns of it, one better-used kernel call in place of two or
three and no state between the calls. That relies on the parent reading its input only through those projections,
which holds for the transformers architectures declared in ``ARCHITECTURES`` (tested); their float32 RMSNorms
(fp32 upcast, mean of squares, rsqrt, scale) also run as one ``F.rms_norm`` call, the same result bit for bit
(tested). A model of another architecture keeps its own norms and runs each projection through the kernel alone.
A float32 model on transformers' SDPA attention runs ``specviz_verify_attention`` instead
(``specviz.models.verify_attention``: the thin library attends a step's or a verify's few new tokens over the cache,
each row over its own visible positions) where the library built, else ``specviz_grouped_sdpa``
(``specviz.models.grouped_sdpa``): torch's kernel without copying every layer's cache per forward to repeat grouped
key/value heads.

``fast_copy`` leaves the loaded model as it is (transformers' reference rows, training and drafters that borrow the
target's embedding use it) and returns a structural copy that shares every parameter tensor; only the packed or
stacked weights are new memory. The numbers are the same maths in another summation order, so logits agree with
transformers' forward to float tolerance, not bit for bit; the tests compare greedy output with transformers' own
``generate``.
"""

from __future__ import annotations

import copy
import inspect
import sys
from types import MethodType

import torch
from torch import nn

from specviz.errors import SpecvizError
from specviz.models import grouped_sdpa, verify_attention
from specviz.models.linear_backend import KernelChoice, LinearKernel, choose

_MARK = "_specviz_fast_forward"
#: Linear children of one module that read the module's input and nothing else does: (stacked name, members).
SIBLING_PROJECTIONS = (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj")))
#: transformers model types whose attention and MLP read their input only through ``SIBLING_PROJECTIONS`` and whose
#: RMSNorm (named here) computes ``weight * x * rsqrt(mean(x^2) + eps)`` exactly as ``F.rms_norm`` does in float32.
ARCHITECTURES = {"llama": "LlamaRMSNorm", "mistral": "MistralRMSNorm", "qwen2": "Qwen2RMSNorm",
                 "qwen3": "Qwen3RMSNorm"}
#: The fast path's dtypes on the CPU (float16 products are slow there: transformers' forward keeps those).
DTYPES = (torch.float32, torch.bfloat16)


def available(device: str, dtype: torch.dtype) -> bool:
    """True where the fast path runs: a CPU model in float32 (the thin kernel, where it builds) or bfloat16."""
    return torch.device(device).type == "cpu" and dtype in DTYPES


def fast_copy(model: nn.Module, *, thin: bool | None = None) -> nn.Module:
    """A copy of ``model`` sharing all its tensors whose linear layers run through the declared kernel
    (``linear_backend.choose``; ``thin``: True insists on the thin kernel, False runs torch's for every product)."""
    parameter = next(model.parameters())
    if not available(str(parameter.device), parameter.dtype):
        raise SpecvizError(f"the fast target forward needs a CPU model in float32 or bfloat16; this one is "
                           f"{parameter.dtype} on {parameter.device}: use --target-forward hf")
    choice = choose(parameter.device, parameter.dtype, thin=thin)
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    fast = copy.deepcopy(model, shared)  # new modules, the same parameter and buffer tensors
    declared = architecture(fast)
    norm = getattr(sys.modules[type(fast).__module__], ARCHITECTURES[declared]) if declared else None
    for module in list(fast.modules()):
        if declared:
            for name, members in SIBLING_PROJECTIONS:
                if fuse_siblings(module, name, members, choice):
                    break
        if isinstance(module, nn.Linear) and "forward" not in vars(module):
            module.kernel = LinearKernel(module.weight, module.bias, choice)
            module.forward = MethodType(_through_kernel, module)
        elif norm is not None and isinstance(module, norm) and module.weight.dtype == torch.float32:
            module.forward = MethodType(_rms_norm, module)
    if getattr(fast.config, "_attn_implementation", None) == "sdpa":
        if verify_attention.usable(parameter.dtype, parameter.device, head_dim(fast.config)) is None:
            verify_attention.register()
            fast.set_attn_implementation(verify_attention.NAME)
        elif grouped_sdpa.supported():
            grouped_sdpa.register()
            fast.set_attn_implementation(grouped_sdpa.NAME)
    setattr(fast, _MARK, True)
    fast.kernel_choice = choice.to_dict()
    return fast


def head_dim(config) -> int:
    """The attention head size of a transformers config (``head_dim`` where set, else hidden size / heads)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def is_fast(model: nn.Module) -> bool:
    return bool(getattr(model, _MARK, False))


def architecture(model: nn.Module) -> str | None:
    """``model``'s type when it is one of ``ARCHITECTURES`` in transformers' own modeling module (not remote code
    under the same name), else None: then nothing is fused."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in ARCHITECTURES and type(model).__module__ == f"transformers.models.{model_type}.modeling_" \
                                                                 f"{model_type}":
        return model_type
    return None


def packed_linear(weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``x -> x @ weight.T + bias`` through the kernel declared for ``weight``'s device and dtype, laid out once:
    drafters' own layers and heads (the thin kernel for a float32 CPU weight where it builds, else ``F.linear``)."""
    return LinearKernel(weight, bias, choose(weight.device, weight.dtype)).forward


def linear_kernels(module: nn.Module) -> list[LinearKernel]:
    """The kernel modules ``module``'s linear products run through (a fused group's once)."""
    return [child for child in module.modules() if isinstance(child, LinearKernel)]


def fuse_siblings(parent: nn.Module, name: str, members: tuple[str, ...], choice: KernelChoice) -> bool:
    """Stack ``parent``'s linear children ``members`` into one kernel, ``parent.<name>``, fed ``parent``'s input:
    ``parent``'s forward runs on the stacked product and each member returns its own columns of it. Only for a
    parent that reads its input through these members alone (``ARCHITECTURES``). Returns whether the group was
    fused (all present, linear, one input width and dtype, biases on all or none, ``name`` free)."""
    modules = [getattr(parent, member, None) for member in members]
    if not all(isinstance(m, nn.Linear) and "forward" not in vars(m) for m in modules) or hasattr(parent, name):
        return False
    biased = {m.bias is not None for m in modules}
    if len(biased) > 1 or len({m.weight.dtype for m in modules}) > 1 or len({m.in_features for m in modules}) > 1:
        return False
    with torch.no_grad():
        weight = torch.cat([m.weight.detach() for m in modules])
        bias = torch.cat([m.bias.detach() for m in modules]) if biased == {True} else None
    setattr(parent, name, LinearKernel(weight, bias, choice))
    start = 0
    for module in modules:
        module.stacked_columns = (start, start + module.out_features, weight.shape[0])
        module.forward = MethodType(_stacked_columns, module)
        start += module.out_features
    parameters = iter(inspect.signature(type(parent).forward).parameters)
    next(parameters)  # self
    parent.stacked_input = (name, next(parameters))
    parent.forward = MethodType(_fed_stacked, parent)
    return True


def _through_kernel(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return self.kernel.forward(x)


def _fed_stacked(self: nn.Module, *args, **kwargs):
    """``self``'s own forward with its input replaced by its stacked projections' product (``fuse_siblings``)."""
    name, argument = self.stacked_input
    stacked = getattr(self, name).forward
    if args:
        args = (stacked(args[0]), *args[1:])
    else:
        kwargs[argument] = stacked(kwargs[argument])
    return type(self).forward(self, *args, **kwargs)


def _stacked_columns(self: nn.Linear, stacked: torch.Tensor) -> torch.Tensor:
    start, stop, width = self.stacked_columns
    if stacked.shape[-1] != width:
        raise SpecvizError(f"this projection is fused with its siblings and reads their stacked product ({width} "
                           f"columns), not a {stacked.shape[-1]}-wide input: call its parent module")
    return stacked[..., start:stop]


def _rms_norm(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``weight * x * rsqrt(mean(x^2) + eps)`` in one ``F.rms_norm`` call (float32 models)."""
    return nn.functional.rms_norm(x, (self.weight.shape[0],), self.weight, self.variance_epsilon)
