"""The built-in mods: what the structure arguments are.

`is_causal` and `sliding_window` are a `Band`, `segment_ids` are
`Segments`, `logit_soft_cap` is a `SoftCap` and `alibi` an `Alibi`: mods
of the protocol in `_core.mods`, which `keras_attention.mods` returns
too (`mods.causal()` is a `Band`). Besides their elementwise meaning, the
mask mods know their block map without evaluating it: a band from its
bounds, segment ids from each block's smallest and largest id. The
blockwise path reads those maps to skip empty block pairs and to leave
out the elementwise mask where a block is full; a mod it does not know
is evaluated into a map (`_kernels.blockwise.plan.mod_blocks`).

Shape legend: B batch, N heads, T query length, S key length, C block
rows, R query rows and C keys of a grid.
"""

import inspect

import keras
import numpy as np
from keras import ops

from keras_attention._core.mods import Chained
from keras_attention._core.mods import Combined
from keras_attention._core.mods import Positioned

# A band bound this wide reaches every key of any sequence that fits in
# memory; kept as a number, `p + right` could overflow int32 positions.
_REACH = 2**30


class Band:
    """Query `i`, at position `p = i + offset` among the keys, sees key
    `j` when `p - left <= j <= p + right` (a `None` bound is unbounded).

    Causal attention is `right=0`; a window of `w` causal keys
    `left=w - 1, right=0`; bottom-right alignment `offset = S - T`.
    """

    def __init__(self, left=None, right=None, offset=0):
        self.left, self.right = (
            None if bound is None or bound >= _REACH else int(bound)
            for bound in (left, right)
        )
        self.offset = offset

    def __call__(self, batch, head, q_idx, kv_idx):
        return self.visible(q_idx, kv_idx)

    def visible(self, rows, cols):
        """The band at query rows `rows` and keys `cols` (broadcasting
        integer tensors); all true for an unbounded band."""
        position = rows + self.offset
        visible = ops.ones_like(cols - position, "bool")
        if self.left is not None:
            visible = cols >= position - self.left
        if self.right is not None:
            visible = ops.logical_and(visible, cols <= position + self.right)
        return visible

    def intersect(self, other):
        """The band both allow; both must have the same offset."""
        left = _tighter(self.left, other.left)
        return Band(left, _tighter(self.right, other.right), self.offset)

    def shifted(self, offset):
        """The same bounds with `offset` added to the query positions."""
        return Band(self.left, self.right, self.offset + offset)

    def key_blocks(self, i, block, count):
        """Key blocks `[start, end)` that query block `i` of `block` rows
        can see, and `[full_start, full_end)` that each of its rows sees
        whole (both clipped into `[0, count]`; `i` an int or int
        tensor, of any shape)."""
        first = i * block + self.offset  # the first row's position
        last = first + block - 1
        low = high = None  # (for some row, for every row)
        if self.left is not None:
            low = (first - self.left, last - self.left)
        if self.right is not None:
            high = (last + self.right, first + self.right)
        return _blocks(count, low, high, block)

    def block_kinds(self, length, key_length, block, xp=ops):
        """Each block pair of `length` queries and `key_length` keys in
        blocks of `block`, int32 `(T'/C, S'/C)`: 0 where the band hides
        every position, 2 where it shows every one, else 1 (padding
        counts as neither). Over a block pair's rows `r0..r1` and keys
        `k0..k1`, `j - p` takes every value from `k0 - r1 - offset` to
        `k1 - r0 - offset`; the band keeps `-left..right` of them.
        `xp=numpy` computes it ahead of any program, for static sizes
        and offset."""
        rows = xp.arange(-(-length // block), dtype="int32")[:, None] * block
        cols = xp.arange(-(-key_length // block), dtype="int32")[None] * block
        low = cols - xp.minimum(rows + block, length) + 1 - self.offset
        high = xp.minimum(cols + block, key_length) - 1 - rows - self.offset
        reached = full = xp.ones_like(low - high, "bool")
        if self.left is not None:
            reached = high >= -self.left
            full = low >= -self.left
        if self.right is not None:
            reached = xp.logical_and(reached, low <= self.right)
            full = xp.logical_and(full, high <= self.right)
        return xp.where(full, 2, xp.where(reached, 1, 0))

    def query_blocks(self, j, block, count):
        """Query blocks `[start, end)` that can see key block `j`, and
        `[full_start, full_end)` each of whose rows sees all of it."""
        first = j * block - self.offset  # the first key, minus the offset
        last = first + block - 1
        low = high = None  # (for some key, for every key)
        if self.right is not None:
            low = (first - self.right, last - self.right)
        if self.left is not None:
            high = (last + self.left, first + self.left)
        return _blocks(count, low, high, block)


def _blocks(count, low, high, block):
    """`(start, end, full_start, full_end)` of the blocks between a lower
    bound and an upper one, each `(for some row, for every row)` or
    `None` when unbounded: a block is reached when it holds a position at or
    above the lower bound of some row and at or below the upper, full
    when every position is within both for every row."""
    start, full_start, end, full_end = 0, 0, count, count
    if low is not None:
        start = _clip(_floor_divide(low[0], block), 0, count)
        full_start = _clip(-_floor_divide(-low[1], block), 0, count)
    if high is not None:
        end = _clip(_floor_divide(high[0], block) + 1, 0, count)
        full_end = _clip(_floor_divide(high[1] + 1, block), 0, count)
    full_start = _clip(full_start, start, end)
    return start, end, full_start, _clip(full_end, full_start, end)


class Segments:
    """Packed sequences: query `i` of row `b` sees key `j` when
    `query_ids[b, i] == key_ids[b, j] != 0` (0 marks padding).

    Attributes:
        query_ids, key_ids: integer tensors `(B, T)` and `(B, S)`.
    """

    def __init__(self, query_ids, key_ids):
        self.query_ids, self.key_ids = query_ids, key_ids

    def __call__(self, batch, head, q_idx, kv_idx):
        query = _gather_rows(self.query_ids, batch, q_idx)
        key = _gather_rows(self.key_ids, batch, kv_idx)
        return ops.logical_and(ops.equal(query, key), ops.not_equal(key, 0))

    def block_kinds(self, query_ids, key_ids, block):
        """Each block pair of ids padded to whole blocks of `block` with 0
        (hidden), int32 `(T'/C, S'/C)`: 0 where the blocks' id spans
        meet in no row of the batch, 2 where both blocks hold one id, the
        same, in every row, else 1 (as `Band.block_kinds`)."""
        meets, whole = self._pairs(query_ids, key_ids, block)
        return ops.where(whole, 2, ops.where(meets, 1, 0))

    def _pairs(self, query_ids, key_ids, block):
        """Block pairs `(T'/C, S'/C)` whose id spans meet in some row, and
        those that are one id, the same, in every row. A block's ids
        span `[lo, hi]` (0, padding, left out); two blocks can share an
        id only where their spans overlap."""
        query_lo, query_hi = _id_span(query_ids, block)  # (B, T'/C)
        key_lo, key_hi = _id_span(key_ids, block)  # (B, S'/C)
        lengths = [static_length(x) for x in (self.query_ids, self.key_ids)]
        meets = ops.logical_and(
            query_lo[:, :, None] <= key_hi[:, None, :],
            key_lo[:, None, :] <= query_hi[:, :, None],
        )  # (B, T'/C, S'/C)
        query_one = _one_id(query_ids, query_lo, query_hi, block, lengths[0])
        key_one = _one_id(key_ids, key_lo, key_hi, block, lengths[1])
        whole = ops.logical_and(
            ops.logical_and(query_one[:, :, None], key_one[:, None, :]),
            ops.equal(query_lo[:, :, None], key_lo[:, None, :]),
        )  # (B, T'/C, S'/C)
        return ops.any(meets, axis=0), ops.all(whole, axis=0)


def segments_visible(query_segments, key_segments):
    """`(B, T, S)`: equal segment ids, key id not 0 (padding)."""
    queries = ops.expand_dims(query_segments, 2)  # (B, T, 1)
    keys = ops.expand_dims(key_segments, 1)  # (B, 1, S)
    return ops.logical_and(ops.equal(queries, keys), ops.not_equal(keys, 0))


class SoftCap:
    """Logits become `cap tanh(score / cap)` (Gemma 2)."""

    def __init__(self, cap):
        self.cap = float(cap)

    def __call__(self, score, batch, head, q_idx, kv_idx):
        return self.cap * ops.tanh(score / self.cap)


class Alibi:
    """The linear biases of ALiBi (Press et al. 2022): `score - m_h |p -
    j|` for query position `p = i + offset` and key `j`, with the head
    slopes `m_h` of `alibi_slopes`."""

    def __init__(self, num_heads, offset=0):
        self.num_heads, self.offset = num_heads, offset
        self.slopes = np.asarray(alibi_slopes(num_heads), "float32")

    def __call__(self, score, batch, head, q_idx, kv_idx):
        slopes = ops.take(ops.convert_to_tensor(self.slopes), head)
        distance = ops.abs(q_idx + self.offset - kv_idx)
        distance = ops.cast(distance, score.dtype)
        return score - ops.cast(slopes, score.dtype) * distance

    def bias(self, rows, cols):
        """`-m_n |p_i - j|`, float32 `(N, R, C)` for query rows `rows`
        `(R, 1)` and key positions `cols` `(1, C)`."""
        distance = ops.abs(rows + self.offset - cols)  # (R, C)
        slopes = ops.convert_to_tensor(self.slopes, "float32")
        return -slopes[:, None, None] * ops.cast(distance, "float32")


class RelativeBias:
    """A score mod that adds a bias depending only on the head and the
    relative position `kv_idx - q_idx` (T5's relative position bias).
    Besides its elementwise call, it gives the bias of whole relative
    positions (`distance_bias`): a block of `R x C` logits holds only
    `R + C - 1` of them, so the blockwise path computes those and lays
    them out along the block's diagonals (`relative_block_bias`): the
    lookup of a bias table runs once per relative position, not once per
    logit, and so does its gradient."""

    def distance_bias(self, num_heads, distance):
        """The bias `(N, D)` of `num_heads` heads at relative positions
        `distance` `(D,)` (`kv_idx - q_idx`)."""
        raise NotImplementedError


def relative_bias(mod):
    """`(bias, offset)` where the score mod `mod` is a `RelativeBias`
    (as it is, positioned, or a Keras layer's `call`) that adds
    `bias.distance_bias` at relative position `kv_idx - q_idx - offset`;
    `None` for any other mod. A subclass whose elementwise call is not the
    one that comes with its `distance_bias` is any other mod."""
    offset = 0
    if isinstance(mod, Positioned):
        mod, offset = mod.mod, mod.offset
    call = "__call__"
    if inspect.ismethod(mod) and mod.__name__ == "call":
        mod, call = mod.__self__, "call"
    if not isinstance(mod, RelativeBias):
        return None
    if _defined_in(type(mod), call) is not _defined_in(
        type(mod), "distance_bias"
    ):
        return None
    return mod, offset


def _defined_in(cls, name):
    return next((c for c in cls.__mro__ if name in vars(c)), None)


def relative_block_bias(mod, num_heads, first_query, first_key, rows, cols):
    """The bias `(N, R, C)` that the `RelativeBias` score mod `mod` (see
    `relative_bias`) adds to `R x C` logits of query indices `first_query
    + r` and key indices `first_key + c`."""
    bias, offset = relative_bias(mod)
    first = first_key - first_query - (rows - 1)  # at (r, c) = (R - 1, 0)
    distance = ops.arange(rows + cols - 1, dtype="int32") + ops.cast(
        first - offset, "int32"
    )
    diagonals = bias.distance_bias(num_heads, distance)  # (N, R + C - 1)
    return along_diagonals(diagonals, rows, cols)


def along_diagonals(diagonals, rows, cols):
    """`(N, R, C)` whose entry `(r, c)` is `diagonals[:, c - r + R - 1]`,
    for `diagonals` `(N, R + C - 1)`: a Toeplitz matrix per head."""
    width = rows + cols - 1
    if rows > cols:
        # The transpose of the layout with the diagonals reversed: its
        # copy below is then min(R, C) rows of R + C, not R rows.
        flipped = along_diagonals(ops.flip(diagonals, axis=-1), cols, rows)
        return ops.transpose(flipped, (0, 2, 1))
    if keras.backend.backend() == "tensorflow":
        # TensorFlow gathers whole rows of heads (and scatters them in the
        # gradient) faster than it copies and sums the layout below.
        index = ops.arange(cols)[None, :] - ops.arange(rows)[:, None]
        laid = ops.take(ops.transpose(diagonals), index + rows - 1, axis=0)
        return ops.transpose(laid, (2, 0, 1))  # from (R, C, N)
    # Row r of the (R, L + 1) repetition of the padded diagonals, read
    # from flat offset R - 1 with a stride of L, starts at diagonal
    # R - 1 - r: the layout is a copy, and its gradient a sum over rows,
    # where a gather's gradient would scatter every entry.
    padded = ops.pad(diagonals, ((0, 0), (0, 1)))  # (N, L + 1)
    repeated = ops.broadcast_to(
        padded[:, None, :], (ops.shape(diagonals)[0], rows, width + 1)
    )
    flat = ops.reshape(repeated, (-1, rows * (width + 1)))
    skewed = flat[:, rows - 1 : rows - 1 + rows * width]
    return ops.reshape(skewed, (-1, rows, width))[:, :, :cols]


def alibi_slopes(num_heads):
    """The head slopes of ALiBi (Press et al. 2022): `2^(-8 h / n)` for
    `h = 1..n` heads when `n` is a power of two; otherwise those of the
    largest power of two below, then every other slope of twice that."""

    def powers(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    base = 2 ** int(np.floor(np.log2(num_heads)))
    return powers(base) + powers(2 * base)[0::2][: num_heads - base]


def conjuncts(mod):
    """The mask mods that must all allow a key for `mod` to."""
    if isinstance(mod, Positioned) and _is_conjunction(mod.mod):
        return [m for p in mod.mod.mods for m in conjuncts(mod.rewrapped(p))]
    if _is_conjunction(mod):
        return [m for part in mod.mods for m in conjuncts(part)]
    return [] if mod is None else [mod]


def _is_conjunction(mod):
    return isinstance(mod, Combined) and mod.conjunction


def links(mod):
    """The score mods applied one after the other for `mod`."""
    if isinstance(mod, Positioned) and isinstance(mod.mod, Chained):
        return [m for p in mod.mod.mods for m in links(mod.rewrapped(p))]
    if isinstance(mod, Chained):
        return [m for part in mod.mods for m in links(part)]
    return [] if mod is None else [mod]


def unpositioned(mod):
    """A positioned built-in mod as the built-in mod of its offset (the
    query position minus the key position); any other mod as it is."""
    if not isinstance(mod, Positioned):
        return mod
    inner, shift = mod.mod, mod.offset
    if isinstance(inner, Band):
        return inner.shifted(shift)
    if isinstance(inner, Alibi):
        return Alibi(inner.num_heads, _add(inner.offset, shift))
    if isinstance(inner, SoftCap):
        return inner
    return mod


def _gather_rows(ids, batch, index):
    """`ids[batch, index]` for broadcasting index tensors."""
    length = ops.shape(ids)[1]
    flat = ops.reshape(ids, (-1,))
    return ops.take(flat, batch * length + index)


def _id_span(ids, block):
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


def _one_id(ids, low, high, block, length):
    """`(B, n)`: whether each block holds one id and no padding id among
    its first `length` positions (the others pad the blocks)."""
    real = ops.reshape(ops.arange(ops.shape(ids)[1]) < length, (1, -1, block))
    ids = ops.reshape(ids, (ops.shape(ids)[0], -1, block))  # (B, n, C)
    padding = ops.any(ops.logical_and(ops.equal(ids, 0), real), axis=-1)
    return ops.logical_and(ops.equal(low, high), ops.logical_not(padding))


def static_length(ids):
    """The length of `ids` `(B, L)`: static where known."""
    length = ids.shape[1]
    return length if isinstance(length, int) else ops.shape(ids)[1]


def _add(a, b):
    if isinstance(a, int) and a == 0:
        return b
    if isinstance(b, int) and b == 0:
        return a
    return a + b


def _tighter(a, b):
    if a is None or b is None:
        return b if a is None else a
    return min(a, b)


def _floor_divide(a, b):
    return a // b if isinstance(a, int) else ops.floor_divide(a, b)


def _clip(x, low, high):
    if all(isinstance(v, int) for v in (x, low, high)):
        return min(max(x, low), high)
    return ops.minimum(ops.maximum(x, low), high)
