"""Context-parallel attention: the sequence sharded over devices (JAX).

Under `keras_attention.distribution.ContextParallel`, queries, keys and
values arrive sharded along their time axis over the mesh's sequence
axis (`P` devices) and, optionally, along the batch over its batch
axis. Each device keeps its query shard and meets every key shard, in
one of two ways:

* **ring** (Liu et al. 2023, "Ring Attention with Blockwise
  Transformers"): `P` steps; at each, the device attends to the key and
  value shard it holds, then passes it to the next device
  (`lax.ppermute`), so that only two shards are ever held;
* **all-gather** (as in Llama 3's context parallelism): the key and
  value shards are gathered once and attended to in one step; the
  backward pass reduce-scatters their gradients.

Both merge partial results by their log-sum-exp (the online softmax of
the blockwise kernel) and write their own backward pass, which keeps
only each device's inputs, output and log-sum-exp and recomputes the
logits, as FlashAttention does: a device holds `O(T / P)` activations.

Every position is global: the band (causal, bottom-right alignment,
sliding windows), ALiBi, segment ids and masks are evaluated on the
positions a shard holds in the whole sequence.

Load balance. Each device's shard is two chunks of `T / (2P)` rows.
With causal attention and contiguous shards, the last device would see
`P` times the first one's key chunks; so there the sequence is reordered
as a zig-zag (Brandon et al. 2023 balance causal work by striping; the
zig-zag of MaxText and PyTorch's context parallelism does it with
contiguous chunks): device `d` holds chunks `d` and `2P - 1 - d`, and
every device visits `2P + 1` chunk pairs of `4P`. The reordering is two
`ppermute`s of half a shard each way, inside the attention call; outputs
come back in the original order. Chunk pairs that the band leaves empty
are skipped (`lax.cond`), which is also how a sliding window skips the
shards it never reaches.

Shape legend: B batch (per device: b), T query length, S key length,
L = T / P query rows per device, M = S / P keys per device, N query
heads, K key/value heads, H head dim, V value head dim.
"""

import math

import jax
import numpy as np
from jax import lax
from jax import numpy as jnp
from jax.sharding import PartitionSpec

from keras_attention._core.builtins import segments_visible
from keras_attention._core.mods import visible as mod_visible

# The all-gather variant holds every key and value on each device; it is
# chosen while they take at most this many bytes per device (float32),
# the ring beyond.
ALL_GATHER_MAX_BYTES = 64 << 20
# Rows of the query and key blocks a chunk pair is computed in, as in the
# blockwise kernel: a device holds `O(BLOCK^2)` logits at a time.
BLOCK = 512


class Sharding:
    """The mesh axes of one context-parallel call, and its layout.

    Attributes:
        mesh: `jax.sharding.Mesh`.
        batch_axis, sequence_axis: mesh axis names.
        devices: int, devices along the sequence axis (`P`).
        batch_devices: int, devices along the batch axis.
        zigzag: bool. Shards hold chunks `d` and `2P - 1 - d` (causal
            load balance) instead of `2d` and `2d + 1`.
        ring: bool. Keys and values pass around a ring; else gathered.
    """

    def __init__(self, mesh, batch_axis, sequence_axis, zigzag, ring):
        self.mesh = mesh
        self.batch_axis, self.sequence_axis = batch_axis, sequence_axis
        self.devices = mesh.shape[sequence_axis]
        self.batch_devices = mesh.shape[batch_axis]
        self.zigzag, self.ring = zigzag, ring

    def chunks(self, device):
        """The two global chunks (of `T / 2P` rows) a device holds, in
        the order it holds them (`device` an int or int32 scalar)."""
        if self.zigzag:
            return device, 2 * self.devices - 1 - device
        return 2 * device, 2 * device + 1


def layout(structure, batch, heads, kv_heads, query_length, key_length,
           head_dims, mesh, batch_axis, sequence_axis):  # fmt: skip
    """The `Sharding` of a call, and why ring or all-gather and why the
    order; refuses shapes the mesh does not divide."""
    devices = mesh.shape[sequence_axis]
    for name, length in (("query", query_length), ("key", key_length)):
        if length is None or length % (2 * devices):
            raise ValueError(
                f"{structure.where}: under ContextParallel the {name} "
                f"length must be a multiple of 2 x {devices} (two chunks "
                f"for each of the {devices} devices of the "
                f"'{sequence_axis}' axis). Received: {name} length "
                f"{length}"
            )
    batch_devices = mesh.shape[batch_axis]
    if batch is not None and batch % batch_devices:
        raise ValueError(
            f"{structure.where}: under ContextParallel the batch size must "
            f"be a multiple of the {batch_devices} devices of the "
            f"'{batch_axis}' axis. Received: batch size {batch}"
        )
    zigzag = structure.causal and structure.left is None
    rows = 1 if batch is None else batch // batch_devices
    gathered = 4 * rows * key_length * kv_heads * sum(head_dims)
    ring = gathered > ALL_GATHER_MAX_BYTES
    reasons = {
        "exchange": (
            f"ring: the gathered keys and values would take "
            f"{gathered / 2**20:.0f} MiB per device, over "
            f"{ALL_GATHER_MAX_BYTES >> 20} MiB"
            if ring
            else f"all-gather: the keys and values take "
            f"{gathered / 2**20:.1f} MiB per device gathered, at most "
            f"{ALL_GATHER_MAX_BYTES >> 20} MiB"
        ),
        "order": (
            "zig-zag: causal attention, so that every device visits as "
            "many key chunks"
            if zigzag
            else "contiguous: every device has as much work in order"
        ),
    }
    sharding = Sharding(mesh, batch_axis, sequence_axis, zigzag, ring)
    return sharding, reasons


def visited_chunks(sharding, structure, query_length, key_length):
    """Per device, the chunk pairs (query chunk, key chunk) the band
    leaves at least one visible position in: int array `(P,)`, computed
    ahead of any program."""
    devices = sharding.devices
    query_chunk, key_chunk = (
        query_length // (2 * devices),
        key_length // (2 * devices),
    )
    counts = np.zeros(devices, "int64")
    for device in range(devices):
        for q in sharding.chunks(device):
            for k in range(2 * devices):
                counts[device] += _reached(
                    structure, q, k, query_chunk, key_chunk, np
                )
    return counts


def _reached(structure, q, k, query_chunk, key_chunk, xp=jnp):
    """Whether the band shows any key of chunk `k` to any query of chunk
    `q` (always, without a band)."""
    return _reached_at(
        structure, q * query_chunk, k * key_chunk, query_chunk, key_chunk, xp
    )


def _reached_at(structure, first_query, first_key, queries, keys, xp=jnp):
    """Whether the band shows any of `keys` keys from `first_key` to any
    of `queries` queries from `first_query` (positions in the sequence)."""
    band = structure.band
    if band is None:
        return True
    first = first_query + band.offset  # the first query's position
    last = first + queries - 1
    reached = True
    if band.right is not None:
        reached = xp.logical_and(reached, first_key <= last + band.right)
    if band.left is not None:
        last_key = first_key + keys - 1
        reached = xp.logical_and(reached, last_key >= first - band.left)
    return reached


def attention(query, key, value, mask, structure, scale, sharding):
    """Attention of `(B, T, N, H)` queries on `(B, S, K, H)` keys and
    `(B, S, K, V)` values sharded as `sharding` says; `mask` has rank 4
    `(B|1, N|1, T|1, S)` or is `None`. Returns `(B, T, N, V)`."""
    batch_axis, sequence_axis = sharding.batch_axis, sharding.sequence_axis
    data = PartitionSpec(batch_axis, sequence_axis)
    arrays = {"query": query, "key": key, "value": value}
    specs = {"query": data, "key": data, "value": data}
    if mask is not None:
        # The key axis stays whole: each step takes the columns it needs.
        arrays["mask"] = mask
        specs["mask"] = PartitionSpec(
            batch_axis if mask.shape[0] > 1 else None,
            None,
            sequence_axis if mask.shape[2] > 1 else None,
            None,
        )
    if structure.segments is not None:
        arrays["query_ids"] = structure.query_segments
        arrays["key_ids"] = structure.key_segments
        specs["query_ids"] = data
        specs["key_ids"] = PartitionSpec(batch_axis, None)
    names = tuple(arrays)
    step = _Step(structure, scale, batch_axis)

    def local(*tensors):
        tensors = dict(zip(names, tensors, strict=True))
        device = lax.axis_index(sequence_axis)
        tensors = _to_chunk_order(sharding, tensors, device)
        query, key, value = (tensors.pop(n) for n in ("query", "key", "value"))
        output = _ring_attention(step, sharding)(query, key, value, tensors)
        return _from_chunk_order(sharding, output, device)

    fn = jax.shard_map(
        local,
        mesh=sharding.mesh,
        in_specs=tuple(specs[name] for name in names),
        out_specs=data,
        check_vma=False,
    )
    return fn(*(arrays[name] for name in names))


def _to_chunk_order(sharding, tensors, device):
    """With the zig-zag order, each sequence-sharded tensor rearranged
    from chunks `2d, 2d + 1` to chunks `d, 2P - 1 - d`."""
    if not sharding.zigzag:
        return tensors
    moved = dict(tensors)
    for name, axis in (("query", 1), ("key", 1), ("value", 1),
                       ("query_ids", 1), ("mask", 2)):  # fmt: skip
        if name in moved and moved[name].shape[axis] > 1:
            moved[name] = _zigzag(sharding, moved[name], axis, device)
    return moved


def _zigzag(sharding, x, axis, device, inverse=False):
    """Chunks `2d, 2d + 1` of device `d` to chunks `d, 2P - 1 - d`, or
    back: chunk `c` lives on device `c` (`c < P`, first half) or
    `2P - 1 - c` (second half). The even chunks and the odd chunks each
    move by one permutation of the devices."""
    devices = sharding.devices

    def home(chunk):
        return chunk if chunk < devices else 2 * devices - 1 - chunk

    even = [(d, home(2 * d)) for d in range(devices)]
    odd = [(d, home(2 * d + 1)) for d in range(devices)]
    first, second = jnp.split(x, 2, axis=axis)
    is_even = device % 2 == 0
    name = sharding.sequence_axis
    if not inverse:
        from_even = lax.ppermute(first, name, even)
        from_odd = lax.ppermute(second, name, odd)
        # Device d receives chunk d (even d: from an even chunk) first.
        low = jnp.where(is_even, from_even, from_odd)
        high = jnp.where(is_even, from_odd, from_even)
        return jnp.concatenate([low, high], axis=axis)
    # Back: chunk d (held first) and chunk 2P - 1 - d return home.
    to_even = jnp.where(is_even, first, second)
    to_odd = jnp.where(is_even, second, first)
    back_even = lax.ppermute(to_even, name, [(b, a) for a, b in even])
    back_odd = lax.ppermute(to_odd, name, [(b, a) for a, b in odd])
    return jnp.concatenate([back_even, back_odd], axis=axis)


def _from_chunk_order(sharding, output, device):
    if not sharding.zigzag:
        return output
    return _zigzag(sharding, output, 1, device, inverse=True)


class _Step:
    """The logits of one query chunk on one key chunk, at their global
    positions, with every part of the structure applied."""

    def __init__(self, structure, scale, batch_axis):
        self.structure, self.scale = structure, scale
        self.batch_axis = batch_axis

    def positions(self, chunk, rows):
        return chunk * rows + jnp.arange(rows, dtype="int32")

    def visible(self, tensors, query_pos, key_pos, query_rows, grid):
        """Booleans `(b|1, N|1, R, C)`, or `None` when all are visible;
        `grid` is `(b, N)`, the batch rows and heads of the queries."""
        structure = self.structure
        visible = None
        if structure.mask_mod is not None:
            batch, heads = grid
            first = lax.axis_index(self.batch_axis) * batch  # global rows
            indices = (
                (first + jnp.arange(batch, dtype="int32"))[:, None, None, None],
                jnp.arange(heads, dtype="int32")[None, :, None, None],
                query_pos[None, None, :, None],
                key_pos[None, None, None, :],
            )
            visible = mod_visible(structure.where, structure.mask_mod, indices)
        band = structure.band_visible(query_pos[:, None], key_pos[None, :])
        if band is not None:
            visible = band[None, None]
        if "query_ids" in tensors:
            query_ids = lax.dynamic_slice_in_dim(
                tensors["query_ids"], query_rows, len(query_pos), axis=1
            )
            key_ids = jnp.take(tensors["key_ids"], key_pos, axis=1)
            same = segments_visible(query_ids, key_ids)[:, None]
            visible = same if visible is None else visible & same
        if "mask" in tensors:
            mask = tensors["mask"]
            if mask.shape[2] > 1:
                mask = lax.dynamic_slice_in_dim(
                    mask, query_rows, len(query_pos), axis=2
                )
            if mask.shape[3] > 1:
                mask = jnp.take(mask, key_pos, axis=3)
            visible = mask if visible is None else visible & mask
        return visible

    def logits(self, query, key, query_pos, key_pos):
        """Scaled (capped, biased) float32 logits `(b, N, R, C)`."""
        batch, rows, heads, depth = query.shape
        kv_heads = key.shape[2]
        query = query.astype("float32") * self.scale
        key = key.astype("float32")
        grouped = query.reshape(batch, rows, kv_heads, heads // kv_heads, depth)
        logits = jnp.einsum("brkgh,bckh->bkgrc", grouped, key)
        logits = logits.reshape(batch, heads, rows, key.shape[1])
        structure = self.structure
        if structure.soft_cap is not None:
            logits = structure.soft_cap * jnp.tanh(logits / structure.soft_cap)
        if structure.alibi:
            bias = structure.alibi_bias(
                heads, query_pos[:, None], key_pos[None, :]
            )
            logits = logits + bias[None]
        return logits


def _ring_attention(step, sharding):
    """`fn(query, key, value, tensors)` on one device's shards (in chunk
    order), with its own backward pass. One loop visits every key chunk:
    the ring's `P` steps (two chunks held at each, then passed on), or
    the `2P` chunks of the gathered keys."""
    devices = sharding.devices
    name = sharding.sequence_axis
    shift = [(d, (d + 1) % devices) for d in range(devices)]
    steps = devices if sharding.ring else 2 * devices

    def held(device, index, rows):
        """`(global chunk, first row)` of each key chunk held at loop
        step `index`, chunks of `rows` rows."""
        if sharding.ring:
            source = (device - index) % devices  # whose shard is held
            return [
                (c, i * rows) for i, c in enumerate(sharding.chunks(source))
            ]
        order = jnp.asarray(_all_chunks(sharding), "int32")
        return [(order[index], index * rows)]

    def pairs(device, index, query_rows, key_rows):
        """Each chunk pair of a step: `(query row, query positions, key
        row, key positions, reached)`."""
        found = []
        for k, k_row in held(device, index, key_rows):
            for i, q in enumerate(sharding.chunks(device)):
                found.append(
                    (
                        i * query_rows,
                        step.positions(q, query_rows),
                        k_row,
                        step.positions(k, key_rows),
                        _reached(step.structure, q, k, query_rows, key_rows),
                    )
                )
        return found

    def exchanged(key, value):
        if sharding.ring:
            return key, value
        return tuple(
            lax.all_gather(x, name, axis=1, tiled=True) for x in (key, value)
        )

    def forward_pass(query, key, value, tensors):
        batch, length, heads, _ = query.shape
        query_rows, key_rows = length // 2, key.shape[1] // 2
        device = lax.axis_index(name)

        def visit(index, carry):
            output, lse, keys, values = carry
            for q_row, q_pos, k_row, k_pos, reached in pairs(
                device, index, query_rows, key_rows
            ):
                parts = (
                    lax.dynamic_slice_in_dim(output, q_row, query_rows, 1),
                    lax.dynamic_slice_in_dim(lse, q_row, query_rows, 2),
                    lax.dynamic_slice_in_dim(query, q_row, query_rows, 1),
                    lax.dynamic_slice_in_dim(keys, k_row, key_rows, 1),
                    lax.dynamic_slice_in_dim(values, k_row, key_rows, 1),
                )
                o, m = lax.cond(
                    reached,
                    lambda o, m, q, k, v, qp=q_pos, kp=k_pos, r=q_row:
                        _merge_chunk(step, tensors, o, m, q, k, v, qp, kp, r),
                    lambda o, m, *_: (o, m),
                    *parts,
                )  # fmt: skip
                output = lax.dynamic_update_slice_in_dim(output, o, q_row, 1)
                lse = lax.dynamic_update_slice_in_dim(lse, m, q_row, 2)
            if sharding.ring:
                keys, values = (
                    lax.ppermute(x, name, shift) for x in (keys, values)
                )
            return output, lse, keys, values

        output = jnp.zeros((*query.shape[:3], value.shape[3]), "float32")
        lse = jnp.full((batch, heads, length), -jnp.inf, "float32")
        output, lse, _, _ = lax.fori_loop(
            0, steps, visit, (output, lse, *exchanged(key, value))
        )
        return output.astype(value.dtype), lse

    @jax.custom_vjp
    def attend(query, key, value, tensors):
        return forward_pass(query, key, value, tensors)[0]

    def attend_forward(query, key, value, tensors):
        output, lse = forward_pass(query, key, value, tensors)
        return output, (query, key, value, tensors, output, lse)

    def attend_backward(residuals, grad):
        query, key, value, tensors, output, lse = residuals
        grad = grad.astype("float32")
        delta = jnp.einsum("btnv,btnv->bnt", grad, output.astype("float32"))
        query_rows, key_rows = query.shape[1] // 2, key.shape[1] // 2
        device = lax.axis_index(name)

        def visit(index, carry):
            grad_query, grad_key, grad_value, keys, values = carry
            for q_row, q_pos, k_row, k_pos, reached in pairs(
                device, index, query_rows, key_rows
            ):
                parts = (
                    lax.dynamic_slice_in_dim(query, q_row, query_rows, 1),
                    lax.dynamic_slice_in_dim(keys, k_row, key_rows, 1),
                    lax.dynamic_slice_in_dim(values, k_row, key_rows, 1),
                    lax.dynamic_slice_in_dim(grad, q_row, query_rows, 1),
                    lax.dynamic_slice_in_dim(lse, q_row, query_rows, 2),
                    lax.dynamic_slice_in_dim(delta, q_row, query_rows, 2),
                )
                dq, dk, dv = lax.cond(
                    reached,
                    lambda *p, qp=q_pos, kp=k_pos, r=q_row:
                        _chunk_grads(step, tensors, *p, qp, kp, r),
                    lambda q, k, v, *_: tuple(
                        jnp.zeros(x.shape, "float32") for x in (q, k, v)),
                    *parts,
                )  # fmt: skip
                grad_query = _add_rows(grad_query, dq, q_row, 1)
                grad_key = _add_rows(grad_key, dk, k_row, 1)
                grad_value = _add_rows(grad_value, dv, k_row, 1)
            if sharding.ring:
                # The gradients travel with their keys: after P moves
                # they are home.
                moved = (grad_key, grad_value, keys, values)
                grad_key, grad_value, keys, values = (
                    lax.ppermute(x, name, shift) for x in moved
                )
            return grad_query, grad_key, grad_value, keys, values

        keys, values = exchanged(key, value)
        zeros = [jnp.zeros(x.shape, "float32") for x in (query, keys, values)]
        grad_query, grad_key, grad_value, _, _ = lax.fori_loop(
            0, steps, visit, (*zeros, keys, values)
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

    attend.defvjp(attend_forward, attend_backward)
    return attend


def _all_chunks(sharding):
    """The global chunks of the gathered keys, in the order they sit."""
    return [c for d in range(sharding.devices) for c in sharding.chunks(d)]


def _add_rows(total, part, start, axis):
    current = lax.dynamic_slice_in_dim(total, start, part.shape[axis], axis)
    return lax.dynamic_update_slice_in_dim(total, current + part, start, axis)


def _masked_logits(step, tensors, query, key, query_pos, key_pos, query_rows):
    logits = step.logits(query, key, query_pos, key_pos)
    grid = (query.shape[0], query.shape[2])
    visible = step.visible(tensors, query_pos, key_pos, query_rows, grid)
    if visible is not None:
        logits = jnp.where(visible, logits, -jnp.inf)
    return logits


def _block(rows):
    """Rows per block inside a chunk: the chunk whole up to `BLOCK`,
    else the largest divisor of its rows up to `BLOCK`."""
    if rows <= BLOCK:
        return rows
    return next(c for c in range(BLOCK, 0, -1) if rows % c == 0)


def _blocks(step, query_rows, key_rows, q_pos, k_pos, row):
    """The block pairs of one chunk pair: `(query blocks, key blocks,
    block rows, block keys, visit)` where `visit(i, j, fn, skip)` runs
    `fn(q_slice, k_slice, q_pos, k_pos, row)` on block pair `(i, j)` if
    the band reaches it, else `skip()`; slices are `(start, size)`."""
    size_q, size_k = _block(query_rows), _block(key_rows)

    def visit(i, j, fn, skip, *operands):
        q_start, k_start = i * size_q, j * size_k
        positions = (
            lax.dynamic_slice_in_dim(q_pos, q_start, size_q),
            lax.dynamic_slice_in_dim(k_pos, k_start, size_k),
        )
        reached = _reached_at(
            step.structure, positions[0][0], positions[1][0], size_q, size_k
        )
        return lax.cond(
            reached,
            lambda *ops: fn(q_start, k_start, *positions, row + q_start, *ops),
            lambda *ops: skip(*ops),
            *operands,
        )

    return query_rows // size_q, key_rows // size_k, size_q, size_k, visit


def _merge_chunk(step, tensors, output, lse, query, key, value, q_pos,
                 k_pos, row):  # fmt: skip
    """`_merge` of one chunk pair, block by block: `(output (b, R, N, V),
    lse (b, N, R))`."""
    count_q, count_k, size_q, size_k, visit = _blocks(
        step, query.shape[1], key.shape[1], q_pos, k_pos, row
    )

    def merge(q_start, k_start, qp, kp, r, o, m):
        q = lax.dynamic_slice_in_dim(query, q_start, size_q, 1)
        k = lax.dynamic_slice_in_dim(key, k_start, size_k, 1)
        v = lax.dynamic_slice_in_dim(value, k_start, size_k, 1)
        return _merge(step, tensors, o, m, q, k, v, qp, kp, r)

    def rows(i, carry):
        output, lse = carry
        o = lax.dynamic_slice_in_dim(output, i * size_q, size_q, 1)
        m = lax.dynamic_slice_in_dim(lse, i * size_q, size_q, 2)
        o, m = lax.fori_loop(
            0,
            count_k,
            lambda j, om: visit(i, j, merge, lambda o, m: (o, m), *om),
            (o, m),
        )
        output = lax.dynamic_update_slice_in_dim(output, o, i * size_q, 1)
        return output, lax.dynamic_update_slice_in_dim(lse, m, i * size_q, 2)

    return lax.fori_loop(0, count_q, rows, (output, lse))


def _chunk_grads(step, tensors, query, key, value, grad, lse, delta, q_pos,
                 k_pos, row):  # fmt: skip
    """`_block_grads` of one chunk pair, block by block."""
    count_q, count_k, size_q, size_k, visit = _blocks(
        step, query.shape[1], key.shape[1], q_pos, k_pos, row
    )

    def grads(q_start, k_start, qp, kp, r, dq, dk, dv):
        parts = (
            lax.dynamic_slice_in_dim(query, q_start, size_q, 1),
            lax.dynamic_slice_in_dim(key, k_start, size_k, 1),
            lax.dynamic_slice_in_dim(value, k_start, size_k, 1),
            lax.dynamic_slice_in_dim(grad, q_start, size_q, 1),
            lax.dynamic_slice_in_dim(lse, q_start, size_q, 2),
            lax.dynamic_slice_in_dim(delta, q_start, size_q, 2),
        )
        block = _block_grads(step, tensors, *parts, qp, kp, r)
        return (
            _add_rows(dq, block[0], q_start, 1),
            _add_rows(dk, block[1], k_start, 1),
            _add_rows(dv, block[2], k_start, 1),
        )

    def pair(index, carry):
        i, j = index // count_k, index % count_k
        return visit(i, j, grads, lambda *g: g, *carry)

    zeros = tuple(jnp.zeros(x.shape, "float32") for x in (query, key, value))
    return lax.fori_loop(0, count_q * count_k, pair, zeros)


def _merge(step, tensors, output, lse, query, key, value, q_pos, k_pos, rows):
    """The running `(output (b, R, N, V), lse (b, N, R))` with one more
    key block merged in."""
    logits = _masked_logits(step, tensors, query, key, q_pos, k_pos, rows)
    block_lse = jax.nn.logsumexp(logits, axis=-1)  # (b, N, R), -inf if empty
    new_lse = jnp.logaddexp(lse, block_lse)
    finite = jnp.isfinite(new_lse)
    safe = jnp.where(finite, new_lse, 0.0)
    weights = jnp.where(finite[..., None], jnp.exp(logits - safe[..., None]), 0)
    part = _attend(weights, value)  # (b, R, N, V)
    keep = jnp.where(finite, jnp.exp(lse - safe), 0.0)  # (b, N, R)
    output = output * jnp.transpose(keep, (0, 2, 1))[..., None] + part
    return output, new_lse


def _attend(weights, value):
    """`Σ_c weights[r, c] value[c]` with grouped heads: `(b, R, N, V)`."""
    batch, heads, rows, length = weights.shape
    kv_heads = value.shape[2]
    weights = weights.reshape(batch, kv_heads, heads // kv_heads, rows, length)
    output = jnp.einsum("bkgrc,bckv->brkgv", weights, value.astype("float32"))
    return output.reshape(batch, rows, heads, value.shape[3])


def _block_grads(step, tensors, query, key, value, grad, lse, delta, q_pos,
                 k_pos, rows):  # fmt: skip
    """The gradients of one block pair: `(dq, dk, dv)` in float32, from
    the final log-sum-exp (FlashAttention-2's backward pass)."""
    logits, pullback = jax.vjp(
        lambda q, k: _masked_logits(step, tensors, q, k, q_pos, k_pos, rows),
        query,
        key,
    )
    finite = jnp.isfinite(lse)
    safe = jnp.where(finite, lse, 0.0)
    weights = jnp.where(finite[..., None], jnp.exp(logits - safe[..., None]), 0)
    batch, heads, length, keys = weights.shape
    kv_heads = value.shape[2]
    grouped = weights.reshape(batch, kv_heads, heads // kv_heads, length, keys)
    grad_g = grad.reshape(batch, length, kv_heads, heads // kv_heads, -1)
    grad_value = jnp.einsum("bkgrc,brkgv->bckv", grouped, grad_g)
    grad_weights = jnp.einsum(
        "brkgv,bckv->bkgrc", grad_g, value.astype("float32")
    ).reshape(weights.shape)
    grad_logits = weights * (grad_weights - delta[..., None])
    grad_query, grad_key = pullback(grad_logits)
    return grad_query, grad_key, grad_value


def refusal(structure, return_weights):
    """Why a call under `ContextParallel` runs on the gathered sequence
    instead, or `None`."""
    if return_weights:
        return "the weights are requested: they are (T, S) whole"
    if structure.score_mod is not None:
        return (
            "a score mod is applied to the whole sequence (its tensors' "
            "gradients are not passed around the ring)"
        )
    return None


def plan(query, key, value, structure, distribution):
    """`(Sharding, reasons)` of a call on `(B, T, N, H)` or `(B, T, H)`
    tensors under `distribution`."""
    four = len(query.shape) == 4
    heads = query.shape[2] if four else 1
    kv_heads = key.shape[2] if four else 1
    mesh = distribution.device_mesh.backend_mesh
    return layout(
        structure,
        query.shape[0],
        heads,
        kv_heads,
        query.shape[1],
        key.shape[1],
        (key.shape[-1], value.shape[-1]),
        mesh,
        distribution.batch_dim_name,
        distribution.sequence_dim_name,
    )


def context_attention(query, key, value, mask, structure, scale, distribution):
    """`attention` for the inputs of `dispatch.attention` (3-D or 4-D,
    `mask` of the weights' rank)."""
    sharding, _ = plan(query, key, value, structure, distribution)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if len(query.shape) == 3:
        query, key, value = (x[:, :, None] for x in (query, key, value))
        mask = None if mask is None else mask[:, None]
        output = attention(query, key, value, mask, structure, scale, sharding)
        return output[:, :, 0]
    return attention(query, key, value, mask, structure, scale, sharding)
