"""The loops' layout: inputs cut into whole blocks, heads folded into
the batch, and back.

Shape legend: B batch, T query length, S key length, C block rows,
N query heads, K key/value heads, G = N // K queries per key/value head,
H head dim, V value head dim, P = B x K.
"""

from keras import ops

from keras_attention._kernels import backends


def to_blocks(plan, query, key, value):
    """The inputs in the loops' layout, padded to whole blocks: the query
    `(P, G, T', H)`, scaled, and the key and value `(P, S', H|V)`, all in
    the compute dtype."""
    dtype = plan.compute_dtype
    query = ops.cast(query, dtype) * ops.cast(plan.scale, dtype)
    return (
        query_blocks(plan, query),
        key_blocks(plan, ops.cast(key, dtype)),
        key_blocks(plan, ops.cast(value, dtype)),
    )


def query_blocks(plan, tensor):
    """`(B, T, N, X)` as `(P, G, T', X)`, query head `n = k * G + g`."""
    tensor = ops.transpose(tensor, (0, 2, 1, 3))  # (B, N, T, X)
    tensor = ops.reshape(
        tensor, (-1, plan.groups, plan.length, tensor.shape[-1])
    )  # (P, G, T, X)
    pad = plan.query_blocks * plan.block - plan.length
    return (
        ops.pad(tensor, [(0, 0), (0, 0), (0, pad), (0, 0)]) if pad else tensor
    )


def key_blocks(plan, tensor):
    """`(B, S, K, X)` as `(P, S', X)`."""
    tensor = ops.transpose(tensor, (0, 2, 1, 3))  # (B, K, S, X)
    tensor = ops.reshape(tensor, (-1, plan.key_length, tensor.shape[-1]))
    pad = plan.key_blocks * plan.block - plan.key_length
    return ops.pad(tensor, [(0, 0), (0, pad), (0, 0)]) if pad else tensor


def from_query_blocks(plan, tensor, dtype):
    """`(P, G, T', X)` back to `(B, T, N, X)` in `dtype`."""
    tensor = tensor[:, :, : plan.length]  # (P, G, T, X)
    tensor = ops.reshape(
        tensor, (-1, plan.heads, plan.length, tensor.shape[-1])
    )  # (B, N, T, X)
    return ops.cast(ops.transpose(tensor, (0, 2, 1, 3)), dtype)


def from_key_blocks(plan, tensor, dtype):
    """`(P, S', X)` back to `(B, S, K, X)` in `dtype`."""
    tensor = tensor[:, : plan.key_length]  # (P, S, X)
    tensor = ops.reshape(
        tensor, (-1, plan.kv_heads, plan.key_length, tensor.shape[-1])
    )  # (B, K, S, X)
    return ops.cast(ops.transpose(tensor, (0, 2, 1, 3)), dtype)


def from_query_buffer(plan, buffer):
    """A buffer of the query blocks' rows `(P, G*C, ...)` (see
    `blocks.buffer`) as `(P, G, T', ...)`."""
    tensor = backends.current().stacked_blocks(buffer)  # (T'/C, P, G*C, ...)
    rest = tuple(tensor.shape[3:])
    tensor = ops.reshape(
        tensor, (plan.query_blocks, -1, plan.groups, plan.block, *rest)
    )  # (T'/C, P, G, C, ...)
    order = (1, 2, 0, 3, *range(4, 4 + len(rest)))
    tensor = ops.transpose(tensor, order)  # (P, G, T'/C, C, ...)
    return ops.reshape(
        tensor, (-1, plan.groups, plan.query_blocks * plan.block, *rest)
    )  # (P, G, T', ...)


def from_key_buffer(plan, buffer):
    """A buffer of the key blocks' rows `(P, C, X)` as `(P, S', X)`."""
    tensor = backends.current().stacked_blocks(buffer)  # (S'/C, P, C, X)
    tensor = ops.transpose(tensor, (1, 0, 2, 3))  # (P, S'/C, C, X)
    return ops.reshape(
        tensor, (-1, plan.key_blocks * plan.block, tensor.shape[-1])
    )  # (P, S', X)
