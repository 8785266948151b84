"""The fused path at the shapes a GPU's attention kernels take.

The path harness (`test_paths.py`, `tests/unit/core/test_structure.py`)
checks every path at head dims of 4, where a GPU backend leaves its
kernels for a plain computation: cuDNN's flash attention (JAX) and
PyTorch's flash and memory-efficient kernels need head dims that are a
multiple of 8, and cuDNN half precision. Here the forced fused path is
compared with the float64 NumPy reference (outputs and the gradients of
q, k and v, within the suite's tolerances per dtype) at head dims 64 and
128 with each structure the fused path lowers to a mask: padding with a
query that sees no key, causal, grouped-query heads, a window with
segment ids, and the one-query step of a KV cache. On a GPU a second test
names the kernel that ran (the cuDNN custom call in JAX's compiled
program, a fused operator in PyTorch's profile), so that the fused path
cannot quietly fall back to a plain computation. `make gpu-check` runs
both there.

Shape legend: B batch, T query length, S key length, N query heads,
K key/value heads, H head dim.
"""

import numpy as np
import pytest
from keras import ops

from keras_attention import functional as F
from tests.autodiff import path_context
from tests.helpers import BACKEND
from tests.helpers import rng
from tests.unit.kernels.test_paths import check_sdpa

DTYPES = ("float32", "float16", "bfloat16")
PACKED = np.repeat([[1, 2, 3, 0], [1, 1, 2, 2]], 32, axis=1)  # (B, 128)

# name: (query shape, key shape, mask kind, structure arguments)
CASES = {
    "causal H=64": ((2, 128, 4, 64), (2, 128, 4, 64), "none", {"c": True}),
    "padding, a query seeing no key, H=64": (
        (2, 128, 4, 64),
        (2, 128, 4, 64),
        "padding",
        {},
    ),
    "gqa causal+padding H=64": (
        (2, 128, 4, 64),
        (2, 128, 2, 64),
        "padding",
        {"c": True},
    ),
    "cross T<S padding H=128": (
        (2, 64, 2, 128),
        (2, 192, 2, 128),
        "padding",
        {},
    ),
    "window+segments gqa H=64": (
        (2, 128, 4, 64),
        (2, 128, 2, 64),
        "none",
        {"sliding_window": 32, "segment_ids": PACKED},
    ),
    "cached step gqa H=128": (
        (2, 1, 4, 128),
        (2, 128, 2, 128),
        "cache",
        {"c": "bottom_right"},
    ),
}


def case_inputs(name):
    """`q, k, v, mask, is_causal, structure` of a case; v has k's shape
    (JAX's kernel needs equal query and value head dims)."""
    q_shape, k_shape, mask_kind, structure = CASES[name]
    structure = dict(structure)
    causal = structure.pop("c", False)
    generator = rng(7)
    q, k, v = (
        generator.standard_normal(shape).astype("float32")
        for shape in (q_shape, k_shape, k_shape)
    )
    batch, t, s = q_shape[0], q_shape[1], k_shape[1]
    mask = None
    if mask_kind == "padding":
        mask = np.arange(s)[None, None, :] < np.array([[[s - 24]], [[s]]])
        mask = np.broadcast_to(mask, (batch, t, s)).copy()
        mask[1, 5] = False  # a query that sees no key
    elif mask_kind == "cache":  # the cache holds 40 and 128 positions
        mask = np.arange(s)[None, None, :] < np.array([[[40]], [[s]]])
    return q, k, v, mask, causal, structure


@pytest.mark.parametrize("name", tuple(CASES))
def test_fused_path_at_kernel_shapes_equals_float64_reference(name):
    """Outputs and q, k, v gradients of the fused path in every dtype."""
    q, k, v, mask, causal, structure = case_inputs(name)
    cases = [("fused at kernel shapes", "fused", d) for d in DTYPES]
    check_sdpa(cases, q, k, v, mask, causal, **structure)


def _on_gpu():
    if BACKEND == "jax":
        import jax

        return jax.default_backend() == "gpu"
    if BACKEND == "torch":
        import torch

        return torch.cuda.is_available()
    return False  # TensorFlow has no fused kernel of its own to name


def _jax_kernels(fn, inputs, backward):
    """The cuDNN attention calls in the compiled program of `fn` (and of
    its gradients with `backward`)."""
    import re

    import jax

    def loss(*inputs):
        return ops.sum(ops.cast(fn(*inputs), "float32"))

    program = jax.grad(loss, (0, 1, 2)) if backward else fn
    compiled = jax.jit(program).lower(*inputs).compile()
    return set(re.findall(r"__cudnn\$fmha\w*", compiled.as_text()))


def _torch_kernels(fn, inputs, backward):
    """The attention operators PyTorch ran for `fn` (and its backward)."""
    import torch

    inputs = [x.detach().requires_grad_(backward) for x in inputs]
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as profile:
        output = fn(*inputs)
        if backward:
            output.float().sum().backward()
    names = {event.key for event in profile.key_averages()}
    return {name for name in names if "scaled_dot_product" in name}


@pytest.mark.skipif(not _on_gpu(), reason="names a GPU's kernel; no GPU")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", tuple(CASES))
def test_a_gpu_runs_its_fused_kernel(name, dtype):
    """On a GPU the fused path reaches the GPU's attention kernel, forward
    and backward (a cached step: forward), not a plain computation of the
    whole `(T, S)` matrix."""
    q, k, v, mask, causal, structure = case_inputs(name)
    inputs = [ops.cast(x, dtype) for x in (q, k, v)]
    backward = not name.startswith("cached step")

    def fn(q, k, v):
        with path_context("fused"):
            return F.scaled_dot_product_attention(
                q, k, v, mask=mask, is_causal=causal, **structure
            )

    if BACKEND == "jax":
        kernels = _jax_kernels(fn, inputs, backward)
        assert any("Backward" not in kernel for kernel in kernels), kernels
        if backward:
            assert any("Backward" in kernel for kernel in kernels), kernels
    else:
        kernels = _torch_kernels(fn, inputs, backward)
        fused = ("flash", "efficient", "cudnn")
        assert any(w in op for op in kernels for w in fused), kernels
        assert not any("math" in op for op in kernels), kernels
