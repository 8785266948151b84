"""The KV-cache write, in the form that costs least on each backend.

Shape legend: B batch, T new tokens, S_max cache length, K key/value heads,
H head dim.
"""

import keras
from keras import ops


def update_kv_cache(cache, key, value, index):
    """Writes keys and values into a `(B, 2, S_max, K, H)` cache.

    `key` and `value` are `(B, T, K, H)`, written at positions `index ...
    index + T - 1`. Returns `(cache, keys, values)`, the new cache and its
    `(B, S_max, K, H)` halves to attend over. Eager PyTorch copies a tensor
    per functional update, so one update of the stacked cache (the halves
    are views of it) is cheapest there; under XLA, slicing the halves back
    out of an updated cache inside a decoding loop costs another copy of
    the cache per step, so the halves are updated apart and stacked for the
    returned cache. TensorFlow scatters the new rows: its
    `DynamicUpdateSlice` op (what `slice_update` becomes) has no ONNX
    conversion (tf2onnx).
    """
    key = ops.cast(key, cache.dtype)
    value = ops.cast(value, cache.dtype)
    backend = keras.backend.backend()
    if backend == "torch":
        update = ops.stack([key, value], axis=1)  # (B, 2, T, K, H)
        start = (0, 0, index, 0, 0)
        if ops.is_tensor(index):
            # A tensor start becomes the indices of an `index_put_`, which
            # ONNX (`ScatterND`) takes in int64 only, all of one dtype.
            zero = ops.zeros((), "int64")
            start = (zero, zero, ops.cast(index, "int64"), zero, zero)
        cache = ops.slice_update(cache, start, update)
        return cache, cache[:, 0], cache[:, 1]
    write = _scatter_update if backend == "tensorflow" else _slice_update
    keys = write(cache[:, 0], key, index)  # (B, S_max, K, H)
    values = write(cache[:, 1], value, index)  # (B, S_max, K, H)
    return ops.stack([keys, values], axis=1), keys, values


def _slice_update(tensor, update, index):
    return ops.slice_update(tensor, (0, index, 0, 0), update)


def _scatter_update(tensor, update, index):
    """`tensor` `(B, S_max, K, H)` with rows `index ... index + T - 1`
    replaced by those of `update` `(B, T, K, H)`: a scatter of the T new
    rows, which has a gradient and converts to ONNX (`ScatterND`)."""
    import tensorflow as tf

    batch, length = tf.shape(update)[0], tf.shape(update)[1]
    rows = tf.cast(index, "int32") + tf.range(length)  # (T,)
    b, t = tf.meshgrid(tf.range(batch), rows, indexing="ij")  # (B, T)
    indices = tf.stack([b, t], axis=-1)  # (B, T, 2)
    return tf.tensor_scatter_nd_update(tensor, indices, update)
