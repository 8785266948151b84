"""Masking: the dtype logits are computed in, the one masking constant,
the masked softmax and the combination of masks."""

import keras
import numpy as np
from keras import ops

HALF_DTYPES = ("float16", "bfloat16")


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
    return "float32" if dtype in HALF_DTYPES else dtype


def large_negative(dtype) -> float:
    """A finite, dtype-aware stand-in for minus infinity in masked logits.

    Half of the most negative finite value of `dtype`: large enough that
    `exp(masked - max)` underflows to exactly zero, finite so that a row in
    which every logit is masked never produces `inf - inf = NaN`. Every
    path of the library masks with this value.

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
    input_dtype = logits.dtype
    logits = ops.cast(logits, logits_dtype(input_dtype))
    if mask is None:
        return ops.cast(_softmax(logits, axis), input_dtype)
    mask = ops.cast(mask, "bool")
    weights = softmax_of_visible(logits, mask, axis)
    weights = ops.where(mask, weights, ops.zeros_like(weights))
    return ops.cast(weights, input_dtype)


def softmax_of_visible(logits, mask, axis=-1):
    """The softmax of `masked_softmax` before its rows with no visible
    entry are zeroed: hidden entries (`mask` `False`) are replaced by
    `large_negative` and get exactly zero weight beside any visible one;
    a row with none visible comes out uniform, and the caller zeroes it
    (`reference` does so through each row's flag)."""
    fill = ops.full((), large_negative(logits.dtype), dtype=logits.dtype)
    return _softmax(ops.where(mask, logits, fill), axis)


def _softmax(logits, axis):
    """`ops.softmax`, written out where the axis has size 1 as traced:
    Keras's softmax warns about such an axis, and PyTorch's ONNX exporter
    traces a length given as `None` as 1, so the graph must still be a
    softmax at any length (weights of one would be summed values)."""
    if logits.shape[axis] != 1:
        return ops.softmax(logits, axis=axis)
    exp = ops.exp(logits - ops.max(logits, axis=axis, keepdims=True))
    return exp / ops.sum(exp, axis=axis, keepdims=True)


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


def expand_mask(mask, rank):
    """Gives a broadcastable mask the weights' rank (a 3-D mask for 4-D
    weights is `(B, T, S)`, shared by the heads)."""
    while len(mask.shape) < rank:
        axis = 1 if rank == 4 and len(mask.shape) == 3 else 0
        mask = ops.expand_dims(mask, axis)
    return mask
