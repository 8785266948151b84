"""The plan of one blockwise call: its shapes, blocks and dtypes, and
which key blocks each query block can see (and the reverse) under its
structure.

Shape legend: B batch, T query length, S key length, C block rows,
N query heads, K key/value heads, G = N // K queries per key/value head,
H head dim, V value head dim, P = B x K.
"""

from typing import Any
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from keras_attention._core import large_negative
from keras_attention._core.mods import BlockTable
from keras_attention._core.mods import Bound
from keras_attention._kernels.blockwise import blocks


class Plan:
    """The static facts of one call: shapes, blocks, dtypes, structure."""

    def __init__(self, query, key, value, mask, structure, scale, block):
        _, self.length, self.heads, _ = query.shape
        self.key_length, self.kv_heads = key.shape[1], key.shape[2]
        self.groups = self.heads // self.kv_heads
        self.value_dim = value.shape[-1]
        self.block = block
        self.query_blocks = -(-self.length // block)
        self.key_blocks = -(-self.key_length // block)
        self.structure = structure
        self.batch = ops.shape(query)[0]
        self.mask_mod = _bound(structure.mask_mod)
        self.score_mod = _bound(structure.score_mod)
        # The score mod's floating tensors are differentiated.
        self.captures, score_constants = (
            self.score_mod.split(self.score_mod.held)
            if self.score_mod is not None
            else ([], [])
        )
        self.soft_cap = structure.soft_cap
        self.alibi = structure.alibi
        # Top-left causal: only the diagonal block needs the condition.
        self.is_causal = structure.is_top_left_causal
        # Any other structure: applied in every block visited.
        self.general = not structure.is_empty and not self.is_causal
        self.scale = scale
        self.dtypes = tuple(
            keras.backend.standardize_dtype(x.dtype)
            for x in (query, key, value)
        )
        half = self.dtypes[0] in ("float16", "bfloat16")
        self.compute_dtype = "float32" if half else self.dtypes[0]
        # Below every real logit: float32's masking value, which float64
        # holds too (and which backends convert from a Python float).
        self.negative = large_negative("float32")
        segments = self._blocked_segments(structure)
        self.tensors = Tensors(
            None if mask is None else self._blocked_mask(mask),
            *segments,
            *self._segment_reach(*segments),
            mask_held=tuple(self.mask_mod.held) if self.mask_mod else (),
            score_constants=tuple(score_constants),
        )
        if self.mask_mod is not None:
            table = self._mod_blocks()  # (T'/C, S'/C)
            self.tensors = self.tensors._replace(
                key_lists=block_lists(table),
                query_lists=block_lists(ops.transpose(table)),
            )
        padded = self.key_length % block != 0
        # The last key block a query block sees: its causal diagonal, and
        # the one with the padded keys.
        self.key_edge = blocks.Edge(causal=self.is_causal, padded=padded)
        # Every block of a general structure.
        self.full_edge = blocks.Edge(
            padded=padded,
            band=structure.has_band,
            segments=structure.has_segments,
        )

    def key_range(self, i, tensors):
        """Key blocks `[start, end)` that query block `i` can see (an
        empty range when `end <= start`)."""
        if self.is_causal:
            return 0, blocks.minimum(i + 1, self.key_blocks)
        c, band = self.block, self.structure
        start, end = 0, self.key_blocks
        if band.left is not None:
            first = i * c + band.offset - band.left  # first row's first key
            start = blocks.clip(
                blocks.floor_divide(first, c), 0, self.key_blocks
            )
        if band.right is not None:
            last = i * c + c - 1 + band.offset + band.right
            end = blocks.clip(
                blocks.floor_divide(last, c) + 1, 0, self.key_blocks
            )
        if band.has_segments:
            start = ops.maximum(start, ops.take(tensors.key_starts, i))
            end = ops.minimum(end, ops.take(tensors.key_ends, i))
        return start, end

    def query_range(self, j, tensors):
        """Query blocks `[start, end)` that can see key block `j`."""
        if self.is_causal:
            return blocks.minimum(j, self.query_blocks), self.query_blocks
        c, band = self.block, self.structure
        start, end = 0, self.query_blocks
        if band.right is not None:
            first = j * c - band.right - band.offset
            start = blocks.clip(
                blocks.floor_divide(first, c), 0, self.query_blocks
            )
        if band.left is not None:
            last = j * c + c - 1 + band.left - band.offset
            end = blocks.clip(
                blocks.floor_divide(last, c) + 1, 0, self.query_blocks
            )
        if band.has_segments:
            start = ops.maximum(start, ops.take(tensors.query_starts, j))
            end = ops.minimum(end, ops.take(tensors.query_ends, j))
        return start, end

    def _mod_blocks(self):
        """Each block pair under the mask mod (see `mod_blocks`), with the
        block pairs outside the structure's ranges `EMPTY`; a `BlockTable`
        of the call's sizes gives its own."""
        mod = self.structure.mask_mod
        if isinstance(mod, BlockTable) and mod.fits(
            self.batch, self.heads, self.length, self.key_length, self.block
        ):
            table = ops.convert_to_tensor(mod.blocks)
        else:
            table = mod_blocks(
                self.structure,
                self.batch,
                self.heads,
                self.length,
                self.key_length,
                self.block,
            )
        if not (self.structure.has_band or self.structure.has_segments):
            return table
        columns = ops.arange(self.key_blocks)

        def row(i, table):
            start, end = self.key_range(i, self.tensors)
            inside = ops.logical_and(columns >= start, columns < end)
            kinds = ops.where(inside, ops.take(table, i, axis=0), EMPTY)
            return ops.slice_update(
                table, (i, 0), ops.cast(kinds, "int32")[None]
            )

        return blocks.fori_loop(0, self.query_blocks, row, table)

    def _segment_reach(self, query_ids, key_ids):
        """The block ranges segment ids leave: for each query block, the
        first and one past the last key block holding one of its ids in
        some row of the batch, `(T'/C,)` twice; the same for each key
        block over the query blocks, `(S'/C,)` twice; or four `None`.

        A block's ids span `[lo, hi]` (0, padding, left out); two blocks
        can share an id only where their spans overlap, and a range
        covers every block between its first and last overlap."""
        if query_ids is None:
            return None, None, None, None
        query_lo, query_hi = id_span(query_ids, self.block)  # (B, T'/C)
        key_lo, key_hi = id_span(key_ids, self.block)  # (B, S'/C)
        meets = ops.logical_and(
            query_lo[:, :, None] <= key_hi[:, None, :],
            key_lo[:, None, :] <= query_hi[:, :, None],
        )  # (B, T'/C, S'/C)
        meets = ops.any(meets, axis=0)
        return (*_first_and_end(meets), *_first_and_end(ops.transpose(meets)))

    def _blocked_segments(self, structure):
        """Query and key segment ids `(B, T')`, `(B, S')`, padded with 0
        (hidden), or `None` twice."""
        if not structure.has_segments:
            return None, None
        return (
            ops.pad(structure.query_segments, [(0, 0), (0, self._pad(
                self.length))]),
            ops.pad(structure.key_segments, [(0, 0), (0, self._pad(
                self.key_length))]),
        )  # fmt: skip

    def _blocked_mask(self, mask):
        """`(B|1, N|1, T|1, S)` as `(B|1, K|1, G|1, T'|1, S')`, padded
        to whole blocks with hidden positions."""
        mask = ops.cast(mask, "bool")
        if mask.shape[-1] == 1 and self.key_length != 1:
            # Broadcast over the keys: blocks slice key columns.
            mask = ops.logical_and(
                mask, ops.ones((1, 1, 1, self.key_length), "bool")
            )
        _, mask_heads, mask_rows, key_length = mask.shape
        if mask_heads == 1:
            mask = ops.expand_dims(mask, 1)  # (B|1, 1, 1, T|1, S)
        else:
            mask = ops.reshape(
                mask,
                (-1, self.kv_heads, self.groups, mask_rows, key_length),
            )  # (B|1, K, G, T|1, S)
        rows_pad = self._pad(self.length) if mask_rows != 1 else 0
        widths = [(0, 0)] * 3 + [(0, rows_pad), (0, self._pad(self.key_length))]
        return ops.pad(mask, widths, constant_values=False)

    def _pad(self, length):
        return -length % self.block


class Tensors(NamedTuple):
    """The plan's tensors, each `None` when the call has no such thing:
    the blocked mask, the blocked segment ids, and the block ranges the
    ids leave (see `Plan._segment_reach`)."""

    mask: Any
    query_ids: Any
    key_ids: Any
    key_starts: Any
    key_ends: Any
    query_starts: Any
    query_ends: Any
    mask_held: tuple = ()
    score_constants: tuple = ()
    key_lists: Any = None
    query_lists: Any = None


EMPTY, PARTIAL, FULL = 0, 1, 2


def mod_blocks(structure, batch, heads, length, key_length, block):
    """Each block pair of `block` rows under the mask mod of `structure`,
    int32 `(T'/C, S'/C)`: `EMPTY` (no position visible in any row of the
    batch or head), `FULL` (every position visible) or `PARTIAL`.
    Padded positions count as neither: they are hidden in every block
    they are in, and a mod is never called on them (see
    `blocks.real_indices`)."""
    c = block
    query_blocks, columns = -(-length // c), -(-key_length // c)
    cols = ops.arange(columns * c)  # (S',)
    real_cols = cols < key_length
    mod_cols = ops.minimum(cols, key_length - 1)

    def row(i, table):
        rows = i * c + ops.arange(c)  # (C,)
        visible = structure.mod_mask(
            batch, heads, ops.minimum(rows, length - 1), mod_cols
        )  # (B|1, N|1, C|1, S'|1)
        real = ops.logical_and((rows < length)[:, None], real_cols)
        visible = ops.broadcast_to(
            visible, (*ops.shape(visible)[:2], c, columns * c)
        )
        grid = (-1, c, columns, c)
        seen = ops.reshape(ops.logical_and(visible, real), grid)
        whole = ops.reshape(ops.logical_or(visible, ~real), grid)
        kinds = ops.where(
            ops.all(whole, axis=(0, 1, 3)),
            FULL,
            ops.where(ops.any(seen, axis=(0, 1, 3)), PARTIAL, EMPTY),
        )  # (S'/C,)
        return ops.slice_update(table, (i, 0), ops.cast(kinds, "int32")[None])

    table = ops.zeros((query_blocks, columns), "int32")
    return blocks.fori_loop(0, query_blocks, row, table)


def block_lists(table):
    """For each row of a block table `(n, m)`: the columns of its
    `PARTIAL` blocks, in order and first in an `(n, m)` row, and their
    count `(n,)`; the same for its `FULL` blocks. The loops visit those."""
    columns = table.shape[1]
    order = ops.arange(columns, dtype="int32")
    lists = []
    for kind in (PARTIAL, FULL):
        hit = ops.equal(table, kind)
        first = ops.argsort(ops.where(hit, order, columns + order), axis=-1)
        lists += [ops.cast(first, "int32"), ops.sum(ops.cast(hit, "int32"), -1)]
    return tuple(lists)


def _bound(mod):
    return None if mod is None else Bound(mod)


def id_span(ids, block):
    """Each block's smallest and largest non-zero id, `(B, n)` twice; a
    block of padding only spans `[max, min]` of the dtype, which no span
    overlaps."""
    dtype = keras.backend.standardize_dtype(ids.dtype)
    info = np.iinfo(dtype)
    ids = ops.reshape(ids, (ops.shape(ids)[0], -1, block))  # (B, n, C)
    real = ops.not_equal(ids, 0)
    low = ops.min(ops.where(real, ids, ops.full_like(ids, info.max)), -1)
    high = ops.max(ops.where(real, ids, ops.full_like(ids, info.min)), -1)
    return low, high


def _first_and_end(meets):
    """For each row of `meets` `(n, m)`: its first true column and one
    past its last, int32 `(n,)` twice (`m` and `0` for a row with none)."""
    columns = ops.arange(meets.shape[1], dtype="int32")
    first = ops.min(ops.where(meets, columns, meets.shape[1]), -1)
    end = ops.max(ops.where(meets, columns + 1, 0), -1)
    return first, end
