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

from keras_attention import _explain
from keras_attention import _kernels

_HALF_DTYPES = ("float16", "bfloat16")
_FN = "scaled_dot_product_attention"


def logits_dtype(dtype) -> str:
    """The dtype attention logits and softmax are computed in.

    Half-precision inputs (`float16`, `bfloat16`) get `float32` logits: their
    range and resolution are too small for a stable softmax. Other float
    dtypes are kept.

    Args:
        dtype (str | DType): The dtype of the query/key tensors.

    Returns:
        str: `"float32"` for half dtypes, else the standardized `dtype`.

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
        dtype (str | DType): A floating dtype.

    Returns:
        float: The masking value.

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
        query_length (int | Tensor): T.
        key_length (int | Tensor): S.
        offset (int | Tensor): Position of the first query among the
            keys. Defaults to `0` (top-left aligned, as in PyTorch).

    Returns:
        Tensor: Boolean, of shape `(T, S)`, `True` = attend.

    Examples:
        >>> import keras
        >>> print(keras.ops.convert_to_numpy(causal_mask(2, 3)))
        [[ True False False]
         [ True  True False]]
    """
    # `arange(0, n)` rather than `arange(n)` throughout: jax2onnx (ONNX
    # export from JAX) misreads the one-argument form.
    rows = ops.expand_dims(ops.arange(0, query_length), 1) + offset  # (T, 1)
    cols = ops.expand_dims(ops.arange(0, key_length), 0)  # (1, S)
    return ops.greater_equal(rows, cols)  # (T, S)


def structure_mask(
    query_length,
    key_length,
    is_causal: bool | str = False,
    sliding_window: int | tuple[int, int] | None = None,
    segment_ids=None,
):
    """The dense mask of the structural arguments of
    `scaled_dot_product_attention`.

    Attention takes the structure as arguments and applies it without
    this `(T, S)` tensor where it can; the mask is for the layers' own
    weight computations, for plots and for reading what an argument
    means. The arguments mean what they mean there.

    Args:
        query_length (int): T.
        key_length (int): S.
        is_causal: `True`, `"top_left"` or `"bottom_right"`. Defaults to
            `False`.
        sliding_window: An int `w` or a pair `(left, right)`, as in
            `scaled_dot_product_attention`.
        segment_ids (Tensor | tuple[Tensor, Tensor] | None): Integer ids
            `(B, T)`, or a tuple `(query_ids (B, T), key_ids (B, S))`.

    Returns:
        Tensor: Boolean, `(B, T, S)` with segment ids, else `(1, T, S)`;
            `True` = attend. All `True` without structure.

    Examples:
        A causal window of 2 keys, and two packed sequences:

        >>> import keras
        >>> m = structure_mask(4, 4, is_causal=True, sliding_window=2)
        >>> print(keras.ops.convert_to_numpy(m[0]).astype(int))
        [[1 0 0 0]
         [1 1 0 0]
         [0 1 1 0]
         [0 0 1 1]]
        >>> m = structure_mask(4, 4, segment_ids=[[1, 1, 2, 0]])
        >>> print(keras.ops.convert_to_numpy(m[0]).astype(int))
        [[1 1 0 0]
         [1 1 0 0]
         [0 0 1 0]
         [0 0 0 0]]
    """
    structure = _kernels.structure.normalize(
        "structure_mask",
        None,
        query_length,
        key_length,
        is_causal,
        sliding_window,
        segment_ids,
    )
    mask = structure.dense_mask(query_length, key_length)
    if mask is None:
        return ops.ones((1, query_length, key_length), "bool")
    return mask


def segment_positions(segment_ids):
    """Positions that restart at 0 at the start of each packed sequence.

    A sequence starts where the id differs from the previous token's.
    Position layers given `segment_ids` use these positions, so that a
    sequence packed after others gets the positions it would have alone.

    Args:
        segment_ids (Tensor): Shape `(B, T)`, integer.

    Returns:
        Tensor: Int32 positions `(B, T)`.

    Examples:
        >>> import keras
        >>> p = segment_positions([[1, 1, 1, 2, 2, 3, 0, 0]])
        >>> print(keras.ops.convert_to_numpy(p))
        [[0 1 2 0 1 0 0 1]]
    """
    where = "segment_positions"
    if not _kernels.structure.is_tensor(segment_ids):
        _kernels.structure.host_integers(where, "segment_ids", segment_ids)
    ids = ops.convert_to_tensor(segment_ids)  # (B, T)
    dtype = keras.backend.standardize_dtype(ids.dtype)
    if len(ids.shape) != 2 or "int" not in dtype:
        raise ValueError(
            f"{where}: `segment_ids` must be an integer tensor (B, T). "
            f"Received: segment_ids.shape={tuple(ids.shape)}, dtype={dtype}"
        )
    index = ops.broadcast_to(
        ops.arange(0, ops.shape(ids)[1], dtype="int32"), ops.shape(ids)
    )  # (B, T)
    # Compared in their own dtype: wide ids do not wrap into equal ones.
    changed = ops.not_equal(ids[:, 1:], ids[:, :-1])  # (B, T - 1)
    starts = ops.concatenate(
        [ops.ones_like(changed[:, :1]), changed], axis=1
    )  # (B, T)
    last_start = ops.associative_scan(
        ops.maximum, ops.where(starts, index, ops.zeros_like(index)), axis=1
    )  # (B, T): the index where each token's sequence starts
    # The scan can lose the static shape inside a compiled TensorFlow step.
    return ops.reshape(ops.cast(index - last_start, "int32"), ops.shape(ids))


def _angles_at(positions, dim, max_wavelength):
    """`position_angles` at explicit positions `(B, T)`: `(B, T, ⌈D/2⌉)`."""
    positions = ops.cast(positions, "float32")
    exponents = ops.arange(0, dim, 2, dtype="float32") / dim  # (⌈D/2⌉,)
    inverse = ops.power(float(max_wavelength), -exponents)
    return ops.expand_dims(positions, -1) * inverse  # (B, T, ⌈D/2⌉)


def position_angles(length, dim: int, start_index=0, max_wavelength=1e4):
    """The angles `p / m^(2i/D)` of sinusoidal and rotary positions.

    Shared by `PositionalEncoding` (sines and cosines of the angles) and
    `RotaryEmbedding` (rotations by the angles). Computed in float32.

    Args:
        length (int | Tensor): T, the number of positions.
        dim: D, the feature size; there are `ceil(D / 2)` angles.
        start_index (int | Tensor): The first position. Defaults to
            `0`.
        max_wavelength (float): `m`. Defaults to `10000.0`.

    Returns:
        Tensor: Float32 angles `(T, ceil(D / 2))`; row `p` holds
            `(start_index + p) / m^(2i/D)`.

    Examples:
        >>> import keras
        >>> angles = position_angles(2, 4, start_index=1)
        >>> print(keras.ops.convert_to_numpy(angles).round(4))
        [[1.   0.01]
         [2.   0.02]]
    """
    positions = ops.cast(ops.arange(0, length), "float32") + ops.cast(
        start_index, "float32"
    )  # (T,)
    exponents = ops.arange(0, dim, 2, dtype="float32") / dim  # (⌈D/2⌉,)
    inverse = ops.power(float(max_wavelength), -exponents)
    return ops.einsum("t,i->ti", positions, inverse)  # (T, ⌈D/2⌉)


def merge_masks(*masks):
    """Logical AND of the given boolean masks, skipping `None`.

    Args:
        *masks (Tensor | None): Boolean tensors that broadcast together, or
            `None`.

    Returns:
        Tensor | None: The broadcast conjunction, or `None` if every mask is
            `None`.

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
        padding_mask (Tensor | None): Shape `(B, S)`, boolean, `True` for real
            tokens, or `None`.
        query_length (int | None): T. When omitted the result is
            `(B, 1, S)`, which broadcasts over any query length.

    Returns:
        Tensor | None: Boolean, `(B, T, S)` or `(B, 1, S)`, or `None`.

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
    # Broadcast by a logical and: the batch size may be unknown here.
    rows = ops.ones((1, query_length, 1), "bool")  # (1, T, 1)
    return ops.logical_and(mask, rows)  # (B, T, S)


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
        logits (Tensor): Float logits.
        mask (Tensor | None): Boolean, broadcastable to `logits`, `True` =
            keep, or `None`.
        axis (int): The normalised axis. Defaults to `-1`.

    Returns:
        Tensor: The weights, of `logits`' shape and dtype, with rows summing
            to 1, or to 0 where every entry of the row is masked.

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
        query (Tensor): Shape `(B, T, U)`, the projected queries `W q`.
        key (Tensor): Shape `(B, S, U)`, the projected keys `U h`.
        kernel (Tensor): Shape `(U,)`, the vector `v`.
        bias (Tensor | None): Shape `(U,)`. Added inside the `tanh`.

    Returns:
        Tensor: The scores, `(B, T, S)`.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> q = np.zeros((1, 1, 2), "float32")
        >>> k = np.array([[[0.0, 0.0], [1.0, 1.0]]], "float32")
        >>> s = additive_score(q, k, np.ones(2, "float32"))
        >>> print(np.round(keras.ops.convert_to_numpy(s), 4))  # 2 tanh(1)
        [[[0.     1.5232]]]
    """
    # One dtype for all three (Keras's PyTorch matmul returns float32 for
    # float64 inputs, so projections may come back in another float).
    query, key = ops.cast(query, kernel.dtype), ops.cast(key, kernel.dtype)
    hidden = ops.expand_dims(query, 2) + ops.expand_dims(key, 1)  # (B,T,S,U)
    if bias is not None:
        hidden = hidden + bias
    return ops.einsum("btsu,u->bts", ops.tanh(hidden), kernel)  # (B, T, S)


def monotonic_attention(p_choose, previous_alignment, mode="parallel"):
    """The expected monotonic alignment (Raffel et al. 2017).

    Reading the source from where the previous step stopped, the decoder
    stops at position `j` with probability `p_choose[j]`:

    $$\\alpha_j = p_j \\sum_{k \\le j} \\alpha^{prev}_k
    \\prod_{l=k}^{j-1} (1 - p_l)$$

    `"recursive"` computes it with `q_j = (1 - p_{j-1}) q_{j-1} +
    α^{prev}_j`, `α_j = p_j q_j` (a scan along the source); `"parallel"` in
    closed form, `α = p · c · cumsum(α^{prev} / c)` with `c` the exclusive
    cumulative product of `1 - p`, taken in log space and clipped (at the
    dtype's smallest normal number inside the `log`, at `1e-10` in the
    division) as in tensorflow-addons; `"hard"` expects 0/1 `p_choose` and
    gives a one-hot alignment at the first chosen position at or after the
    previous one, or zeros. The same equations and numbers as
    tensorflow-addons' `monotonic_attention`.

    Args:
        p_choose (Tensor): Shape `(..., S)`, the stopping probabilities
            (0 at masked positions).
        previous_alignment (Tensor): Shape `(..., S)`, broadcastable to
            `p_choose`.
        mode (str): `"parallel"`, `"recursive"` or `"hard"`.

    Returns:
        Tensor: The alignment, of `p_choose`'s shape and float dtype
            (computed in float32 for half-precision inputs); each row sums
            to at most 1 (the rest is the probability of stopping nowhere).

    The closed form loses mass when the cumulative product falls below its
    `1e-10` floor: past a run of positions that the decoder is all but
    certain to stop at (`p` near 1), an alignment carried further along
    is under-counted, as in tensorflow-addons. The recursion is exact;
    prefer it when the stopping probabilities saturate.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> p = np.array([[0.5, 0.5, 0.5]], "float32")
        >>> first = np.array([[1.0, 0.0, 0.0]], "float32")
        >>> a = monotonic_attention(p, first, "recursive")
        >>> print(keras.ops.convert_to_numpy(a))
        [[0.5   0.25  0.125]]
    """
    if mode not in ("parallel", "recursive", "hard"):
        raise ValueError(
            "monotonic_attention: `mode` must be 'parallel', 'recursive' or "
            f"'hard'. Received: mode={mode!r}"
        )
    p_choose = ops.convert_to_tensor(p_choose)
    dtype = keras.backend.standardize_dtype(p_choose.dtype)
    if "float" not in dtype:
        raise ValueError(
            "monotonic_attention: `p_choose` must be floating point. "
            f"Received: p_choose.dtype={dtype}"
        )
    if dtype != logits_dtype(dtype):
        # float16's smallest normal number and 1e-10 floor do not exist.
        alignment = monotonic_attention(
            ops.cast(p_choose, "float32"), previous_alignment, mode
        )
        return ops.cast(alignment, dtype)
    previous = ops.cast(previous_alignment, dtype)
    if mode == "recursive":
        decay = _shift_right(1.0 - p_choose, 1.0)  # (..., S)
        previous = previous * ops.ones_like(p_choose)
        steps = (ops.moveaxis(decay, -1, 0), ops.moveaxis(previous, -1, 0))

        def step(carry, inputs):
            return inputs[0] * carry + inputs[1]

        q = _kernels.scan_carries(step, ops.zeros_like(p_choose[..., 0]), steps)
        return p_choose * ops.moveaxis(q, 0, -1)
    if mode == "parallel":
        cumprod = _exclusive_cumprod(1.0 - p_choose)
        floor = ops.clip(cumprod, 1e-10, 1.0)
        return p_choose * cumprod * ops.cumsum(previous / floor, axis=-1)
    # Hard: stop at the first chosen position at or after the previous one.
    p_choose = p_choose * ops.cumsum(previous, axis=-1)
    return p_choose * _shift_right(ops.cumprod(1.0 - p_choose, axis=-1), 1.0)


def _exclusive_cumprod(x):
    """`[1, x_0, x_0 x_1, ...]` along the last axis, in log space with `x`
    clipped at its dtype's smallest normal number."""
    tiny = float(np.finfo(keras.backend.standardize_dtype(x.dtype)).tiny)
    logs = ops.log(ops.clip(x, tiny, 1.0))
    return ops.exp(_shift_right(ops.cumsum(logs, axis=-1), 0.0))


def _shift_right(x, first):
    """`[first, x_0, ..., x_{S-2}]` along the last axis."""
    head = ops.full_like(x[..., :1], first)
    return ops.concatenate([head, x[..., :-1]], axis=-1)


def scaled_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    is_causal: bool | str = False,
    scale: float | None = None,
    return_attention_scores: bool = False,
    sliding_window: int | tuple[int, int] | None = None,
    segment_ids=None,
    alibi: bool = False,
    logit_soft_cap: float | None = None,
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

    Without `return_attention_scores` the computation takes the fastest
    exact path the backend has: PyTorch's fused kernel (and cuDNN's on a
    JAX GPU), or, on TensorFlow and JAX on CPU for 512 queries or more
    and 256 keys or more, blockwise attention with an online softmax and
    a backward pass that recomputes each block (as in FlashAttention), so
    that memory grows with the sequence length, not its square. With
    `is_causal=True` the blocks above the diagonal are skipped, which
    saves about half of the work for `T = S`; a sliding window skips every
    block outside it. Every path gives the same outputs and gradients; the
    weights, when asked for, come from the reference computation. On
    `keras.Input` tensors the function builds an operation of a
    functional model.

    Structure is given as arguments rather than as a dense mask, so that
    each path applies it without an `O(T x S)` tensor where it can. Query
    `i` stands at position `p = i` among the keys (top-left alignment) or
    `p = i + S - T` (bottom-right: the queries are the last `T` of `S`
    positions, as when new tokens attend to a KV cache). `is_causal` hides
    the keys after `p`; `sliding_window` keeps a band of keys around `p`;
    `segment_ids` keeps each query inside its own packed sequence. They
    combine with each other and with `mask`.

    Args:
        query (Tensor): Shape `(B, T, H)` or `(B, T, N, H)`.
        key (Tensor): Shape `(B, S, H)` or `(B, S, K, H)`.
        value (Tensor): Shape `(B, S, V)` or `(B, S, K, V)`.
        mask (Tensor | None): Boolean, `True` = attend, or `None`. For 3-D
            inputs it broadcasts to `(B, T, S)`; for 4-D inputs it broadcasts to
            `(B, N, T, S)`, and a 3-D `(B, T, S)` mask is shared by all heads.
            Defaults to `None`.
        is_causal: Also hide the keys after each query's
            position. `True` or `"top_left"`: query `i` sees keys
            `j <= i` (as in `keras.ops.dot_product_attention`, PyTorch and
            JAX). `"bottom_right"`: query `i` sees keys `j <= i + S - T`
            (the queries are the last `T` positions). Defaults to `False`.
        scale: Multiplies the logits. Defaults to
            `1 / sqrt(H)`.
        return_attention_scores: Also return the attention weights.
            Defaults to `False`.
        sliding_window: Local attention
            around each query's position `p` (aligned as `is_causal`
            says; top-left without it). An int `w` keeps the `w` keys
            `p - w < j <= p` (the query's own position and the `w - 1`
            before it: a causal window, as in Mistral); a pair keeps
            `p - left <= j <= p + right` (bidirectional local attention).
            Defaults to `None` (no window).
        segment_ids (Tensor | tuple[Tensor, Tensor] | None): Integer ids
            `(B, T)`, or a tuple `(query_ids (B, T), key_ids (B, S))`. Packed
            sequences: query `i` sees
            key `j` only when their ids are equal; id `0` marks padding (such
            keys are hidden, such queries get zeros). One tensor serves queries
            and keys when `T = S`. Defaults to `None`.
        alibi: Adds the linear biases of ALiBi (Press et al. 2022)
            to the logits, `-m_n |p_i - j|` with the slope `m_n` of head
            `n` (positions aligned as `is_causal` says). Defaults to
            `False`.
        logit_soft_cap: Caps the logits smoothly,
            `cap * tanh(logits / cap)` (Gemma 2), before the ALiBi bias;
            in float32 for half-precision inputs. Defaults to `None`.

    Returns:
        Tensor | tuple[Tensor, Tensor]: The output, `(B, T, V)` or
            `(B, T, N, V)`; with `return_attention_scores=True` the tuple
            `(output, weights)` with weights `(B, T, S)` or `(B, N, T, S)`.

    Examples:
        One query, two keys: the first key matches the query better and
        gets most of the weight.

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
    segments = _segment_pair(segment_ids)
    if _any_symbolic(query, key, value, mask, *segments):
        _check_inputs(query, key, value, mask)
        _kernels.structure.normalize(
            _FN,
            *_kernels.structure.lengths(query, key),
            is_causal,
            sliding_window,
            segment_ids,
            alibi,
            logit_soft_cap,
        )
        operation = _Attention(
            is_causal,
            scale,
            return_attention_scores,
            sliding_window,
            alibi,
            logit_soft_cap,
        )
        return operation(query, key, value, mask, *segments)
    query, key, value = (ops.convert_to_tensor(x) for x in (query, key, value))
    mask = _check_inputs(query, key, value, mask)
    structure = _kernels.structure.normalize(
        _FN,
        *_kernels.structure.lengths(query, key),
        is_causal,
        sliding_window,
        segment_ids,
        alibi,
        logit_soft_cap,
    )
    return _attention(
        query, key, value, mask, structure, scale, return_attention_scores
    )


def _attention(query, key, value, mask, structure, scale=None, weights=False):
    """Attention on checked inputs and a normalised structure: the
    dispatched path, or the reference with its weights (`weights=True`).
    The layers call it directly when their queries stand at a known
    offset among a static-size KV cache."""
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if mask is not None:
        mask = _expand_mask(mask, len(query.shape))  # the weights' rank
    if weights:
        return _reference(query, key, value, mask, scale, structure, True)
    return _kernels.attention(
        query, key, value, mask, structure, scale, reference=_reference
    )


def _structure(query, key, offset=None, **arguments):
    """The normalised structure of `arguments` (those of
    `scaled_dot_product_attention`) for a call on `query` and `key`; with
    `offset`, query `i` stands at position `offset + i` among the keys
    (as with a static-size KV cache). Arguments are checked by the
    caller."""
    structure = _kernels.structure.normalize(
        _FN,
        *_kernels.structure.lengths(query, key),
        arguments.get("is_causal", False),
        arguments.get("sliding_window"),
        arguments.get("segment_ids"),
        arguments.get("alibi", False),
        arguments.get("logit_soft_cap"),
    )
    if offset is not None:
        structure.offset = offset
    return structure


def _weights(query, key, mask, structure):
    """The reference weights `(B, N, T, S)` with the structure applied."""
    return _reference(query, key, None, mask, None, structure, weights=True)


def explain(
    query,
    key,
    value=None,
    mask=None,
    is_causal: bool | str = False,
    sliding_window: int | tuple[int, int] | None = None,
    segment_ids=None,
    return_attention_scores: bool = False,
    alibi: bool = False,
    logit_soft_cap: float | None = None,
):
    """Which path `scaled_dot_product_attention` takes for these arguments,
    and why.

    The report comes from the rule the dispatch itself uses, for these
    shapes and dtypes on this backend and device: the path that will run,
    the reason each faster path was refused, and how the causal, window
    and segment structure is applied on that path. Nothing is computed.

    Args:
        query (Tensor | keras.KerasTensor): A tensor, or a `keras.KerasTensor`
            of its shape, as in `scaled_dot_product_attention`.
        key (Tensor | keras.KerasTensor): As there.
        value (Tensor | keras.KerasTensor | None): Defaults to `key`.
        mask (Tensor | None): As in `scaled_dot_product_attention`.
        is_causal: As there.
        sliding_window: As there.
        segment_ids (Tensor | tuple[Tensor, Tensor] | None): As there.
        return_attention_scores: As there.
        alibi: As there.
        logit_soft_cap: As there.

    Returns:
        Explanation: Its `.path` (`"fused"`, `"chunked"` or
            `"reference"`), `.refused` (path name to reason), `.structure`;
            `print` it for a summary.

    Examples:
        >>> import keras
        >>> q = keras.KerasTensor((1, 64, 4, 16))
        >>> report = explain(q, q, return_attention_scores=True)
        >>> report.path
        'reference'
        >>> print(report.refused["fused"])
        the weights are requested; only the reference computes them
    """
    value = key if value is None else value
    mask = _check_inputs(query, key, value, mask)
    structure = _kernels.structure.normalize(
        "explain",
        *_kernels.structure.lengths(query, key),
        is_causal,
        sliding_window,
        segment_ids,
        alibi,
        logit_soft_cap,
    )
    return _explain.explain(
        query, key, value, mask, structure, return_attention_scores
    )


def _segment_pair(segment_ids):
    """`(query_ids, key_ids)`, each a tensor or `None`."""
    if isinstance(segment_ids, tuple) and len(segment_ids) == 2:
        return tuple(segment_ids)
    return segment_ids, None


def _reference(
    query,
    key,
    value,
    mask,
    scale,
    structure=None,
    with_weights=False,
    weights=False,
):
    """The reference path: the whole weight matrix, then the values, with
    the structure (a `_kernels.structure.Structure`) as a dense mask and
    bias; `weights=True` returns the weights alone."""
    if mask is not None:
        mask = _expand_mask(mask, len(query.shape))  # the weights' rank
    bias, soft_cap = None, None
    if structure is not None:
        query_length, key_length = ops.shape(query)[1], ops.shape(key)[1]
        dense = structure.dense_mask(query_length, key_length)
        if dense is not None:
            mask = merge_masks(mask, _expand_mask(dense, len(query.shape)))
        heads = 1 if len(query.shape) == 3 else query.shape[2]
        bias = structure.dense_bias(heads, query_length, key_length)
        if bias is not None and len(query.shape) == 3:
            bias = bias[:, 0]  # (1, T, S)
        soft_cap = structure.soft_cap
    probabilities = attention_weights(
        query, key, mask, scale, soft_cap=soft_cap, bias=bias
    )
    if weights:
        return probabilities
    output = attend(probabilities, value)
    return (output, probabilities) if with_weights else output


@keras.saving.register_keras_serializable(
    package="keras_attention", name="ScaledDotProductAttention"
)
class _Attention(keras.Operation):
    """`scaled_dot_product_attention` as an operation of a functional
    model: traced on `keras.Input` by its output spec, run on the path the
    dispatch picks when the model is called."""

    def __init__(
        self,
        is_causal,
        scale,
        return_attention_scores,
        sliding_window=None,
        alibi=False,
        logit_soft_cap=None,
        name=None,
    ):
        super().__init__(name=name)
        self.is_causal = is_causal
        self.scale = scale
        self.return_attention_scores = return_attention_scores
        self.sliding_window = sliding_window
        self.alibi = alibi
        self.logit_soft_cap = logit_soft_cap

    def call(self, query, key, value, mask=None, query_ids=None, key_ids=None):
        return scaled_dot_product_attention(
            query,
            key,
            value,
            mask=mask,
            is_causal=self.is_causal,
            scale=self.scale,
            return_attention_scores=self.return_attention_scores,
            sliding_window=self.sliding_window,
            segment_ids=_segment_argument(query_ids, key_ids),
            alibi=self.alibi,
            logit_soft_cap=self.logit_soft_cap,
        )

    def compute_output_spec(
        self, query, key, value, mask=None, query_ids=None, key_ids=None
    ):
        _check_inputs(query, key, value, mask)
        _kernels.structure.normalize(
            _FN,
            *_kernels.structure.lengths(query, key),
            self.is_causal,
            self.sliding_window,
            _segment_argument(query_ids, key_ids),
            self.alibi,
            self.logit_soft_cap,
        )
        output = keras.KerasTensor(
            (*query.shape[:-1], value.shape[-1]),
            dtype=keras.backend.standardize_dtype(value.dtype),
        )
        if not self.return_attention_scores:
            return output
        batch, query_length = query.shape[0], query.shape[1]
        heads = () if len(query.shape) == 3 else (query.shape[2],)
        weights = keras.KerasTensor(
            (batch, *heads, query_length, key.shape[1]),
            dtype=keras.backend.standardize_dtype(query.dtype),
        )
        return output, weights

    def get_config(self):
        return {
            "name": self.name,
            "is_causal": self.is_causal,
            "scale": self.scale,
            "return_attention_scores": self.return_attention_scores,
            "sliding_window": self.sliding_window,
            "alibi": self.alibi,
            "logit_soft_cap": self.logit_soft_cap,
        }


def _segment_argument(query_ids, key_ids):
    """`segment_ids` as the user gave it: one tensor, a pair or `None`."""
    return query_ids if key_ids is None else (query_ids, key_ids)


def _any_symbolic(*tensors) -> bool:
    return any(isinstance(x, keras.KerasTensor) for x in tensors)


def attention_weights(
    query, key, mask=None, scale=None, *, soft_cap=None, bias=None
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
    if soft_cap is not None:
        cap = ops.cast(soft_cap, compute_dtype)
        logits = cap * ops.tanh(logits / cap)
    if bias is not None:
        logits = logits + ops.cast(bias, compute_dtype)
    weights = masked_softmax(logits, mask)
    return ops.cast(weights, input_dtype)


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
    if not isinstance(mask, keras.KerasTensor):
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
