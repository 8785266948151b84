"""The zig-zag order of causal context parallelism, inside the call.

Data arrive with device `d` holding chunks `2d` and `2d + 1` of the
sequence (contiguous shards). For causal attention the last device would
then see every key chunk and the first one almost none, so the chunks
are moved until device `d` holds chunks `d` and `2P - 1 - d`, one early
and one late, and moved back after (outputs come back in order). Chunk
`c` belongs on device `c` for `c < P` and `2P - 1 - c` after: the even
chunks and the odd chunks each move by one permutation of the devices,
so each direction is two `ppermute`s of half a shard.
"""

from jax import lax
from jax import numpy as jnp

# The tensors that arrive sharded along time, and their time axis.
TIME_AXES = {"query": 1, "key": 1, "value": 1, "query_ids": 1, "mask": 2}


def to_chunk_order(sharding, tensors, device):
    """`tensors` (a dict) with each time-sharded one in the zig-zag order
    where the sharding has it; a mask broadcast along time stays."""
    if not sharding.zigzag:
        return tensors
    moved = dict(tensors)
    for name, axis in TIME_AXES.items():
        if name in moved and moved[name].shape[axis] > 1:
            moved[name] = _move(sharding, moved[name], axis, device)
    return moved


def from_chunk_order(sharding, output, device):
    """The output `(b, L, N, V)` back in the order the data came in."""
    if not sharding.zigzag:
        return output
    return _move(sharding, output, 1, device, back=True)


def _move(sharding, x, axis, device, back=False):
    """Chunks `2d, 2d + 1` of device `d` to chunks `d, 2P - 1 - d` along
    `axis`, or `back`."""
    devices = sharding.devices

    def home(chunk):
        return chunk if chunk < devices else 2 * devices - 1 - chunk

    even = [(d, home(2 * d)) for d in range(devices)]
    odd = [(d, home(2 * d + 1)) for d in range(devices)]
    first, second = jnp.split(x, 2, axis=axis)
    is_even = device % 2 == 0
    name = sharding.sequence_axis
    if not back:
        from_even = lax.ppermute(first, name, even)
        from_odd = lax.ppermute(second, name, odd)
        # Device d's own chunk d is even exactly when d is.
        low = jnp.where(is_even, from_even, from_odd)
        high = jnp.where(is_even, from_odd, from_even)
        return jnp.concatenate([low, high], axis=axis)
    to_even = jnp.where(is_even, first, second)
    to_odd = jnp.where(is_even, second, first)
    back_even = lax.ppermute(to_even, name, [(b, a) for a, b in even])
    back_odd = lax.ppermute(to_odd, name, [(b, a) for a, b in odd])
    return jnp.concatenate([back_even, back_odd], axis=axis)
