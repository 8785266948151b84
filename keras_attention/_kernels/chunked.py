"""The memory-efficient path: blockwise attention with an online softmax.

The `(T, S)` logits are never materialised. Queries and keys are cut into
blocks of `C` rows; for each query block a loop runs over the key blocks,
keeping a running maximum `m`, a running sum `l` of the exponentials and
an unnormalised output, rescaled whenever the maximum grows (Milakov and
Gimelshein 2018; Rabe and Staats 2021; Dao et al. 2022, FlashAttention).
The backward pass is written by hand, as in FlashAttention-2 (Dao 2023):
it keeps only the output and the log-sum-exp of each row from the
forward pass and recomputes each block's logits once, so a training step
holds `O(B x N x C^2)` attention buffers beyond its inputs and outputs.

Block pairs that the structure leaves empty are never computed: with a
top-left causal structure, query block `i` visits key blocks `0..i`
only, and the backward pass visits, for key block `j`, query blocks
`j..` only, which skips about half of the work for `T = S`; only the
diagonal block applies the causal condition. Any other band (bottom-right
alignment, a sliding window) visits the key blocks the band reaches and
applies the band, the padded keys and the segment ids in every block.
Segment ids narrow the range further: a block pair whose query and key
ids share no value in any row of the batch is left out (packed
sequences reach only the blocks of their own documents). Which blocks
those are depends on the ids, so the ranges are computed on the device,
once per call, from each block's smallest and largest id.

Shape legend: B batch, T query length, S key length, C block rows,
N query heads, K key/value heads, G = N // K queries per key/value head,
H head dim, V value head dim, P = B x K.
"""

from typing import Any
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from keras_attention._kernels.structure import segments_visible


def chunked_attention(
    query, key, value, mask, structure, scale, reference, chunk_size
):
    """Attention over blocks of `chunk_size` queries and keys.

    `mask` has the weights' rank (`(B|1, T|1, S)` for 3-D inputs,
    `(B|1, N|1, T|1, S)` for 4-D) or is `None`; `structure` (a
    `structure.Structure`) may come with it, and is what lets blocks be
    skipped. `reference` is unused: the blocks compute the same math.
    """
    del reference
    single_head = len(query.shape) == 3
    if single_head:
        query, key, value = (ops.expand_dims(x, 2) for x in (query, key, value))
        if mask is not None:
            mask = ops.expand_dims(mask, 1)  # (B|1, 1, T|1, S)
    plan = _Plan(query, key, value, mask, structure, scale, chunk_size)
    output = _with_gradient(plan)(query, key, value, plan.tensors)
    if single_head:
        output = ops.squeeze(output, 2)  # (B, T, V)
    return output


class _Plan:
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
        # Below every real logit, and safe to subtract from in float32.
        self.negative = -1e30
        segments = self._blocked_segments(structure)
        self.tensors = _Tensors(
            None if mask is None else self._blocked_mask(mask),
            *segments,
            *self._segment_reach(*segments),
        )
        padded = self.key_length % block != 0
        # The last key block a query block sees: its causal diagonal, and
        # the one with the padded keys.
        self.key_edge = _Edge(causal=self.is_causal, padded=padded)
        # Every block of a general structure.
        self.full_edge = _Edge(
            padded=padded,
            band=structure.has_band,
            segments=structure.has_segments,
        )

    def key_range(self, i, tensors):
        """Key blocks `[start, end)` that query block `i` can see (an
        empty range when `end <= start`)."""
        if self.is_causal:
            return 0, _minimum(i + 1, self.key_blocks)
        c, band = self.block, self.structure
        start, end = 0, self.key_blocks
        if band.left is not None:
            first = i * c + band.offset - band.left  # first row's first key
            start = _clip(_floor_divide(first, c), 0, self.key_blocks)
        if band.right is not None:
            last = i * c + c - 1 + band.offset + band.right
            end = _clip(_floor_divide(last, c) + 1, 0, self.key_blocks)
        if band.has_segments:
            start = ops.maximum(start, ops.take(tensors.key_starts, i))
            end = ops.minimum(end, ops.take(tensors.key_ends, i))
        return start, end

    def query_range(self, j, tensors):
        """Query blocks `[start, end)` that can see key block `j`."""
        if self.is_causal:
            return _minimum(j, self.query_blocks), self.query_blocks
        c, band = self.block, self.structure
        start, end = 0, self.query_blocks
        if band.right is not None:
            first = j * c - band.right - band.offset
            start = _clip(_floor_divide(first, c), 0, self.query_blocks)
        if band.left is not None:
            last = j * c + c - 1 + band.left - band.offset
            end = _clip(_floor_divide(last, c) + 1, 0, self.query_blocks)
        if band.has_segments:
            start = ops.maximum(start, ops.take(tensors.query_starts, j))
            end = ops.minimum(end, ops.take(tensors.query_ends, j))
        return start, end

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
        query_lo, query_hi = _id_span(query_ids, self.block)  # (B, T'/C)
        key_lo, key_hi = _id_span(key_ids, self.block)  # (B, S'/C)
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


class _Tensors(NamedTuple):
    """The plan's tensors, each `None` when the call has no such thing:
    the blocked mask, the blocked segment ids, and the block ranges the
    ids leave (see `_Plan._segment_reach`)."""

    mask: Any
    query_ids: Any
    key_ids: Any
    key_starts: Any
    key_ends: Any
    query_starts: Any
    query_ends: Any


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


def _first_and_end(meets):
    """For each row of `meets` `(n, m)`: its first true column and one
    past its last, int32 `(n,)` twice (`m` and `0` for a row with none)."""
    columns = ops.arange(meets.shape[1], dtype="int32")
    first = ops.min(ops.where(meets, columns, meets.shape[1]), -1)
    end = ops.max(ops.where(meets, columns + 1, 0), -1)
    return first, end


def _minimum(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return ops.minimum(a, b)


def _floor_divide(a, b):
    return a // b if isinstance(a, int) else ops.floor_divide(a, b)


def _clip(x, low, high):
    if isinstance(x, int):
        return min(max(x, low), high)
    return ops.clip(x, low, high)


def _with_gradient(plan):
    """`fn(query, key, value, tensors)`: the attention output
    `(B, T, N, V)`, differentiated by `_backward` on every backend.
    `tensors` are the plan's blocked mask, segment ids and their block
    ranges."""

    def forward(query, key, value, tensors):
        query, key, value = _to_blocks(plan, query, key, value)
        outputs, lse = _forward(plan, query, key, value, tensors)
        output = _from_query_blocks(plan, outputs, plan.dtypes[2])
        return output, (query, key, value, outputs, lse)

    def backward(tensors, residuals, grad):
        query, key, value, outputs, lse = residuals
        grad = _query_blocks(plan, ops.cast(grad, plan.compute_dtype))
        grads = _backward(plan, query, key, value, tensors, outputs, lse, grad)
        grad_query, grad_key, grad_value = grads
        return (
            _from_query_blocks(plan, grad_query * plan.scale, plan.dtypes[0]),
            _from_key_blocks(plan, grad_key, plan.dtypes[1]),
            _from_key_blocks(plan, grad_value, plan.dtypes[2]),
        )

    return _custom_gradient(forward, backward)


def _custom_gradient(forward, backward):
    """`fn(query, key, value, tensors)` whose value is `forward(...)[0]`
    and whose gradients are `backward(tensors, residuals, grad)`; the
    tensors (mask, segment ids) get none."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        @jax.custom_vjp
        def fn(query, key, value, mask):
            return forward(query, key, value, mask)[0]

        def fn_forward(query, key, value, mask):
            output, residuals = forward(query, key, value, mask)
            return output, (residuals, mask)

        def fn_backward(saved, grad):
            residuals, mask = saved
            return (*backward(mask, residuals, grad), None)

        fn.defvjp(fn_forward, fn_backward)
        return fn
    if backend == "tensorflow":
        import tensorflow as tf

        def fn(query, key, value, mask):
            @tf.custom_gradient
            def attend(query, key, value):
                output, residuals = forward(query, key, value, mask)
                return output, lambda grad: backward(mask, residuals, grad)

            return attend(query, key, value)

        return fn
    import torch

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, query, key, value, mask):
            output, residuals = forward(query, key, value, mask)
            ctx.save_for_backward(*residuals)
            ctx.mask = mask
            return output

        @staticmethod
        def backward(ctx, grad):
            return (*backward(ctx.mask, ctx.saved_tensors, grad), None)

    return Attention.apply


def _to_blocks(plan, query, key, value):
    """The inputs in the loops' layout, padded to whole blocks: the query
    `(P, G, T', H)`, scaled, and the key and value `(P, S', H|V)`, all in
    the compute dtype."""
    dtype = plan.compute_dtype
    query = ops.cast(query, dtype) * ops.cast(plan.scale, dtype)
    return (
        _query_blocks(plan, query),
        _key_blocks(plan, ops.cast(key, dtype)),
        _key_blocks(plan, ops.cast(value, dtype)),
    )


def _query_blocks(plan, tensor):
    """`(B, T, N, X)` as `(P, G, T', X)`, query head `n = k * G + g`."""
    tensor = ops.transpose(tensor, (0, 2, 1, 3))  # (B, N, T, X)
    tensor = ops.reshape(
        tensor, (-1, plan.groups, plan.length, tensor.shape[-1])
    )  # (P, G, T, X)
    pad = plan.query_blocks * plan.block - plan.length
    return (
        ops.pad(tensor, [(0, 0), (0, 0), (0, pad), (0, 0)]) if pad else tensor
    )


def _key_blocks(plan, tensor):
    """`(B, S, K, X)` as `(P, S', X)`."""
    tensor = ops.transpose(tensor, (0, 2, 1, 3))  # (B, K, S, X)
    tensor = ops.reshape(tensor, (-1, plan.key_length, tensor.shape[-1]))
    pad = plan.key_blocks * plan.block - plan.key_length
    return ops.pad(tensor, [(0, 0), (0, pad), (0, 0)]) if pad else tensor


def _from_query_blocks(plan, tensor, dtype):
    """`(P, G, T', X)` back to `(B, T, N, X)` in `dtype`."""
    tensor = tensor[:, :, : plan.length]  # (P, G, T, X)
    tensor = ops.reshape(
        tensor, (-1, plan.heads, plan.length, tensor.shape[-1])
    )  # (B, N, T, X)
    return ops.cast(ops.transpose(tensor, (0, 2, 1, 3)), dtype)


def _from_key_blocks(plan, tensor, dtype):
    """`(P, S', X)` back to `(B, S, K, X)` in `dtype`."""
    tensor = tensor[:, : plan.key_length]  # (P, S, X)
    tensor = ops.reshape(
        tensor, (-1, plan.kv_heads, plan.key_length, tensor.shape[-1])
    )  # (B, K, S, X)
    return ops.cast(ops.transpose(tensor, (0, 2, 1, 3)), dtype)


def _forward(plan, query, key, value, tensors):
    """Outputs `(P, G, T', V)` and row log-sum-exps `(P, G, T')`, both in
    the compute dtype, from blocked inputs (see `_to_blocks`)."""
    c, groups, dtype = plan.block, plan.groups, plan.compute_dtype
    pairs = ops.shape(query)[0]

    def query_block(i, carry):
        outputs, lse = carry
        q = _query_rows(query, i, c)  # (P, G*C, H)

        def key_block(j, state, edge):
            running_max, total, acc = state
            k, v = _key_rows(key, j, c), _key_rows(value, j, c)
            logits = ops.matmul(q, ops.swapaxes(k, 1, 2))  # (P, G*C, C)
            logits, _ = _transform(plan, i, j, logits)
            logits = _hide(plan, tensors, i, j, logits, edge)
            new_max = ops.maximum(running_max, ops.max(logits, axis=-1))
            # Rows with no visible key yet subtract 0, so that their hidden
            # logits still give exp(-1e30) = 0.
            shift = ops.where(new_max > plan.negative / 2, new_max, 0.0)
            p = ops.exp(logits - shift[..., None])  # (P, G*C, C)
            rescale = ops.exp(running_max - shift)
            total = total * rescale + ops.sum(p, axis=-1)
            acc = acc * rescale[..., None] + ops.matmul(p, v)  # (P, G*C, V)
            return new_max, total, acc

        shape = (pairs, groups * c)
        state = (
            ops.full(shape, plan.negative, dtype),
            ops.zeros(shape, dtype),
            ops.zeros((*shape, plan.value_dim), dtype),
        )
        start, end = plan.key_range(i, tensors)
        if plan.general:
            state = _loop(start, end, key_block, state, edge=plan.full_edge)
        else:
            state = _loop(start, end - 1, key_block, state, edge=_Edge())
            state = key_block(end - 1, state, edge=plan.key_edge)
        running_max, total, acc = state
        seen = total > 0  # a row with no visible key gives zeros
        safe_total = ops.where(seen, total, ops.ones_like(total))
        out = ops.where(seen[..., None], acc / safe_total[..., None], 0.0)
        row_lse = ops.where(seen, running_max + ops.log(safe_total), 0.0)
        outputs = _write_rows(outputs, out, i, c, groups)
        lse = _write_rows(lse, row_lse, i, c, groups)
        return outputs, lse

    rows = plan.query_blocks * c
    init = (
        ops.zeros((pairs, groups, rows, plan.value_dim), dtype),
        ops.zeros((pairs, groups, rows), dtype),
    )
    return _fori_loop(0, plan.query_blocks, query_block, init)


def _backward(plan, query, key, value, tensors, outputs, lse, grad):
    """Gradients of the blocked query, key and value (the query's without
    the scale), in the compute dtype."""
    c, groups = plan.block, plan.groups
    delta = ops.sum(grad * outputs, axis=-1)  # (P, G, T')

    def key_block(j, carry, padded):
        grad_query, grad_key, grad_value = carry
        k, v = _key_rows(key, j, c), _key_rows(value, j, c)

        def query_block(i, state, edge):
            grad_query, grad_k, grad_v = state
            q = _query_rows(query, i, c)  # (P, G*C, H)
            do = _query_rows(grad, i, c)  # (P, G*C, V)
            logits = ops.matmul(q, ops.swapaxes(k, 1, 2))  # (P, G*C, C)
            logits, slope = _transform(plan, i, j, logits)
            logits = _hide(plan, tensors, i, j, logits, edge)
            # The forward's weights; hidden logits give exp(-1e30) = 0.
            p = ops.exp(logits - _query_rows(lse, i, c)[..., None])
            grad_v = grad_v + ops.matmul(ops.swapaxes(p, 1, 2), do)
            grad_p = ops.matmul(do, ops.swapaxes(v, 1, 2))  # (P, G*C, C)
            grad_logits = p * (grad_p - _query_rows(delta, i, c)[..., None])
            if slope is not None:  # through the soft cap
                grad_logits = grad_logits * slope
            grad_k = grad_k + ops.matmul(ops.swapaxes(grad_logits, 1, 2), q)
            grad_q = _query_rows(grad_query, i, c) + ops.matmul(grad_logits, k)
            grad_query = _write_rows(grad_query, grad_q, i, c, groups)
            return grad_query, grad_k, grad_v

        start, end = plan.query_range(j, tensors)
        state = (grad_query, ops.zeros_like(k), ops.zeros_like(v))
        if plan.general:
            state = _loop(start, end, query_block, state, edge=plan.full_edge)
        else:
            # The diagonal block, first in the range, is the causal edge.
            diagonal = _Edge(causal=plan.is_causal, padded=padded)
            state = _loop(start, _minimum(start + 1, end), query_block,
                          state, edge=diagonal)  # fmt: skip
            interior = _Edge(padded=padded)
            state = _loop(start + 1, end, query_block, state, edge=interior)
        grad_query, grad_k, grad_v = state
        grad_key = ops.slice_update(grad_key, (0, j * c, 0), grad_k)
        grad_value = ops.slice_update(grad_value, (0, j * c, 0), grad_v)
        return grad_query, grad_key, grad_value

    carry = (ops.zeros_like(query), ops.zeros_like(key), ops.zeros_like(value))
    # Only the last key block holds padded keys.
    last = plan.key_blocks - 1 if plan.key_edge.padded else plan.key_blocks
    carry = _loop(0, last, key_block, carry, padded=False)
    return _loop(last, plan.key_blocks, key_block, carry, padded=True)


def _loop(start, end, body, carry, **flags):
    """`body(i, carry, **flags)` for `i` in `[start, end)`; nothing when
    the range is statically empty."""
    if isinstance(start, int) and isinstance(end, int) and start >= end:
        return carry
    return _fori_loop(start, end, lambda i, c: body(i, c, **flags), carry)


def _fori_loop(start, end, body, carry):
    """`ops.fori_loop`, one iteration at a time on TensorFlow: a graph's
    while loop otherwise runs up to ten iterations at once, each holding
    its own copy of the whole-length buffers it updates."""
    if keras.backend.backend() != "tensorflow":
        return ops.fori_loop(start, end, body, carry)
    import tensorflow as tf

    return tf.while_loop(
        lambda i, carry: i < end,
        lambda i, carry: (i + 1, body(i, carry)),
        (start, carry),
        parallel_iterations=1,
    )[1]


def _query_rows(tensor, index, block):
    """Query block `index` of `(P, G, T', ...)` as `(P, G*C, ...)`."""
    shape = list(ops.shape(tensor))
    starts = [0, 0, index * block] + [0] * (len(shape) - 3)
    shape[2] = block
    piece = ops.slice(tensor, starts, shape)  # (P, G, C, ...)
    return ops.reshape(piece, (-1, shape[1] * block, *shape[3:]))


def _key_rows(tensor, index, block):
    """Key block `index` of `(P, S', X)` as `(P, C, X)`."""
    shape = list(ops.shape(tensor))
    return ops.slice(tensor, (0, index * block, 0), (shape[0], block, shape[2]))


def _write_rows(tensor, rows, index, block, groups):
    """`tensor` `(P, G, T', ...)` with query block `index` set to `rows`
    `(P, G*C, ...)`."""
    rows = ops.reshape(rows, (-1, groups, block, *rows.shape[2:]))
    starts = [0, 0, index * block] + [0] * (len(tensor.shape) - 3)
    return ops.slice_update(tensor, starts, rows)


def _transform(plan, i, j, logits):
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


class _Edge:
    """Which structure a block pair must apply beyond the user's mask:
    the top-left causal diagonal, the padded keys of the last key block,
    a general band, segment ids."""

    def __init__(self, causal=False, padded=False, band=False, segments=False):
        self.causal, self.padded = causal, padded
        self.band, self.segments = band, segments


def _hide(plan, tensors, i, j, logits, edge):
    """`logits` `(P, G*C, C)` of block pair `(i, j)` with every hidden
    position set to a large negative number."""
    c = plan.block
    mask, query_ids, key_ids = tensors.mask, tensors.query_ids, tensors.key_ids
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
    if edge.causal:
        conditions.append(queries[:, None] >= keys[None, :])  # (C, C)
    if edge.band:
        conditions.append(
            plan.structure.band_visible(queries[:, None], keys[None, :])
        )  # (C, C)
    if edge.segments:
        batch = ops.shape(query_ids)[0]
        same = segments_visible(
            ops.slice(query_ids, (0, i * c), (batch, c)),
            ops.slice(key_ids, (0, j * c), (batch, c)),
        )  # (B, C, C)
        conditions.append(ops.expand_dims(same, (1, 2)))  # (B, 1, 1, C, C)
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
