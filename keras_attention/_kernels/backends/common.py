"""What the backends' primitives share: Keras's own fused attention, the
slice-update KV-cache write and block buffers held as one tensor.

Shape legend: B batch, T query length, S key length, S_max cache length,
N query heads, K key/value heads, H head dim, V value head dim.
"""

from keras import ops

from keras_attention._core import large_negative


def keras_kernel(query, key, value, mask, is_causal, scale, bias=None):
    """`keras.ops.dot_product_attention` on `(B, T, N, H)` heads, with an
    additive `bias` `(1, N, T, S)` if given (Keras takes a bias or a mask,
    not both: the mask is folded into the bias)."""
    if bias is not None:
        bias = ops.cast(bias, query.dtype)
        if mask is not None:
            negative = ops.cast(large_negative(query.dtype), query.dtype)
            bias = ops.where(mask, bias, negative)
            mask = None
    return ops.dot_product_attention(
        query,
        key,
        value,
        bias=bias,
        mask=mask,
        scale=scale,
        is_causal=is_causal,
    )  # (B, T, N, V)


def top_k(x, k):
    """The `k` largest entries of the last axis, best first, and their
    indices: TensorFlow's and XLA's top-k put the lower index first among
    equal values, as `argmax` picks."""
    return ops.top_k(x, k)


def slice_write_kv_cache(cache, key, value, index):
    """The cache halves updated apart and stacked: under XLA, slicing the
    halves back out of an updated cache inside a decoding loop would cost
    another copy of the cache per step."""
    keys = ops.slice_update(cache[:, 0], (0, index, 0, 0), key)
    values = ops.slice_update(cache[:, 1], (0, index, 0, 0), value)
    return ops.stack([keys, values], axis=1), keys, values


def block_buffer(zeros):
    """`zeros` `(n, ...)`, held whole: XLA updates a loop's buffer in
    place."""
    return zeros


def read_block(buffer, index):
    """Block `index` of the buffer."""
    shape = list(ops.shape(buffer))
    starts = [index] + [0] * (len(shape) - 1)
    return ops.slice(buffer, starts, [1, *shape[1:]])[0]


def write_block(buffer, index, block):
    """The buffer with block `index` set to `block`."""
    starts = [index] + [0] * (len(block.shape))
    return ops.slice_update(buffer, starts, ops.expand_dims(block, 0))


def stacked_blocks(buffer):
    """The buffer's blocks as one tensor `(n, ...)`."""
    return buffer


def leading_sum(x):
    """`x` `(n, ...)` summed over its leading axis."""
    return ops.sum(x, axis=0)
