"""What one target forward costs as the number of tokens it verifies grows: the curve every draft budget pays.

Speculative decoding assumes verifying w tokens costs about as much as one. On GPUs that holds up to a width set by
the hardware; on CPUs it can break at small widths (measured figures: BENCHMARKS.md, "Verify cost"), so the best
chain length and tree budget depend on this curve. The bench measures
it on the real target, over a real cached context, so its report says where drafting more stops being free.
"""

from __future__ import annotations

import torch

from specviz.engine.cost_curve import forward_ms
from specviz.engine.target import Target

DEFAULT_WIDTHS = (1, 2, 3, 4, 5, 8, 16)


def widths_for(k: int, budget: int) -> list[int]:
    """The default widths plus the benchmark's own chain (k + 1) and tree (budget + 1) verify widths."""
    return sorted({*DEFAULT_WIDTHS, k + 1, budget + 1})


def weight_bytes(model) -> int:
    """Bytes of the weights one forward reads: every linear layer's weight and bias (tied tensors once)."""
    seen: dict[int, int] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            for tensor in (module.weight, module.bias):
                if tensor is not None:
                    seen[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    return sum(seen.values())


def flops_per_token(model, keys: int) -> float:
    """Floating-point operations of one token in a forward where it attends to ``keys`` positions (the cached context
    and itself): two per weight of every linear layer (a tied weight counts in each layer using it) plus attention's
    two products over the keys."""
    linear = sum(2 * m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    config = model.config
    heads = getattr(config, "num_attention_heads", 0) or 0
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else 0)
    attention = 4 * getattr(config, "num_hidden_layers", 0) * heads * head_dim * keys
    return float(linear + attention)


def compare_paths(targets: dict[str, Target], context: list[int], widths: list[int],
                  bandwidth_gbs: float | None, repeats: int = 5, peak_gflops: float | None = None) -> dict:
    """The verify-width curve of each forward path (e.g. ``fast`` and ``hf``) in one run, with the floors.

    The memory floor is the weights' bytes over the memory bandwidth measured on this machine: a forward of a few
    tokens cannot beat it on a CPU, where reading the weights is the work. The compute floor of width w is w tokens'
    operations over the matrix-product rate measured on this machine: past the width where it overtakes the memory
    floor, a wider verify costs more however well it is dispatched.
    """
    curves = {name: measure(target, context, widths, repeats) for name, target in targets.items()}
    model = next(iter(targets.values())).model
    size = weight_bytes(model)
    floor = size / (bandwidth_gbs * 1e9) * 1e3 if bandwidth_gbs else None
    per_token = flops_per_token(model, len(context) + 1)
    compute = ({str(w): w * per_token / (peak_gflops * 1e9) * 1e3 for w in sorted(set(widths))}
               if peak_gflops else None)
    return {"paths": curves, "weight_bytes": size, "bandwidth_gbs": bandwidth_gbs, "floor_ms": floor,
            "flops_per_token": per_token, "peak_gflops": peak_gflops, "compute_floor_ms": compute}


def measure(target: Target, context: list[int], widths: list[int], repeats: int = 5) -> list[dict]:
    """Median milliseconds of a causal target forward over ``w`` new tokens after ``context``, for each width.

    The cache is cropped back after every forward, so each one sees the same context length. Returns
    ``[{"width", "ms", "relative"}]`` where ``relative`` is the cost over the narrowest forward (width 1 by default).
    """
    timings = forward_ms(target, context, widths, repeats)
    base = timings[min(timings)]
    return [{"width": w, "ms": timings[w], "relative": timings[w] / base} for w in sorted(set(widths))]
