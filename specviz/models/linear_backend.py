"""Which kernel runs a linear product, declared per device and row count, and the module that runs it.

Two backends: ``torch`` (``F.linear``: whatever torch dispatches to on the device) and ``thin`` (specviz's thin
kernel through the operator ``specviz::thin_linear``, ``specviz.models.linear_ops``). Which one runs a product is
declared here (``DECLARED``: per device type and dtype, and by the product's row count through ``plain_rows``), not
timed at load: a timed choice can differ from one load to the next, and with it which kernel a one-row step and a
k-row verify use and how they round. ``choose`` gives a model its choice; ``KernelChoice.to_dict`` is what the trace
header records (``linear_kernels``).

A CPU in float32 runs the thin kernel for every row count where it builds: its cost stays near one read of the
weights from a one-row step to a verify's width, where the library kernels' cost climbs with the rows
(BENCHMARKS.md, "Verify cost"), and it is what the load-time timing this table replaces picked in nearly every bench
run (docs/bench-log). Everything else (another dtype, a GPU, a CPU where the kernel cannot be built) runs torch's own
kernel for every product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specviz.errors import SpecvizError
from specviz.models import linear_ops, thin_kernel

BACKENDS = ("thin", "torch")


@dataclass(frozen=True)
class KernelChoice:
    """Products of up to ``plain_rows`` rows run through torch's ``F.linear``, wider ones through ``wide``
    (``thin`` or ``torch``). ``thin_unavailable``: why the declared thin kernel gave way to torch's here."""

    wide: str
    plain_rows: int = 0
    thin_unavailable: str | None = None

    def __post_init__(self):
        if self.wide not in BACKENDS or self.plain_rows < 0:
            raise ValueError(f"a kernel choice runs {' or '.join(BACKENDS)} above plain_rows >= 0, not {self}")

    def backend(self, rows: int) -> str:
        """The backend for a product of ``rows`` rows."""
        return "torch" if rows <= self.plain_rows else self.wide

    def to_dict(self) -> dict:
        """For the trace header and the bench report: ``wide``, ``plain_rows`` (and ``thin_unavailable``)."""
        found = {"wide": self.wide, "plain_rows": self.plain_rows}
        return found | ({"thin_unavailable": self.thin_unavailable} if self.thin_unavailable else {})


TORCH = KernelChoice("torch")
#: (device type, dtype) -> the choice; anything not listed runs ``TORCH``.
DECLARED: dict[tuple[str, torch.dtype], KernelChoice] = {("cpu", torch.float32): KernelChoice("thin", plain_rows=0)}


def choose(device: torch.device | str, dtype: torch.dtype, *, thin: bool | None = None) -> KernelChoice:
    """The declared choice for weights on ``device`` in ``dtype``; where it names the thin kernel and that did not
    build, torch's with the reason. ``thin``: True insists on the thin kernel (a one-line error where it cannot
    run), False is torch's for every product, None the declaration."""
    kind = torch.device(device).type
    if thin is False:
        return TORCH
    declared = DECLARED.get((kind, dtype), TORCH)
    if thin:
        if (kind, dtype) != ("cpu", torch.float32) or not linear_ops.available():
            why = thin_kernel.unavailable_reason() or f"it runs float32 CPU weights, not {dtype} on {kind}"
            raise SpecvizError(f"the thin kernel cannot run here: {why}")
        return declared if declared.wide == "thin" else KernelChoice("thin")
    if declared.wide == "thin" and not linear_ops.available():
        return KernelChoice("torch", thin_unavailable=thin_kernel.unavailable_reason())
    return declared


class LinearKernel(nn.Module):
    """``x @ weight.T + bias`` through the backend ``choice`` gives ``x``'s row count, over the weight laid out once
    for it: packed for the thin kernel, as it is (a shared tensor, or a fused group's stacked copy) for torch's.
    Holds no parameters: the model's own stay where they are, and this module shares or copies them once."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, choice: KernelChoice):
        super().__init__()
        self.choice = choice
        self.out_features, self.in_features = weight.shape
        weight = weight.detach()
        self.bias = None if bias is None else bias.detach().contiguous()
        self.packed = linear_ops.pack(weight) if choice.wide == "thin" else None
        #: torch's operand, kept only where torch runs some products
        self.weight = weight if self.packed is None or choice.plain_rows else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or x.numel() <= self.choice.plain_rows * x.shape[-1]:
            return nn.functional.linear(x, self.weight, self.bias)
        return linear_ops.linear(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, wide={self.choice.wide}, "
                f"plain_rows={self.choice.plain_rows}")
