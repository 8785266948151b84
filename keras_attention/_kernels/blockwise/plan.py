"""The plan of one blockwise call: its shapes, blocks and dtypes, and
which key blocks each query block can see (and the reverse) under its
structure.

Shape legend: B batch, T query length, S key length, C block rows,
N query heads, K key/value heads, G = N // K queries per key/value head,
H head dim, V value head dim, P = B x K.
"""

import functools
from typing import Any
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from keras_attention._core import large_negative
from keras_attention._core import same_size
from keras_attention._core.binding import Bound
from keras_attention._core.builtins import Band
from keras_attention._core.builtins import Segments
from keras_attention._core.builtins import relative_bias
from keras_attention._core.mods import BlockTable
from keras_attention._core.mods import Combined
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
        # A relative bias is added along each block's diagonals.
        self.relative_bias = relative_bias(structure.score_mod) is not None
        self.soft_cap = structure.soft_cap
        self.alibi = structure.alibi
        self.band, self.segments = structure.band, structure.segments
        # Top-left causal: only the diagonal block needs the condition.
        self.is_causal = structure.is_top_left_causal
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
        self.tensors = Tensors(
            None if mask is None else self._blocked_mask(mask),
            *self._blocked_segments(structure),
            mask_held=tuple(self.mask_mod.held) if self.mask_mod else (),
            score_constants=tuple(score_constants),
        )
        # Segment ids and mask mods depend on the data: the loops visit
        # the blocks their map lists (`block_lists`), the partial ones
        # with the elementwise mask, the full ones without it.
        self.by_map = self.mask_mod is not None or self.segments is not None
        if self.by_map:
            table = self._mod_blocks()  # (T'/C, S'/C)
            self.tensors = self.tensors._replace(
                key_lists=block_lists(table),
                query_lists=block_lists(ops.transpose(table)),
            )
        padded = self.key_length % block != 0
        # A partial block pair applies every mask mod of the structure (a
        # top-left causal diagonal, the band, the segment ids, the mask
        # mod) and a full one none; the last key block holds the padded
        # keys.
        self.partial_edge = blocks.Edge(padded=padded, partial=True)
        self.full_edge = blocks.Edge(padded=padded)

    @property
    def padded(self):
        return self.full_edge.padded

    def key_spans(self, i):
        """Key blocks `(start, end, full_start, full_end)` of query block
        `i`: the ones it can see, and among them the ones each of its
        rows sees whole (the structure's mask mods need no elementwise
        mask there)."""
        if self.band is None:
            start, end = 0, self.key_blocks
            full_start, full_end = start, end
        else:
            start, end, full_start, full_end = self.band.key_blocks(
                i, self.block, self.key_blocks
            )
        return start, end, full_start, full_end

    def query_spans(self, j):
        """Query blocks `(start, end, full_start, full_end)` of key block
        `j`, as `key_spans`."""
        if self.band is None:
            start, end = 0, self.query_blocks
            full_start, full_end = start, end
        else:
            start, end, full_start, full_end = self.band.query_blocks(
                j, self.block, self.query_blocks
            )
        return start, end, full_start, full_end

    def _mod_blocks(self):
        """Each block pair under every mask mod of the structure (see
        `block_map`); a `BlockTable` of the call's sizes gives its own
        map of the mask mod."""
        sizes = (
            self.batch,
            self.heads,
            self.length,
            self.key_length,
            self.block,
        )
        table = known_mod_blocks(self.structure, *sizes)
        return block_map(self.structure, *sizes, table=table)

    def _blocked_segments(self, structure):
        """Query and key segment ids `(B, T')`, `(B, S')`, padded with 0
        (hidden), or `None` twice."""
        if not structure.has_segments:
            return None, None
        return blocked_ids(structure.segments, self.length, self.key_length,
                           self.block)  # fmt: skip

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
    the blocked mask and segment ids, the mask mod's and score mod's
    tensors, and the block lists of the map (see `block_lists`)."""

    mask: Any
    query_ids: Any
    key_ids: Any
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
    `blocks.real_indices`). A built-in mod's map comes from its ranges
    (`range_kinds`); any other mod is evaluated, one row of blocks at a
    time."""
    known = range_kinds(structure.mask_mod, length, key_length, block)
    if known is not None:
        return known
    return evaluated_blocks(structure, batch, heads, length, key_length, block)


def evaluated_blocks(structure, batch, heads, length, key_length, block):
    """`mod_blocks` by evaluating the mask mod on every position."""
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


def range_kinds(mod, length, key_length, block):
    """The block map of a built-in mask mod, computed from the ranges of
    positions each block pair spans as `mod_blocks` would find it
    evaluated, or `None` for any other mod. Of `and_masks` / `or_masks`
    of built-in mods, the least / greatest kind of its mods': where mods
    overlap in a way their ranges do not show, a block may be `PARTIAL`
    that evaluation finds empty or full, never the reverse."""
    if isinstance(mod, Combined):
        kinds = [range_kinds(m, length, key_length, block) for m in mod.mods]
        if any(k is None for k in kinds):
            return None
        combine = ops.minimum if mod.conjunction else ops.maximum
        return functools.reduce(combine, kinds)
    if isinstance(mod, Segments):
        ids = blocked_ids(mod, length, key_length, block)
        return ops.cast(mod.block_kinds(*ids, block), "int32")
    if isinstance(mod, Band) or hasattr(mod, "block_kinds"):
        return ops.cast(mod.block_kinds(length, key_length, block), "int32")
    return None


def known_mod_blocks(structure, batch, heads, length, key_length, block):
    """The map of the mask mod of `structure` for a call of these sizes
    where it is already known (a `BlockTable` made for them, or one
    `visited_fraction` evaluated), else `None`."""
    sizes = (batch, heads, length, key_length, block)
    mod = structure.mask_mod
    if isinstance(mod, BlockTable) and _same_sizes(sizes, mod.sizes()):
        return ops.convert_to_tensor(mod.blocks)
    if structure.mod_map is not None and _same_sizes(
        sizes, structure.mod_map[0]
    ):
        return structure.mod_map[1]
    return None


def _same_sizes(sizes, others):
    """Equal sizes, or the very sizes a map was made for (unknown ones
    included: `mod_map` holds the sizes of this call)."""
    return all(
        a is b or same_size(a, b) for a, b in zip(sizes, others, strict=True)
    )


def visited_fraction(structure, batch, heads, length, key_length, block):
    """The fraction of block pairs the blockwise path visits in a call of
    these sizes (a 0-d float32 tensor). The mask mod's map it evaluates
    stays on `structure`, for the path that runs next."""
    sizes = (batch, heads, length, key_length, block)
    table = known_mod_blocks(structure, *sizes)
    if table is None and structure.mask_mod is not None:
        table = mod_blocks(structure, *sizes)
        structure.mod_map = (sizes, table)
    table = block_map(structure, *sizes, table=table)
    return ops.mean(ops.cast(table > 0, "float32"))


def static_visited_fraction(structure, length, key_length, block):
    """The fraction of block pairs the blockwise path visits, known from
    the sizes alone (a float), or `None` where it depends on the data
    (segment ids, a mask mod) or on an offset known only as the program
    runs."""
    if structure is None:
        return 1.0
    if structure.segments is not None or structure.mask_mod is not None:
        return None
    band = structure.band
    if band is None:
        return 1.0
    if not isinstance(band.offset, int | np.integer):
        return None
    kinds = band.block_kinds(length, key_length, block, xp=np)
    return float(np.mean(kinds > 0))


def block_map(structure, batch, heads, length, key_length, block, table=None):
    """Each block pair of `block` rows under every mask mod of
    `structure`, int32 `(T'/C, S'/C)`: `EMPTY` where one of them hides
    every position, `FULL` where all of them show every one, else
    `PARTIAL`. The mask mod's map is `table` if given, else evaluated
    (`mod_blocks`); the band's comes from its bounds, the segment ids'
    from each block's ids (`Segments.block_kinds`)."""
    if table is None and structure.mask_mod is not None:
        table = mod_blocks(structure, batch, heads, length, key_length, block)
    if table is None:
        shape = (-(-length // block), -(-key_length // block))
        table = ops.full(shape, FULL, "int32")
    if structure.band is not None:
        kinds = structure.band.block_kinds(length, key_length, block)
        table = ops.minimum(table, kinds)
    if structure.segments is not None:
        ids = blocked_ids(structure.segments, length, key_length, block)
        kinds = structure.segments.block_kinds(*ids, block)
        table = ops.minimum(table, kinds)
    return ops.cast(table, "int32")


def blocked_ids(segments, length, key_length, block):
    """The query and key ids of `segments`, `(B, T')` and `(B, S')`,
    padded to whole blocks with 0 (hidden). Ids of a whole sequence, given
    to a cached step at its start, are cut to the call's positions."""
    return tuple(
        ops.pad(ids[:, :n], [(0, 0), (0, -n % block)])
        for ids, n in (
            (segments.query_ids, length),
            (segments.key_ids, key_length),
        )
    )


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
