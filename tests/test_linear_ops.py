"""``specviz::thin_linear``: the thin kernel as a registered torch operator.

It must refuse what its raw pointers cannot check (dtype, shape, device: one line each), show in the profiler under
its name, and let ``torch.compile`` trace a model through it in one graph with the same result; and the package
reaches no private linear operator or ctypes call outside it.
"""

import shutil
from pathlib import Path

import pytest
import tiny
import torch

from specviz.engine import attention
from specviz.errors import SpecvizError
from specviz.models import fast_forward, linear_ops, thin_kernel

needs_kernel = pytest.mark.skipif(not linear_ops.available(),
                                  reason=f"thin kernel unavailable: {thin_kernel.unavailable_reason()}")
PACKAGE = Path(__file__).resolve().parents[1] / "specviz"


def _args(n: int = 37, k: int = 23, rows: int = 5, dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(n + k)
    weight = linear_ops.pack(torch.randn(n, k, generator=generator), dtype)
    return torch.randn(2, rows, k, generator=generator), weight, torch.randn(n, generator=generator)


def test_the_operator_is_registered_with_its_schema():
    schema = str(torch.ops.specviz.thin_linear.default._schema)
    assert schema == ("specviz::thin_linear(Tensor x, Tensor packed, Tensor? scale, Tensor? bias, "
                      "SymInt out_features) -> Tensor")


@pytest.mark.parametrize("mistake,message", [
    (lambda x, w, b: (x, w.values, w.scale, b.half(), w.out_features),
     "bias must be contiguous float32 of shape \\(37,\\), got torch.float16"),
    (lambda x, w, b: (x, w.values, w.scale, b[:36], w.out_features),
     "bias must be .* shape \\(37,\\), got .* \\(36,\\)"),
    (lambda x, w, b: (x[..., :20], w.values, w.scale, b, w.out_features),
     "packed holds 1104 values, not 37 outputs x 20 inputs"),
    (lambda x, w, b: (x, w.values, w.scale, b, 50), "packed holds 1104 values, not 50 outputs"),
    (lambda x, w, b: (x.double(), w.values, w.scale, b, w.out_features), "x must be float32"),
    (lambda x, w, b: (x, w.values.half(), w.scale, b, w.out_features),
     "packed must be a contiguous 1-D float32 or int8"),
    (lambda x, w, b: (x, w.values, torch.ones(37), b, w.out_features), ".* float32 weights take none"),
    (lambda x, w, b: (x.to("meta"), w.values, w.scale, b, w.out_features),
     "x is on meta; the thin kernel runs on the CPU"),
    (lambda x, w, b: (x, w.values, w.scale, b.to("meta"), w.out_features), "bias is on meta"),
])
def test_the_operator_refuses_wrong_arguments_in_one_line(mistake, message):
    """Checked before any pointer reaches C, in the operator itself (so the fake kernel, which ``torch.compile``
    runs, refuses them too; the meta device stands in for a GPU)."""
    with pytest.raises(SpecvizError, match=f"^specviz::thin_linear: {message}") as error:
        torch.ops.specviz.thin_linear(*mistake(*_args()))
    assert "\n" not in str(error.value)


def test_int8_weights_need_their_scales():
    x, weight, bias = _args(dtype=torch.int8)
    with pytest.raises(SpecvizError, match="int8 weights need their per-output scales"):
        torch.ops.specviz.thin_linear(x, weight.values, None, bias, weight.out_features)
    with pytest.raises(SpecvizError, match="scale must be contiguous float32"):
        torch.ops.specviz.thin_linear(x, weight.values, weight.scale.double(), bias, weight.out_features)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_torch_librarys_own_operator_checks_pass(dtype):
    """Schema, fake kernel and AOT dispatch agree with the real kernel (``torch.library.opcheck``)."""
    x, weight, bias = _args(dtype=dtype)
    torch.library.opcheck(torch.ops.specviz.thin_linear.default, (x, weight.values, weight.scale, bias,
                                                                  weight.out_features))


@needs_kernel
def test_no_rows_give_no_rows():
    x, weight, bias = _args(rows=0)
    assert linear_ops.linear(x, weight, bias).shape == (2, 0, 37)


@needs_kernel
def test_the_profiler_sees_the_operator_by_name():
    """A fast model's forward under ``torch.profiler``: its linear products are ``specviz::thin_linear`` events."""
    fast = fast_forward.fast_copy(tiny.model("llama", 64, layers=2))
    with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fast(input_ids=torch.tensor([[3, 17, 5, 9]]))
    names = [event.name for event in prof.events()]
    assert names.count(linear_ops.OP) == len(fast_forward.linear_kernels(fast))


@needs_kernel
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_traces_a_linear_through_the_operator_in_one_graph(backend):
    """``register_fake`` lets ``torch.compile`` keep the operator in its graph (``fullgraph``: no break) and the
    compiled module computes what the eager one does, for several row counts."""
    if backend == "inductor" and not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("inductor compiles C++ on the CPU: no C++ compiler here")
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 37)
    kernel = fast_forward.packed_linear(layer.weight, layer.bias).__self__
    compiled = torch.compile(kernel, fullgraph=True, backend=backend)
    with torch.no_grad():
        for rows in (1, 4, 16):
            x = torch.randn(rows, 48)
            torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-5)
            assert torch.equal(compiled(x), kernel(x))


def test_the_package_calls_no_private_linear_operator_and_no_ctypes_outside_the_operator():
    """oneDNN's packed linear and fbgemm's quantized ops are gone; the C library is reached from one module."""
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert "torch.ops.mkldnn" not in text and "torch.ops.quantized" not in text, path
        if "import ctypes" in text:
            assert path.name == "thin_kernel.py", path
        if ".products[" in text:
            assert path.name == "linear_ops.py", path


@needs_kernel
def test_a_whole_fast_model_compiles_in_one_graph():
    """The fast copy (stacked q/k/v and gate/up, fused norms, every product through the operator) traces without a
    graph break and gives transformers' logits."""
    net = tiny.model("qwen2", 64, layers=2, scale=25)
    fast = fast_forward.fast_copy(net)
    with attention.attention_implementation(fast, "sdpa"):  # as a run switching attention for one forward does:
        pass  # the model's attention now goes through the engine's per-call choice, which a graph must not read
    compiled = torch.compile(fast, fullgraph=True, backend="aot_eager")
    ids = torch.tensor([[3, 17, 5, 9, 3, 17]])
    with torch.inference_mode():
        torch.testing.assert_close(compiled(input_ids=ids).logits, net(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
