"""TensorFlow's primitives (see `backends`).

Shape legend: B batch, T new tokens, S_max cache length, K key/value
heads, H head dim.
"""

import contextlib

import keras
import tensorflow as tf

from keras_attention._kernels.backends import common

PROGRAMS_TAKE_VARIABLES = False  # a graph reads the variables itself
# Keras's attention, unfused on TensorFlow's CPU: never chosen by the
# dispatch (`has_fused_kernel`), but it can be forced and checked.
fused_kernel = common.keras_kernel
leading_sum = common.leading_sum
top_k = common.top_k


def custom_gradient(forward, backward):
    """`fn(query, key, value, captures, tensors)` whose value is
    `forward(...)[0]` and whose gradients are `backward(tensors,
    residuals, grad)` (for the query, key, value and the list
    `captures`); the tensors (mask, segment ids) get none."""

    def fn(query, key, value, captures, tensors):
        @tf.custom_gradient
        def attend(query, key, value, *captures):
            output, residuals = forward(
                query, key, value, list(captures), tensors
            )

            def grad_fn(grad):
                *grads, grad_captures = backward(tensors, residuals, grad)
                return (*grads, *grad_captures)

            return output, grad_fn

        # Variables are read first: `tf.custom_gradient` would otherwise
        # ask for their gradients apart (and a variable is no tensor).
        inputs = [tf.convert_to_tensor(x) for x in (query, key, value)]
        return attend(*inputs, *map(tf.convert_to_tensor, captures))

    return fn


def vjp(fn, *primals):
    """`(fn(*primals), pullback)`: `pullback(cotangent)` gives the
    gradients of `fn`'s output for each primal (zeros where it does not
    depend on one). The primals are copied first, so that a tape inside a
    loop body watches the body's own tensors."""
    primals = [tf.identity(x) for x in primals]
    with tf.GradientTape() as tape:
        tape.watch(primals)
        output = fn(*primals)

    def pullback(cotangent):
        grads = tape.gradient(output, primals, output_gradients=cotangent)
        return [
            tf.zeros_like(x) if g is None else g
            for x, g in zip(primals, grads, strict=True)
        ]

    return output, pullback


def fori_loop(start, end, body, carry):
    """Two iterations at a time: the next block's matmuls run while this
    one's elementwise steps finish, which keeps both cores of a small CPU
    busy. The loops' buffers are `TensorArray`s, so an iteration in
    flight holds its own blocks only; a graph's default of ten would hold
    ten sets of them. Measured with benchmarks/mods.py (attention alone,
    forward and backward, B=2, T=4096, float32, 2-core CPU): against one
    iteration at a time, mask mods gain 1.14-1.23x and causal attention
    1.02x; four at a time are no faster than two, and slower for causal
    attention."""
    return tf.while_loop(
        lambda i, carry: i < end,
        lambda i, carry: (i + 1, body(i, carry)),
        (start, carry),
        parallel_iterations=2,
    )[1]


def scan_carries(f, init, xs):
    """`tf.scan` keeps the carry in loop tensors, where Keras's scan keeps
    it in TensorArrays, which tf2onnx cannot convert to ONNX."""
    return tf.scan(f, xs, initializer=init)


def write_kv_cache(cache, key, value, index):
    """Scatters the new rows: TensorFlow's `DynamicUpdateSlice` op (what
    `slice_update` becomes) has no ONNX conversion (tf2onnx), and a
    scatter is as fast without XLA."""
    keys = _scatter_rows(cache[:, 0], key, index)  # (B, S_max, K, H)
    values = _scatter_rows(cache[:, 1], value, index)  # (B, S_max, K, H)
    return keras.ops.stack([keys, values], axis=1), keys, values


def _scatter_rows(tensor, update, index):
    """`tensor` `(B, S_max, K, H)` with rows `index ... index + T - 1`
    replaced by those of `update` `(B, T, K, H)`."""
    batch, length = tf.shape(update)[0], tf.shape(update)[1]
    rows = tf.cast(index, "int32") + tf.range(length)  # (T,)
    b, t = tf.meshgrid(tf.range(batch), rows, indexing="ij")  # (B, T)
    indices = tf.stack([b, t], axis=-1)  # (B, T, 2)
    return tf.tensor_scatter_nd_update(tensor, indices, update)


def block_buffer(zeros):
    """`zeros` `(n, ...)` as a `TensorArray` of its `n` blocks: a graph
    updates a tensor by copying all of it, a list one block."""
    return tf.TensorArray(
        zeros.dtype,
        size=tf.shape(zeros)[0],
        element_shape=zeros.shape[1:],
        clear_after_read=False,
    ).unstack(zeros)


def read_block(buffer, index):
    return buffer.read(index)


def write_block(buffer, index, block):
    return buffer.write(index, block)


def stacked_blocks(buffer):
    return buffer.stack()


def has_fused_kernel() -> bool:
    return False


def sparse_blocks_beat_fused() -> bool:
    return False  # no fused kernel


def fused_refusal(query, value):
    """Keras's kernel on TensorFlow computes half-precision logits in half
    precision (the library computes them in float32), and fails for one
    key/value head shared by several query heads (its einsum does not
    broadcast the head axis)."""
    dtype = keras.backend.standardize_dtype(query.dtype)
    if dtype in ("float16", "bfloat16"):
        return (
            f"Keras's kernel on TensorFlow computes {dtype} logits in {dtype}"
        )
    if len(query.shape) == 4 and value.shape[2] == 1 != query.shape[2]:
        return (
            "Keras's kernel on TensorFlow cannot share one key/value head "
            f"among {query.shape[2]} query heads"
        )
    return None


def device_name() -> str:
    return "TensorFlow"


def without_gradients():
    return contextlib.nullcontext()  # TensorFlow records only when asked


def compile_function(fn):
    return tf.function(fn, jit_compile=True, autograph=False)


def is_symbolic_dim(value) -> bool:
    return False


def is_exporting() -> bool:
    return False


def host_array(value):
    if tf.executing_eagerly():
        return value.numpy()
    return tf.get_static_value(value)
