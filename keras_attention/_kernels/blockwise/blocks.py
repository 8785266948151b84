"""What the forward and backward loops share: loops over block ranges,
reading and writing a block's rows, and the logits of one block pair
(soft cap, ALiBi, hidden positions).

Shape legend: B batch, T query length, S key length, C block rows,
N query heads, K key/value heads, G = N // K queries per key/value head,
H head dim, V value head dim, P = B x K.
"""

from keras import ops

from keras_attention._core import segments_visible
from keras_attention._core.builtins import relative_block_bias
from keras_attention._kernels import backends


def minimum(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return ops.minimum(a, b)


def floor_divide(a, b):
    return a // b if isinstance(a, int) else ops.floor_divide(a, b)


def clip(x, low, high):
    if isinstance(x, int):
        return min(max(x, low), high)
    return ops.clip(x, low, high)


def loop(start, end, body, carry, **flags):
    """`body(i, carry, **flags)` for `i` in `[start, end)`; nothing when
    the range is statically empty."""
    if isinstance(start, int) and isinstance(end, int) and start >= end:
        return carry
    return fori_loop(start, end, lambda i, c: body(i, c, **flags), carry)


def visit(plan, lists, index, body, carry):
    """`body(j, carry, edge=...)` for each block `j` that the block lists
    (`plan.block_lists`) give row `index`: its partial blocks with the mask
    mods applied, then its full blocks without them."""
    partial, partial_count, full, full_count = lists
    for columns, count, edge_ in (
        (partial, partial_count, plan.partial_edge),
        (full, full_count, plan.full_edge),
    ):
        row = ops.take(columns, index, axis=0)  # (m,)

        def step(n, carry, row=row, edge_=edge_):
            return body(ops.take(row, n), carry, edge=edge_)

        carry = fori_loop(0, ops.take(count, index), step, carry)
    return carry


def spans(plan, bounds, body, carry, padded):
    """`body(n, carry, edge=...)` over the blocks `[start, end)` of
    `bounds = (start, end, full_start, full_end)`: the full ones without
    the structure's mask mods, the others with them; `padded`: whether
    every block holds padded keys."""
    start, end, full_start, full_end = bounds
    partial = Edge(padded=padded, partial=True)
    carry = loop(start, full_start, body, carry, edge=partial)
    carry = loop(full_start, full_end, body, carry, edge=Edge(padded=padded))
    return loop(full_end, end, body, carry, edge=partial)


def fori_loop(start, end, body, carry):
    """`ops.fori_loop`, two iterations at a time on TensorFlow (see
    `backends.tensorflow.fori_loop`)."""
    return backends.current().fori_loop(start, end, body, carry)


def rows(tensor, index):
    """Block `index` of a tensor in the loops' layout `(n, ...)` (see
    `layout`), a slice of the leading axis."""
    shape = list(ops.shape(tensor))
    starts = [index] + [0] * (len(shape) - 1)
    return ops.slice(tensor, starts, [1, *shape[1:]])[0]


def buffer(count, shape, dtype):
    """Zeros for `count` blocks of `shape`, as the backend's buffer of
    blocks (see `backends`): the loops read and write one block at a
    time (`read_block`, `write_block`)."""
    return backends.current().block_buffer(ops.zeros((count, *shape), dtype))


def read_block(blocks, index):
    """Block `index` of a `buffer`."""
    return backends.current().read_block(blocks, index)


def write_block(blocks, index, block):
    """The `buffer` with block `index` set to `block`."""
    return backends.current().write_block(blocks, index, block)


def stacked(blocks):
    """A `buffer`'s blocks as one tensor `(n, ...)`, in the loops'
    layout."""
    return backends.current().stacked_blocks(blocks)


def score(plan, i, j, logits, held):
    """The logits `(P, G*C, C)` of block pair `(i, j)` through the score
    mod, with `held = (tensors, constants)` in place of the mod's own."""
    if plan.relative_bias:
        return add_bias(plan, logits, relative_bias(plan, i, j, held))
    c = plan.block
    scores = ops.reshape(logits, (-1, plan.heads, c, c))  # (B, N, C, C)
    mod = plan.score_mod
    rows, cols = real_indices(plan, i, j)

    def bound(scores, *indices):
        return mod(held, scores, *indices)

    scores = plan.structure.with_mods(score_mod=bound).modify_scores(
        scores, rows, cols
    )
    return ops.reshape(scores, (-1, plan.groups * c, c))


def relative_bias(plan, i, j, held):
    """The bias `(N, C, C)` of block pair `(i, j)` under a relative score
    mod (`plan.relative_bias`), with `held` in place of its tensors: its
    2C - 1 relative positions laid along the block's diagonals (the
    padding past the last query or key gets a bias it hides)."""
    c = plan.block
    bias = plan.score_mod.apply(
        held, lambda m: relative_block_bias(m, plan.heads, i * c, j * c, c, c)
    )
    return ops.cast(bias, plan.compute_dtype)


def add_bias(plan, logits, bias):
    """`logits` `(P, G*C, C)` plus `bias` `(N, C, C)` in every row of the
    batch."""
    c = plan.block
    scores = ops.reshape(logits, (-1, plan.heads, c, c))  # (B, N, C, C)
    scores = scores + bias
    return ops.reshape(scores, (-1, plan.groups * c, c))


def transform(plan, i, j, logits):
    """The logits `(P, G*C, C)` of block pair `(i, j)` soft-capped and
    with the ALiBi bias, and the cap's derivative (or `None`)."""
    slope = None
    if plan.soft_cap is not None:
        capped = ops.tanh(logits / plan.soft_cap)
        logits, slope = plan.soft_cap * capped, 1.0 - capped * capped
    if plan.alibi:
        c = plan.block
        rows = i * c + ops.arange(c)  # (C,) query rows
        cols = j * c + ops.arange(c)  # (C,) key positions
        bias = plan.structure.alibi_bias(
            plan.heads, rows[:, None], cols[None, :]
        )  # (N, C, C)
        bias = ops.reshape(bias, (plan.kv_heads, plan.groups, c, c))
        logits = ops.reshape(logits, (-1, plan.kv_heads, plan.groups, c, c))
        logits = logits + ops.cast(bias, logits.dtype)
        logits = ops.reshape(logits, (-1, plan.groups * c, c))
    return logits, slope


def real_indices(plan, i, j):
    """The query rows and keys `(C,)` of block pair `(i, j)` that a mod is
    called with: the padding past the last query or key is given the last
    one's index (it is hidden anyway), so that a mod never sees an index
    outside its tensors."""
    c = plan.block
    rows = ops.minimum(i * c + ops.arange(c), plan.length - 1)
    cols = ops.minimum(j * c + ops.arange(c), plan.key_length - 1)
    return rows, cols


class Edge:
    """What a block pair applies beyond the user's mask: the padded keys
    of the last key block, and, in a partial block pair, every mask mod
    of the structure (the band, the segment ids, the mask mod)."""

    def __init__(self, padded=False, partial=False):
        self.padded, self.partial = padded, partial


def hide(plan, tensors, i, j, logits, edge):
    """`logits` `(P, G*C, C)` of block pair `(i, j)` with every hidden
    position set to a large negative number."""
    c = plan.block
    mask = tensors.mask
    visible = None
    if mask is not None:
        b, k, g, rows, _ = ops.shape(mask)  # a batch may be unknown
        starts = (0, 0, 0, i * c if rows != 1 else 0, j * c)
        visible = ops.slice(mask, starts, (b, k, g, min(rows, c), c))
    keys = j * c + ops.arange(c)  # (C,) key positions
    queries = i * c + ops.arange(c)  # (C,) query rows
    conditions = []
    if edge.padded:
        conditions.append(keys < plan.key_length)
    if edge.partial and plan.band is not None:
        conditions.append(
            plan.band.visible(queries[:, None], keys[None, :])
        )  # (C, C)
    if edge.partial and plan.segments is not None:
        batch = ops.shape(tensors.query_ids)[0]
        same = segments_visible(
            ops.slice(tensors.query_ids, (0, i * c), (batch, c)),
            ops.slice(tensors.key_ids, (0, j * c), (batch, c)),
        )  # (B, C, C)
        conditions.append(ops.expand_dims(same, (1, 2)))  # (B, 1, 1, C, C)
    if edge.partial and plan.mask_mod is not None:
        conditions.append(
            _mod_visible(plan, tensors, *real_indices(plan, i, j))
        )
    for condition in conditions:
        visible = (
            condition
            if visible is None
            else ops.logical_and(visible, condition)
        )
    if visible is None:
        return logits
    logits = ops.reshape(logits, (-1, plan.kv_heads, plan.groups, c, c))
    logits = ops.where(visible, logits, ops.cast(plan.negative, logits.dtype))
    return ops.reshape(logits, (-1, plan.groups * c, c))


def _mod_visible(plan, tensors, rows, cols):
    """The mask mod at query rows `rows` and keys `cols` `(C,)` as
    `(B|1, K|1, G|1, C, C)`."""
    mod = plan.mask_mod

    def bound(*indices):
        return mod(list(tensors.mask_held), *indices)

    visible = plan.structure.with_mods(mask_mod=bound).mod_mask(
        plan.batch, plan.heads, rows, cols
    )  # (B|1, N|1, C|1, C|1)
    c = plan.block
    visible = ops.broadcast_to(visible, (*ops.shape(visible)[:2], c, c))
    if visible.shape[1] == 1:
        return ops.expand_dims(visible, 1)  # (B|1, 1, 1, C, C)
    return ops.reshape(visible, (-1, plan.kv_heads, plan.groups, c, c))
