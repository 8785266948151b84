"""PyTorch's primitives (see `backends`).

Shape legend: B batch, T query length, S key length, N query heads,
K key/value heads, H head dim, V value head dim.
"""

import math

import keras
import torch
from keras import ops

from keras_attention._kernels.backends.common import keras_kernel
from keras_attention._kernels.backends.common import leading_sum  # noqa: F401

PROGRAMS_TAKE_VARIABLES = False  # the loop runs eagerly


def custom_gradient(forward, backward):
    """`fn(query, key, value, captures, tensors)` whose value is
    `forward(...)[0]` and whose gradients are `backward(tensors,
    residuals, grad)` (for the query, key, value and the list
    `captures`); the tensors (mask, segment ids) get none."""

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, query, key, value, tensors, *captures):
            output, residuals = forward(
                query, key, value, list(captures), tensors
            )
            ctx.save_for_backward(*residuals)
            ctx.tensors = tensors
            return output

        @staticmethod
        def backward(ctx, grad):
            *grads, grad_captures = backward(
                ctx.tensors, ctx.saved_tensors, grad
            )
            return (*grads, None, *grad_captures)

    def fn(query, key, value, captures, tensors):
        return Attention.apply(query, key, value, tensors, *captures)

    return fn


def vjp(fn, *primals):
    """`(fn(*primals), pullback)`: `pullback(cotangent)` gives the
    gradients of `fn`'s output for each primal (zeros where it does not
    depend on one)."""
    with torch.enable_grad():
        primals = [x.detach().requires_grad_(True) for x in primals]
        output = fn(*primals)

    def pullback(cotangent):
        if not output.requires_grad:
            return [torch.zeros_like(x) for x in primals]
        grads = torch.autograd.grad(
            output, primals, cotangent, allow_unused=True
        )
        return [
            torch.zeros_like(x) if g is None else g
            for x, g in zip(primals, grads, strict=True)
        ]

    return output, pullback


def fori_loop(start, end, body, carry):
    return ops.fori_loop(start, end, body, carry)


def scan_carries(f, init, xs):
    return ops.scan(lambda c, x: (f(c, x),) * 2, init, xs)[1]


def top_k(x, k):
    # `torch.topk` returns equal values in no set order; a stable sort
    # keeps them in index order, as the other backends' top-k does.
    values, indices = torch.sort(
        ops.convert_to_tensor(x), dim=-1, descending=True, stable=True
    )
    return values[..., :k], indices[..., :k]


def write_kv_cache(cache, key, value, index):
    """One update of the stacked cache (the halves are views of it): eager
    PyTorch copies a tensor per functional update."""
    update = ops.stack([key, value], axis=1)  # (B, 2, T, K, H)
    start = (0, 0, index, 0, 0)
    if ops.is_tensor(index):
        # A tensor start becomes the indices of an `index_put_`, which
        # ONNX (`ScatterND`) takes in int64 only, all of one dtype.
        zero = ops.zeros((), "int64")
        start = (zero, zero, ops.cast(index, "int64"), zero, zero)
    cache = ops.slice_update(cache, start, update)
    return cache, cache[:, 0], cache[:, 1]


def block_buffer(zeros):
    """`zeros` `(n, ...)`, written in place: the blockwise loops own their
    buffers and run outside autograd (`custom_gradient`), where a
    functional update would copy the whole buffer per block."""
    return zeros


def read_block(buffer, index):
    return buffer[index]


def write_block(buffer, index, block):
    buffer[index] = block
    return buffer


def stacked_blocks(buffer):
    return buffer


def has_fused_kernel() -> bool:
    return True


def sparse_blocks_beat_fused() -> bool:
    # Measured on CPU (see `dispatch.SPARSE_FRACTION`); GPU kernels skip
    # masked blocks themselves and are not measured against ours.
    return on_cpu()


def on_cpu() -> bool:
    """Whether Keras computes on the CPU (PyTorch's only; `flex` asks)."""
    return keras.src.backend.torch.core.get_device() == "cpu"


def fused_refusal(query, value):
    return None


def fused_kernel(query, key, value, mask, is_causal, scale, bias=None):
    """`torch.nn.functional.scaled_dot_product_attention` on transposed
    views of `(B, T, N, H)` heads, with grouped-query heads left to the
    kernel: `keras.ops.dot_product_attention` copies the keys and values
    into contiguous, repeated heads first, which for a decoding step means
    copying the whole KV cache. The mask stays boolean (the kernel gives a
    hidden key no weight at all, where an additive masking constant in
    half precision can be outweighed by logits past it); a row with no
    visible key is shown every key, so that it stays finite, and is zeroed
    by the caller."""
    dtypes = {
        keras.backend.standardize_dtype(x.dtype) for x in (query, key, value)
    }
    if len(dtypes) > 1:
        return keras_kernel(query, key, value, mask, is_causal, scale, bias)
    query, key, value = (
        ops.convert_to_tensor(x).transpose(1, 2) for x in (query, key, value)
    )  # (B, N, T, H), (B, K, S, H), (B, K, S, V)
    if mask is not None:
        mask = ops.convert_to_tensor(mask)
        mask = mask | ~mask.any(dim=-1, keepdim=True)
    if bias is not None:
        bias = ops.convert_to_tensor(bias).to(query.dtype)
        mask = bias if mask is None else bias.masked_fill(~mask, -math.inf)
    grouped = {"enable_gqa": True} if query.shape[1] != key.shape[1] else {}
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        is_causal=is_causal,
        scale=scale,
        **grouped,
    )  # (B, N, T, V)
    return output.transpose(1, 2)  # (B, T, N, V)


def device_name() -> str:
    return "torch"


def without_gradients():
    return torch.no_grad()


def compile_function(fn):
    """PyTorch has no compiler that traces Keras layers without graph
    breaks: `fn` runs eagerly."""
    return fn


def is_symbolic_dim(value) -> bool:
    return isinstance(value, (torch.SymInt, torch.Tensor))


def is_exporting() -> bool:
    """Whether PyTorch is tracing (`torch.jit.trace`, the TorchScript
    ONNX exporter) or exporting (`torch.export`) the running code."""
    # `torch.compiler.is_exporting` is new in PyTorch 2.7.
    exporting = getattr(torch.compiler, "is_exporting", lambda: False)
    return torch.jit.is_tracing() or exporting()


def host_array(value):
    # Traced, exported or compiled, a value read back would be baked into
    # the program (or break the graph); under `torch.vmap` (FlexAttention
    # calls the mods so) a tensor has no single value to read.
    if (
        value.device.type != "cpu"
        or is_exporting()
        or torch.compiler.is_compiling()
        or torch._C._functorch.is_functorch_wrapped_tensor(value)
    ):
        return None
    return value.detach().numpy()
