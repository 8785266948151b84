"""Attention math as pure functions on `keras.ops`.

Every layer of the library computes its masks, softmax and dot-product
attention here, so the numerics live in exactly one place.

Shape legend: B batch, T query length, S key/value length, D model dim,
N query heads, K key/value heads, G = N // K query heads per key/value head,
H head dim (query/key), V value head dim.
"""

import math

import keras
import numpy as np
from keras import ops

_HALF_DTYPES = ("float16", "bfloat16")
_FN = "scaled_dot_product_attention"


def logits_dtype(dtype) -> str:
    """The dtype attention logits and softmax are computed in.

    Half-precision inputs (`float16`, `bfloat16`) get `float32` logits: their
    range and resolution are too small for a stable softmax. Other float
    dtypes are kept.

    Args:
        dtype: str or dtype. The dtype of the query/key tensors.

    Returns:
        str. `"float32"` for half dtypes, else the standardized `dtype`.

    Examples:
        >>> logits_dtype("bfloat16")
        'float32'
        >>> logits_dtype("float64")
        'float64'
    """
    dtype = keras.backend.standardize_dtype(dtype)
    return "float32" if dtype in _HALF_DTYPES else dtype


def large_negative(dtype) -> float:
    """A finite, dtype-aware stand-in for minus infinity in masked logits.

    Half of the most negative finite value of `dtype`: large enough that
    `exp(masked - max)` underflows to exactly zero, finite so that a row in
    which every logit is masked never produces `inf - inf = NaN`.

    Args:
        dtype: str or dtype. A floating dtype.

    Returns:
        float. The masking value.

    Examples:
        >>> large_negative("float16")
        -32752.0
    """
    dtype = keras.backend.standardize_dtype(dtype)
    if dtype == "bfloat16":
        return -1.6e38
    return float(np.finfo(dtype).min) / 2


def causal_mask(query_length, key_length, offset=0):
    """A lower-triangular `(T, S)` mask: query `i` sees keys `j <= i + offset`.

    `offset` is the absolute position of the first query, so an incremental
    decoding step whose queries start at position `p` of a cache of `S` keys
    uses `offset=p`.

    Args:
        query_length: int or scalar tensor. T.
        key_length: int or scalar tensor. S.
        offset: int or scalar tensor. Position of the first query among the
            keys. Defaults to `0` (top-left aligned, as in PyTorch).

    Returns:
        Boolean tensor of shape `(T, S)`, `True` = attend.

    Examples:
        >>> import keras
        >>> print(keras.ops.convert_to_numpy(causal_mask(2, 3)))
        [[ True False False]
         [ True  True False]]
    """
    rows = ops.expand_dims(ops.arange(query_length), 1) + offset  # (T, 1)
    cols = ops.expand_dims(ops.arange(key_length), 0)  # (1, S)
    return ops.greater_equal(rows, cols)  # (T, S)


def position_angles(length, dim: int, start_index=0, max_wavelength=1e4):
    """The angles `p / m^(2i/D)` of sinusoidal and rotary positions.

    Shared by `PositionalEncoding` (sines and cosines of the angles) and
    `RotaryEmbedding` (rotations by the angles). Computed in float32.

    Args:
        length: int or scalar tensor. T, the number of positions.
        dim: int. D, the feature size; there are `ceil(D / 2)` angles.
        start_index: int or scalar tensor. The first position. Defaults to
            `0`.
        max_wavelength: float. `m`. Defaults to `10000.0`.

    Returns:
        Float32 tensor `(T, ceil(D / 2))`: row `p` holds
        `(start_index + p) / m^(2i/D)`.

    Examples:
        >>> import keras
        >>> angles = position_angles(2, 4, start_index=1)
        >>> print(keras.ops.convert_to_numpy(angles).round(4))
        [[1.   0.01]
         [2.   0.02]]
    """
    positions = ops.cast(ops.arange(length), "float32") + ops.cast(
        start_index, "float32"
    )  # (T,)
    exponents = ops.arange(0, dim, 2, dtype="float32") / dim  # (⌈D/2⌉,)
    inverse = ops.power(float(max_wavelength), -exponents)
    return ops.einsum("t,i->ti", positions, inverse)  # (T, ⌈D/2⌉)


def merge_masks(*masks):
    """Logical AND of the given boolean masks, skipping `None`.

    Args:
        *masks: boolean tensors that broadcast together, or `None`.

    Returns:
        The broadcast conjunction, or `None` if every mask is `None`.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> m = merge_masks(None, np.array([True, False]), np.array([True]))
        >>> print(keras.ops.convert_to_numpy(m))
        [ True False]
    """
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def padding_to_attention_mask(padding_mask, query_length=None):
    """Turns a key padding mask `(B, S)` into an attention mask `(B, T, S)`.

    Args:
        padding_mask: boolean tensor `(B, S)`, `True` for real tokens, or
            `None`.
        query_length: int, optional. T. When omitted the result is
            `(B, 1, S)`, which broadcasts over any query length.

    Returns:
        Boolean tensor `(B, T, S)` or `(B, 1, S)`, or `None`.

    Examples:
        >>> import numpy as np
        >>> m = padding_to_attention_mask(np.array([[True, False]]), 3)
        >>> tuple(m.shape)
        (1, 3, 2)
    """
    if padding_mask is None:
        return None
    mask = ops.expand_dims(ops.cast(padding_mask, "bool"), 1)  # (B, 1, S)
    if query_length is None:
        return mask
    batch, key_length = ops.shape(mask)[0], ops.shape(mask)[2]
    return ops.broadcast_to(mask, (batch, query_length, key_length))


def masked_softmax(logits, mask=None, axis=-1):
    """Softmax over `axis` that gives masked entries exactly zero weight.

    Masked logits are replaced (with `where`, not added to) by
    `large_negative` of the logits' dtype before the softmax, and the
    weights are zeroed where the mask is `False` afterwards. A row whose
    entries are all masked therefore gets all-zero weights, never NaN and
    never a uniform distribution over padding. Half-precision logits are
    normalised in `float32` (their own range holds real logits below any
    masking value), and the weights are returned in the logits' dtype.

    Args:
        logits: float tensor.
        mask: boolean tensor broadcastable to `logits`, `True` = keep, or
            `None`.
        axis: int. The normalised axis. Defaults to `-1`.

    Returns:
        Tensor of `logits`' shape and dtype with rows summing to 1, or to 0
        where every entry of the row is masked.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> w = masked_softmax(
        ...     np.array([[0.0, 0.0], [1.0, 2.0]], "float32"),
        ...     np.array([[False, False], [True, False]]),
        ... )
        >>> print(keras.ops.convert_to_numpy(w))
        [[0. 0.]
         [1. 0.]]
    """
    if logits.shape[axis] == 1:
        # One key: the weight is 1 where visible (and Keras's softmax would
        # warn about a size-1 axis).
        weights = ops.ones_like(logits)
        if mask is None:
            return weights
        return ops.where(
            ops.cast(mask, "bool"), weights, ops.zeros_like(logits)
        )
    input_dtype = logits.dtype
    logits = ops.cast(logits, logits_dtype(input_dtype))
    if mask is None:
        return ops.cast(ops.softmax(logits, axis=axis), input_dtype)
    mask = ops.cast(mask, "bool")
    fill = ops.full((), large_negative(logits.dtype), dtype=logits.dtype)
    weights = ops.softmax(ops.where(mask, logits, fill), axis=axis)
    weights = ops.where(mask, weights, ops.zeros_like(weights))
    return ops.cast(weights, input_dtype)


def additive_score(query, key, kernel, bias=None):
    """The additive score `e[t, s] = vᵀ tanh(q[t] + k[s] + b)`.

    The score of Bahdanau attention and of Luong's `concat` form, written
    once. `query` and `key` are already projected to the same `units`.

    Args:
        query: tensor `(B, T, U)`, the projected queries `W q`.
        key: tensor `(B, S, U)`, the projected keys `U h`.
        kernel: tensor `(U,)`, the vector `v`.
        bias: tensor `(U,)` or `None`. Added inside the `tanh`.

    Returns:
        Tensor `(B, T, S)` of scores.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> q = np.zeros((1, 1, 2), "float32")
        >>> k = np.array([[[0.0, 0.0], [1.0, 1.0]]], "float32")
        >>> s = additive_score(q, k, np.ones(2, "float32"))
        >>> print(np.round(keras.ops.convert_to_numpy(s), 4))  # 2 tanh(1)
        [[[0.     1.5232]]]
    """
    hidden = ops.expand_dims(query, 2) + ops.expand_dims(key, 1)  # (B,T,S,U)
    if bias is not None:
        hidden = hidden + bias
    return ops.einsum("btsu,u->bts", ops.tanh(hidden), kernel)  # (B, T, S)


def scaled_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    is_causal: bool = False,
    scale: float | None = None,
    return_attention_scores: bool = False,
):
    """Scaled dot-product attention, `softmax(q kᵀ / sqrt(H)) v`.

    $$\\operatorname{Attention}(Q, K, V) =
    \\operatorname{softmax}\\left(\\frac{QK^\\top}{\\sqrt{H}}\\right)V$$

    Works on single-head `(B, T, H)` and multi-head `(B, T, N, H)` tensors.
    Multi-head keys and values may have fewer heads `K` than the queries
    (grouped-query attention, `N % K == 0`; query head `n` uses key/value
    head `n // (N // K)`).

    A query row with no visible key gets all-zero weights and an all-zero
    output in every dtype. For `float16`/`bfloat16` inputs the logits and
    the softmax are computed in `float32`.

    Args:
        query: tensor `(B, T, H)` or `(B, T, N, H)`.
        key: tensor `(B, S, H)` or `(B, S, K, H)`.
        value: tensor `(B, S, V)` or `(B, S, K, V)`.
        mask: boolean tensor, `True` = attend, or `None`. For 3-D inputs
            it broadcasts to `(B, T, S)`; for 4-D inputs it broadcasts to
            `(B, N, T, S)`, and a 3-D `(B, T, S)` mask is shared by all
            heads. Defaults to `None`.
        is_causal: bool. Also hide keys after each query (query `i` sees
            keys `j <= i`). Defaults to `False`.
        scale: float, optional. Multiplies the logits. Defaults to
            `1 / sqrt(H)`.
        return_attention_scores: bool. Also return the attention weights.
            Defaults to `False`.

    Returns:
        The output, `(B, T, V)` or `(B, T, N, V)`; with
        `return_attention_scores=True` the tuple `(output, weights)` with
        weights `(B, T, S)` or `(B, N, T, S)`.

    Examples:
        The worked example of seed 002: one query, two keys.

        >>> import keras
        >>> import numpy as np
        >>> q = np.array([[[2.0]]], "float32")
        >>> k = np.array([[[2.0], [1.0]]], "float32")
        >>> v = np.array([[[10.0], [4.0]]], "float32")
        >>> out, w = scaled_dot_product_attention(
        ...     q, k, v, return_attention_scores=True
        ... )
        >>> print(np.round(keras.ops.convert_to_numpy(w), 3))
        [[[0.881 0.119]]]
        >>> print(np.round(keras.ops.convert_to_numpy(out), 3))
        [[[9.285]]]

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """
    query, key, value = (ops.convert_to_tensor(x) for x in (query, key, value))
    mask = _check_inputs(query, key, value, mask)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if not return_attention_scores:
        if _fused_kernel_available():
            return _fused_attention(query, key, value, mask, is_causal, scale)
        if _chunks_pay_off(query, key):
            return _chunked_attention(query, key, value, mask, is_causal, scale)
    if is_causal:
        causal = causal_mask(ops.shape(query)[1], ops.shape(key)[1])  # (T, S)
        mask = merge_masks(mask, causal)
    if mask is not None:
        mask = _expand_mask(mask, len(query.shape))
    weights = attention_weights(query, key, mask, scale)
    output = attend(weights, value)
    if return_attention_scores:
        return output, weights
    return output


def attention_weights(query, key, mask=None, scale=None):
    """The attention weights `softmax(scale · q kᵀ)` with masking.

    The first half of `scaled_dot_product_attention`, for callers that
    transform the weights (dropout) before `attend`. `mask` must already
    have the rank of the weights or be 3-D for 4-D inputs.

    Args:
        query: tensor `(B, T, H)` or `(B, T, N, H)`.
        key: tensor `(B, S, H)` or `(B, S, K, H)`.
        mask: boolean tensor or `None`, as in `scaled_dot_product_attention`.
        scale: float, optional. Defaults to `1 / sqrt(H)`.

    Returns:
        Weights `(B, T, S)` or `(B, N, T, S)` in the query's dtype.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> w = attention_weights(np.ones((1, 1, 4), "float32"),
        ...                       np.ones((1, 3, 4), "float32"))
        >>> print(np.round(keras.ops.convert_to_numpy(w), 4))
        [[[0.3333 0.3333 0.3333]]]
    """
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    input_dtype = query.dtype
    compute_dtype = logits_dtype(input_dtype)
    query = ops.cast(query, compute_dtype) * ops.cast(scale, compute_dtype)
    key = ops.cast(key, compute_dtype)
    if len(query.shape) == 3:
        logits = ops.einsum("bth,bsh->bts", query, key)  # (B, T, S)
    else:
        logits = _grouped_logits(query, key)  # (B, N, T, S)
        if mask is not None:
            mask = _expand_mask(mask, 4)  # (B|1, N|1, T, S)
    weights = masked_softmax(logits, mask)
    return ops.cast(weights, input_dtype)


def attend(weights, value):
    """The weighted sum of values, `Σ_s weights[t, s] · value[s]`.

    Args:
        weights: tensor `(B, T, S)` or `(B, N, T, S)`.
        value: tensor `(B, S, V)` or `(B, S, K, V)` (`N % K == 0`).

    Returns:
        Tensor `(B, T, V)` or `(B, T, N, V)` in the value's dtype.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> out = attend(np.array([[[0.25, 0.75]]], "float32"),
        ...              np.array([[[4.0], [8.0]]], "float32"))
        >>> print(keras.ops.convert_to_numpy(out))
        [[[7.]]]
    """
    weights = ops.cast(weights, value.dtype)
    if len(value.shape) == 3:
        return ops.einsum("bts,bsv->btv", weights, value)  # (B, T, V)
    batch, num_heads, query_length, key_length = ops.shape(weights)
    num_kv_heads = value.shape[2]
    if num_heads == num_kv_heads:
        return ops.einsum("bnts,bsnv->btnv", weights, value)  # (B, T, N, V)
    groups = num_heads // num_kv_heads
    weights = ops.reshape(
        weights, (batch, num_kv_heads, groups, query_length, key_length)
    )  # (B, K, G, T, S)
    output = ops.einsum("bkgts,bskv->btkgv", weights, value)  # (B,T,K,G,V)
    return ops.reshape(
        output, (batch, query_length, num_heads, value.shape[-1])
    )  # (B, T, N, V)


def _grouped_logits(query, key):
    """`q kᵀ` for 4-D inputs, with grouped-query heads when `K < N`."""
    batch, query_length, num_heads, head_dim = ops.shape(query)
    num_kv_heads = key.shape[2]
    if num_heads == num_kv_heads:
        return ops.einsum("btnh,bsnh->bnts", query, key)  # (B, N, T, S)
    groups = num_heads // num_kv_heads
    query = ops.reshape(
        query, (batch, query_length, num_kv_heads, groups, head_dim)
    )  # (B, T, K, G, H)
    logits = ops.einsum("btkgh,bskh->bkgts", query, key)  # (B, K, G, T, S)
    return ops.reshape(
        logits, (batch, num_heads, query_length, ops.shape(key)[1])
    )  # (B, N, T, S)


def _check_inputs(query, key, value, mask):
    """Validates ranks, dims and the mask; returns the mask as bool."""
    rank = len(query.shape)
    if rank not in (3, 4) or len(key.shape) != rank or len(value.shape) != rank:
        raise ValueError(
            f"{_FN}: `query`, `key` and `value` must all be 3-D (B, T, H) "
            "or all 4-D (B, T, N, H). Received: "
            f"query.shape={_shape(query)}, key.shape={_shape(key)}, "
            f"value.shape={_shape(value)}"
        )
    q, k, v = _shape(query), _shape(key), _shape(value)
    _check_dims_equal("query", q, 0, "key", k, 0)
    _check_dims_equal("query", q, 0, "value", v, 0)
    _check_dims_equal("key", k, 1, "value", v, 1)
    _check_dims_equal("query", q, -1, "key", k, -1)
    if rank == 4:
        _check_dims_equal("key", k, 2, "value", v, 2)
        num_heads, num_kv_heads = query.shape[2], key.shape[2]
        if num_kv_heads and num_heads % num_kv_heads:
            raise ValueError(
                f"{_FN}: the number of query heads must be a multiple of the "
                "number of key/value heads. Received: "
                f"query.shape={_shape(query)}, key.shape={_shape(key)}"
            )
    if mask is None:
        return None
    mask = ops.convert_to_tensor(mask)
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if dtype != "bool" and "int" not in dtype:
        raise ValueError(
            f"{_FN}: `mask` must be boolean (True = attend). "
            f"Received: mask.dtype={dtype}"
        )
    batch, query_length, key_length = (
        query.shape[0],
        query.shape[1],
        key.shape[1],
    )
    if rank == 3 or len(mask.shape) == 3:
        target = (batch, query_length, key_length)
    else:
        target = (batch, query.shape[2], query_length, key_length)
    if not _broadcastable(mask.shape, target):
        raise ValueError(
            f"{_FN}: `mask` must broadcast to {_shape_str(target)}. "
            f"Received: mask.shape={_shape(mask)}, "
            f"query.shape={_shape(query)}, key.shape={_shape(key)}"
        )
    return ops.cast(mask, "bool")


def _expand_mask(mask, rank):
    """Gives a broadcastable mask the weights' rank (a 3-D mask for 4-D
    weights is `(B, T, S)`, shared by the heads)."""
    while len(mask.shape) < rank:
        axis = 1 if rank == 4 and len(mask.shape) == 3 else 0
        mask = ops.expand_dims(mask, axis)
    return mask


def _check_dims_equal(name_a, shape_a, axis_a, name_b, shape_b, axis_b):
    dim_a, dim_b = shape_a[axis_a], shape_b[axis_b]
    if dim_a is not None and dim_b is not None and dim_a != dim_b:
        raise ValueError(
            f"{_FN}: `{name_a}` axis {axis_a} and `{name_b}` axis {axis_b} "
            f"must match. Received: {name_a}.shape={shape_a}, "
            f"{name_b}.shape={shape_b}"
        )


def _shape(tensor):
    return tuple(tensor.shape)


def _broadcastable(shape, target):
    if len(shape) > len(target) or len(shape) < 2:
        return False
    for dim, want in zip(reversed(shape), reversed(target), strict=False):
        if dim not in (1, None) and want is not None and dim != want:
            return False
    return True


def _shape_str(target):
    names = ("B", "T", "S") if len(target) == 3 else ("B", "N", "T", "S")
    dims = ", ".join(f"{n}={d}" for n, d in zip(names, target, strict=True))
    return f"({dims})"


# --------------------------------------------------------------------------
# Fused-kernel dispatch: the one place here that looks at the backend.
#
# `keras.ops.dot_product_attention` reaches PyTorch's fused SDPA kernels and,
# on GPU, cuDNN flash attention for JAX. It returns the mean of the values
# for a query row with no visible key (where we return zeros), so its output
# is zeroed on those rows, which makes both paths agree on every input. On
# TensorFlow, and on JAX without a GPU, it is the same XLA computation as the
# reference path, so it is not used there.
#
# Where no fused kernel runs (TensorFlow; JAX on CPU), long sequences take a
# memory-efficient path instead: the queries are processed in chunks of
# `_CHUNK` rows, and each chunk is rematerialised in the backward pass
# (`jax.checkpoint`, `tf.recompute_grad`), so a training step never holds
# the whole `(B, N, T, S)` weight matrix. Each chunk runs the reference
# computation on its rows, so the numbers are the reference path's.
#
# The KV-cache write (`_update_kv_cache`) also takes a per-backend form.
# --------------------------------------------------------------------------

_CHUNK = 256  # query rows per chunk
_CHUNKED_MIN_LENGTH = 512  # shorter queries fit the cache whole


def _fused_kernel_available() -> bool:
    backend = keras.backend.backend()
    if backend == "torch":
        return True
    if backend == "jax":
        import jax

        return jax.default_backend() == "gpu"
    return False


def _fused_attention(query, key, value, mask, is_causal, scale):
    single_head = len(query.shape) == 3
    if single_head:
        query, key, value = (ops.expand_dims(x, 2) for x in (query, key, value))
    if mask is not None:
        if is_causal:
            # Merged here so that rows emptied by padding and causality
            # together are found and zeroed below.
            causal = causal_mask(ops.shape(query)[1], ops.shape(key)[1])
            mask, is_causal = merge_masks(mask, causal), False
        if len(mask.shape) == 3 and single_head:
            mask = ops.expand_dims(mask, 1)  # (B, 1, T, S)
        mask = _expand_mask(mask, 4)  # (B|1, N|1, T, S)
    output = _fused_kernel(query, key, value, mask, is_causal, scale)
    if mask is not None:
        visible = ops.any(mask, axis=-1)  # (B, N|1, T)
        visible = ops.expand_dims(ops.transpose(visible, (0, 2, 1)), -1)
        output = ops.where(visible, output, ops.zeros_like(output))
    if single_head:
        output = ops.squeeze(output, 2)  # (B, T, V)
    return output


def _fused_kernel(query, key, value, mask, is_causal, scale):
    """The backend's fused kernel on `(B, T, N, H)` heads.

    On PyTorch, `torch.nn.functional.scaled_dot_product_attention` is
    called on transposed views, with grouped-query heads left to the
    kernel: `keras.ops.dot_product_attention` copies the keys and values
    into contiguous, repeated heads first, which for a decoding step means
    copying the whole KV cache. The mask becomes additive (0 or a large
    negative), as Keras makes it, so that a row with no visible key stays
    finite (it is zeroed by the caller).
    """
    dtypes = {
        keras.backend.standardize_dtype(x.dtype) for x in (query, key, value)
    }
    if keras.backend.backend() != "torch" or len(dtypes) > 1:
        return ops.dot_product_attention(
            query, key, value, mask=mask, scale=scale, is_causal=is_causal
        )  # (B, T, N, V)
    import torch

    query, key, value = (
        ops.convert_to_tensor(x).transpose(1, 2) for x in (query, key, value)
    )  # (B, N, T, H), (B, K, S, H), (B, K, S, V)
    if mask is not None:
        mask = torch.where(
            ops.convert_to_tensor(mask),
            torch.zeros((), dtype=query.dtype, device=query.device),
            large_negative(query.dtype),
        )
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


def _chunks_pay_off(query, key) -> bool:
    query_length, key_length = query.shape[1], key.shape[1]
    return (
        keras.backend.backend() in ("jax", "tensorflow")
        and query_length is not None
        and key_length is not None
        and query_length >= _CHUNKED_MIN_LENGTH
        and key_length >= _CHUNK
    )


def _chunked_attention(query, key, value, mask, is_causal, scale):
    rank = len(query.shape)
    if mask is not None:
        mask = _expand_mask(mask, 3 if rank == 3 else 4)  # (..., T|1, S)
    length, key_length = query.shape[1], key.shape[1]
    chunks = -(-length // _CHUNK)
    pad = chunks * _CHUNK - length
    # A sequential loop over equal chunks (`ops.map`), so that one chunk's
    # buffers are live at a time; the last chunk is padded with queries
    # whose outputs are dropped.
    rows = _to_chunks(query, 1, pad, chunks)  # (chunks, B, C, [N,] H)
    chunked_mask = mask is not None and mask.shape[-2] != 1
    if chunked_mask:
        mask_rows = _to_chunks(mask, len(mask.shape) - 2, pad, chunks)
    starts = ops.arange(chunks) * _CHUNK  # first query position per chunk

    def chunk(inputs):
        query_rows, start = inputs[0], inputs[1]
        rows_mask = inputs[2] if chunked_mask else mask  # (..., C|1, S)
        if is_causal:
            causal = causal_mask(_CHUNK, key_length, offset=start)  # (C, S)
            rows_mask = merge_masks(rows_mask, causal)
        weights = attention_weights(query_rows, key, rows_mask, scale)
        return attend(weights, value)  # (B, C, [N,] V)

    inputs = (rows, starts, mask_rows) if chunked_mask else (rows, starts)
    outputs = ops.map(_rematerialized(chunk), inputs)  # (chunks, B, C, ...)
    outputs = ops.moveaxis(outputs, 0, 1)  # (B, chunks, C, [N,] V)
    outputs = ops.reshape(
        outputs, (-1, chunks * _CHUNK, *outputs.shape[3:])
    )  # (B, T + pad, [N,] V)
    return outputs[:, :length]


def _to_chunks(tensor, axis, pad, chunks):
    """`tensor` with `axis` padded by `pad` and split into `chunks` equal
    pieces stacked on a new leading axis."""
    if pad:
        widths = [(0, 0)] * len(tensor.shape)
        widths[axis] = (0, pad)
        tensor = ops.pad(tensor, widths)
    shape = ops.shape(tensor)
    tensor = ops.reshape(
        tensor, (*shape[:axis], chunks, _CHUNK, *shape[axis + 1 :])
    )
    return ops.moveaxis(tensor, axis, 0)


def _rematerialized(fn):
    """`fn` whose intermediates are recomputed, not stored, for gradients."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.checkpoint(fn)
    import tensorflow as tf

    return tf.recompute_grad(fn)


def _update_kv_cache(cache, key, value, index):
    """Writes one step's keys and values into a `(B, 2, S_max, K, H)` cache.

    `key` and `value` are `(B, T, K, H)`, written at positions `index ...
    index + T - 1`. Returns `(cache, keys, values)`, the new cache and its
    `(B, S_max, K, H)` halves to attend over. The form that costs least
    differs: eager PyTorch copies a tensor per functional update, so one
    update of the stacked cache (the halves are views of it) is cheapest;
    under XLA, slicing the halves back out of an updated cache inside a
    decoding loop costs another copy of the cache per step, so the halves
    are updated apart and stacked for the returned cache.
    """
    key = ops.cast(key, cache.dtype)
    value = ops.cast(value, cache.dtype)
    if keras.backend.backend() == "torch":
        update = ops.stack([key, value], axis=1)  # (B, 2, T, K, H)
        cache = ops.slice_update(cache, (0, 0, index, 0, 0), update)
        return cache, cache[:, 0], cache[:, 1]
    keys = ops.slice_update(cache[:, 0], (0, index, 0, 0), key)
    values = ops.slice_update(cache[:, 1], (0, index, 0, 0), value)
    return ops.stack([keys, values], axis=1), keys, values
