"""Attention structure: which keys each query may see, besides a mask.

The structural arguments of `scaled_dot_product_attention` (`is_causal`,
`sliding_window`, `segment_ids`, `alibi`, `logit_soft_cap`, `mask_mod`,
`score_mod`) are checked
and normalised here, once, into a `Structure` (`Structure.from_args`);
each path lowers it its own way. The chunked path
visits only the key blocks a query block can see and applies the rest
inside each block; the fused path hands PyTorch its causal flag where
that is the whole structure; the reference path builds the dense mask.

Positions: query `i` stands at position `p = i + offset` among the keys,
`offset = 0` for top-left alignment and `S - T` for bottom-right (the
queries are the last `T` of `S` positions, as with a KV cache). Query `i`
sees key `j` when `p - left <= j <= p + right` (the band; a `None` bound
is unbounded) and, with segment ids, when both ids are equal and not 0.

Shape legend: B batch, T query length, S key length.
"""

import copy
import math

import keras
import numpy as np
from keras import ops

from keras_attention._core.checks import check_length
from keras_attention._core.checks import host_integers
from keras_attention._core.checks import is_tensor
from keras_attention._core.checks import static_dim
from keras_attention._core.mods import check_mod
from keras_attention._core.mods import grid
from keras_attention._core.mods import modified
from keras_attention._core.mods import visible

ALIGNMENTS = ("top_left", "bottom_right")
# A band bound this wide reaches every key of any sequence that fits in
# memory; kept as a number, `p + right` could overflow int32 positions.
_REACH = 2**30


class Structure:
    """Normalised structure of one attention call.

    Attributes:
        causal: bool. Keys after each query's position are hidden.
        offset: int or scalar tensor. Position of query 0 among the keys.
        left, right: int or `None`. Keys visible before and after each
            query's position (`None`: all of them).
        query_segments, key_segments: int tensors `(B, T)`, `(B, S)`, or
            `None`.
        alibi: bool. Linear position biases `-m_n |p - j|` per head.
        soft_cap: float or `None`. Logits become `cap tanh(logits / cap)`.
        mask_mod, score_mod: callables or `None` (see `_core.mods`).
        where: str. The function or layer the structure is checked for.
    """

    def __init__(
        self,
        causal,
        offset,
        window,
        segments,
        alibi=False,
        soft_cap=None,
        mask_mod=None,
        score_mod=None,
        where="scaled_dot_product_attention",
    ):
        self.causal = causal
        self.mask_mod, self.score_mod = mask_mod, score_mod
        self.where = where
        self.alibi = alibi
        self.soft_cap = soft_cap
        self.offset = offset
        left, right = window if window is not None else (None, None)
        left, right = (
            None if bound is None or bound >= _REACH else bound
            for bound in (left, right)
        )
        if causal:
            right = 0 if right is None else min(right, 0)
        self.left, self.right = left, right
        self.query_segments, self.key_segments = segments

    @classmethod
    def from_args(
        cls,
        *,
        where,
        batch=None,
        query_length=None,
        key_length=None,
        is_causal=False,
        sliding_window=None,
        segment_ids=None,
        alibi=False,
        logit_soft_cap=None,
        offset=None,
        mask_mod=None,
        score_mod=None,
    ):
        """Checks the structural arguments of a call with `batch` rows,
        `T = query_length` queries and `S = key_length` keys (ints, `None`
        where unknown, or scalar tensors) and returns their `Structure`.

        The arguments mean what they mean in `scaled_dot_product_attention`.
        `offset`, if given, is the position of query 0 among the keys (a
        static-size KV cache) and replaces the one `is_causal` implies.

        Raises:
            ValueError: naming `where`, the argument and what was received.
        """
        check_length(where, "query_length", query_length)
        check_length(where, "key_length", key_length)
        alignment = _alignment(where, is_causal)
        window_ = window(where, sliding_window)
        segments = _segments(
            where, (batch, query_length), (batch, key_length), segment_ids
        )
        _check_alibi(where, alibi)
        _check_soft_cap(where, logit_soft_cap)
        check_mod(where, "mask_mod", mask_mod)
        check_mod(where, "score_mod", score_mod)
        if offset is None:
            offset = 0
            # Unknown lengths (a symbolic check) leave the offset to the run.
            known = None not in (query_length, key_length)
            if alignment == "bottom_right" and known:
                offset = key_length - query_length
        soft_cap = None if logit_soft_cap is None else float(logit_soft_cap)
        return cls(
            bool(is_causal),
            offset,
            window_,
            segments,
            alibi,
            soft_cap,
            mask_mod,
            score_mod,
            where,
        )

    @classmethod
    def of_call(cls, where, query, key, **arguments):
        """`from_args` for a call on `query` `(B, T, ...)` and `key`
        `(B, S, ...)`: the batch and lengths are read from their shapes
        (static where known, else scalar tensors)."""
        batch, query_length, key_length = lengths(query, key)
        return cls.from_args(
            where=where,
            batch=batch,
            query_length=query_length,
            key_length=key_length,
            **arguments,
        )

    @property
    def has_band(self) -> bool:
        return self.left is not None or self.right is not None

    @property
    def has_segments(self) -> bool:
        return self.query_segments is not None

    @property
    def is_empty(self) -> bool:
        """No structure: every key visible (to what the mask allows)."""
        return (
            not self.has_band
            and not self.has_segments
            and self.mask_mod is None
        )

    @property
    def is_top_left_causal(self) -> bool:
        """Exactly `is_causal=True`: what a kernel's causal flag means."""
        return (
            self.causal
            and self.left is None
            and _is_zero(self.offset)
            and not self.has_segments
            and self.mask_mod is None
        )

    def alibi_bias(self, num_heads, rows, cols):
        """`-m_n |p_i - j|`, float32 `(N, R, C)` for query rows `rows`
        `(R, 1)` and key positions `cols` `(1, C)`."""
        distance = ops.abs(rows + self.offset - cols)  # (R, C)
        slopes = ops.convert_to_tensor(alibi_slopes(num_heads), "float32")
        return -slopes[:, None, None] * ops.cast(distance, "float32")

    def dense_bias(self, num_heads, query_length, key_length):
        """The ALiBi bias `(1, N, T, S)`, or `None` without ALiBi."""
        if not self.alibi:
            return None
        rows = ops.expand_dims(ops.arange(0, query_length), 1)  # (T, 1)
        cols = ops.expand_dims(ops.arange(0, key_length), 0)  # (1, S)
        return ops.expand_dims(self.alibi_bias(num_heads, rows, cols), 0)

    def with_mods(self, **mods):
        """A copy with `mask_mod` and/or `score_mod` replaced."""
        other = copy.copy(self)
        for name, mod in mods.items():
            setattr(other, name, mod)
        return other

    def mod_mask(self, batch, heads, rows, cols):
        """The mask mod at query rows `rows` `(R,)` and keys `cols` `(C,)`
        of every batch row and head: booleans that broadcast to
        `(B, N, R, C)`, or `None` without a mask mod."""
        if self.mask_mod is None:
            return None
        indices = grid(batch, heads, rows, cols)
        return visible(self.where, self.mask_mod, indices)

    def modify_scores(self, scores, rows, cols):
        """`scores` `(B, N, R, C)` through the score mod, for query rows
        `rows` `(R,)` and keys `cols` `(C,)`; unchanged without one."""
        if self.score_mod is None:
            return scores
        batch, heads = ops.shape(scores)[0], scores.shape[1]
        indices = grid(batch, heads, rows, cols)
        return modified(self.where, self.score_mod, scores, indices)

    def band_visible(self, rows, cols):
        """The band at query rows `rows` and key positions `cols`
        (broadcasting integer tensors), or `None` without a band."""
        position = rows + self.offset
        visible = None
        if self.left is not None:
            visible = cols >= position - self.left
        if self.right is not None:
            after = cols <= position + self.right
            visible = after if visible is None else visible & after
        return visible

    def dense_mask(self, query_length, key_length):
        """The structure as a boolean `(B|1, T, S)` mask, or `None`."""
        visible = None
        if self.has_band:
            rows = ops.expand_dims(ops.arange(0, query_length), 1)  # (T, 1)
            cols = ops.expand_dims(ops.arange(0, key_length), 0)  # (1, S)
            visible = ops.expand_dims(self.band_visible(rows, cols), 0)
        if self.has_segments:
            same = segments_visible(
                self.query_segments, self.key_segments
            )  # (B, T, S)
            visible = (
                same if visible is None else ops.logical_and(visible, same)
            )
        return visible


def alibi_slopes(num_heads):
    """The head slopes of ALiBi (Press et al. 2022): `2^(-8 h / n)` for
    `h = 1..n` heads when `n` is a power of two; otherwise those of the
    largest power of two below, then every other slope of twice that."""

    def powers(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    base = 2 ** math.floor(math.log2(num_heads))
    return powers(base) + powers(2 * base)[0::2][: num_heads - base]


def segments_visible(query_segments, key_segments):
    """`(B, T, S)`: equal segment ids, key id not 0 (padding)."""
    queries = ops.expand_dims(query_segments, 2)  # (B, T, 1)
    keys = ops.expand_dims(key_segments, 1)  # (B, 1, S)
    return ops.logical_and(ops.equal(queries, keys), ops.not_equal(keys, 0))


def _check_alibi(where, alibi):
    if not isinstance(alibi, bool):
        raise ValueError(
            f"{where}: `alibi` must be True or False. Received: alibi={alibi!r}"
        )


def _check_soft_cap(where, logit_soft_cap):
    if logit_soft_cap is not None and not (
        isinstance(logit_soft_cap, (int, float))
        and not isinstance(logit_soft_cap, bool)
        and 0 < logit_soft_cap < math.inf
    ):
        raise ValueError(
            f"{where}: `logit_soft_cap` must be a positive finite number or "
            f"None. Received: logit_soft_cap={logit_soft_cap!r}"
        )


def lengths(query, key):
    """`(B, T, S)` of a call: static where known, else scalar tensors
    (the batch stays `None`; it only checks shapes)."""
    query_length = static_dim(query.shape[1])
    key_length = static_dim(key.shape[1])
    if query_length is None or key_length is None:
        query_length, key_length = ops.shape(query)[1], ops.shape(key)[1]
    return static_dim(query.shape[0]), query_length, key_length


def _alignment(where, is_causal):
    if isinstance(is_causal, (bool, np.bool_)):
        return "top_left"
    if isinstance(is_causal, str) and is_causal in ALIGNMENTS:
        return is_causal
    raise ValueError(
        f"{where}: `is_causal` must be True, False, 'top_left' or "
        f"'bottom_right'. Received: is_causal={is_causal!r}"
    )


def window(where, sliding_window):
    """`(left, right)` keys visible each side of a query, or `None`."""
    if sliding_window is None:
        return None
    if _is_int(sliding_window):
        if sliding_window < 1:
            raise ValueError(
                f"{where}: `sliding_window` must be at least 1 (the query's "
                f"own position). Received: sliding_window={sliding_window}"
            )
        return int(sliding_window) - 1, 0
    if (
        isinstance(sliding_window, (tuple, list))
        and len(sliding_window) == 2
        and all(_is_int(x) and x >= 0 for x in sliding_window)
    ):
        return int(sliding_window[0]), int(sliding_window[1])
    raise ValueError(
        f"{where}: `sliding_window` must be a positive int or a pair "
        "`(left, right)` of non-negative ints. Received: "
        f"sliding_window={sliding_window!r}"
    )


def _segments(where, query_shape, key_shape, segment_ids):
    """`(query_ids (B, T), key_ids (B, S))` as tensors, or `(None, None)`."""
    if segment_ids is None:
        return None, None
    if isinstance(segment_ids, tuple):
        if len(segment_ids) != 2:
            raise ValueError(
                f"{where}: `segment_ids` must be one `(B, T)` tensor or a "
                "tuple `(query_ids (B, T), key_ids (B, S))`. Received: "
                f"{len(segment_ids)} tensors in segment_ids"
            )
        query_ids, key_ids = segment_ids
    else:
        query_ids = key_ids = segment_ids
    ids = []
    for name, axis, ids_, expected in (
        ("queries", "T", query_ids, query_shape),
        ("keys", "S", key_ids, key_shape),
    ):
        if not is_tensor(ids_):
            host_integers(where, "segment_ids", ids_)
            ids_ = ops.convert_to_tensor(ids_)
        dtype = keras.backend.standardize_dtype(ids_.dtype)
        expected = tuple(static_dim(d) for d in expected)
        shape = tuple(static_dim(d) for d in ids_.shape)
        if "int" not in dtype or not _matches(shape, expected):
            raise ValueError(
                f"{where}: `segment_ids` for the {name} must be integers of "
                f"shape (B, {axis})={expected}. Received: "
                f"segment_ids.shape={shape}, dtype={dtype}"
            )
        ids.append(ids_)  # compared in their own dtype: no wrap-around
    return tuple(ids)


def _matches(shape, expected):
    return len(shape) == 2 and all(
        a is None or b is None or a == b
        for a, b in zip(shape, expected, strict=True)
    )


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_zero(x) -> bool:
    return isinstance(x, int) and x == 0
