"""The loops' layout: inputs cut into whole blocks along the leading
axis, heads folded into the batch, and back. A block is then one slice
of the leading axis, which the loops read without copying it.

Shape legend: B batch, T query length, S key length, C block rows,
N query heads, K key/value heads, G = N // K queries per key/value head,
H head dim, V value head dim, P = B x K.
"""

from keras import ops


def to_blocks(plan, query, key, value):
    """The inputs in the loops' layout, padded to whole blocks: the query
    `(T'/C, P, G*C, H)`, scaled, and the key and value `(S'/C, P, C,
    H|V)`, all in the compute dtype."""
    dtype = plan.compute_dtype
    query = ops.cast(query, dtype) * ops.cast(plan.scale, dtype)
    return (
        query_blocks(plan, query),
        key_blocks(plan, ops.cast(key, dtype)),
        key_blocks(plan, ops.cast(value, dtype)),
    )


def query_blocks(plan, tensor):
    """`(B, T, N, X)` as `(T'/C, P, G*C, X)`: query head `n = k * G + g`
    of pair `p = b * K + k`, the G heads' rows of a block one after the
    other."""
    c, x = plan.block, tensor.shape[-1]
    tensor = _padded(tensor, plan.query_blocks * c)  # (B, T', N, X)
    tensor = ops.reshape(
        tensor, (-1, plan.query_blocks, c, plan.kv_heads, plan.groups, x)
    )  # (B, T'/C, C, K, G, X)
    tensor = ops.transpose(tensor, (1, 0, 3, 4, 2, 5))  # (T'/C, B, K, G, C, X)
    return ops.reshape(tensor, (plan.query_blocks, -1, plan.groups * c, x))


def key_blocks(plan, tensor):
    """`(B, S, K, X)` as `(S'/C, P, C, X)`."""
    c, x = plan.block, tensor.shape[-1]
    tensor = _padded(tensor, plan.key_blocks * c)  # (B, S', K, X)
    tensor = ops.reshape(tensor, (-1, plan.key_blocks, c, plan.kv_heads, x))
    tensor = ops.transpose(tensor, (1, 0, 3, 2, 4))  # (S'/C, B, K, C, X)
    return ops.reshape(tensor, (plan.key_blocks, -1, c, x))


def from_query_blocks(plan, tensor, dtype):
    """`(T'/C, P, G*C, X)` back to `(B, T, N, X)` in `dtype`."""
    c, x = plan.block, tensor.shape[-1]
    tensor = ops.reshape(
        tensor, (plan.query_blocks, -1, plan.kv_heads, plan.groups, c, x)
    )  # (T'/C, B, K, G, C, X)
    tensor = ops.transpose(tensor, (1, 0, 4, 2, 3, 5))  # (B, T'/C, C, K, G, X)
    tensor = ops.reshape(tensor, (-1, plan.query_blocks * c, plan.heads, x))
    return ops.cast(_unpadded(tensor, plan.length), dtype)


def from_key_blocks(plan, tensor, dtype):
    """`(S'/C, P, C, X)` back to `(B, S, K, X)` in `dtype`."""
    c, x = plan.block, tensor.shape[-1]
    tensor = ops.reshape(tensor, (plan.key_blocks, -1, plan.kv_heads, c, x))
    tensor = ops.transpose(tensor, (1, 0, 3, 2, 4))  # (B, S'/C, C, K, X)
    tensor = ops.reshape(tensor, (-1, plan.key_blocks * c, plan.kv_heads, x))
    return ops.cast(_unpadded(tensor, plan.key_length), dtype)


def _padded(tensor, length):
    """`(B, L, ...)` padded with zeros to `length` rows."""
    pad = length - tensor.shape[1]
    if not pad:
        return tensor
    return ops.pad(tensor, [(0, 0), (0, pad)] + [(0, 0)] * (tensor.ndim - 2))


def _unpadded(tensor, length):
    """The first `length` rows of `(B, L', ...)`."""
    return tensor[:, :length] if tensor.shape[1] != length else tensor
