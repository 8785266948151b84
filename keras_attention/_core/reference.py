"""The one reference computation of dot-product attention.

The whole `(T, S)` weight matrix, `softmax(scale · q kᵀ)` with the mask
and the structure applied, then the weighted sum of the values. Every
other path of the library (the blockwise kernel, the backends' fused
kernels) is tested against it, and it is the path that returns the
weights.

Shape legend: B batch, T query length, S key/value length, N query heads,
K key/value heads, G = N // K query heads per key/value head, H head dim
(query/key), V value head dim.
"""

import math

from keras import ops

from keras_attention._core.builtins import relative_bias
from keras_attention._core.builtins import relative_block_bias
from keras_attention._core.masking import expand_mask
from keras_attention._core.masking import logits_dtype
from keras_attention._core.masking import masked_softmax
from keras_attention._core.masking import merge_masks
from keras_attention._core.masking import softmax_of_visible
from keras_attention._core.positions import steps


def reference(query, key, value, mask, scale, structure):
    """Attention on the whole weight matrix: `(output, weights)`.

    Args:
        query, key, value: `(B, T, H)`, `(B, S, H)`, `(B, S, V)` or
            `(B, T, N, H)`, `(B, S, K, H)`, `(B, S, K, V)`, checked.
        mask: boolean, broadcastable to the weights, or `None`.
        scale: float, or `None` for `1 / sqrt(H)`.
        structure: `Structure`, applied as a dense mask and bias.

    Returns:
        The output `(B, T, V)` / `(B, T, N, V)` and the weights
        `(B, T, S)` / `(B, N, T, S)`.

    A row with no visible key gets zero weights and a zero output; the
    output is zeroed through the rows' flags rather than through the
    weights, so that a compiled graph that does not return the weights
    makes no pass over the `(B, N, T, S)` matrix for it.
    """
    logits, mask, dtype = _reference_logits(query, key, mask, structure, scale)
    if mask is None:
        weights = ops.cast(masked_softmax(logits, mask), dtype)
        return attend(weights, value), weights
    mask = ops.cast(mask, "bool")
    weights = ops.cast(softmax_of_visible(logits, mask), dtype)
    seen = ops.any(mask, axis=-1, keepdims=True)  # (B|1, [N|1,] T|1, 1)
    output = attend(weights, value)
    rows = seen if len(query.shape) == 3 else ops.transpose(seen, (0, 2, 1, 3))
    output = ops.where(rows, output, ops.zeros_like(output))
    return output, ops.where(seen, weights, ops.zeros_like(weights))


def reference_weights(query, key, mask, structure, scale=None):
    """The weights of `reference` alone, `(B, T, S)` or `(B, N, T, S)`."""
    logits, mask, dtype = _reference_logits(query, key, mask, structure, scale)
    return ops.cast(masked_softmax(logits, mask), dtype)


def _reference_logits(query, key, mask, structure, scale):
    """`(logits, mask, dtype)`: `reference`'s logits with the structure's
    scores and bias, the mask merged with the structure's (`None` if
    there is none), and the dtype of the weights."""
    rank = len(query.shape)
    if mask is not None:
        mask = expand_mask(mask, rank)  # the weights' rank
    query_length, key_length = ops.shape(query)[1], ops.shape(key)[1]
    dense = structure.dense_mask(query_length, key_length)
    if dense is not None:
        mask = merge_masks(mask, expand_mask(dense, rank))
    heads = 1 if rank == 3 else query.shape[2]
    rows, cols = steps(query_length), steps(key_length)
    modded = structure.mod_mask(ops.shape(query)[0], heads, rows, cols)
    if modded is not None:
        mask = merge_masks(mask, modded[:, 0] if rank == 3 else modded)
    bias = structure.dense_bias(heads, query_length, key_length)
    if bias is not None and rank == 3:
        bias = bias[:, 0]  # (1, T, S)

    def scores(logits):
        if rank == 4:
            return _modified(structure, logits, rows, cols)
        logits = ops.expand_dims(logits, 1)  # (B, 1, T, S)
        return _modified(structure, logits, rows, cols)[:, 0]

    return _logits(
        query,
        key,
        mask,
        scale,
        soft_cap=structure.soft_cap,
        bias=bias,
        score_fn=None if structure.score_mod is None else scores,
    )


def _modified(structure, scores, rows, cols):
    """`scores` `(B, N, T, S)` through the structure's score mod at query
    rows `rows` and keys `cols`, the `steps` of the lengths. A relative
    bias (`builtins.RelativeBias`) of known lengths is laid along the
    diagonals: one lookup per relative position, not per logit."""
    heads, length, key_length = scores.shape[1:]
    if relative_bias(structure.score_mod) is not None and all(
        isinstance(n, int) for n in (length, key_length)
    ):
        bias = relative_block_bias(
            structure.score_mod, heads, 0, 0, length, key_length
        )  # (N, T, S)
        return scores + ops.cast(bias, scores.dtype)
    return structure.modify_scores(scores, rows, cols)


def attention_weights(
    query,
    key,
    mask=None,
    scale=None,
    *,
    soft_cap=None,
    bias=None,
    score_fn=None,
):
    """The attention weights `softmax(scale · q kᵀ)` with masking.

    The first half of `scaled_dot_product_attention`, for callers that
    transform the weights (dropout) before `attend`. `mask` must already
    have the rank of the weights or be 3-D for 4-D inputs.

    Args:
        query (Tensor): Shape `(B, T, H)` or `(B, T, N, H)`.
        key (Tensor): Shape `(B, S, H)` or `(B, S, K, H)`.
        mask (Tensor | None): Boolean, as in `scaled_dot_product_attention`.
        scale (float | None): Defaults to `1 / sqrt(H)`.
        soft_cap (float | None): Logits become
            `soft_cap * tanh(logits / soft_cap)`.
        bias (Tensor | None): Float, broadcastable to the logits. Added
            after the cap (an ALiBi bias, for example).
        score_fn (Callable | None): Rewrites the scaled logits before the
            cap (a score mod).

    Returns:
        Tensor: The weights, `(B, T, S)` or `(B, N, T, S)`, in the query's
            dtype.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> w = attention_weights(np.ones((1, 1, 4), "float32"),
        ...                       np.ones((1, 3, 4), "float32"))
        >>> print(np.round(keras.ops.convert_to_numpy(w), 4))
        [[[0.3333 0.3333 0.3333]]]
    """
    logits, mask, dtype = _logits(
        query,
        key,
        mask,
        scale,
        soft_cap=soft_cap,
        bias=bias,
        score_fn=score_fn,
    )
    return ops.cast(masked_softmax(logits, mask), dtype)


def _logits(query, key, mask, scale, *, soft_cap, bias, score_fn):
    """`(logits, mask, dtype)` of `attention_weights`: the logits in the
    compute dtype, the mask in their rank, and the weights' dtype."""
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    input_dtype = query.dtype
    compute_dtype = logits_dtype(input_dtype)
    query = ops.cast(query, compute_dtype) * ops.cast(scale, compute_dtype)
    key = ops.cast(key, compute_dtype)
    if len(query.shape) == 3:
        logits = ops.einsum("bth,bsh->bts", query, key)  # (B, T, S)
    else:
        logits = grouped_logits(query, key)  # (B, N, T, S)
        if mask is not None:
            mask = expand_mask(mask, 4)  # (B|1, N|1, T, S)
    if score_fn is not None:
        logits = score_fn(logits)
    if soft_cap is not None:
        cap = ops.cast(soft_cap, compute_dtype)
        logits = cap * ops.tanh(logits / cap)
    if bias is not None:
        logits = logits + ops.cast(bias, compute_dtype)
    return logits, mask, input_dtype


def attend(weights, value):
    """The weighted sum of values, `Σ_s weights[t, s] · value[s]`.

    Args:
        weights (Tensor): Shape `(B, T, S)` or `(B, N, T, S)`.
        value (Tensor): Shape `(B, S, V)` or `(B, S, K, V)` (`N % K == 0`).

    Returns:
        Tensor: The output, `(B, T, V)` or `(B, T, N, V)`, in the value's
            dtype.

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


def grouped_logits(query, key):
    """`q kᵀ` for 4-D inputs `(B, T, N, H)` and `(B, S, K, H)`, with
    grouped-query heads when `K < N`: `(B, N, T, S)`."""
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
