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
    returned cache.
    """
    key = ops.cast(key, cache.dtype)
    value = ops.cast(value, cache.dtype)
    if keras.backend.backend() == "torch":
        update = ops.stack([key, value], axis=1)  # (B, 2, T, K, H)
        cache = ops.slice_update(cache, (0, 0, index, 0, 0), update)
        return cache, cache[:, 0], cache[:, 1]
    keys = _slice_update(cache[:, 0], (0, index, 0, 0), key)
    values = _slice_update(cache[:, 1], (0, index, 0, 0), value)
    return ops.stack([keys, values], axis=1), keys, values


def _slice_update(tensor, start, update):
    """`ops.slice_update`, differentiable on TensorFlow too: its XLA
    `DynamicUpdateSlice` op has no registered gradient there."""
    if keras.backend.backend() != "tensorflow":
        return ops.slice_update(tensor, start, update)
    import tensorflow as tf

    begin = tf.stack([tf.cast(i, "int32") for i in start])

    @tf.custom_gradient
    def updated(tensor, update):
        def grad(upstream):
            into_update = tf.slice(upstream, begin, tf.shape(update))
            into_tensor = ops.slice_update(
                upstream, start, tf.zeros_like(update)
            )
            return into_tensor, into_update

        return ops.slice_update(tensor, start, update), grad

    return updated(tensor, update)
