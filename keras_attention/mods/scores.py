"""The score mods: functions of the logits.

Shape legend: B batch, N heads, T query length, S key length.
"""

import math

import keras
from keras import ops

from keras_attention._core import static_dim
from keras_attention._core.builtins import Alibi
from keras_attention._core.builtins import RelativeBias
from keras_attention._core.builtins import SoftCap
from keras_attention._core.checks import check_flag
from keras_attention._core.checks import positive_integer
from keras_attention._core.checks import real_number
from keras_attention.mods._common import PACKAGE
from keras_attention.mods._common import Configured
from keras_attention.mods._common import check_head_count
from keras_attention.mods._common import check_heads
from keras_attention.mods._common import tensors


@keras.saving.register_keras_serializable(package=PACKAGE)
class _SoftCap(Configured, SoftCap):
    def __init__(self, cap):
        if not (real_number(cap) and 0 < cap < math.inf):
            raise ValueError(
                "soft_cap: `cap` must be a positive finite number. "
                f"Received: cap={cap!r}"
            )
        super().__init__(float(cap))

    def __call__(self, score, batch, head, q_idx, kv_idx):
        return super().__call__(*tensors(score, batch, head, q_idx, kv_idx))

    def get_config(self):
        return {"cap": self.cap}

    def __repr__(self):
        return f"soft_cap({self.cap:g})"


def soft_cap(cap: float):
    """Caps the logits smoothly, $c \\tanh(s / c)$ with $c$ = `cap`
    (Gemma 2), as the `logit_soft_cap` argument does.

    Args:
        cap: A positive finite number.

    Returns:
        A score mod.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> score = np.array([0.5, 5.0, 50.0], "float32")
        >>> capped = soft_cap(5.0)(score, 0, 0, 0, 0)
        >>> print(np.round(keras.ops.convert_to_numpy(capped), 3))
        [0.498 3.808 5.   ]
    """
    return _SoftCap(cap)


@keras.saving.register_keras_serializable(package=PACKAGE)
class _Alibi(Configured, Alibi):
    def __init__(self, num_heads):
        super().__init__(positive_integer("alibi", "num_heads", num_heads))

    def __call__(self, score, batch, head, q_idx, kv_idx):
        score, batch, head, q_idx, kv_idx = tensors(
            score, batch, head, q_idx, kv_idx
        )
        check_heads("alibi", "num_heads", self.num_heads, head)
        return super().__call__(score, batch, head, q_idx, kv_idx)

    def get_config(self):
        return {"num_heads": self.num_heads}

    def __repr__(self):
        return f"alibi({self.num_heads})"


def alibi(num_heads: int):
    """The linear biases of ALiBi (Press et al. 2022),
    $s - m_h \\lvert q - k \\rvert$ for the logit $s$ of query position
    $q$ (`q_idx`) and key position $k$ (`kv_idx`), with the head slopes
    $m_h$ that `alibi=True` uses.

    Args:
        num_heads: The number of query heads the mod will see.

    Returns:
        A score mod.

    Examples:
        The bias of one head (slope 1/256) for one query at position 2:

        >>> import keras
        >>> import numpy as np
        >>> zeros = np.zeros((1, 1, 1, 4), "float32")
        >>> head = np.zeros((1, 1, 1, 1), "int32")
        >>> kv_idx = np.arange(4).reshape(1, 1, 1, 4)
        >>> biased = alibi(1)(zeros, 0, head, 2, kv_idx)
        >>> print(keras.ops.convert_to_numpy(biased)[0, 0] * 256)
        [[-2. -1.  0. -1.]]
    """
    return _Alibi(num_heads)


class _RelativePositionBias(RelativeBias):
    def __init__(self, table, num_buckets, max_distance, bidirectional):
        self.table = table
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional

    def __call__(self, score, batch, head, q_idx, kv_idx):
        score, batch, head, q_idx, kv_idx = tensors(
            score, batch, head, q_idx, kv_idx
        )
        heads = self.table.shape[1]
        check_heads("relative_position_bias", "table", heads, head)
        bucket = _buckets(
            kv_idx - q_idx,
            self.num_buckets,
            self.max_distance,
            self.bidirectional,
        )  # (1, 1, T, S)
        if _is_grid(bucket, head):
            # The heads asked for, then whole rows of that small table:
            # the gather (and its backward scatter) moves rows, not scalars.
            heads_table = ops.take(self.table, head[0, :, 0, 0], axis=1)
            rows = ops.take(heads_table, bucket[0, 0], axis=0)  # (T, S, N)
            bias = ops.transpose(rows, (2, 0, 1))[None]  # (1, N, T, S)
        else:  # scalars (FlexAttention) or other broadcasts
            flat = ops.reshape(self.table, (-1,))  # (num_buckets * N,)
            bias = ops.take(flat, bucket * heads + head)
        return score + ops.cast(bias, score.dtype)

    def distance_bias(self, num_heads, distance):
        heads = self.table.shape[1]
        check_head_count("relative_position_bias", "table", heads, num_heads)
        bucket = _buckets(
            distance, self.num_buckets, self.max_distance, self.bidirectional
        )  # (D,)
        rows = ops.take(self.table, bucket, axis=0)  # (D, N)
        return ops.transpose(rows[:, :num_heads])

    def __repr__(self):
        return (
            f"relative_position_bias(table, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional})"
        )


def _is_grid(bucket, head):
    """Buckets `(1, 1, T, S)` and heads `(1, N, 1, 1)`, as every path
    calls a score mod."""
    if len(bucket.shape) != 4 or len(head.shape) != 4:
        return False
    bucket_shape = [static_dim(d) for d in bucket.shape]
    head_shape = [static_dim(d) for d in head.shape]
    return (
        bucket_shape[:2] == [1, 1]
        and head_shape[0] == 1
        and head_shape[2:] == [1, 1]
    )


def relative_position_bias(
    table,
    num_buckets: int = 32,
    max_distance: int = 128,
    bidirectional: bool = True,
):
    """T5's relative position bias (Raffel et al. 2020): a learned bias
    per head for the bucket of `kv_idx - q_idx`, added to the logits.

    Distances below a quarter of the buckets (half of them without
    `bidirectional`) each get a bucket of their own; longer ones share
    logarithmically wider buckets up to `max_distance`
    (`relative_position_bucket`). The gradients of `table` flow on every
    path.

    Args:
        table (Tensor | keras.Variable): The biases, `(num_buckets, N)`.
        num_buckets: Buckets of relative positions. Defaults to `32`.
        max_distance: Distances from here on share the last bucket.
            Defaults to `128`.
        bidirectional: Separate buckets for keys before and after the
            query (an encoder); a decoder uses `False`. Defaults to
            `True`.

    Returns:
        A score mod.

    Raises:
        ValueError: if `table` is not a float tensor `(num_buckets, N)`.

    Examples:
        With eight buckets and one head, each bucket's bias is its number:
        keys before the query fall in buckets 0-3, keys after it in 4-7.

        >>> import keras
        >>> import numpy as np
        >>> table = np.arange(8, dtype="float32")[:, None]  # (8, 1)
        >>> mod = relative_position_bias(table, num_buckets=8, max_distance=8)
        >>> head = np.zeros((1, 1, 1, 1), "int32")
        >>> kv_idx = np.arange(5).reshape(1, 1, 1, 5)
        >>> zeros = np.zeros((1, 1, 1, 5), "float32")
        >>> biased = mod(zeros, 0, head, 2, kv_idx)
        >>> print(keras.ops.convert_to_numpy(biased)[0, 0])
        [[2. 1. 0. 5. 6.]]
    """
    where = "relative_position_bias"
    num_buckets = positive_integer(where, "num_buckets", num_buckets)
    max_distance = positive_integer(where, "max_distance", max_distance)
    check_flag(where, "bidirectional", bidirectional)
    bidirectional = bool(bidirectional)
    check_buckets(where, num_buckets, max_distance, bidirectional)
    shape = tuple(static_dim(d) for d in getattr(table, "shape", ()))
    dtype = (
        keras.backend.standardize_dtype(table.dtype)
        if hasattr(table, "dtype")
        else type(table).__name__
    )
    if len(shape) != 2 or shape[0] != num_buckets or "float" not in dtype:
        raise ValueError(
            f"{where}: `table` must be a float tensor of shape (num_buckets, "
            f"N) = ({num_buckets}, N). Received: table.shape={shape}, "
            f"dtype={dtype}"
        )
    return _RelativePositionBias(
        table, num_buckets, max_distance, bidirectional
    )


def check_buckets(where, num_buckets, max_distance, bidirectional):
    """T5's buckets need at least one exact distance per direction and a
    `max_distance` beyond the exact ones (else the logarithmic buckets
    divide by zero)."""
    exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    if exact < 1 or max_distance <= exact:
        raise ValueError(
            f"{where}: `num_buckets` must leave at least one exact distance "
            f"per direction (4 or more bidirectional, 2 or more otherwise) "
            f"and `max_distance` must exceed the {exact} exact ones. "
            f"Received: num_buckets={num_buckets}, "
            f"max_distance={max_distance}, bidirectional={bidirectional}"
        )


def relative_position_bucket(
    relative_position, num_buckets=32, max_distance=128, bidirectional=True
):
    """T5's bucket of each relative position `kv_idx - q_idx`, int32.

    With `bidirectional`, half of the buckets are for keys after the
    query and half for the others. In each direction, half of its buckets
    hold the exact distances (`0 .. num_buckets / 4 - 1` with
    `bidirectional`, `0 .. num_buckets / 2 - 1` without), the others
    distances up to `max_distance` on a logarithmic scale; longer
    distances share the direction's last bucket.

    Args:
        relative_position (Tensor): Integer `kv_idx - q_idx`, any shape.
        num_buckets (int): Defaults to `32`.
        max_distance (int): Defaults to `128`.
        bidirectional (bool): Defaults to `True`.

    Returns:
        Tensor: int32 buckets, of `relative_position`'s shape.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> buckets = relative_position_bucket(
        ...     np.array([-200, -3, -1, 0, 1, 3, 200]), num_buckets=8,
        ...     max_distance=20)
        >>> print(keras.ops.convert_to_numpy(buckets))
        [3 2 1 0 5 6 7]
    """
    where = "relative_position_bucket"
    num_buckets = positive_integer(where, "num_buckets", num_buckets)
    max_distance = positive_integer(where, "max_distance", max_distance)
    check_flag(where, "bidirectional", bidirectional)
    check_buckets(where, num_buckets, max_distance, bidirectional)
    return _buckets(
        relative_position, num_buckets, max_distance, bool(bidirectional)
    )


def _buckets(relative_position, num_buckets, max_distance, bidirectional):
    """`relative_position_bucket` of arguments checked once, where the
    mod was made (it runs once per block)."""
    relative_position = ops.cast(relative_position, "int32")
    bucket = ops.zeros_like(relative_position)
    distance = -relative_position  # T5's `n`: positive for earlier keys
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + ops.cast(distance < 0, "int32") * num_buckets
        distance = ops.abs(distance)
    else:
        distance = ops.maximum(distance, 0)
    exact = num_buckets // 2
    scaled = ops.log(
        ops.cast(ops.maximum(distance, 1), "float32") / exact
    ) / math.log(max_distance / exact)
    large = exact + ops.cast(scaled * (num_buckets - exact), "int32")
    large = ops.minimum(large, num_buckets - 1)
    return bucket + ops.where(distance < exact, distance, large)
