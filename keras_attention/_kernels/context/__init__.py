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
logits, as FlashAttention does: a device holds `O(T / P)` activations
(`ring`), computing each chunk pair in blocks (`blocks`).

Every position is global: the band (causal, bottom-right alignment,
sliding windows), ALiBi, segment ids and masks are evaluated on the
positions a shard holds in the whole sequence.

Load balance. Each device's shard is two chunks of `T / (2P)` rows.
With causal attention and contiguous shards, device `d` would visit
`4d + 3` chunk pairs; the zig-zag order (`zigzag`; Brandon et al. 2023
balance causal work by striping, MaxText and PyTorch with contiguous
chunks) gives every device `2P + 1`. The order whose busiest device
visits fewer chunk pairs is taken (`sharding.layout`). Chunk pairs and
blocks that the band leaves empty are skipped (`lax.cond`), which is
also how a sliding window skips the shards it never reaches.

Shape legend: B batch (per device: b), T query length, S key length,
L = T / P query rows per device, M = S / P keys per device, N query
heads, K key/value heads, H head dim, V value head dim.
"""

import math

import jax
from jax import lax
from jax.sharding import PartitionSpec

from keras_attention._kernels.context import blocks
from keras_attention._kernels.context import sharding as layouts
from keras_attention._kernels.context import zigzag
from keras_attention._kernels.context.ring import exchanged_attention
from keras_attention._kernels.context.sharding import Sharding
from keras_attention._kernels.context.sharding import visited_chunks

__all__ = ["Sharding", "visited_chunks"]


def refusal(structure, return_weights):
    """Why a call under `ContextParallel` runs on the whole sequence
    instead (XLA gathers it), or `None`."""
    if return_weights:
        return (
            "the weights are needed (return_attention_scores, or attention "
            "dropout in training): they are (T, S) whole"
        )
    if structure.score_mod is not None:
        return (
            "a score mod is applied to the whole sequence (its tensors' "
            "gradients are not passed around the ring)"
        )
    return None


def plan(query, key, value, structure, distribution):
    """`(Sharding, reasons)` of a call on `(B, T, N, H)` or `(B, T, H)`
    tensors under `distribution`."""
    shapes = {
        "batch": query.shape[0],
        "query_length": query.shape[1],
        "key_length": key.shape[1],
        "kv_heads": key.shape[2] if len(key.shape) == 4 else 1,
        "head_dims": (key.shape[-1], value.shape[-1]),
    }
    return layouts.layout(
        structure,
        shapes,
        distribution.device_mesh.backend_mesh,
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


def attention(query, key, value, mask, structure, scale, sharding):
    """Attention of `(B, T, N, H)` queries on `(B, S, K, H)` keys and
    `(B, S, K, V)` values sharded as `sharding` says; `mask` has rank 4,
    `(B|1, N|1, T|1, S|1)`, or is `None`. Returns `(B, T, N, V)`."""
    batch_axis, sequence_axis = sharding.batch_axis, sharding.sequence_axis
    data = PartitionSpec(batch_axis, sequence_axis)
    arrays = {"query": query, "key": key, "value": value}
    specs = {"query": data, "key": data, "value": data}
    if mask is not None:
        # The key axis stays whole: each block takes the columns it needs.
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
    step = blocks.Step(structure, scale, batch_axis)

    def local(*tensors):
        tensors = dict(zip(names, tensors, strict=True))
        device = lax.axis_index(sequence_axis)
        tensors = zigzag.to_chunk_order(sharding, tensors, device)
        query, key, value = (tensors.pop(n) for n in ("query", "key", "value"))
        output = exchanged_attention(step, sharding)(query, key, value, tensors)
        return zigzag.from_chunk_order(sharding, output, device)

    sharded = jax.shard_map(
        local,
        mesh=sharding.mesh,
        in_specs=tuple(specs[name] for name in names),
        out_specs=data,
        check_vma=False,
    )
    return sharded(*(arrays[name] for name in names))
