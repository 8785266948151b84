"""The mask mods: which keys each query may see.

Shape legend: B batch, N heads, T query length, S key length.
"""

import keras
import numpy as np
from keras import ops

from keras_attention._core import is_tensor
from keras_attention._core import static_dim
from keras_attention._core.builtins import Band
from keras_attention._core.builtins import Segments
from keras_attention._core.checks import positive_integer
from keras_attention._core.mods import Combined
from keras_attention._core.structure import window as check_window
from keras_attention.mods._common import PACKAGE
from keras_attention.mods._common import Configured
from keras_attention.mods._common import callables
from keras_attention.mods._common import check_reach
from keras_attention.mods._common import check_rows
from keras_attention.mods._common import check_shape
from keras_attention.mods._common import integers
from keras_attention.mods._common import tensors


@keras.saving.register_keras_serializable(package=PACKAGE)
class _Causal(Configured, Band):
    def __init__(self):
        super().__init__(right=0)

    def __call__(self, batch, head, q_idx, kv_idx):
        return super().__call__(*tensors(batch, head, q_idx, kv_idx))

    def get_config(self):
        return {}

    def __repr__(self):
        return "causal()"


def causal():
    """Causal attention: query $i$ sees the keys $j \\le i$.

    Returns:
        A mask mod.

    Examples:
        >>> import keras
        >>> import numpy as np
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


@keras.saving.register_keras_serializable(package=PACKAGE)
class _SlidingWindow(Configured, Band):
    def __init__(self, window):
        left, right = check_window("sliding_window", window)
        # As given (an int or a pair), in Python ints for its config.
        self.window = (
            (left, right) if isinstance(window, (tuple, list)) else left + 1
        )
        super().__init__(left, right)

    def __call__(self, batch, head, q_idx, kv_idx):
        return super().__call__(*tensors(batch, head, q_idx, kv_idx))

    def get_config(self):
        return {"window": self.window}

    def __repr__(self):
        return f"sliding_window({self.window!r})"


def sliding_window(window: int | tuple[int, int]):
    """Local attention, as the `sliding_window` argument of
    `scaled_dot_product_attention` (top-left aligned).

    Args:
        window: An int $w$ keeps the $w$ keys $i - w < j \\le i$ (a causal
            window, as in Mistral); a pair `(left, right)` keeps
            $i - \\text{left} \\le j \\le i + \\text{right}$.

    Returns:
        A mask mod.

    Raises:
        ValueError: if `window` is not a positive int or a pair of
            non-negative ints.

    Examples:
        >>> import keras
        >>> import numpy as np
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


class _Document(Segments):
    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = tensors(batch, head, q_idx, kv_idx)
        check_rows("document", "segment_ids", self.query_ids, batch)
        check_rows("document", "segment_ids", self.key_ids, batch)
        return super().__call__(batch, head, q_idx, kv_idx)

    def check_sizes(self, where, batch, query_length, key_length, exact):
        """The query ids `(B, T)` and the key ids `(B, S)` of the call; in
        a cached step, ids reaching every position it reads."""
        for ids, length, is_exact, axes in (
            (self.query_ids, query_length, exact[0], "(B, T)"),
            (self.key_ids, key_length, exact[1], "(B, S)"),
        ):
            if is_exact:
                check_shape(where, "document", "segment_ids", ids.shape,
                            (batch, length), axes)  # fmt: skip
            else:
                check_reach(where, "document", "segment_ids", ids.shape,
                            batch, length)  # fmt: skip

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

        >>> import keras
        >>> import numpy as np
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
    query_ids = integers(where, "segment_ids", query_ids, 2)
    key_ids = integers(where, "segment_ids", key_ids, 2)
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
        batch, head, q_idx, kv_idx = tensors(batch, head, q_idx, kv_idx)
        check_rows("prefix_lm", "prefix_lengths", self.prefix_lengths, batch)
        prefix = ops.take(self.prefix_lengths, batch)  # (B, 1, 1, 1)
        return ops.logical_or(kv_idx < prefix, kv_idx <= q_idx)

    def block_kinds(self, length, key_length, block):
        """Some key of a block is seen if its first is in the prefix or
        at most the last query; every key if its last is in the prefix
        or at most the first query (in every row of the batch)."""
        first_row, last_row, first_key, last_key = _edges(
            length, key_length, block
        )
        prefix = ops.reshape(self.prefix_lengths, (-1, 1, 1))  # (B, 1, 1)
        seen = (first_key < prefix) | (first_key <= last_row)
        whole = (last_key < prefix) | (last_key <= first_row)
        return _kinds(ops.all(whole, axis=0), ops.any(seen, axis=0))

    def check_sizes(self, where, batch, query_length, key_length, exact):
        """A prefix length for each row of the call's batch."""
        check_shape(where, "prefix_lm", "prefix_lengths",
                    self.prefix_lengths.shape, (batch,), "(B,)")  # fmt: skip

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
        >>> import keras
        >>> import numpy as np
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
    lengths = integers("prefix_lm", "prefix_lengths", prefix_lengths, 1)
    if not is_tensor(prefix_lengths) and np.min(prefix_lengths, initial=0) < 0:
        raise ValueError(
            "prefix_lm: `prefix_lengths` must not be negative. Received: "
            f"prefix_lengths={np.asarray(prefix_lengths).tolist()}"
        )
    return _PrefixLM(ops.cast(lengths, "int32"))


@keras.saving.register_keras_serializable(package=PACKAGE)
class _Chunked(Configured):
    def __init__(self, chunk_size):
        self.chunk_size = positive_integer(
            "chunked", "chunk_size", chunk_size, is_position=True
        )

    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = tensors(batch, head, q_idx, kv_idx)
        size = self.chunk_size
        return ops.equal(q_idx // size, kv_idx // size)

    def block_kinds(self, length, key_length, block):
        """Some key of a block is seen where the chunks its queries and
        its keys span overlap; every key where they are one chunk."""
        first_row, last_row, first_key, last_key = (
            edge // self.chunk_size
            for edge in _edges(length, key_length, block)
        )
        seen = (first_key <= last_row) & (first_row <= last_key)
        one = (first_row == last_row) & (first_key == last_key)
        return _kinds(one & (first_row == first_key), seen)

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
        >>> import keras
        >>> import numpy as np
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


@keras.saving.register_keras_serializable(package=PACKAGE)
class _SinkTokens(Configured):
    def __init__(self, num_sinks):
        self.num_sinks = positive_integer(
            "sink_tokens", "num_sinks", num_sinks, is_position=True
        )

    def __call__(self, batch, head, q_idx, kv_idx):
        batch, head, q_idx, kv_idx = tensors(batch, head, q_idx, kv_idx)
        return kv_idx < self.num_sinks + ops.zeros_like(q_idx)

    def block_kinds(self, length, key_length, block):
        """Some key of a block is seen if its first is a sink; every key
        if its last is."""
        first_row, _, first_key, last_key = _edges(length, key_length, block)
        rows = ops.zeros_like(first_row, "bool")  # (T'/C, 1)
        return _kinds(rows | (last_key < self.num_sinks),
                      rows | (first_key < self.num_sinks))  # fmt: skip

    def get_config(self):
        return {"num_sinks": self.num_sinks}

    def __repr__(self):
        return f"sink_tokens({self.num_sinks})"


def _edges(length, key_length, block):
    """The first and last real query of each block row `(T'/C, 1)` and
    the first and last real key of each block column `(1, S'/C)`, int32
    (padding past the lengths belongs to no block's range)."""
    rows = ops.arange(-(-length // block), dtype="int32")[:, None] * block
    keys = ops.arange(-(-key_length // block), dtype="int32")[None] * block
    return (
        rows,
        ops.minimum(rows + block, length) - 1,
        keys,
        ops.minimum(keys + block, key_length) - 1,
    )


def _kinds(whole, seen):
    """`FULL` (2) where every position is seen, `PARTIAL` (1) where some
    are, else `EMPTY` (0): int32 `(T'/C, S'/C)`, as `Band.block_kinds`."""
    shape = ops.shape(ops.logical_or(whole, seen))
    return ops.cast(
        ops.where(ops.broadcast_to(whole, shape), 2,
                  ops.where(ops.broadcast_to(seen, shape), 1, 0)),
        "int32",
    )  # fmt: skip


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
        >>> import keras
        >>> import numpy as np
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


@keras.saving.register_keras_serializable(package=PACKAGE)
class _Combined(Combined):
    def __call__(self, batch, head, q_idx, kv_idx):
        return super().__call__(*tensors(batch, head, q_idx, kv_idx))

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

        >>> import keras
        >>> import numpy as np
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
    return _Combined(callables("and_masks", mods), conjunction=True)


def or_masks(*mods):
    """A key is visible where any mask mod allows it.

    Args:
        *mods: Mask mods, at least one.

    Returns:
        A mask mod.

    Examples:
        A two-token prefix seen by every query, the rest causal:

        >>> import keras
        >>> import numpy as np
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
    return _Combined(callables("or_masks", mods), conjunction=False)
