"""How one context-parallel call is laid out: the mesh axes, the chunks
each device holds, ring or all-gather, and which chunk pairs the band
leaves anything in.

Shape legend: B batch, T query length, S key length, P devices along the
sequence axis; each device holds two chunks of `T / 2P` queries and
`S / 2P` keys.
"""

import numpy as np
from jax import numpy as jnp

# The all-gather holds every key and value on each device; it is chosen
# while they take at most this many bytes per device (float32), the ring
# beyond.
ALL_GATHER_MAX_BYTES = 64 << 20


class Sharding:
    """The mesh axes of one context-parallel call, and its layout.

    Attributes:
        mesh (jax.sharding.Mesh): The devices.
        batch_axis (str): The mesh axis of the batch.
        sequence_axis (str): The mesh axis of time.
        devices (int): Devices along the sequence axis (`P`).
        zigzag (bool): Device `d` holds chunks `d` and `2P - 1 - d`
            (causal load balance), else `2d` and `2d + 1`.
        ring (bool): Keys and values pass around a ring, else they are
            gathered.
    """

    def __init__(self, mesh, batch_axis, sequence_axis, zigzag, ring):
        self.mesh = mesh
        self.batch_axis, self.sequence_axis = batch_axis, sequence_axis
        self.devices = mesh.shape[sequence_axis]
        self.zigzag, self.ring = zigzag, ring

    def chunks(self, device):
        """The two global chunks a device holds, in the order it holds
        them (`device` an int or an int32 scalar)."""
        if self.zigzag:
            return device, 2 * self.devices - 1 - device
        return 2 * device, 2 * device + 1

    def all_chunks(self):
        """The global chunks of the gathered keys, in the order they sit."""
        return [c for d in range(self.devices) for c in self.chunks(d)]


def layout(structure, shapes, mesh, batch_axis, sequence_axis):
    """The `Sharding` of a call and the reasons for its exchange and its
    order; refuses lengths and batches the mesh does not divide.

    Args:
        structure: `Structure` of the call.
        shapes: dict with `batch` (int or `None`), `query_length`,
            `key_length`, `kv_heads` and `head_dims` (key and value).
        mesh: `jax.sharding.Mesh`.
        batch_axis, sequence_axis: str. Mesh axis names.
    """
    devices = mesh.shape[sequence_axis]
    for name in ("query_length", "key_length"):
        length = shapes[name]
        if length is None or length % (2 * devices):
            raise ValueError(
                f"{structure.where}: under ContextParallel the "
                f"{name.replace('_', ' ')} must be a multiple of 2 x "
                f"{devices} (two chunks for each of the {devices} devices "
                f"of the '{sequence_axis}' axis). Received: {name}={length}"
            )
    batch_devices = mesh.shape[batch_axis]
    batch = shapes["batch"]
    if batch is not None and batch % batch_devices:
        raise ValueError(
            f"{structure.where}: under ContextParallel the batch size must "
            f"be a multiple of the {batch_devices} devices of the "
            f"'{batch_axis}' axis. Received: batch_size={batch}"
        )
    rows = 1 if batch is None else batch // batch_devices
    gathered = (
        4 * rows * shapes["key_length"] * shapes["kv_heads"]
        * sum(shapes["head_dims"])
    )  # fmt: skip
    ring = gathered > ALL_GATHER_MAX_BYTES
    megabytes = f"{gathered / 2**20:.1f} MiB per device gathered"
    limit = f"{ALL_GATHER_MAX_BYTES >> 20} MiB"
    exchange = (
        f"ring: the keys and values would take {megabytes}, over {limit}"
        if ring
        else f"all-gather: the keys and values take {megabytes}, at most "
        f"{limit}"
    )
    zigzag, order = _order(structure, shapes, mesh, batch_axis, sequence_axis)
    sharding = Sharding(mesh, batch_axis, sequence_axis, zigzag, ring)
    return sharding, {"exchange": exchange, "order": order}


def _order(structure, shapes, mesh, batch_axis, sequence_axis):
    """`(zigzag, reason)`: the order of the chunks whose busiest device
    visits the fewest chunk pairs (contiguous where they tie)."""
    if structure.band is None:
        return False, "contiguous: the work is the same on every device"
    if not isinstance(structure.band.offset, int | np.integer):
        return False, "contiguous: the band's offset is known only as it runs"
    load = {}
    for zigzag in (False, True):
        sharding = Sharding(mesh, batch_axis, sequence_axis, zigzag, True)
        counts = visited_chunks(
            sharding, structure, shapes["query_length"], shapes["key_length"]
        )
        load[zigzag] = counts.max() / max(counts.mean(), 1e-9)
    zigzag = bool(load[True] < load[False])
    name = "zig-zag" if zigzag else "contiguous"
    return zigzag, (
        f"{name}: the busiest device visits {load[zigzag]:.2f}x the mean "
        f"number of chunk pairs ({load[not zigzag]:.2f}x in the other order)"
    )


def visited_chunks(sharding, structure, query_length, key_length):
    """Per device, the chunk pairs (query chunk, key chunk) that the band
    leaves a visible position in: int array `(P,)`, computed ahead of any
    program."""
    devices = sharding.devices
    query_chunk = query_length // (2 * devices)
    key_chunk = key_length // (2 * devices)
    counts = np.zeros(devices, "int64")
    for device in range(devices):
        for q in sharding.chunks(device):
            for k in range(2 * devices):
                counts[device] += reached(
                    structure, q * query_chunk, k * key_chunk,
                    query_chunk, key_chunk, np,
                )  # fmt: skip
    return counts


def reached(structure, first_query, first_key, queries, keys, xp=jnp):
    """Whether the band shows any of `keys` keys from `first_key` to any
    of `queries` queries from `first_query` (indices in the whole
    sequence); always, without a band."""
    band = structure.band
    if band is None:
        return True
    first = first_query + band.offset  # the first query's position
    last = first + queries - 1
    result = True
    if band.right is not None:
        result = xp.logical_and(result, first_key <= last + band.right)
    if band.left is not None:
        last_key = first_key + keys - 1
        result = xp.logical_and(result, last_key >= first - band.left)
    return result
