"""The KV-cache write, in the form that costs least on each backend.

Shape legend: B batch, T new tokens, S_max cache length, K key/value heads,
H head dim.
"""

from keras import ops

from keras_attention._kernels import backends


def update_kv_cache(cache, key, value, index):
    """Writes keys and values into a `(B, 2, S_max, K, H)` cache.

    `key` and `value` are `(B, T, K, H)`, written at positions `index ...
    index + T - 1`. Returns `(cache, keys, values)`, the new cache and its
    `(B, S_max, K, H)` halves to attend over. Eager PyTorch copies a tensor
    per functional update, so one update of the stacked cache (the halves
    are views of it) is cheapest there; under XLA the halves are updated
    apart and stacked for the returned cache; TensorFlow scatters the new
    rows, which converts to ONNX.
    """
    key = ops.cast(key, cache.dtype)
    value = ops.cast(value, cache.dtype)
    return backends.current().write_kv_cache(cache, key, value, index)
