"""Input checks shared by the layers: clear `ValueError`s, written once."""

import keras
import numpy as np
from keras import ops

from keras_attention import _core
from keras_attention import functional
from keras_attention._core.checks import check_flag as check_flag
from keras_attention._core.checks import finite_number
from keras_attention._core.checks import real_number
from keras_attention._kernels import static_dim
from keras_attention._kernels import static_int


def positive_int(value) -> bool:
    """Whether `value` is a Python or NumPy integer (not a bool) greater
    than zero."""
    return (
        isinstance(value, (int, np.integer))
        and not isinstance(value, (bool, np.bool_))
        and value > 0
    )


def check_positive_int(where: str, name: str, value, optional=False):
    """Raises unless `value` is a positive int (or `None` if `optional`)."""
    if optional and value is None:
        return
    if not positive_int(value):
        raise ValueError(
            f"{where}: `{name}` must be a positive integer. "
            f"Received: {name}={value!r}"
        )


def explain_size(where: str, name: str, value, letter: str):
    """`(batch, length)` from a layer's `explain(length, key_length)`.

    An int is the length, with no batch (`None`). A tensor, a
    `keras.KerasTensor` or a shape `(B, T, D)` gives its dim 1 as the
    length and its dim 0 as the batch (`None` where unknown). Anything
    else raises a `ValueError` naming `name` and what it received.
    """
    received = repr(value)
    if isinstance(value, (int, np.integer)) and not isinstance(
        value, (bool, np.bool_)
    ):
        if value > 0:
            return None, int(value)
    elif not isinstance(value, (str, bytes)):
        shape = getattr(value, "shape", value)
        try:
            dims = tuple(None if d is None else static_dim(d) for d in shape)
        except TypeError:  # neither a tensor nor a shape
            dims = None
        if dims is not None and len(dims) == 3 and positive_int(dims[1]):
            return dims[0], dims[1]
        if hasattr(value, "shape"):
            received = f"a tensor of shape {dims}"
    raise ValueError(
        f"{where}: `{name}` must be a positive int ({letter}), or a tensor "
        f"or a shape (B, {letter}, D) with a known {letter}. "
        f"Received: {name}={received}"
    )


def check_head_arguments(
    where: str,
    num_heads,
    key_dim=None,
    value_dim=None,
    num_key_value_heads=None,
    dropout=0.0,
    use_qk_norm=False,
    sliding_window=None,
    alibi=False,
    logit_soft_cap=None,
    use_bias=True,
    use_rotary=False,
):
    """The constructor arguments of multi-head attention (the layers and
    the blocks), checked before anything is built."""
    check_positive_int(where, "num_heads", num_heads)
    for name, flag in (
        ("use_qk_norm", use_qk_norm),
        ("use_bias", use_bias),
        ("use_rotary", use_rotary),
    ):
        check_flag(where, name, flag)
    for name, value in (
        ("key_dim", key_dim),
        ("value_dim", value_dim),
        ("num_key_value_heads", num_key_value_heads),
    ):
        check_positive_int(where, name, value, optional=True)
    if num_heads % (num_key_value_heads or num_heads):
        raise ValueError(
            f"{where}: `num_heads` must be a multiple of "
            "`num_key_value_heads`. Received: "
            f"num_heads={num_heads}, "
            f"num_key_value_heads={num_key_value_heads}"
        )
    _core.Structure.from_args(
        where=where,
        sliding_window=sliding_window,
        alibi=alibi,
        logit_soft_cap=logit_soft_cap,
    )  # checks the structural arguments
    check_dropout(where, dropout)


def head_dim(where, name, shape, num_heads, key_dim, use_rotary=False):
    """The head dim of multi-head attention over features of `shape`
    (`key_dim`, else the model dim split in `num_heads`), even for rotary
    embeddings; `name` is the argument `shape` is of."""
    model_dim = shape[-1]
    if key_dim is None and model_dim % num_heads:
        raise ValueError(
            f"{where}: the model dim must be divisible by `num_heads` when "
            f"`key_dim` is not given. Received: {name}.shape={tuple(shape)}, "
            f"num_heads={num_heads}"
        )
    dim = key_dim or model_dim // num_heads
    if use_rotary and dim % 2:
        raise ValueError(
            f"{where}: `use_rotary=True` needs an even head dim. "
            f"Received: head dim {dim} (key_dim={key_dim}, "
            f"{name}.shape={tuple(shape)}, num_heads={num_heads})"
        )
    return dim


def check_wavelength(where: str, max_wavelength) -> float:
    """`max_wavelength` of sinusoidal or rotary positions: a finite
    positive number."""
    value = finite_number(where, "max_wavelength", max_wavelength)
    if value <= 0:
        raise ValueError(
            f"{where}: `max_wavelength` must be positive. "
            f"Received: max_wavelength={max_wavelength!r}"
        )
    return value


def check_dropout(where: str, dropout):
    """`dropout` is a rate: a real number in [0, 1)."""
    if not (real_number(dropout) and 0.0 <= dropout < 1.0):
        raise ValueError(
            f"{where}: `dropout` must be a number in [0, 1). "
            f"Received: dropout={dropout!r}"
        )


def padding_of_keys(where: str, value_mask, key_mask, shape):
    """The keys' padding `(B, S)`: `value_mask` and `key_mask` (Keras's
    implicit masks of `value` and `key`, as Keras's `MultiHeadAttention`
    reads both), each checked, combined; `None` without either."""
    check_mask(where, "value_mask", value_mask, shape)
    check_mask(where, "key_mask", key_mask, shape)
    if key_mask is None:
        return value_mask
    if value_mask is None:
        return key_mask
    return ops.logical_and(
        ops.cast(value_mask, "bool"), ops.cast(key_mask, "bool")
    )


def check_built_dim(where: str, name: str, tensor, expected: int | None):
    """`tensor` holds floating-point features, and its last dim, where
    known, is the `expected` one a layer was built with (if not `None`)."""
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    if "float" not in dtype:
        raise ValueError(
            f"{where}: `{name}` must be a floating-point tensor of features. "
            f"Received: {name}.dtype={dtype}"
        )
    received = static_dim(tensor.shape[-1])
    if None not in (received, expected) and received != expected:
        raise ValueError(
            f"{where}: `{name}` must have the feature dim {expected} it was "
            f"built with. Received: {name}.shape={tuple(tensor.shape)}"
        )


def check_integer_scalar(where: str, name: str, value):
    """`value` must be one integer: an int, a NumPy integer or a 0-d
    integer array or tensor (traced or not)."""
    if isinstance(value, (bool, np.bool_)):
        received = repr(value)
    elif isinstance(value, (int, np.integer)):
        return
    elif hasattr(value, "shape") and hasattr(value, "dtype"):
        dtype = keras.backend.standardize_dtype(value.dtype)
        try:
            shape = tuple(value.shape)
        except ValueError:  # a graph tensor of unknown rank
            return
        if shape == () and "int" in dtype:
            return
        received = f"a {dtype} tensor of shape {shape}"
    else:
        received = repr(value)
    raise ValueError(
        f"{where}: `{name}` must be an integer scalar (an int or a 0-d "
        f"integer tensor). Received: {name}={received}"
    )


def check_start_index(where: str, start_index):
    """`start_index` is an integer scalar; a known one (an int, a NumPy
    integer, an eager tensor) must not be negative; a traced one is used
    as given."""
    check_integer_scalar(where, "start_index", start_index)
    value = static_int(start_index)
    if value is not None and value < 0:
        raise ValueError(
            f"{where}: `start_index` must be >= 0. "
            f"Received: start_index={value}"
        )


def check_index_range(where, name, index, length, limit, what):
    """`index ... index + length - 1` must lie in `[0, limit)`.

    A known index out of range raises a `ValueError` naming `name`, the
    positions and `limit` (`what` says what the limit is). A traced index
    (or one on an accelerator, see `static_int`) is not checked: it is
    clipped to `[0, limit - length]`, so that the last positions are used,
    the same on every backend (as XLA's `dynamic_update_slice` clips).
    Returns the index to use: a Python int when it is known.
    """
    check_integer_scalar(where, name, index)
    value = static_int(index)
    length, limit = static_dim(length), static_dim(limit)
    if limit is None:
        return index
    if length is not None and length > limit:
        raise ValueError(
            f"{where}: {length} positions do not fit {what} ({limit} "
            f"positions) at any index. Received: {name}={index}"
        )
    if value is not None:
        if length is not None and not 0 <= value <= limit - length:
            raise ValueError(
                f"{where}: positions {value}..{value + length - 1} do not "
                f"fit {what} ({limit} positions). Received: {name}={value}"
            )
        return value
    if length is None:
        return index
    high = max(limit - length, 0)
    # Not `ops.clip`: PyTorch's ONNX exporter (torch 2.13) writes two clips
    # of one input with equal bounds as a graph that reads an undefined
    # value (the decoding step clips its index twice).
    return ops.where(index < 0, 0, ops.where(index > high, high, index))


def check_mask(where: str, name: str, mask, expected):
    """`check_shape` for a boolean (or 0/1 integer) mask.

    Float masks are refused: an additive mask (0 for keep, -inf for drop)
    cast to bool would be read backwards, a silent wrong answer.
    """
    if mask is None:
        return
    if not hasattr(mask, "shape"):  # a nested list, or no mask at all
        try:
            array = np.asarray(mask)
        except ValueError:  # ragged
            array = np.asarray(None)
        if array.dtype.kind not in "biu":
            raise ValueError(
                f"{where}: `{name}` must be a boolean tensor (True = attend). "
                f"Received: {name}={mask!r}"
            )
        mask = array
    dtype = getattr(mask, "dtype", None)
    if dtype is not None:
        dtype = keras.backend.standardize_dtype(dtype)
        if dtype != "bool" and "int" not in dtype:
            raise ValueError(
                f"{where}: `{name}` must be boolean (True = attend) or "
                "0/1 integers, not an additive float mask. "
                f"Received: {name}.dtype={dtype}"
            )
    check_shape(where, name, mask, expected)


def check_attention_mask(where: str, name: str, mask, expected):
    """`check_mask` for an attention mask of `expected` `(B, T, S)`.

    As Keras's `MultiHeadAttention` does, a mask passes if it broadcasts
    to `(B, T, S)`: one shared by the batch, `(T, S)` or `(1, T, S)`, or
    one with a dim of 1 elsewhere, such as `(B, 1, S)`. Pass it through
    `as_attention_mask` before use.
    """
    if mask is None:
        return
    shape = tuple(static_dim(d) for d in mask.shape)
    expected = tuple(map(static_dim, expected))
    if len(shape) in (2, 3) and all(
        a is None or b is None or a in (1, b)
        for a, b in zip(shape[::-1], expected[::-1], strict=False)
    ):
        check_mask(where, name, mask, (None,) * len(shape))  # the dtype
        return
    raise ValueError(
        f"{where}: `{name}` must have shape (B, T, S)={expected} or one "
        "that broadcasts to it, such as (T, S) or (B, 1, S). "
        f"Received: {name}.shape={shape}"
    )


def as_attention_mask(mask, key_length):
    """A mask `check_attention_mask` passed, as a boolean `(B|1, T|1, S)`
    tensor: the batch axis added to a `(T, S)` mask, and a key axis of 1
    broadcast to the `key_length` keys, which the attention paths slice.
    """
    if mask is None:
        return None
    mask = ops.cast(mask, "bool")
    if len(mask.shape) == 2:
        mask = ops.expand_dims(mask, 0)  # (1, T, S)
    if static_dim(mask.shape[-1]) == 1 and static_dim(key_length) != 1:
        mask = ops.logical_and(mask, ops.ones((1, 1, key_length), "bool"))
    return mask


def check_shape(where: str, name: str, tensor, expected):
    """Static check that `tensor` has the rank and known dims of `expected`.

    `None` in either shape matches anything; `tensor=None` passes.
    """
    if tensor is None:
        return
    shape = tuple(static_dim(d) for d in tensor.shape)
    ok = len(shape) == len(expected) and all(
        a is None or b is None or a == b
        for a, b in zip(shape, map(static_dim, expected), strict=True)
    )
    if not ok:
        raise ValueError(
            f"{where}: `{name}` must have shape {tuple(expected)}. "
            f"Received: {name}.shape={shape}"
        )


def check_cache_source(where: str, cache, cache_name="cache", **sources):
    """A source given along with a cross-attention cache `(B, 2, S, K, H)`
    has its length `S`: the cache, not the source, is attended to, and a
    cache of another source would be used without a word. (The batch may
    differ: a beam search may keep a source of B rows while the cache
    holds one for every beam.)"""
    expected = static_dim(cache.shape[2])
    for name, source in sources.items():
        if source is None or len(source.shape) < 2:
            continue
        received = static_dim(source.shape[1])
        if None not in (received, expected) and received != expected:
            raise ValueError(
                f"{where}: `{name}` given with `{cache_name}` must have the "
                f"cache's source length {expected}. Received: "
                f"{name}.shape={tuple(source.shape)}, "
                f"{cache_name}.shape={tuple(cache.shape)}"
            )


def check_batch_and_length(where: str, query_shape, value_shape, key_shape):
    """Queries, keys and values share the batch; keys and values the length."""
    pairs = [
        (query_shape[0], value_shape[0]),
        (key_shape[0], value_shape[0]),
        (key_shape[1], value_shape[1]),
    ]
    for a, b in (map(static_dim, pair) for pair in pairs):
        if a is not None and b is not None and a != b:
            raise ValueError(
                f"{where}: the batch sizes of `query`, `key` and `value` and "
                "the lengths of `key` and `value` must match. Received: "
                f"query.shape={tuple(query_shape)}, "
                f"value.shape={tuple(value_shape)}, "
                f"key.shape={tuple(key_shape)}"
            )


def explicit_positions(where, inputs, positions, segment_ids, start_index=0):
    """The positions `(B, T)` a position layer uses instead of
    `start_index + arange(T)`: `positions` as given, or those of
    `functional.segment_positions(segment_ids)`; `None` without either.

    Positions are used as int32: known positions below 0 or beyond int32
    are refused (they would wrap into others).
    """
    explicit = positions is not None or segment_ids is not None
    if explicit and static_int(start_index) not in (0, None):
        raise ValueError(
            f"{where}: `start_index` cannot be combined with `positions` or "
            f"`segment_ids`. Received: start_index={start_index}"
        )
    if positions is not None and segment_ids is not None:
        raise ValueError(
            f"{where}: pass `positions` or `segment_ids`, not both. "
            "Received: both positions and segment_ids"
        )
    given, name = (
        (positions, "positions")
        if positions is not None
        else (segment_ids, "segment_ids")
    )
    if given is None:
        return None
    if not _core.is_tensor(given):
        _core.host_integers(where, name, given)
        given = ops.convert_to_tensor(given)
    dtype = keras.backend.standardize_dtype(given.dtype)
    expected = (static_dim(inputs.shape[0]), static_dim(inputs.shape[1]))
    shape = tuple(static_dim(d) for d in given.shape)
    if (
        "int" not in dtype
        or len(shape) != 2
        or any(a is not None and b is not None and a != b
               for a, b in zip(shape, expected, strict=True))
    ):  # fmt: skip
        raise ValueError(
            f"{where}: `{name}` must be integers of shape (B, T)={expected}. "
            f"Received: {name}.shape={shape}, dtype={dtype}"
        )
    if positions is None:
        return functional.segment_positions(given)
    lowest = static_int(ops.min(given))
    if lowest is not None and lowest < 0:
        raise ValueError(
            f"{where}: `positions` must be >= 0. "
            f"Received: min(positions)={lowest}"
        )
    highest = static_int(ops.max(given))
    if highest is not None and highest > np.iinfo("int32").max:
        raise ValueError(
            f"{where}: `positions` must fit in int32. "
            f"Received: max(positions)={highest}"
        )
    return ops.cast(given, "int32")
