"""One chunk pair of context-parallel attention, computed in blocks.

A device meets each (query chunk, key chunk) pair it holds; the pair is
computed in blocks of up to `BLOCK` rows each way, as the blockwise
kernel does, so a device holds one block's logits at a time. Blocks the
band leaves empty are skipped. The forward pass merges each block into
the running output and log-sum-exp (the online softmax); the backward
pass recomputes each block's logits from the final log-sum-exp
(FlashAttention-2, Dao 2023). Everything positional is evaluated at the
rows' and keys' indices in the whole sequence.

Shape legend: b batch rows on this device, R query rows and C keys of a
block, N query heads, K key/value heads, G = N // K, H head dim, V value
head dim.
"""

import jax
from jax import lax
from jax import numpy as jnp

from keras_attention._core import attend
from keras_attention._core import grouped_logits
from keras_attention._core.builtins import segments_visible
from keras_attention._core.mods import visible as mod_visible
from keras_attention._kernels.context.sharding import reached

# Rows of the query and key blocks a chunk pair is computed in.
BLOCK = 512


class Step:
    """The logits of query rows on keys at their global indices, with
    every part of the structure applied."""

    def __init__(self, structure, scale, batch_axis):
        self.structure, self.scale = structure, scale
        self.batch_axis = batch_axis

    def logits(self, query, key, query_pos, key_pos):
        """Scaled (capped, biased) float32 logits `(b, N, R, C)` of
        `query` `(b, R, N, H)` on `key` `(b, C, K, H)`."""
        heads = query.shape[2]
        query = query.astype("float32") * self.scale
        logits = grouped_logits(query, key.astype("float32"))  # (b, N, R, C)
        structure = self.structure
        if structure.soft_cap is not None:
            logits = structure.soft_cap * jnp.tanh(logits / structure.soft_cap)
        if structure.alibi:
            bias = structure.alibi_bias(
                heads, query_pos[:, None], key_pos[None, :]
            )  # (N, R, C)
            logits = logits + bias[None]
        return logits

    def visible(self, tensors, query_pos, key_pos, query_row, grid):
        """Booleans `(b|1, N|1, R, C)`, or `None` where all are visible.

        Args:
            tensors: dict of the call's `mask` `(b|1, N|1, L|1, S|1)`,
                `query_ids` `(b, L)` and `key_ids` `(b, S)` (whichever
                it has; `L` this device's queries, in chunk order).
            query_pos, key_pos: int32 `(R,)`, `(C,)` indices in the
                whole sequence.
            query_row: int32. The first query's row among this device's.
            grid: `(b, N)`.
        """
        structure = self.structure
        parts = []
        if structure.mask_mod is not None:
            batch, heads = grid
            first = lax.axis_index(self.batch_axis) * batch  # global rows
            indices = (
                (first + jnp.arange(batch, dtype="int32"))[:, None, None, None],
                jnp.arange(heads, dtype="int32")[None, :, None, None],
                query_pos[None, None, :, None],
                key_pos[None, None, None, :],
            )
            parts.append(
                mod_visible(structure.where, structure.mask_mod, indices)
            )
        band = structure.band_visible(query_pos[:, None], key_pos[None, :])
        if band is not None:
            parts.append(band[None, None])  # (1, 1, R, C)
        rows = len(query_pos)
        if "query_ids" in tensors:
            query_ids = lax.dynamic_slice_in_dim(
                tensors["query_ids"], query_row, rows, axis=1
            )  # (b, R)
            key_ids = jnp.take(tensors["key_ids"], key_pos, axis=1)  # (b, C)
            parts.append(segments_visible(query_ids, key_ids)[:, None])
        if "mask" in tensors:
            mask = tensors["mask"]
            if mask.shape[2] > 1:
                mask = lax.dynamic_slice_in_dim(mask, query_row, rows, axis=2)
            if mask.shape[3] > 1:
                mask = jnp.take(mask, key_pos, axis=3)
            parts.append(mask)
        if not parts:
            return None
        visible = parts[0]
        for part in parts[1:]:
            visible = visible & part
        return visible


def tiling(rows):
    """`(count, size)`: a chunk of `rows` rows in `count = ceil(rows /
    BLOCK)` blocks of equal `size`, as few rows over `rows` as can be.
    Where `size` does not divide `rows`, the last block starts at
    `rows - size`, and its rows that the block before covered are left
    out of it (`fresh`)."""
    count = -(-rows // BLOCK)
    return count, -(-rows // count)


def _start(index, size, rows):
    return jnp.minimum(index * size, rows - size)


def _fresh(index, start, size, rows):
    """Which rows of the block at `start` are its own, or `None` (all,
    where the blocks divide the chunk)."""
    if rows % size == 0:
        return None
    return start + jnp.arange(size) >= index * size


def _visit(step, pair, i, j, fn, skip, *operands):
    """`fn(...)` on block pair `(i, j)` of a chunk pair where the band
    reaches it, else `skip(*operands)`.

    `pair` is `(query rows, key rows, query positions, key positions,
    first query row)` of the chunk pair; `fn` gets `(q_start, k_start,
    q_pos, k_pos, q_row, fresh, *operands)`.
    """
    query_rows, key_rows, q_pos, k_pos, row = pair
    (_, size_q), (_, size_k) = tiling(query_rows), tiling(key_rows)
    q_start, k_start = (
        _start(i, size_q, query_rows),
        _start(j, size_k, key_rows),
    )
    positions = (
        lax.dynamic_slice_in_dim(q_pos, q_start, size_q),
        lax.dynamic_slice_in_dim(k_pos, k_start, size_k),
    )
    fresh = (
        _fresh(i, q_start, size_q, query_rows),
        _fresh(j, k_start, size_k, key_rows),
    )
    seen = reached(
        step.structure, positions[0][0], positions[1][0], size_q, size_k
    )
    return lax.cond(
        seen,
        lambda *o: fn(q_start, k_start, *positions, row + q_start, fresh, *o),
        lambda *o: skip(*o),
        *operands,
    )


def merge_chunk(step, tensors, carry, chunks, pair):
    """The running `(output (b, R, N, V), lse (b, N, R))` of a query
    chunk with one key chunk merged in, block by block; `chunks` are the
    `(query, key, value)` chunks, `pair` as in `_visit`."""
    query, key, value = chunks
    count_q, size_q = tiling(query.shape[1])
    count_k, size_k = tiling(key.shape[1])

    def merge(q_start, k_start, q_pos, k_pos, row, fresh, o, m):
        q = lax.dynamic_slice_in_dim(query, q_start, size_q, 1)
        k = lax.dynamic_slice_in_dim(key, k_start, size_k, 1)
        v = lax.dynamic_slice_in_dim(value, k_start, size_k, 1)
        logits = _masked_logits(step, tensors, q, k, q_pos, k_pos, row, fresh)
        return _merge(o, m, logits, v)

    def rows(i, carry):
        output, lse = carry
        start = _start(i, size_q, query.shape[1])
        o = lax.dynamic_slice_in_dim(output, start, size_q, 1)
        m = lax.dynamic_slice_in_dim(lse, start, size_q, 2)
        o, m = lax.fori_loop(
            0,
            count_k,
            lambda j, om: _visit(
                step, pair, i, j, merge, lambda o, m: (o, m), *om
            ),
            (o, m),
        )
        output = lax.dynamic_update_slice_in_dim(output, o, start, 1)
        return output, lax.dynamic_update_slice_in_dim(lse, m, start, 2)

    return lax.fori_loop(0, count_q, rows, carry)


def chunk_grads(step, tensors, chunks, pair):
    """`(dq, dk, dv)` in float32 of one chunk pair, block by block;
    `chunks` are `(query, key, value, grad, lse, delta)` of the pair's
    query and key chunks (`lse` the final log-sum-exp, `delta` the rows'
    `Σ grad · output`)."""
    query, key, value, grad, lse, delta = chunks
    count_q, size_q = tiling(query.shape[1])
    count_k, size_k = tiling(key.shape[1])

    def grads(q_start, k_start, q_pos, k_pos, row, fresh, dq, dk, dv):
        q = lax.dynamic_slice_in_dim(query, q_start, size_q, 1)
        k = lax.dynamic_slice_in_dim(key, k_start, size_k, 1)
        v = lax.dynamic_slice_in_dim(value, k_start, size_k, 1)
        rows = (
            lax.dynamic_slice_in_dim(grad, q_start, size_q, 1),
            lax.dynamic_slice_in_dim(lse, q_start, size_q, 2),
            lax.dynamic_slice_in_dim(delta, q_start, size_q, 2),
        )
        logits, pullback = jax.vjp(
            lambda q, k: _masked_logits(
                step, tensors, q, k, q_pos, k_pos, row, fresh
            ),
            q,
            k,
        )
        block = _block_grads(logits, pullback, v, *rows)
        return (
            add_rows(dq, block[0], q_start, 1),
            add_rows(dk, block[1], k_start, 1),
            add_rows(dv, block[2], k_start, 1),
        )

    def pair_of(index, carry):
        i, j = index // count_k, index % count_k
        return _visit(step, pair, i, j, grads, lambda *g: g, *carry)

    zeros = tuple(jnp.zeros(x.shape, "float32") for x in (query, key, value))
    return lax.fori_loop(0, count_q * count_k, pair_of, zeros)


def add_rows(total, part, start, axis):
    """`total` with `part` added at `start` along `axis`."""
    current = lax.dynamic_slice_in_dim(total, start, part.shape[axis], axis)
    return lax.dynamic_update_slice_in_dim(total, current + part, start, axis)


def _masked_logits(step, tensors, query, key, q_pos, k_pos, row, fresh):
    """`Step.logits` with `-inf` where a key is hidden, or where a row or
    key of the block is not its own (`fresh`)."""
    logits = step.logits(query, key, q_pos, k_pos)
    grid = (query.shape[0], query.shape[2])
    visible = step.visible(tensors, q_pos, k_pos, row, grid)
    fresh_q, fresh_k = fresh
    if fresh_q is not None or fresh_k is not None:
        rows = True if fresh_q is None else fresh_q[:, None]
        keys = True if fresh_k is None else fresh_k[None, :]
        own = (rows & keys)[None, None]  # (1, 1, R|1, C|1)
        visible = own if visible is None else visible & own
    if visible is not None:
        logits = jnp.where(visible, logits, -jnp.inf)
    return logits


def _merge(output, lse, logits, value):
    """`(output, lse)` with the block of `logits` `(b, N, R, C)` on
    `value` `(b, C, K, V)` merged in; a row with nothing visible so far
    keeps a zero output and `lse = -inf`."""
    block_lse = jax.nn.logsumexp(logits, axis=-1)  # (b, N, R)
    new_lse = jnp.logaddexp(lse, block_lse)
    finite = jnp.isfinite(new_lse)
    safe = jnp.where(finite, new_lse, 0.0)
    weights = jnp.where(finite[..., None], jnp.exp(logits - safe[..., None]), 0)
    part = attend(weights, value.astype("float32"))  # (b, R, N, V)
    keep = jnp.where(finite, jnp.exp(lse - safe), 0.0)  # (b, N, R)
    output = output * jnp.transpose(keep, (0, 2, 1))[..., None] + part
    return output, new_lse


def _block_grads(logits, pullback, value, grad, lse, delta):
    """`(dq, dk, dv)` of one block from its masked `logits` `(b, N, R,
    C)` and their `pullback` to the query and key blocks."""
    finite = jnp.isfinite(lse)
    safe = jnp.where(finite, lse, 0.0)
    weights = jnp.where(finite[..., None], jnp.exp(logits - safe[..., None]), 0)
    # The weighted sum's own gradient: (b, N, R, C) and (b, C, K, V).
    _, attend_pullback = jax.vjp(attend, weights, value.astype("float32"))
    grad_weights, grad_value = attend_pullback(grad)
    grad_logits = weights * (grad_weights - delta[..., None])
    grad_query, grad_key = pullback(grad_logits)
    return grad_query, grad_key, grad_value
