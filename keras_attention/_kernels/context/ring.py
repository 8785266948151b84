"""The exchange of keys and values between devices, and its gradient.

One loop visits every key chunk a device's queries meet: the ring's `P`
steps, at each of which the device holds one key shard (two chunks),
then passes it on with `ppermute` (Liu et al. 2023); or the `2P` chunks
of the keys gathered once (`all_gather`). The backward pass runs the
same loop: in the ring, the key and value gradients travel with their
shard and are home after `P` moves; gathered, they are reduce-scattered
back (`psum_scatter`). Only a device's inputs, its output and its
log-sum-exp are kept between the two passes.

Shape legend: b batch rows on this device, L = T / P queries and
M = S / P keys on it (two chunks each), N query heads, K key/value
heads, H head dim, V value head dim.
"""

import jax
from jax import lax
from jax import numpy as jnp

from keras_attention._kernels.context.blocks import add_rows
from keras_attention._kernels.context.blocks import chunk_grads
from keras_attention._kernels.context.blocks import merge_chunk
from keras_attention._kernels.context.sharding import reached


def exchanged_attention(step, sharding):
    """`fn(query, key, value, tensors)` on one device's shards, in chunk
    order, `(b, L, N, H)`, `(b, M, K, H)`, `(b, M, K, V)`, with its own
    backward pass; `tensors` (mask, segment ids) get no gradient."""

    @jax.custom_vjp
    def attend(query, key, value, tensors):
        return _forward(step, sharding, query, key, value, tensors)[0]

    def attend_forward(query, key, value, tensors):
        output, lse = _forward(step, sharding, query, key, value, tensors)
        return output, (query, key, value, tensors, output, lse)

    def attend_backward(residuals, grad):
        return _backward(step, sharding, residuals, grad)

    attend.defvjp(attend_forward, attend_backward)
    return attend


def _steps(sharding):
    return sharding.devices if sharding.ring else 2 * sharding.devices


def _shift(sharding):
    """Each device's shard to the next device."""
    devices = sharding.devices
    return [(d, (d + 1) % devices) for d in range(devices)]


def _exchanged(sharding, key, value):
    """The keys and values the loop starts from: this device's shard in
    the ring, all of them gathered otherwise."""
    if sharding.ring:
        return key, value
    name = sharding.sequence_axis
    return tuple(
        lax.all_gather(x, name, axis=1, tiled=True) for x in (key, value)
    )


def _pairs(step, sharding, device, index, query_rows, key_rows):
    """The chunk pairs of loop step `index`: `(query row, key row, pair)`
    with `pair` as `blocks._visit` takes it."""
    if sharding.ring:
        source = (device - index) % sharding.devices  # whose shard is held
        held = [
            (c, i * key_rows) for i, c in enumerate(sharding.chunks(source))
        ]
    else:
        order = jnp.asarray(sharding.all_chunks(), "int32")
        held = [(order[index], index * key_rows)]
    found = []
    for k, key_row in held:
        for i, q in enumerate(sharding.chunks(device)):
            query_row = i * query_rows
            positions = (
                q * query_rows + jnp.arange(query_rows, dtype="int32"),
                k * key_rows + jnp.arange(key_rows, dtype="int32"),
            )
            pair = (query_rows, key_rows, *positions, query_row)
            found.append((query_row, key_row, pair))
    return found


def _reached(step, pair):
    """Whether the band leaves anything in a chunk pair."""
    query_rows, key_rows, q_pos, k_pos, _ = pair
    return reached(step.structure, q_pos[0], k_pos[0], query_rows, key_rows)


def _forward(step, sharding, query, key, value, tensors):
    """`(output (b, L, N, V) in the value's dtype, lse (b, N, L))`."""
    batch, length, heads, _ = query.shape
    query_rows, key_rows = length // 2, key.shape[1] // 2
    name = sharding.sequence_axis
    device = lax.axis_index(name)

    def visit(index, carry):
        output, lse, keys, values = carry
        for q_row, k_row, pair in _pairs(
            step, sharding, device, index, query_rows, key_rows
        ):
            chunks = (
                lax.dynamic_slice_in_dim(query, q_row, query_rows, 1),
                lax.dynamic_slice_in_dim(keys, k_row, key_rows, 1),
                lax.dynamic_slice_in_dim(values, k_row, key_rows, 1),
            )
            o = lax.dynamic_slice_in_dim(output, q_row, query_rows, 1)
            m = lax.dynamic_slice_in_dim(lse, q_row, query_rows, 2)
            o, m = lax.cond(
                _reached(step, pair),
                lambda o, m, c=chunks, p=pair: merge_chunk(
                    step, tensors, (o, m), c, p
                ),
                lambda o, m: (o, m),
                o,
                m,
            )
            output = lax.dynamic_update_slice_in_dim(output, o, q_row, 1)
            lse = lax.dynamic_update_slice_in_dim(lse, m, q_row, 2)
        if sharding.ring:
            keys, values = (
                lax.ppermute(x, name, _shift(sharding)) for x in (keys, values)
            )
        return output, lse, keys, values

    output = jnp.zeros((*query.shape[:3], value.shape[3]), "float32")
    lse = jnp.full((batch, heads, length), -jnp.inf, "float32")
    output, lse, _, _ = lax.fori_loop(
        0,
        _steps(sharding),
        visit,
        (output, lse, *_exchanged(sharding, key, value)),
    )
    return output.astype(value.dtype), lse


def _backward(step, sharding, residuals, grad):
    """The gradients of the query, key and value shards (and `None` for
    the tensors)."""
    query, key, value, tensors, output, lse = residuals
    grad = grad.astype("float32")
    delta = jnp.einsum(
        "btnv,btnv->bnt", grad, output.astype("float32")
    )  # (b, N, L)
    query_rows, key_rows = query.shape[1] // 2, key.shape[1] // 2
    name = sharding.sequence_axis
    device = lax.axis_index(name)

    def visit(index, carry):
        grad_query, grad_key, grad_value, keys, values = carry
        for q_row, k_row, pair in _pairs(
            step, sharding, device, index, query_rows, key_rows
        ):
            chunks = (
                lax.dynamic_slice_in_dim(query, q_row, query_rows, 1),
                lax.dynamic_slice_in_dim(keys, k_row, key_rows, 1),
                lax.dynamic_slice_in_dim(values, k_row, key_rows, 1),
                lax.dynamic_slice_in_dim(grad, q_row, query_rows, 1),
                lax.dynamic_slice_in_dim(lse, q_row, query_rows, 2),
                lax.dynamic_slice_in_dim(delta, q_row, query_rows, 2),
            )
            dq, dk, dv = lax.cond(
                _reached(step, pair),
                lambda c=chunks, p=pair: chunk_grads(step, tensors, c, p),
                lambda c=chunks: tuple(
                    jnp.zeros(x.shape, "float32") for x in c[:3]
                ),
            )
            grad_query = add_rows(grad_query, dq, q_row, 1)
            grad_key = add_rows(grad_key, dk, k_row, 1)
            grad_value = add_rows(grad_value, dv, k_row, 1)
        if sharding.ring:
            # The gradients travel with their keys: after P moves they
            # are home.
            moved = (grad_key, grad_value, keys, values)
            grad_key, grad_value, keys, values = (
                lax.ppermute(x, name, _shift(sharding)) for x in moved
            )
        return grad_query, grad_key, grad_value, keys, values

    keys, values = _exchanged(sharding, key, value)
    zeros = [jnp.zeros(x.shape, "float32") for x in (query, keys, values)]
    grad_query, grad_key, grad_value, _, _ = lax.fori_loop(
        0, _steps(sharding), visit, (*zeros, keys, values)
    )
    if not sharding.ring:
        grad_key, grad_value = (
            lax.psum_scatter(g, name, scatter_dimension=1, tiled=True)
            for g in (grad_key, grad_value)
        )
    return (
        grad_query.astype(query.dtype),
        grad_key.astype(key.dtype),
        grad_value.astype(value.dtype),
        None,
    )
