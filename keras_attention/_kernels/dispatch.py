"""The rule that picks a path of dot-product attention, and `force`,
which overrides it.

A path is chosen only where it is faster than the reference and gives the
reference's outputs and gradients: the fused kernel on PyTorch and on JAX
with a GPU; blockwise attention for long sequences where no fused kernel
runs (TensorFlow, JAX on CPU), and on PyTorch's CPU where the structure
leaves few block pairs (`SPARSE_FRACTION`), which the kernel would all
compute under a dense mask, or where the kernel is refused (a score mod)
on long sequences (`KERNEL_MIN_LENGTH`). Every path exists on every
backend, so each can be forced and checked everywhere.

Shape legend: B batch, T query length, S key length, N query heads,
K key/value heads, H head dim, V value head dim.
"""

import contextlib
import math

import keras
from keras import ops

from keras_attention import _core
from keras_attention._kernels import backends
from keras_attention._kernels import flex as flex_kernel
from keras_attention._kernels import runtime
from keras_attention._kernels.blockwise import chunked_attention
from keras_attention._kernels.blockwise import plan
from keras_attention._kernels.fused import fused_attention
from keras_attention._kernels.fused import refusal
from keras_attention._kernels.fused import structure_refusal

CHUNK_SIZE = 256  # query and key rows per block of the chunked path
# Where nothing can be skipped (no mask, structure or mod) and queries
# and keys number at least `DENSE_CHUNK_MIN_LENGTH`, a backend takes
# blocks of `DENSE_CHUNK_SIZE`: measured with benchmarks/kernel_forms.py
# (attention alone, forward and backward, B=8, 8 heads of 64, T=2048,
# float32) on 2-core CPUs, blocks of 512 make that kernel 1.14x faster
# than blocks of 256 on JAX on an AMD EPYC, and within 6% either way on
# an Intel Xeon, for four times the block buffers; on TensorFlow they
# were 1.13x faster on the first and 1.21x slower on the second. Causal
# attention gains nothing from them, and block skipping (windows,
# segment ids, mask mods) is finer with the smaller blocks: everything
# else, and TensorFlow, keeps `CHUNK_SIZE`.
DENSE_CHUNK_SIZE = {"tensorflow": CHUNK_SIZE, "jax": 512, "torch": CHUNK_SIZE}
DENSE_CHUNK_MIN_LENGTH = 2048
CHUNKED_MIN_LENGTH = 512  # shorter queries fit the cache whole
# Where no fused kernel runs, the blockwise path's time over the
# reference's for the same block pairs, a training step (forward and
# backward); the blockwise path is chosen where this times the fraction
# of block pairs it visits is below 1. Fitted with benchmarks/paths.py
# (attention alone, B=8, 8 heads of 64, float32, T = 512-2048, full and
# causal) on a 2-core CPU: TensorFlow, which runs the kernel's loops as
# a graph of small steps without XLA, takes 0.97-1.32x the reference's
# time per block pair where it skips some (causal), 1.23-1.59x where it
# visits all of them (four runs; XLA-compiling the loops' bodies inside
# the graph did not change it); 1.3 keeps full attention on the
# reference and takes causal attention at T=512, which visits 3 of 4
# block pairs, blockwise (reference / blockwise: 104 / 105, 100 / 95,
# 101 / 94, 101 / 92 ms); JAX's compiled loops take 0.6-1.0x for full
# attention from T=1024 and 1.1-1.2x per visited block pair for causal
# attention.
BLOCKWISE_COST = {"tensorflow": 1.3, "jax": 0.85}
# The reference holds the (B, N, T, S) weights and their gradient: it is
# chosen only while those weights take at most this many bytes in
# float32, an unknown batch counted as `UNKNOWN_BATCH` rows.
REFERENCE_MAX_BYTES = 1 << 30
UNKNOWN_BATCH = 8
# Where a fused kernel takes the structure as a dense mask, the blockwise
# path wins once the structure leaves at most this fraction of block pairs
# (on backends where `sparse_blocks_beat_fused()`). Measured with
# benchmarks/mods.py (attention alone, forward and backward, B=2, T=4096,
# 8 heads of 64, float32) on PyTorch on a 2-core CPU: SDPA with the dense
# mask takes 2.0-2.5 s whatever the pattern; the blockwise path 0.7-0.9 s
# with 12% of the block pairs left (documents, chunks) and 3.5 s with 64%
# (prefix-LM), so they break even near 40%.
SPARSE_FRACTION = 0.3
# Where the fused kernel is refused (a score mod) on those backends, the
# reference wins below this length, the blockwise path from it: PyTorch,
# CPU, T5's relative bias as a score mod, the same shapes: 54 / 102 ms
# (reference / blockwise) at T=512, 402 / 484 at 1024, 1392 / 1474 at
# 2048, 23.6 / 7.7 s at 4096, where the reference's (B, N, T, T) buffers
# take GiBs.
KERNEL_MIN_LENGTH = 2048


def reference_attention(query, key, value, mask, structure, scale):
    """The reference math on the whole `(T, S)` matrix."""
    return _core.reference(query, key, value, mask, scale, structure)[0]


def chunk_size(structure=None, mask=None, lengths=None) -> int:
    """Query and key rows per block of the blockwise path: the forced
    size, else the block size of a block mask given as the mask mod,
    else the backend's `DENSE_CHUNK_SIZE` for attention with nothing
    to skip (`structure` empty and without mods, no `mask`) of `lengths
    = (T, S)` from `DENSE_CHUNK_MIN_LENGTH`, else `CHUNK_SIZE`."""
    if _forced["chunk_size"]:
        return _forced["chunk_size"]
    if structure is not None and structure.block_size is not None:
        return structure.block_size
    if (
        structure is not None
        and mask is None
        and _has_nothing_to_skip(structure)
        and lengths is not None
        and all(
            length is not None and length >= DENSE_CHUNK_MIN_LENGTH
            for length in lengths
        )
    ):
        return DENSE_CHUNK_SIZE[keras.backend.backend()]
    return CHUNK_SIZE


def _has_nothing_to_skip(structure):
    """No band, segments or mods, and no ALiBi or soft cap."""
    return (
        structure.is_empty
        and structure.score_mod is None
        and not structure.alibi
        and structure.soft_cap is None
    )


def call_chunk_size(query, key, mask, structure) -> int:
    """`chunk_size` for a call on `query` `(B, T, ...)` and `key`
    `(B, S, ...)`: the block rows its blockwise path takes."""
    lengths = [runtime.static_dim(x.shape[1]) for x in (query, key)]
    return chunk_size(structure, mask, lengths)


def _chunked(query, key, value, mask, structure, scale):
    block = call_chunk_size(query, key, mask, structure)
    return chunked_attention(query, key, value, mask, structure, scale, block)


PATHS = {
    "reference": reference_attention,
    "chunked": _chunked,
    "fused": fused_attention,
}

_forced = {"path": None, "chunk_size": None}


@contextlib.contextmanager
def force(path, chunk_size=None, flex=None):
    """Runs every attention call inside the context on `path`, or on the
    reference where that path cannot take the call (a fused kernel given
    a soft cap or score mod it has no option for, the blockwise path
    given an empty or unknown length, any call whose weights are
    returned); `explain` names the path that runs and why.

    Args:
        path: str. A name in `PATHS`, whatever the lengths or the device.
        chunk_size: int, optional. Query and key rows per block of the
            chunked path. Defaults to `CHUNK_SIZE`.
        flex: str, optional. On PyTorch, the fused path runs
            FlexAttention (see `flex`) on the inputs it takes,
            `"compiled"` or `"eager"`.
    """
    if path not in PATHS:
        raise ValueError(
            f"force: `path` must be one of {sorted(PATHS)}. "
            f"Received: path={path!r}"
        )
    if flex not in (None, *flex_kernel.MODES) or (flex and path != "fused"):
        raise ValueError(
            "force: `flex` must be None, or one of "
            f"{flex_kernel.MODES} with the fused path. "
            f"Received: path={path!r}, flex={flex!r}"
        )
    previous = dict(_forced)
    _forced.update(path=path, chunk_size=chunk_size)
    try:
        with flex_kernel.forced(flex):
            yield
    finally:
        _forced.update(previous)


def select(query, key, value=None) -> str:
    """The name of the path that `attention` takes for these inputs."""
    return choose(query, key, value)[0]


def has_fused_kernel() -> bool:
    """Whether this backend and device have a fused kernel worth choosing."""
    return backends.current().has_fused_kernel()


def choose(query, key, value=None, weights=False, structure=None):
    """`(path, refused)`: the path attention takes for inputs of these
    shapes and dtypes (`weights=True`: the weights are needed too), and
    for each faster path not taken, why."""
    if weights:
        reason = "the weights are requested; only the reference computes them"
        return "reference", {"fused": reason, "chunked": reason}
    if _forced["path"] is not None:
        return _forced_choice(query, key, value, structure)
    if runtime.is_exporting():
        # PyTorch's ONNX exporters do not translate every option of its
        # kernel (grouped-query heads); the reference math exports.
        reason = "PyTorch is tracing or exporting the program"
        return "reference", {"fused": reason, "chunked": reason}
    if has_fused_kernel():
        return _choose_with_kernel(query, key, value, structure)
    refused = {
        "fused": f"no fused kernel on {backends.current().device_name()}"
    }
    return _by_cost(query, key, structure, refused)


def _forced_choice(query, key, value, structure):
    """The forced path, or the reference where that path cannot take
    these inputs (with the reason)."""
    path = _forced["path"]
    refused = {"automatic choice": "a path is forced"}
    why = None
    if path == "chunked":
        lengths = [runtime.static_dim(x.shape[1]) for x in (query, key)]
        if None in lengths:
            why = "the query or key length is not known statically"
        elif 0 in lengths:
            why = "a length is 0: there is no block to compute"
    elif path == "fused" and value is not None:
        if not flex_kernel.chosen(query, key, value):  # FlexAttention takes all
            why = refusal(query, value)
            if why is None and structure is not None:
                why = structure_refusal(structure)
    if why is None:
        return path, refused
    return "reference", {**refused, path: why}


def _by_cost(query, key, structure, refused):
    """Of the reference and the blockwise path, the one `BLOCKWISE_COST`
    estimates faster, but the blockwise path wherever the reference's
    weights would take over `REFERENCE_MAX_BYTES`."""
    batch, query_length = map(runtime.static_dim, query.shape[:2])
    key_length = runtime.static_dim(key.shape[1])
    if (
        query_length is None
        or key_length is None
        or query_length < CHUNKED_MIN_LENGTH
        or key_length < CHUNK_SIZE
    ):
        return _by_length(query, key, refused, CHUNKED_MIN_LENGTH)
    heads = 1 if len(query.shape) == 3 else query.shape[2]
    rows = UNKNOWN_BATCH if batch is None else batch
    weights = 4 * rows * heads * query_length * key_length
    if weights > REFERENCE_MAX_BYTES:
        refused["reference"] = (
            f"its (B, N, T, S) weights would take {weights / 2**30:.1f} GiB "
            f"in float32, over {REFERENCE_MAX_BYTES / 2**30:g} GiB"
        )
        return "chunked", refused
    visited = plan.static_visited_fraction(
        structure, query_length, key_length, chunk_size(structure)
    )
    if visited is None:  # segment ids or a mask mod: known from the data
        return "chunked", refused
    cost = BLOCKWISE_COST[keras.backend.backend()] * visited
    if cost < 1:
        return "chunked", refused
    refused["chunked"] = (
        f"it visits {visited:.0%} of the block pairs: estimated {cost:.2f}x "
        f"the reference's time on {backends.current().device_name()}"
    )
    return "reference", refused


def _by_length(query, key, refused, min_length):
    """The blockwise path from `min_length` queries, else the reference;
    `refused` gets the blockwise path's refusal."""
    query_length = runtime.static_dim(query.shape[1])
    key_length = runtime.static_dim(key.shape[1])
    if query_length is None or key_length is None:
        refused["chunked"] = "the query or key length is not known statically"
    elif query_length < min_length:
        refused["chunked"] = (
            f"{query_length} queries: below {min_length}, the whole "
            "(T, S) matrix fits in cache and is faster"
        )
    elif key_length < CHUNK_SIZE:
        refused["chunked"] = f"{key_length} keys: fewer than one block"
    else:
        return "chunked", refused
    return "reference", refused


def _choose_with_kernel(query, key, value, structure):
    reason = None if value is None else refusal(query, value)
    if structure is not None and structure_refusal(structure):
        reason = structure_refusal(structure)
    measured = backends.current().sparse_blocks_beat_fused()
    sparse = _sparse_reason(query, key, structure) if measured else None
    if sparse:
        return "chunked", {"fused": reason or sparse}
    if reason is None:
        return "fused", {}
    if measured:  # a CPU: the reference against the blockwise path
        return _by_length(query, key, {"fused": reason}, KERNEL_MIN_LENGTH)
    return "reference", {
        "fused": reason,
        "chunked": "not used where a fused kernel exists (not measured faster)",
    }


def _sparse_reason(query, key, structure):
    """Why the blockwise path beats the fused kernel for this call (the
    structure leaves few block pairs, which the kernel would compute
    under a dense mask), or `None`."""
    if (
        structure is None
        or structure.is_top_left_causal  # the kernel skips those blocks
        or all(
            part is None
            for part in (structure.band, structure.segments, structure.mask_mod)
        )
    ):
        return None
    sizes = [runtime.static_dim(d) for d in (*query.shape[:2], key.shape[1])]
    if None in sizes or sizes[1] < CHUNKED_MIN_LENGTH or sizes[2] < CHUNK_SIZE:
        return None
    batch, query_length, key_length = sizes
    heads = 1 if len(query.shape) == 3 else query.shape[2]
    fraction = plan.visited_fraction(
        structure, batch, heads, query_length, key_length, chunk_size(structure)
    )
    # Read only where that is free (not traced, compiled or on a device).
    per_mille = ops.cast(ops.round(fraction * 1000), "int32")
    per_mille = runtime.static_int(per_mille)
    if per_mille is None or per_mille > 1000 * SPARSE_FRACTION:
        return None
    return (
        f"the structure leaves {per_mille / 10:.0f}% of the block pairs; at "
        f"most {SPARSE_FRACTION:.0%}, skipping the others beats the kernel "
        "on a dense mask"
    )


def attention(
    query, key, value, mask, structure, scale=None, return_weights=False
):
    """Dot-product attention on checked inputs and a `Structure`: the
    selected path, or the reference with its weights.

    Args:
        query, key, value: `(B, T, H)`, `(B, S, H)`, `(B, S, V)` or
            `(B, T, N, H)`, `(B, S, K, H)`, `(B, S, K, V)`.
        mask: boolean tensor that broadcasts to the weights, or `None`.
        structure: `Structure`. Causal, windowed and segment structure,
            on top of `mask`.
        scale: float. Multiplies the logits. Defaults to `1 / sqrt(H)`.
        return_weights: bool. Return `(output, weights)` from the
            reference instead.

    Returns:
        The output, `(B, T, V)` or `(B, T, N, V)`, or `(output, weights)`.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if mask is not None:
        mask = _core.expand_mask(mask, len(query.shape))  # the weights' rank
    distribution = runtime.context_parallel()
    if distribution is not None:
        # Imported here: it is written in JAX, the only backend with one.
        from keras_attention._kernels import context

        if context.refusal(structure, return_weights) is None:
            return context.context_attention(
                query, key, value, mask, structure, scale, distribution
            )
    if return_weights:
        return _core.reference(query, key, value, mask, scale, structure)
    path = choose(query, key, value, structure=structure)[0]
    return PATHS[path](query, key, value, mask, structure, scale)
