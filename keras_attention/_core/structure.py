"""Attention structure: which keys each query may see, besides a mask.

The structural arguments of `scaled_dot_product_attention` (`is_causal`,
`sliding_window`, `segment_ids`, `alibi`, `logit_soft_cap`, `mask_mod`,
`score_mod`) are checked and normalised here, once, into a `Structure`
(`Structure.from_args`) of built-in mods (`_core.builtins`: a band,
segment ids, a soft cap, ALiBi) and the user's mods; a built-in mod
given as a mod joins the arguments' own. Each path lowers it its own
way. The blockwise path visits only the key blocks a query block can
see and applies the masks only in the blocks they cut; the fused path
hands PyTorch its causal flag where that is the whole structure; the
reference path builds the dense mask.

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

from keras_attention._core.builtins import Alibi
from keras_attention._core.builtins import Band
from keras_attention._core.builtins import Segments
from keras_attention._core.builtins import SoftCap
from keras_attention._core.builtins import conjuncts
from keras_attention._core.builtins import links
from keras_attention._core.builtins import segments_visible
from keras_attention._core.builtins import unpositioned
from keras_attention._core.checks import check_length
from keras_attention._core.checks import host_integers
from keras_attention._core.checks import is_tensor
from keras_attention._core.checks import real_number
from keras_attention._core.checks import same_size
from keras_attention._core.checks import static_dim
from keras_attention._core.mods import BlockTable
from keras_attention._core.mods import Combined
from keras_attention._core.mods import chained
from keras_attention._core.mods import check_mod
from keras_attention._core.mods import check_mod_sizes
from keras_attention._core.mods import grid
from keras_attention._core.mods import modified
from keras_attention._core.mods import visible
from keras_attention._core.positions import steps

ALIGNMENTS = ("top_left", "bottom_right")


class Structure:
    """Normalised structure of one attention call: the built-in mods its
    arguments are (`_core.builtins`), and the user's mods.

    Attributes:
        band: `Band` or `None`. Keys outside a band around each query's
            position are hidden (`is_causal`, `sliding_window`, and a
            `mods.causal()` or `mods.sliding_window(...)` mask mod).
        offset: int or scalar tensor. Position of query 0 among the keys.
        segments: `Segments` or `None` (`segment_ids`, `mods.document`).
        alibi: bool. Linear position biases `-m_n |p - j|` per head.
        soft_cap: float or `None`. Logits become `cap tanh(logits / cap)`.
        mask_mod, score_mod: callables or `None`: the mods that are not
            built in (see `_core.mods`).
        block_size: int or `None`. The block size of a block mask given
            as the mask mod (`mods.block_mask`): the blockwise path runs
            blocks of that size.
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
        self.mask_mod, self.score_mod = mask_mod, score_mod
        self.where = where
        self.alibi = alibi
        self.soft_cap = soft_cap
        self.offset = offset
        left, right = window if window is not None else (None, None)
        if causal:
            right = 0 if right is None else min(right, 0)
        band = Band(left, right, offset)
        has_bound = band.left is not None or band.right is not None
        self.band = band if has_bound else None
        self.segments = None if segments[0] is None else Segments(*segments)
        # The mask mod's block map once a path has evaluated it:
        # `((batch, heads, T, S, block), table)`, reused by the next.
        self.mod_map = None
        self.block_size = None

    @classmethod
    def from_args(
        cls,
        *,
        where,
        batch=None,
        query_length=None,
        key_length=None,
        heads=None,
        is_causal=False,
        sliding_window=None,
        segment_ids=None,
        alibi=False,
        logit_soft_cap=None,
        offset=None,
        mask_mod=None,
        score_mod=None,
        starts=(None, None),
    ):
        """Checks the structural arguments of a call with `batch` rows,
        `T = query_length` queries, `S = key_length` keys and `heads`
        query heads (ints, `None` where unknown, or scalar tensors) and
        returns their `Structure`.

        The arguments mean what they mean in `scaled_dot_product_attention`.
        `offset`, if given, is the position of query 0 among the keys (a
        static-size KV cache) and replaces the one `is_causal` implies.
        Built-in mods among `mask_mod` and `score_mod` join the structure
        the arguments make where they mean the same (see `absorb`).
        `starts` are the sequence positions of the first query and key
        where the mods see positions rather than indices (a layer's
        cached step; see `check_mod_sizes`).

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
        check_mod_sizes(
            where, mask_mod, batch, query_length, key_length, starts
        )
        if offset is None:
            offset = 0
            # Unknown lengths (a symbolic check) leave the offset to the run.
            known = None not in (query_length, key_length)
            if alignment == "bottom_right" and known:
                offset = key_length - query_length
        soft_cap = None if logit_soft_cap is None else float(logit_soft_cap)
        structure = cls(
            bool(is_causal), offset, window_, segments, alibi, soft_cap,
            where=where,
        )  # fmt: skip
        shape = (batch, query_length, key_length, heads)
        structure.absorb(mask_mod, score_mod, shape)
        return structure

    @classmethod
    def of_call(cls, where, query, key, **arguments):
        """`from_args` for a call on `query` `(B, T, ...)` and `key`
        `(B, S, ...)`: the batch, lengths and heads are read from their
        shapes (static where known, else scalar tensors)."""
        batch, query_length, key_length = lengths(query, key)
        return cls.from_args(
            where=where,
            batch=batch,
            query_length=query_length,
            key_length=key_length,
            heads=1 if len(query.shape) == 3 else static_dim(query.shape[2]),
            **arguments,
        )

    def absorb(self, mask_mod, score_mod, shape):
        """Adds the mods `mask_mod` and `score_mod` of a call of `shape =
        (B, T, S, N)` (`None` where unknown).

        A built-in mask mod (a band, segment ids, and those inside an
        `and_masks`) joins the structure's own where it means the same: a
        band of the same offset narrows the structure's band, segment ids
        fill an empty place. So `mask_mod=mods.causal()` runs exactly as
        `is_causal=True`. Built-in score mods at the end of the chain
        become the soft cap and ALiBi where that keeps their order (score
        mod, soft cap, ALiBi). The rest stay mods."""
        parts = conjuncts(mask_mod)
        tables = [
            unpositioned(m)
            for m in parts
            if isinstance(unpositioned(m), BlockTable)
        ]
        if tables:  # the blocks its map is made of
            self.block_size = tables[0].block_size
        rest = [m for m in parts if not self._takes(m, shape)]
        self.mask_mod = (
            None if not rest else rest[0] if len(rest) == 1 else Combined(rest)
        )
        chain = links(score_mod)
        alibi = unpositioned(chain[-1]) if chain else None
        if (
            isinstance(alibi, Alibi)
            and not self.alibi
            and self.soft_cap is None
            and alibi.num_heads == shape[3]
            and _same(alibi.offset, self.offset)
        ):
            self.alibi = True
            chain.pop()
        cap = unpositioned(chain[-1]) if chain else None
        if isinstance(cap, SoftCap) and self.soft_cap is None:
            self.soft_cap = cap.cap
            chain.pop()
        self.score_mod = chained(*chain)

    def _takes(self, mod, shape):
        """Whether mask mod `mod` joined the structure: a built-in one, or
        a block map of built-in ones only (read from their ranges)."""
        if not isinstance(mod, BlockTable):
            return self._joins(mod, shape)
        trial = copy.copy(self)
        if all(trial._joins(m, shape) for m in conjuncts(mod.mask_mod)):
            self.band, self.offset = trial.band, trial.offset
            self.segments = trial.segments
            return True
        return False

    def _joins(self, mod, shape):
        """Whether built-in mask mod `mod` joined the structure."""
        mod = unpositioned(mod)
        if isinstance(mod, Band):
            if self.band is None and (
                not self.alibi or _same(mod.offset, self.offset)
            ):
                self.band, self.offset = mod, mod.offset
                return True
            if self.band is not None and _same(mod.offset, self.offset):
                self.band = self.band.intersect(mod)
                return True
        if isinstance(mod, Segments) and self.segments is None:
            batch, query_length, key_length, _ = shape
            if _fits(mod.query_ids, (batch, query_length)) and _fits(
                mod.key_ids, (batch, key_length)
            ):
                self.segments = mod
                return True
        return False

    @property
    def left(self):
        return None if self.band is None else self.band.left

    @property
    def right(self):
        return None if self.band is None else self.band.right

    @property
    def causal(self) -> bool:
        """No key after a query's position is visible."""
        return self.right is not None and self.right <= 0

    @property
    def query_segments(self):
        return None if self.segments is None else self.segments.query_ids

    @property
    def key_segments(self):
        return None if self.segments is None else self.segments.key_ids

    @property
    def has_band(self) -> bool:
        return self.band is not None

    @property
    def has_segments(self) -> bool:
        return self.segments is not None

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
        return Alibi(num_heads, self.offset).bias(rows, cols)

    def dense_bias(self, num_heads, query_length, key_length):
        """The ALiBi bias `(1, N, T, S)`, or `None` without ALiBi."""
        if not self.alibi:
            return None
        rows = ops.expand_dims(steps(query_length), 1)  # (T, 1)
        cols = ops.expand_dims(steps(key_length), 0)  # (1, S)
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
        return None if self.band is None else self.band.visible(rows, cols)

    def dense_mask(self, query_length, key_length):
        """The band and the segment ids as a boolean `(B|1, T, S)` mask,
        or `None`."""
        visible = None
        if self.has_band:
            rows = ops.expand_dims(steps(query_length), 1)  # (T, 1)
            cols = ops.expand_dims(steps(key_length), 0)  # (1, S)
            visible = ops.expand_dims(self.band_visible(rows, cols), 0)
        if self.has_segments:
            same = segments_visible(
                self.query_segments, self.key_segments
            )  # (B, T, S)
            visible = (
                same if visible is None else ops.logical_and(visible, same)
            )
        return visible


def _fits(ids, shape):
    return all(same_size(a, b) for a, b in zip(ids.shape, shape, strict=True))


def _same(a, b):
    """Whether two offsets are known to be equal."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return a is b


def _check_alibi(where, alibi):
    if not isinstance(alibi, bool):
        raise ValueError(
            f"{where}: `alibi` must be True or False. Received: alibi={alibi!r}"
        )


def _check_soft_cap(where, logit_soft_cap):
    if logit_soft_cap is not None and not (
        real_number(logit_soft_cap) and 0 < logit_soft_cap < math.inf
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
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_zero(x) -> bool:
    return isinstance(x, int) and x == 0
