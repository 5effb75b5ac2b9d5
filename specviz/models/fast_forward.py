"""The fast CPU execution path for an unmodified Hugging Face target: ``nn.Linear`` through kernels for thin products.

Speculative decoding pays off when verifying k + 1 tokens costs about what one token costs. On CPUs the default
dispatch of ``F.linear`` (MKL) picks kernels whose cost grows steeply with the number of rows and leaves one-row
products on one thread. So each linear layer keeps its module and its weights, and only its ``forward`` is replaced
by a call to a kernel over a copy of its weights packed once at load: the thin kernel (``specviz.models.thin_kernel``:
compiled for this machine on first use, streams each weight matrix once whatever the number of rows, and computes
each row bit for bit as a one-row product would), or, where it cannot be built, oneDNN with the weights reordered
into its blocked layout; or ``F.linear`` on the original weights (below). BENCHMARKS.md has the curves. Sibling
projections that read the same input (attention's q/k/v, the MLP's gate/up) share one packed product over their
stacked weights: one larger, better-used kernel call in place of two or three (``fuse_siblings``). The modeling code
is transformers' own. In float32 the Llama-style RMSNorms (fp32 upcast, mean of squares, rsqrt, scale) run as one
``F.rms_norm`` call: the same result bit for bit (tested) with one operator call instead of six. A model on
transformers' SDPA attention runs ``specviz_grouped_sdpa`` instead (``specviz.models.grouped_sdpa``): the same kernel
without copying every layer's cache per forward to repeat grouped key/value heads.

Which kernel is fastest depends on the processor and on how many rows a product has: on some CPUs MKL's
``F.linear`` beats the packed kernel for one or two rows (a plain decoding step) and loses badly from about four
rows on (a verify forward); on others it runs one-row products on one thread and loses everywhere. So ``fast_copy``
measures, once per model, a pass over all its linear layers at a few row counts with both kernels (weights
streamed from memory, as in a forward) and sets ``plain_rows``: the row counts up to which ``F.linear`` on the
original weights was faster. Where the thin kernel builds it is first timed the same way against oneDNN's packed
product at a verify's widths and kept unless oneDNN wins (``choose_wide``). ``kernel_choice`` on the copy records
both choices (``plain_rows``, ``wide``). The timing reads every weight a few dozen times (``CHOICE_ROWS`` x
``CHOICE_REPEATS`` per kernel), so its cost at load grows with the model's size.

``fast_copy`` leaves the loaded model as it is (transformers' reference rows, training and drafters that borrow
the target's embedding use it) and returns a structural copy that shares every parameter tensor; only the packed
weights are new memory. The numbers are the same maths in another summation order, so logits agree with
transformers' forward to float tolerance, not bit for bit; the tests compare greedy output with transformers' own
``generate``.
"""

from __future__ import annotations

import copy
import threading

import torch
from torch import nn

from specviz.errors import SpecvizError
from specviz.models import grouped_sdpa, thin_kernel

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


def fast_copy(model: nn.Module, *, choose_kernels: bool = True, thin: bool | None = None) -> nn.Module:
    """A copy of ``model`` sharing all its tensors whose linear layers run through pre-packed kernels, or, for the
    narrow products where it measured faster on this machine (``choose_kernels``), through ``F.linear``.

    ``thin``: pack for the thin kernel (True: it must build here; None: where it builds, for a float32 model; False:
    oneDNN's packed kernel)."""
    parameter = next(model.parameters())
    if not available(str(parameter.device), parameter.dtype):
        raise SpecvizError(f"the fast target forward needs a CPU model in float32 (bfloat16 where oneDNN has a "
                           f"bfloat16 path for the CPU) and a torch built with oneDNN; this one is {parameter.dtype} "
                           f"on {parameter.device}: use --target-forward hf")
    kernel = _thin_kernel(thin, parameter.dtype)
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    fast = copy.deepcopy(model, shared)  # new modules, the same parameter and buffer tensors
    for module in list(fast.modules()):
        for names in SIBLING_PROJECTIONS:
            fuse_siblings(module, names, thin=kernel)
    for module in fast.modules():
        if isinstance(module, nn.Linear) and "forward" not in vars(module):
            module.forward = PackedLinear(module.weight, module.bias, thin=kernel)
        elif type(module).__name__ in PLAIN_RMS_NORMS and module.weight.dtype == torch.float32:
            module.forward = fused_rms_norm(module.weight, module.variance_epsilon)
    if getattr(fast.config, "_attn_implementation", None) == "sdpa" and grouped_sdpa.supported():
        grouped_sdpa.register()
        fast.set_attn_implementation(grouped_sdpa.NAME)
    setattr(fast, _MARK, True)
    fast.kernel_choice = {}
    if choose_kernels:
        kernels = linear_kernels(fast)
        wide = choose_wide(kernels) if kernel is not None and thin is None else {"wide": "thin" if kernel else "onednn"}
        fast.kernel_choice = {**choose_plain_rows(kernels), **wide}
        if kernel is None and thin is None and parameter.dtype == torch.float32:
            fast.kernel_choice["thin_unavailable"] = thin_kernel.unavailable_reason()
    return fast


def _thin_kernel(thin: bool | None, dtype: torch.dtype) -> thin_kernel.ThinKernel | None:
    if thin is False or (thin is None and dtype != torch.float32):
        return None
    kernel = thin_kernel.load()
    if thin and (kernel is None or dtype != torch.float32):
        raise SpecvizError(f"the thin kernel cannot run here: {thin_kernel.unavailable_reason() or 'not float32'}")
    return kernel


def is_fast(model: nn.Module) -> bool:
    return bool(getattr(model, _MARK, False))


class PackedLinear:
    """``x -> x @ weight.T + bias`` through a kernel over ``weight`` packed once (the ``thin`` kernel's panels, or
    oneDNN's blocked layout), or through ``F.linear`` on the original weight for products of at most ``plain_rows``
    rows (0: never)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 parts: list[tuple[torch.Tensor, torch.Tensor | None]] | None = None,
                 thin: thin_kernel.ThinKernel | None = None):
        self.thin = thin
        self.packed = (thin.pack(weight) if thin is not None
                       else torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))
        self.bias = None if bias is None else bias.detach()
        self.out_features = weight.shape[0]
        self.plain_rows = 0
        #: the (weight, bias) pairs ``F.linear`` runs below ``plain_rows``: this layer's own (the default), a fused
        #: group's members', or none (always packed)
        self.parts = [(weight.detach(), self.bias)] if parts is None else parts

    def __deepcopy__(self, memo: dict) -> PackedLinear:
        return self  # a copied module shares its kernel, as it would a closure (oneDNN's packed tensor has no storage)

    def narrow(self, x: torch.Tensor) -> bool:
        """Whether ``x`` has few enough rows for ``F.linear``."""
        return bool(self.plain_rows) and x.numel() // x.shape[-1] <= self.plain_rows

    def run_plain(self, x: torch.Tensor, part: int = 0) -> torch.Tensor:
        weight, bias = self.parts[part]
        return nn.functional.linear(x.to(weight.dtype), weight, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_plain(x) if self.narrow(x) else self.run_packed(x)

    def run_packed(self, x: torch.Tensor) -> torch.Tensor:
        if self.thin is not None:
            return self.thin.linear(x, self.packed, self.bias)
        rows = x.reshape(-1, x.shape[-1])
        if rows.dtype != self.packed.dtype or not rows.is_contiguous():
            rows = rows.to(self.packed.dtype).contiguous()
        return torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "").reshape(
            *x.shape[:-1], self.out_features)


def packed_linear(weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``x -> x @ weight.T + bias`` through a kernel over ``weight`` packed once, always packed: drafters' heads. The
    thin kernel for a float32 CPU weight where it builds (it drafted faster than oneDNN, docs/bench-log/notes.md),
    else oneDNN; ``F.linear`` for one row saved too little to keep a second, unpacked copy of gathered rows
    (docs/bench-log/notes.md)."""
    thin = thin_kernel.load() if weight.dtype == torch.float32 and weight.device.type == "cpu" else None
    return PackedLinear(weight, bias, parts=[], thin=thin).run_packed


def linear_kernels(module: nn.Module) -> list[PackedLinear]:
    """The distinct kernels ``module``'s linear layers run through (a fused group's once)."""
    found: dict[int, PackedLinear] = {}
    for child in module.modules():
        kernel = getattr(child.forward, "kernel", child.forward) if isinstance(child, nn.Linear) else None
        if isinstance(kernel, PackedLinear):
            found.setdefault(id(kernel), kernel)
    return list(found.values())


def fuse_siblings(parent: nn.Module, names: tuple[str, ...], *, thin: thin_kernel.ThinKernel | None = None) -> bool:
    """Run ``parent``'s linear children ``names`` as one packed product over their stacked weights.

    The first of them called on an input computes every sibling's output and keeps the others' for that same input
    tensor object (checked by identity, so the modeling code must not modify it in place between the calls, which
    no projection does); a call on any other input computes the stacked product afresh, so every output is its own
    input's product whatever the order or pattern of calls. What is kept is kept per thread: the app's sessions
    run one shared target from several threads. Returns whether the group was fused (all
    present, linear, one dtype, biases on all or none).
    """
    modules = [getattr(parent, name, None) for name in names]
    if not all(isinstance(m, nn.Linear) for m in modules):
        return False
    biased = {m.bias is not None for m in modules}
    if len(biased) > 1 or len({m.weight.dtype for m in modules}) > 1 or len({m.in_features for m in modules}) > 1:
        return False
    # narrow products run each sibling's own F.linear on its own weight: no stacked unpacked copy
    stacked = PackedLinear(torch.cat([m.weight.detach() for m in modules]),
                           torch.cat([m.bias.detach() for m in modules]) if biased == {True} else None,
                           parts=[(m.weight.detach(), None if m.bias is None else m.bias.detach()) for m in modules],
                           thin=thin)
    sizes = [m.out_features for m in modules]
    per_thread = threading.local()  # .input, .kept (sibling index -> its output for .input): one run per thread

    def sibling(index: int):
        def forward(x: torch.Tensor) -> torch.Tensor:
            if stacked.narrow(x):
                return stacked.run_plain(x, index)
            kept = getattr(per_thread, "kept", None)
            if kept and per_thread.input is x and index in kept:
                output = kept.pop(index)
                if not kept:
                    per_thread.input = None
                return output
            outputs = stacked.run_packed(x).split(sizes, dim=-1)
            per_thread.kept = {i: out for i, out in enumerate(outputs) if i != index}
            per_thread.input = x
            return outputs[index]
        return forward

    for index, module in enumerate(modules):
        module.forward = sibling(index)
        module.forward.kernel = stacked  # the group's kernel choice lives on the stacked product
    return True


def fused_rms_norm(weight: torch.Tensor, eps: float):
    """``x -> weight * x * rsqrt(mean(x^2) + eps)`` in one ``F.rms_norm`` call (float32 models)."""
    shape = (weight.shape[0],)
    weight = weight.detach()

    def forward(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x, shape, weight, eps)

    return forward


#: Row counts the kernel choice times; wider products always run packed.
CHOICE_ROWS = (1, 2, 3, 4, 6, 8)
#: Row counts (a verify's widths) at which the thin kernel is timed against oneDNN's packed product.
WIDE_ROWS = (4, 8)
#: ``F.linear`` must beat the packed kernel by this factor to be chosen (timing noise must not flip a choice).
CHOICE_MARGIN = 0.95
CHOICE_REPEATS = 5


def choose_plain_rows(kernels: list[PackedLinear]) -> dict:
    """Time ``kernels`` (a model's, in module order: ``linear_kernels``) both ways and give them one ``plain_rows``.

    One pass runs every kernel in order (a fused group as it runs: one stacked packed product against its
    siblings' separate ``F.linear`` calls), so, as in a forward, each weight comes from memory, not cache. The
    choice is one row count for the whole model, not one per layer: switching libraries between the layers of one
    forward measured slower than either library alone. Returns ``{"plain_rows", "ms": {rows: [packed, plain]}}``.
    """
    members = [kernel for kernel in kernels if kernel.parts]
    chosen, timings = 0, {}
    generator = torch.Generator().manual_seed(0)  # loading a model leaves the global random state alone
    with torch.inference_mode():
        for rows in CHOICE_ROWS if members else ():
            inputs = _random_inputs(members, rows, generator)
            packed = _median_ms(_packed_pass, members, inputs)
            plain = _median_ms(_plain_pass, members, inputs)
            timings[rows] = [round(packed, 3), round(plain, 3)]
            if plain >= CHOICE_MARGIN * packed:
                break
            chosen = rows
    for kernel in members:
        kernel.plain_rows = chosen
    return {"plain_rows": chosen, "ms": timings}


def choose_wide(kernels: list[PackedLinear]) -> dict:
    """Keep the thin kernel for ``kernels`` (a model's, in module order) unless oneDNN's packed product beat it by the
    margin at every row count of ``WIDE_ROWS``, timed as ``choose_plain_rows`` times (a pass over all the layers);
    then repack them for oneDNN. The thin kernel is written for this kind of product, but a library tuned for a
    processor may still win on one this was never measured on. Returns ``{"wide", "wide_ms": {rows: [thin,
    onednn]}}``; the oneDNN copies are freed when the thin kernel stays.
    """
    members = [kernel for kernel in kernels if kernel.thin is not None and kernel.parts]
    if not members:
        return {"wide": "onednn"}
    library = [PackedLinear(torch.cat([w for w, _ in kernel.parts]), kernel.bias, parts=kernel.parts)
               for kernel in members]
    timings = {}
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in WIDE_ROWS:
            inputs = _random_inputs(members, rows, generator)
            timings[rows] = [round(_median_ms(_packed_pass, kernels_, inputs), 3) for kernels_ in (members, library)]
    if not all(onednn < CHOICE_MARGIN * thin for thin, onednn in timings.values()):
        return {"wide": "thin", "wide_ms": timings}
    for kernel, packed in zip(members, library):
        kernel.thin, kernel.packed = None, packed.packed
    return {"wide": "onednn", "wide_ms": timings}


def _random_inputs(members: list[PackedLinear], rows: int, generator: torch.Generator) -> dict[tuple, torch.Tensor]:
    """One ``rows``-row input per (width, dtype) the kernels read, as the timed passes index them."""
    return {(w.shape[1], w.dtype): torch.randn(rows, w.shape[1], dtype=w.dtype, generator=generator)
            for kernel in members for w, _ in kernel.parts}


def _packed_pass(members: list[PackedLinear], inputs: dict[tuple, torch.Tensor]) -> None:
    for kernel in members:
        weight = kernel.parts[0][0]
        kernel.run_packed(inputs[weight.shape[1], weight.dtype])


def _plain_pass(members: list[PackedLinear], inputs: dict[tuple, torch.Tensor]) -> None:
    for kernel in members:
        for weight, bias in kernel.parts:
            nn.functional.linear(inputs[weight.shape[1], weight.dtype], weight, bias)


def _median_ms(run, members: list[PackedLinear], inputs: dict[tuple, torch.Tensor]) -> float:
    """Median wall time of ``run(members, inputs)`` after one untimed call (milliseconds)."""
    import statistics
    import time

    run(members, inputs)
    times = []
    for _ in range(CHOICE_REPEATS):
        start = time.perf_counter()
        run(members, inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3
