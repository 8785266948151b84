"""Masks: causal, structural and padding masks, and packed positions.

Shape legend: B batch, T query length, S key/value length, D model dim,
N query heads, K key/value heads, H head dim (query/key), V value head
dim.
"""

import keras
from keras import ops

from keras_attention import _core
from keras_attention._core import Structure
from keras_attention._core.checks import check_length


def causal_mask(query_length, key_length, offset=0):
    """A lower-triangular `(T, S)` mask: query $i$ sees the keys
    $j \\le i + \\text{offset}$.

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
    for name, length in (
        ("query_length", query_length),
        ("key_length", key_length),
    ):
        if length is None:
            raise ValueError(
                f"causal_mask: `{name}` must be a non-negative integer. "
                f"Received: {name}=None"
            )
        check_length("causal_mask", name, length)
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
    structure = Structure.from_args(
        where="structure_mask",
        query_length=query_length,
        key_length=key_length,
        is_causal=is_causal,
        sliding_window=sliding_window,
        segment_ids=segment_ids,
    )
    mask = structure.dense_mask(query_length, key_length)
    if mask is None:
        return ops.ones((1, query_length, key_length), "bool")
    return mask


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
    where = "padding_to_attention_mask"
    if not isinstance(padding_mask, keras.KerasTensor):
        try:
            padding_mask = ops.convert_to_tensor(padding_mask)
        except (TypeError, ValueError):  # no numbers at all
            raise ValueError(
                f"{where}: `padding_mask` must be boolean (B, S). "
                f"Received: padding_mask={padding_mask!r}"
            ) from None
    dtype = keras.backend.standardize_dtype(padding_mask.dtype)
    if len(padding_mask.shape) != 2 or (dtype != "bool" and "int" not in dtype):
        raise ValueError(
            f"{where}: `padding_mask` must be boolean (B, S), True for real "
            f"tokens. Received: padding_mask.shape="
            f"{tuple(padding_mask.shape)}, dtype={dtype}"
        )
    if query_length is not None:
        check_length(where, "query_length", query_length)
    mask = ops.expand_dims(ops.cast(padding_mask, "bool"), 1)  # (B, 1, S)
    if query_length is None:
        return mask
    # Broadcast by a logical and: the batch size may be unknown here.
    rows = ops.ones((1, query_length, 1), "bool")  # (1, T, 1)
    return ops.logical_and(mask, rows)  # (B, T, S)


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
    if not _core.is_tensor(segment_ids):
        _core.host_integers(where, "segment_ids", segment_ids)
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
    first = ops.ones_like(ids[:, :1], dtype="bool")  # (B, 1), also for T = 1
    starts = ops.concatenate([first, changed], axis=1)  # (B, T)
    last_start = ops.associative_scan(
        ops.maximum, ops.where(starts, index, ops.zeros_like(index)), axis=1
    )  # (B, T): the index where each token's sequence starts
    # The scan can lose the static shape inside a compiled TensorFlow step.
    return ops.reshape(ops.cast(index - last_start, "int32"), ops.shape(ids))
