"""The two kinds of KV cache of `MultiHeadSelfAttention`.

A *plain* cache is a raw `(B, 2, S_max, K, H)` tensor: slot `p` holds the
key `[:, 0]` and value `[:, 1]` of position `p`. A *rolling* cache is a
`RollingCache`: the last `R` positions before `cache_index`, in order, for
a sliding window that sees no further back. The kind is the type of the
value, never its length. Each kind says, for the new keys and values of a
call, what the queries attend over (`CacheView`).

Shape legend: B batch, T new tokens, S_max plain cache length, R rolling
cache length, K key/value heads, H head dim.
"""

from typing import Any
from typing import NamedTuple

import keras
from keras import ops

from keras_attention import _kernels
from keras_attention import functional
from keras_attention._core import structure
from keras_attention.layers import checks


class RollingCache(NamedTuple):
    """The rolling KV cache of a sliding window (Jiang et al. 2023).

    `kv` `(B, 2, R, K, H)` holds the keys `kv[:, 0]` and values `kv[:, 1]`
    of the `R` positions `cache_index - R ... cache_index - 1`, oldest
    first (positions before 0 are empty slots). A call of
    `MultiHeadSelfAttention` with it attends over those and the new
    tokens, then keeps the last `R`, so `cache_index` may grow without
    bound at constant memory. `R` must cover the window: at least `w` for
    an int window `w`, `left + 1` for a pair.

    `TransformerDecoderBlock.init_cache` returns one under `"self"` when
    `max_length` exceeds the window; by hand it is
    `RollingCache(keras.ops.zeros((B, 2, R, K, H)))`. A raw tensor is
    always a plain cache, whatever its length. Being a `NamedTuple`, it
    passes through `keras.tree`, `jax.jit`, `tf.function` and the
    decoding loops of `keras_attention.decoding` (which tile and reorder
    its batch).

    Attributes:
        kv (Tensor): Shape `(B, 2, R, K, H)`.

    Examples:
        >>> import numpy as np
        >>> from keras_attention import MultiHeadSelfAttention
        >>> layer = MultiHeadSelfAttention(num_heads=2, sliding_window=3)
        >>> x = np.random.rand(1, 5, 8).astype("float32")
        >>> cache = RollingCache(np.zeros((1, 2, 3, 2, 4), "float32"))
        >>> for index in range(5):
        ...     step, cache = layer(
        ...         x[:, index : index + 1], cache=cache, cache_index=index
        ...     )
        >>> type(cache).__name__, tuple(cache.kv.shape)
        ('RollingCache', (1, 2, 3, 2, 4))
    """

    kv: Any


class CacheView(NamedTuple):
    """What the queries of one cached call attend over."""

    keys: Any  # (B, S, K, H) in the cache's dtype
    values: Any  # (B, S, K, H)
    visible: Any  # boolean, broadcasts to (B, T, S)
    offset: Any  # the position of the first query among the keys
    cache: Any  # the updated cache, of the kind given


def rolling_length(where: str, sliding_window) -> int | None:
    """Positions a rolling cache needs, or `None` without a window: no
    query sees further back than `left` positions (`w - 1` for an int
    window `w`), so `left + 1` are enough."""
    window = structure.window(where, sliding_window)
    return None if window is None else window[0] + 1


def empty(sizes, max_length: int, sliding_window, dtype, where: str):
    """A cache of zeros for `max_length` positions of `sizes` `(B, K, H)`:
    a `RollingCache` of the window's reach when that is shorter, else a
    plain `(B, 2, S_max, K, H)` tensor."""
    batch, heads, head_dim = sizes
    needed = rolling_length(where, sliding_window)
    rolls = needed is not None and needed < max_length
    length = needed if rolls else max_length
    zeros = ops.zeros((batch, 2, length, heads, head_dim), dtype=dtype)
    return RollingCache(zeros) if rolls else zeros


def split_block_cache(cache, where: str):
    """`(self_cache, cross_cache)` of a decoder block's cache: the dict
    of `init_cache`, or a decoder-only block's self-attention cache."""
    if cache is None or not isinstance(cache, dict):
        return cache, None
    unknown = set(cache) - {"self", "cross"}
    if "self" not in cache or unknown:
        raise ValueError(
            f"{where}: `cache` must be the dict of `init_cache`, with keys "
            "'self' and, for cross-attention, 'cross'. Received: keys "
            f"{sorted(cache)}"
        )
    return cache["self"], cache.get("cross")


def kind_of(cache, where: str, sliding_window):
    """The kind of `cache`: `Rolling` for a `RollingCache`, else `Plain`."""
    rolling = isinstance(cache, RollingCache)
    tensor = cache.kv if rolling else cache
    name = "cache.kv" if rolling else "cache"
    if not (hasattr(tensor, "shape") and hasattr(tensor, "dtype")):
        raise ValueError(
            f"{where}: `cache` must be a (B, 2, S_max, K, H) tensor or a "
            f"RollingCache. Received: {name} of type "
            f"{type(tensor).__name__}"
        )
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    if "float" not in dtype:
        raise ValueError(
            f"{where}: `cache` must hold floating-point keys and values "
            f"(an {dtype} cache would truncate them). Received: "
            f"{name}.dtype={dtype}"
        )
    if rolling:
        return Rolling(tensor, where, rolling_length(where, sliding_window))
    return Plain(tensor, where)


class Plain:
    """A raw `(B, 2, S_max, K, H)` tensor: position `p` in slot `p`."""

    def __init__(self, tensor, where: str):
        self.tensor = tensor
        self.where = where

    def key_length(self, length):
        """S, the number of keys a call of `length` tokens attends over."""
        return self.tensor.shape[2]

    def check(self, batch, length, cache_index, padding_mask, attention_mask):
        """Checks a call of `length` new tokens; returns the index to use
        (a Python int when known, clipped when traced)."""
        size = self.tensor.shape[2]
        cache_index = checks.check_index_range(
            self.where, "cache_index", cache_index, length, size, "the cache"
        )
        checks.check_mask(
            self.where, "padding_mask", padding_mask, (batch, size)
        )
        checks.check_attention_mask(
            self.where, "attention_mask", attention_mask, (batch, length, size)
        )
        return cache_index

    def update(self, key, value, cache_index, padding_mask, attention_mask):
        """Writes the new `(B, T, K, H)` keys and values at `cache_index`;
        the queries attend over every slot written so far."""
        tensor, keys, values = _kernels.update_kv_cache(
            self.tensor, key, value, cache_index
        )  # (B, 2, S_max, K, H), (B, S_max, K, H) twice
        # Slots after the new tokens hold no keys yet: always hidden. The
        # new tokens are the last of the written keys (bottom-right
        # alignment): query i stands at position cache_index + i.
        last = cache_index + ops.shape(key)[1]
        written = ops.expand_dims(ops.arange(0, tensor.shape[2]) < last, 0)
        visible = functional.merge_masks(
            ops.expand_dims(written, 0),  # (1, 1, S_max)
            functional.padding_to_attention_mask(padding_mask),
            attention_mask,
        )
        return CacheView(keys, values, visible, cache_index, tensor)


class Rolling:
    """A `RollingCache`: positions `cache_index - R ... cache_index - 1`."""

    def __init__(self, tensor, where: str, needed: int | None):
        self.tensor = tensor
        self.where = where
        self.needed = needed  # positions the window sees, None: no window

    def key_length(self, length):
        """S = R + T: the cached positions and the new ones."""
        size = self.tensor.shape[2]
        return None if None in (size, length) else size + length

    def check(self, batch, length, cache_index, padding_mask, attention_mask):
        """As `Plain.check`; the index may grow without bound, masks cover
        the absolute positions."""
        size = self.tensor.shape[2]
        if self.needed is None:
            raise ValueError(
                f"{self.where}: a RollingCache keeps only the last positions, "
                "so it needs a `sliding_window` that sees no further back. "
                "Received: sliding_window=None"
            )
        if size is not None and size < self.needed:
            raise ValueError(
                f"{self.where}: a RollingCache must hold the {self.needed} "
                "positions the `sliding_window` sees. Received: "
                f"cache.kv.shape={tuple(self.tensor.shape)}"
            )
        checks.check_integer_scalar(self.where, "cache_index", cache_index)
        known = _kernels.static_int(cache_index)
        if known is not None and known < 0:
            raise ValueError(
                f"{self.where}: `cache_index` must be non-negative. "
                f"Received: cache_index={known}"
            )
        if attention_mask is not None:
            raise ValueError(
                f"{self.where}: `attention_mask` cannot be combined with a "
                f"rolling cache (of {size} positions); hide padding with "
                "`padding_mask` over the absolute positions. Received: "
                f"attention_mask.shape={tuple(attention_mask.shape)}"
            )
        if padding_mask is not None:
            checks.check_mask(
                self.where, "padding_mask", padding_mask, (batch, None)
            )
            if None not in (known, length):
                self._check_padding_length(padding_mask, known, length)
        return cache_index if known is None else known

    def update(self, key, value, cache_index, padding_mask, attention_mask):
        """Appends the new `(B, T, K, H)` keys and values and keeps the
        last R positions; the queries are the last T of the R + T keys."""
        size = self.tensor.shape[2]  # R
        dtype = self.tensor.dtype
        new = ops.stack(
            [ops.cast(key, dtype), ops.cast(value, dtype)], axis=1
        )  # (B, 2, T, K, H)
        window = ops.concatenate([self.tensor, new], axis=2)  # (B,2,R+T,K,H)
        # Key j stands at position cache_index - R + j; the queries are the
        # last T of them (offset R). Slots before position 0 are empty.
        steps = size + ops.shape(key)[1]  # R + T, known or not
        positions = cache_index - size + ops.arange(0, steps)  # (R+T,)
        visible = ops.expand_dims(ops.expand_dims(positions >= 0, 0), 0)
        if padding_mask is not None:
            # Absolute positions; the empty slots read as padding.
            padded = ops.concatenate(
                [
                    ops.zeros((ops.shape(key)[0], size), "bool"),
                    ops.cast(padding_mask, "bool"),
                ],
                axis=1,
            )  # (B, R + S)
            kept = ops.take(padded, positions + size, axis=1)  # (B, R + T)
            visible = ops.logical_and(visible, ops.expand_dims(kept, 1))
        kept_cache = RollingCache(window[:, :, -size:])  # the last R
        return CacheView(window[:, 0], window[:, 1], visible, size, kept_cache)

    def _check_padding_length(self, padding_mask, known, length):
        needed = known + length
        if padding_mask.shape[1] is not None and padding_mask.shape[1] < needed:
            raise ValueError(
                f"{self.where}: with a rolling cache, `padding_mask` covers "
                "the absolute positions 0 .. cache_index + T - 1 "
                f"({needed} positions). Received: padding_mask.shape="
                f"{tuple(padding_mask.shape)}, cache_index={known}"
            )
