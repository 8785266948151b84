"""Attention patterns as functions: mask mods, score mods and block masks.

A mask mod says which keys a query may see; a score mod rewrites the
logits. Pass them to `functional.scaled_dot_product_attention`
(`mask_mod=`, `score_mod=`); every path runs them, and the blockwise path
skips the blocks a mask mod leaves empty.

$$\\operatorname{mask\\_mod}(b, h, q, k) \\in \\{\\text{True}, \\text{False}\\}
\\qquad
\\operatorname{score\\_mod}(s, b, h, q, k) = s'$$

Both are called with int32 index tensors that broadcast to `(B, N, T, S)`
(`batch` `(B, 1, 1, 1)`, `head` `(1, N, 1, 1)`, `q_idx` `(1, 1, T, 1)`,
`kv_idx` `(1, 1, 1, S)`) or with any block of that grid, so a mod must be
elementwise in `keras.ops`. The mods here cover the patterns of the
literature; write a new one as a function of the same four tensors:

```python
def prefix_or_causal(batch, head, q_idx, kv_idx):
    return (kv_idx < 16) | (kv_idx <= q_idx)
```

Shape legend: B batch, N heads, T query length, S key length.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_attention import _kernels
from keras_attention._core import alibi_slopes
from keras_attention._core import is_tensor
from keras_attention._core import static_dim
from keras_attention._core.mods import BlockTable
from keras_attention._core.structure import window as check_window

_PACKAGE = "keras_attention"


class _Configured:
    """A mod made again from its config (`keras.saving`)."""

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class _Causal(_Configured):
    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = _tensors(batch, head, q_idx, kv_idx)
        return kv_idx <= q_idx

    def get_config(self):
        return {}

    def __repr__(self):
        return "causal()"


def causal():
    """Causal attention: query `i` sees the keys `j <= i`.

    Returns:
        A mask mod.

    Examples:
        >>> import keras
        >>> mod = causal()
        >>> q = keras.ops.reshape(keras.ops.arange(3), (1, 1, 3, 1))
        >>> k = keras.ops.reshape(keras.ops.arange(3), (1, 1, 1, 3))
        >>> print(keras.ops.convert_to_numpy(mod(0, 0, q, k))[0, 0])
        [[ True False False]
         [ True  True False]
         [ True  True  True]]
    """
    return _Causal()


@keras.saving.register_keras_serializable(package=_PACKAGE)
class _SlidingWindow(_Configured):
    def __init__(self, window):
        self.window = window
        self.left, self.right = check_window("sliding_window", window)

    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = _tensors(batch, head, q_idx, kv_idx)
        return ops.logical_and(
            kv_idx >= q_idx - self.left, kv_idx <= q_idx + self.right
        )

    def get_config(self):
        return {"window": self.window}

    def __repr__(self):
        return f"sliding_window({self.window!r})"


def sliding_window(window: int | tuple[int, int]):
    """Local attention, as the `sliding_window` argument of
    `scaled_dot_product_attention` (top-left aligned).

    Args:
        window: An int `w` keeps the `w` keys `i - w < j <= i` (a causal
            window, as in Mistral); a pair `(left, right)` keeps
            `i - left <= j <= i + right`.

    Returns:
        A mask mod.

    Raises:
        ValueError: if `window` is not a positive int or a pair of
            non-negative ints.

    Examples:
        >>> q = keras.ops.arange(5)[:, None]  # query indices (T, 1)
        >>> k = keras.ops.arange(5)[None, :]  # key indices (1, S)
        >>> mask = sliding_window((1, 1))(0, 0, q, k)
        >>> print(keras.ops.convert_to_numpy(mask).astype(int))
        [[1 1 0 0 0]
         [1 1 1 0 0]
         [0 1 1 1 0]
         [0 0 1 1 1]
         [0 0 0 1 1]]
    """
    return _SlidingWindow(window)


class _Document:
    def __init__(self, query_ids, key_ids):
        self.query_ids, self.key_ids = query_ids, key_ids

    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = _tensors(batch, head, q_idx, kv_idx)
        query = _gather_rows(self.query_ids, batch, q_idx)
        key = _gather_rows(self.key_ids, batch, kv_idx)
        return ops.logical_and(ops.equal(query, key), ops.not_equal(key, 0))

    def __repr__(self):
        return "document(segment_ids)"


def document(segment_ids):
    """Packed documents: a query sees the keys of its own document.

    Args:
        segment_ids (Tensor | tuple[Tensor, Tensor]): Integer document ids
            `(B, T)` for queries and keys alike, or a pair `(query_ids
            (B, T), key_ids (B, S))`. Equal non-zero ids see each other;
            id `0` marks padding (its keys are hidden, its queries get
            zeros).

    Returns:
        A mask mod.

    Raises:
        ValueError: if the ids are not integer tensors of rank 2 with one
            batch size.

    Examples:
        Two documents packed in one row, then padding:

        >>> q = keras.ops.arange(5)[:, None]  # query indices (T, 1)
        >>> k = keras.ops.arange(5)[None, :]  # key indices (1, S)
        >>> mod = document(np.array([[1, 1, 2, 2, 0]]))
        >>> print(keras.ops.convert_to_numpy(mod(0, 0, q, k)).astype(int))
        [[1 1 0 0 0]
         [1 1 0 0 0]
         [0 0 1 1 0]
         [0 0 1 1 0]
         [0 0 0 0 0]]
    """
    where = "document"
    if isinstance(segment_ids, (tuple, list)):
        if len(segment_ids) != 2:
            raise ValueError(
                f"{where}: `segment_ids` must be one `(B, T)` tensor or a "
                "pair `(query_ids, key_ids)`. Received: "
                f"{len(segment_ids)} tensors"
            )
        query_ids, key_ids = segment_ids
    else:
        query_ids = key_ids = segment_ids
    query_ids = _integers(where, "segment_ids", query_ids, 2)
    key_ids = _integers(where, "segment_ids", key_ids, 2)
    batches = {static_dim(x.shape[0]) for x in (query_ids, key_ids)} - {None}
    if len(batches) > 1:
        raise ValueError(
            f"{where}: the query and key ids must have one batch size. "
            f"Received: shapes {tuple(query_ids.shape)} and "
            f"{tuple(key_ids.shape)}"
        )
    return _Document(query_ids, key_ids)


class _PrefixLM:
    def __init__(self, prefix_lengths):
        self.prefix_lengths = prefix_lengths

    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = _tensors(batch, head, q_idx, kv_idx)
        prefix = ops.take(self.prefix_lengths, batch)  # (B, 1, 1, 1)
        return ops.logical_or(kv_idx < prefix, kv_idx <= q_idx)

    def __repr__(self):
        return "prefix_lm(prefix_lengths)"


def prefix_lm(prefix_lengths):
    """Prefix language modelling (T5, PaliGemma): the keys before the
    prefix length are visible to every query, the rest causally.

    Args:
        prefix_lengths (Tensor): Integer prefix lengths, shape `(B,)`.

    Returns:
        A mask mod.

    Raises:
        ValueError: if `prefix_lengths` is not an integer tensor `(B,)`.

    Examples:
        >>> q = keras.ops.arange(5)[:, None]  # query indices (T, 1)
        >>> k = keras.ops.arange(5)[None, :]  # key indices (1, S)
        >>> mod = prefix_lm(np.array([2]))
        >>> print(keras.ops.convert_to_numpy(mod(0, 0, q, k)).astype(int))
        [[1 1 0 0 0]
         [1 1 0 0 0]
         [1 1 1 0 0]
         [1 1 1 1 0]
         [1 1 1 1 1]]
    """
    lengths = _integers("prefix_lm", "prefix_lengths", prefix_lengths, 1)
    return _PrefixLM(ops.cast(lengths, "int32"))


@keras.saving.register_keras_serializable(package=_PACKAGE)
class _Chunked(_Configured):
    def __init__(self, chunk_size):
        self.chunk_size = _positive_int("chunked", "chunk_size", chunk_size)

    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = _tensors(batch, head, q_idx, kv_idx)
        size = self.chunk_size
        return ops.equal(q_idx // size, kv_idx // size)

    def get_config(self):
        return {"chunk_size": self.chunk_size}

    def __repr__(self):
        return f"chunked({self.chunk_size})"


def chunked(chunk_size: int):
    """Chunked local attention (Llama 4): a query sees the keys of its own
    chunk of `chunk_size` positions. Combine with `causal()` for causal
    chunks.

    Args:
        chunk_size: Positions per chunk, at least 1.

    Returns:
        A mask mod.

    Raises:
        ValueError: if `chunk_size` is not a positive int.

    Examples:
        >>> q = keras.ops.arange(5)[:, None]  # query indices (T, 1)
        >>> k = keras.ops.arange(5)[None, :]  # key indices (1, S)
        >>> mask = chunked(2)(0, 0, q, k)
        >>> print(keras.ops.convert_to_numpy(mask).astype(int))
        [[1 1 0 0 0]
         [1 1 0 0 0]
         [0 0 1 1 0]
         [0 0 1 1 0]
         [0 0 0 0 1]]
    """
    return _Chunked(chunk_size)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class _SinkTokens(_Configured):
    def __init__(self, num_sinks):
        self.num_sinks = _positive_int("sink_tokens", "num_sinks", num_sinks)

    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = _tensors(batch, head, q_idx, kv_idx)
        return kv_idx < self.num_sinks + ops.zeros_like(q_idx)

    def get_config(self):
        return {"num_sinks": self.num_sinks}

    def __repr__(self):
        return f"sink_tokens({self.num_sinks})"


def sink_tokens(num_sinks: int):
    """The first `num_sinks` keys, visible to every query (attention
    sinks, Xiao et al. 2024, StreamingLLM). Combine with a window:
    `or_masks(sink_tokens(4), sliding_window(512))`.

    Args:
        num_sinks: Number of sink keys, at least 1.

    Returns:
        A mask mod.

    Raises:
        ValueError: if `num_sinks` is not a positive int.

    Examples:
        >>> q = keras.ops.arange(5)[:, None]  # query indices (T, 1)
        >>> k = keras.ops.arange(5)[None, :]  # key indices (1, S)
        >>> mod = or_masks(sink_tokens(1), sliding_window(2))
        >>> print(keras.ops.convert_to_numpy(mod(0, 0, q, k)).astype(int))
        [[1 0 0 0 0]
         [1 1 0 0 0]
         [1 1 1 0 0]
         [1 0 1 1 0]
         [1 0 0 1 1]]
    """
    return _SinkTokens(num_sinks)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class _Combined:
    def __init__(self, mods, conjunction):
        self.mods, self.conjunction = list(mods), conjunction

    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = _tensors(batch, head, q_idx, kv_idx)
        combine = ops.logical_and if self.conjunction else ops.logical_or
        result = None
        for mod in self.mods:
            visible = mod(batch, head, q_idx, kv_idx)
            result = visible if result is None else combine(result, visible)
        return result

    def get_config(self):
        return {
            "mods": [keras.saving.serialize_keras_object(m) for m in self.mods],
            "conjunction": self.conjunction,
        }

    @classmethod
    def from_config(cls, config):
        mods = [
            keras.saving.deserialize_keras_object(m) for m in config["mods"]
        ]
        return cls(mods, config["conjunction"])

    def __repr__(self):
        name = "and_masks" if self.conjunction else "or_masks"
        return f"{name}({', '.join(map(repr, self.mods))})"


def and_masks(*mods):
    """A key is visible where every mask mod allows it.

    Args:
        *mods: Mask mods, at least one.

    Returns:
        A mask mod.

    Examples:
        Causal attention inside chunks of two:

        >>> q = keras.ops.arange(5)[:, None]  # query indices (T, 1)
        >>> k = keras.ops.arange(5)[None, :]  # key indices (1, S)
        >>> mod = and_masks(causal(), chunked(2))
        >>> print(keras.ops.convert_to_numpy(mod(0, 0, q, k)).astype(int))
        [[1 0 0 0 0]
         [1 1 0 0 0]
         [0 0 1 0 0]
         [0 0 1 1 0]
         [0 0 0 0 1]]
    """
    return _Combined(_callables("and_masks", mods), conjunction=True)


def or_masks(*mods):
    """A key is visible where any mask mod allows it.

    Args:
        *mods: Mask mods, at least one.

    Returns:
        A mask mod.

    Examples:
        A two-token prefix seen by every query, the rest causal:

        >>> q = keras.ops.arange(5)[:, None]  # query indices (T, 1)
        >>> k = keras.ops.arange(5)[None, :]  # key indices (1, S)
        >>> mod = or_masks(causal(), lambda b, h, q_idx, kv_idx: kv_idx < 2)
        >>> print(keras.ops.convert_to_numpy(mod(0, 0, q, k)).astype(int))
        [[1 1 0 0 0]
         [1 1 0 0 0]
         [1 1 1 0 0]
         [1 1 1 1 0]
         [1 1 1 1 1]]
    """
    return _Combined(_callables("or_masks", mods), conjunction=False)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class _SoftCap(_Configured):
    def __init__(self, cap):
        if isinstance(cap, bool) or not (
            isinstance(cap, (int, float)) and 0 < cap < math.inf
        ):
            raise ValueError(
                "soft_cap: `cap` must be a positive finite number. "
                f"Received: cap={cap!r}"
            )
        self.cap = float(cap)

    def __call__(self, score, batch, head, q_idx, kv_idx):
        score, batch, head, q_idx, kv_idx = _tensors(
            score, batch, head, q_idx, kv_idx
        )
        return self.cap * ops.tanh(score / self.cap)

    def get_config(self):
        return {"cap": self.cap}

    def __repr__(self):
        return f"soft_cap({self.cap:g})"


def soft_cap(cap: float):
    """Caps the logits smoothly, `cap * tanh(score / cap)` (Gemma 2), as
    the `logit_soft_cap` argument does.

    Args:
        cap: A positive finite number.

    Returns:
        A score mod.

    Examples:
        >>> score = np.array([0.5, 5.0, 50.0], "float32")
        >>> capped = soft_cap(5.0)(score, 0, 0, 0, 0)
        >>> print(np.round(keras.ops.convert_to_numpy(capped), 3))
        [0.498 3.808 5.   ]
    """
    return _SoftCap(cap)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class _Alibi(_Configured):
    def __init__(self, num_heads):
        self.num_heads = _positive_int("alibi", "num_heads", num_heads)
        self.slopes = np.asarray(alibi_slopes(self.num_heads), "float32")

    def __call__(self, score, batch, head, q_idx, kv_idx):
        score, batch, head, q_idx, kv_idx = _tensors(
            score, batch, head, q_idx, kv_idx
        )
        _check_heads("alibi", "num_heads", self.num_heads, head)
        slopes = ops.take(ops.convert_to_tensor(self.slopes), head)
        distance = ops.cast(ops.abs(q_idx - kv_idx), score.dtype)
        return score - ops.cast(slopes, score.dtype) * distance

    def get_config(self):
        return {"num_heads": self.num_heads}

    def __repr__(self):
        return f"alibi({self.num_heads})"


def alibi(num_heads: int):
    """The linear biases of ALiBi (Press et al. 2022),
    `score - m_h |q_idx - kv_idx|`, with the head slopes `m_h` that
    `alibi=True` uses.

    Args:
        num_heads: The number of query heads the mod will see.

    Returns:
        A score mod.

    Examples:
        The bias of one head (slope 1/256) for one query at position 2:

        >>> zeros = np.zeros((1, 1, 1, 4), "float32")
        >>> head = np.zeros((1, 1, 1, 1), "int32")
        >>> kv_idx = np.arange(4).reshape(1, 1, 1, 4)
        >>> biased = alibi(1)(zeros, 0, head, 2, kv_idx)
        >>> print(keras.ops.convert_to_numpy(biased)[0, 0] * 256)
        [[-2. -1.  0. -1.]]
    """
    return _Alibi(num_heads)


class _RelativePositionBias:
    def __init__(self, table, num_buckets, max_distance, bidirectional):
        self.table = table
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional

    def __call__(self, score, batch, head, q_idx, kv_idx):
        score, batch, head, q_idx, kv_idx = _tensors(
            score, batch, head, q_idx, kv_idx
        )
        heads = self.table.shape[1]
        _check_heads("relative_position_bias", "table", heads, head)
        bucket = relative_position_bucket(
            kv_idx - q_idx,
            self.num_buckets,
            self.max_distance,
            self.bidirectional,
        )  # (1, 1, T, S)
        flat = ops.reshape(self.table, (-1,))  # (num_buckets * N,)
        bias = ops.take(flat, bucket * heads + head)  # (1, N, T, S)
        return score + ops.cast(bias, score.dtype)

    def __repr__(self):
        return (
            f"relative_position_bias(table, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional})"
        )


def relative_position_bias(
    table,
    num_buckets: int = 32,
    max_distance: int = 128,
    bidirectional: bool = True,
):
    """T5's relative position bias (Raffel et al. 2020): a learned bias
    per head for the bucket of `kv_idx - q_idx`, added to the logits.

    Exact distances below half the buckets each get a bucket; longer ones
    share logarithmically wider buckets up to `max_distance`
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
    num_buckets = _positive_int(where, "num_buckets", num_buckets)
    max_distance = _positive_int(where, "max_distance", max_distance)
    shape = tuple(static_dim(d) for d in getattr(table, "shape", ()))
    dtype = keras.backend.standardize_dtype(getattr(table, "dtype", "none"))
    if len(shape) != 2 or shape[0] != num_buckets or "float" not in dtype:
        raise ValueError(
            f"{where}: `table` must be a float tensor of shape (num_buckets, "
            f"N) = ({num_buckets}, N). Received: table.shape={shape}, "
            f"dtype={dtype}"
        )
    return _RelativePositionBias(
        table, num_buckets, max_distance, bool(bidirectional)
    )


def relative_position_bucket(
    relative_position, num_buckets=32, max_distance=128, bidirectional=True
):
    """T5's bucket of each relative position `kv_idx - q_idx`, int32.

    With `bidirectional`, half of the buckets are for keys after the
    query. Of the rest, half hold the exact distances `0 ..
    num_buckets / 2 - 1`, the others distances up to `max_distance` on a
    logarithmic scale; longer distances share the last bucket.

    Args:
        relative_position (Tensor): Integer `kv_idx - q_idx`, any shape.
        num_buckets (int): Defaults to `32`.
        max_distance (int): Defaults to `128`.
        bidirectional (bool): Defaults to `True`.

    Returns:
        Tensor: int32 buckets, of `relative_position`'s shape.

    Examples:
        >>> import numpy as np
        >>> buckets = relative_position_bucket(
        ...     np.array([-200, -3, -1, 0, 1, 3, 200]), num_buckets=8,
        ...     max_distance=20)
        >>> print(keras.ops.convert_to_numpy(buckets))
        [3 2 1 0 5 6 7]
    """
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


class BlockMask(BlockTable):
    """A mask mod evaluated once into a map of blocks, to be reused.

    The blockwise path classifies each pair of a query block and a key
    block as empty (skipped, forward and backward), full (no elementwise
    mask) or partial (the mod applied inside it). Given a `BlockMask` as
    `mask_mod`, it reads that map instead of evaluating the mod over the
    whole grid again, so that several layers and training steps pay for
    it once. It is called like the mod itself, so every path takes it.

    Attributes:
        mask_mod: The mask mod.
        batch_size, num_heads, query_length, key_length: int. The grid it
            was evaluated on.
        block_size: int. Query and key rows per block.
        blocks: int32 tensor `(ceil(T / block_size), ceil(S / block_size))`:
            0 empty, 1 partial, 2 full.
    """

    def __init__(
        self,
        mask_mod,
        batch_size,
        num_heads,
        query_length,
        key_length,
        block_size,
    ):
        self.mask_mod = mask_mod
        self.batch_size, self.num_heads = batch_size, num_heads
        self.query_length, self.key_length = query_length, key_length
        self.block_size = block_size
        self.blocks = _kernels.mod_blocks(
            mask_mod,
            batch_size,
            num_heads,
            query_length,
            key_length,
            block_size,
        )

    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = _tensors(batch, head, q_idx, kv_idx)
        return self.mask_mod(batch, head, q_idx, kv_idx)

    def __repr__(self):
        return (
            f"block_mask({self.mask_mod!r}, batch_size={self.batch_size}, "
            f"num_heads={self.num_heads}, query_length={self.query_length}, "
            f"key_length={self.key_length}, block_size={self.block_size})"
        )


def block_mask(
    mask_mod,
    batch_size: int,
    num_heads: int,
    query_length: int,
    key_length: int,
    block_size: int | None = None,
) -> BlockMask:
    """Evaluates a mask mod once into a reusable `BlockMask`.

    Args:
        mask_mod: The mask mod.
        batch_size: The batch size it will be used with (`1` if it does
            not depend on the batch).
        num_heads: The number of query heads (`1` if it does not depend on
            the head).
        query_length: The number of queries.
        key_length: The number of keys.
        block_size: Query and key rows per block; a call on the blockwise
            path with other blocks evaluates the mod itself. Defaults to
            the block size the blockwise path uses.

    Returns:
        BlockMask: Usable wherever a mask mod is.

    Raises:
        ValueError: if `mask_mod` is not callable or a size is not a
            positive int.

    Examples:
        Causal attention over 1,024 positions in blocks of 256: the
        diagonal blocks are partial, those below it full, the rest empty.

        >>> mask = block_mask(causal(), 1, 1, 1024, 1024, block_size=256)
        >>> print(keras.ops.convert_to_numpy(mask.blocks))
        [[1 0 0 0]
         [2 1 0 0]
         [2 2 1 0]
         [2 2 2 1]]
    """
    where = "block_mask"
    _callables(where, (mask_mod,))
    sizes = [
        _positive_int(where, name, value)
        for name, value in (
            ("batch_size", batch_size),
            ("num_heads", num_heads),
            ("query_length", query_length),
            ("key_length", key_length),
            ("block_size", block_size or _kernels.CHUNK_SIZE),
        )
    ]
    return BlockMask(mask_mod, *sizes)


def _tensors(*xs):
    """A mod called by hand (on NumPy arrays or ints) computes in tensors,
    as it does on every path: its indices int32."""
    tensors = [ops.convert_to_tensor(x) for x in xs]
    return [
        ops.cast(x, "int32")
        if "int" in keras.backend.standardize_dtype(x.dtype)
        else x
        for x in tensors
    ]


def _gather_rows(ids, batch, index):
    """`ids[batch, index]` for broadcasting index tensors."""
    length = ops.shape(ids)[1]
    flat = ops.reshape(ids, (-1,))
    return ops.take(flat, batch * length + index)


def _integers(where, name, x, rank):
    if not is_tensor(x):
        x = ops.convert_to_tensor(np.asarray(x))
    dtype = keras.backend.standardize_dtype(x.dtype)
    if "int" not in dtype or len(x.shape) != rank:
        axes = "(B, T)" if rank == 2 else "(B,)"
        raise ValueError(
            f"{where}: `{name}` must be integers of shape {axes}. Received: "
            f"{name}.shape={tuple(x.shape)}, dtype={dtype}"
        )
    return x


def _positive_int(where, name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        value_ok = False
    else:
        value_ok = value >= 1
    if not value_ok:
        raise ValueError(
            f"{where}: `{name}` must be a positive int. Received: "
            f"{name}={value!r}"
        )
    return int(value)


def _callables(where, mods):
    if not mods or not all(callable(m) for m in mods):
        raise ValueError(
            f"{where}: expects one or more mask mods (callables). Received: "
            f"{mods!r}"
        )
    return mods


def _check_heads(where, name, num_heads, head):
    heads = static_dim(head.shape[1]) if len(head.shape) == 4 else None
    if heads is not None and heads not in (1, num_heads):
        raise ValueError(
            f"{where}: `{name}` is for {num_heads} heads; the attention has "
            f"{heads}. Received: {heads} heads"
        )
