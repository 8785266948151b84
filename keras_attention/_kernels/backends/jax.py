"""JAX's primitives (see `backends`)."""

import contextlib

import jax
import keras
import numpy as np

from keras_attention._kernels.backends import common

PROGRAMS_TAKE_VARIABLES = True  # a jitted program gets the variables' values
fused_kernel = common.keras_kernel  # cuDNN's flash attention on a GPU
write_kv_cache = common.slice_write_kv_cache
block_buffer = common.block_buffer
read_block = common.read_block
write_block = common.write_block
stacked_blocks = common.stacked_blocks
top_k = common.top_k


def leading_sum(x):
    """`x` `(n, ...)` summed over its leading axis, one slice at a time:
    XLA:CPU reduces a few rows of many columns 30-80x slower than it
    adds them (a `(4, 524288)` sum: 17 ms against 0.5 ms)."""

    def add(i, total):
        return total + keras.ops.take(x, i, axis=0)

    return fori_loop(0, x.shape[0], add, keras.ops.zeros_like(x[0]))


def custom_gradient(forward, backward):
    """`fn(query, key, value, captures, tensors)` whose value is
    `forward(...)[0]` and whose gradients are `backward(tensors,
    residuals, grad)` (for the query, key, value and the list
    `captures`); the tensors (mask, segment ids) get none."""

    @jax.custom_vjp
    def fn(query, key, value, captures, tensors):
        return forward(query, key, value, captures, tensors)[0]

    def fn_forward(query, key, value, captures, tensors):
        output, residuals = forward(query, key, value, captures, tensors)
        return output, (residuals, tensors)

    def fn_backward(saved, grad):
        residuals, tensors = saved
        return (*backward(tensors, residuals, grad), None)

    fn.defvjp(fn_forward, fn_backward)
    return fn


def vjp(fn, *primals):
    """`(fn(*primals), pullback)`: `pullback(cotangent)` gives the
    gradients of `fn`'s output for each primal."""
    output, pullback = jax.vjp(fn, *primals)
    return output, lambda cotangent: list(pullback(cotangent))


def fori_loop(start, end, body, carry):
    return keras.ops.fori_loop(start, end, body, carry)


def scan_carries(f, init, xs):
    return keras.ops.scan(lambda c, x: (f(c, x),) * 2, init, xs)[1]


def has_fused_kernel() -> bool:
    return jax.default_backend() == "gpu"


def sparse_blocks_beat_fused() -> bool:
    return False  # not measured on a GPU; on CPU there is no fused kernel


def fused_refusal(query, value):
    """JAX's kernel needs the value head dim to equal the key head dim,
    and on CPU (its XLA implementation) it cannot multiply float16 into
    float32."""
    if query.shape[-1] != value.shape[-1]:
        return (
            "JAX's kernel needs equal query and value head dims "
            f"(received {query.shape[-1]} and {value.shape[-1]})"
        )
    dtype = keras.backend.standardize_dtype(query.dtype)
    if jax.default_backend() == "cpu" and dtype == "float16":
        return "JAX's kernel on CPU cannot compute in float16"
    return None


def device_name() -> str:
    return f"JAX ({jax.default_backend().upper()})"


def without_gradients():
    return contextlib.nullcontext()  # JAX records only when asked


def compile_function(fn):
    return jax.jit(fn)


def is_symbolic_dim(value) -> bool:
    return jax.export.is_symbolic_dim(value)


def is_exporting() -> bool:
    return False


def host_array(value):
    if isinstance(value, jax.core.Tracer):
        return None
    if any(device.platform != "cpu" for device in value.devices()):
        return None  # reading it back would synchronise the device
    return np.asarray(value)
