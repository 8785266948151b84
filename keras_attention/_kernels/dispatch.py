"""The rule that picks a path of dot-product attention, and `force`,
which overrides it.

A path is chosen only where it is faster than the reference and gives the
reference's outputs and gradients: the fused kernel on PyTorch and on JAX
with a GPU; blockwise attention for long sequences where no fused kernel
runs (TensorFlow, JAX on CPU). Every path exists on every backend, so each
can be forced and checked everywhere.

Shape legend: B batch, T query length, S key length, N query heads,
K key/value heads, H head dim, V value head dim.
"""

import contextlib
import math

from keras_attention import _core
from keras_attention._kernels import backends
from keras_attention._kernels import runtime
from keras_attention._kernels.blockwise import chunked_attention
from keras_attention._kernels.fused import fused_attention
from keras_attention._kernels.fused import refusal
from keras_attention._kernels.fused import structure_refusal

CHUNK_SIZE = 256  # query and key rows per block of the chunked path
CHUNKED_MIN_LENGTH = 512  # shorter queries fit the cache whole


def reference_attention(query, key, value, mask, structure, scale):
    """The reference math on the whole `(T, S)` matrix."""
    return _core.reference(query, key, value, mask, scale, structure)[0]


def chunk_size() -> int:
    """Query and key rows per block of the blockwise path."""
    return _forced["chunk_size"] or CHUNK_SIZE


def _chunked(query, key, value, mask, structure, scale):
    return chunked_attention(
        query, key, value, mask, structure, scale, chunk_size()
    )


PATHS = {
    "reference": reference_attention,
    "chunked": _chunked,
    "fused": fused_attention,
}

_forced = {"path": None, "chunk_size": None}


@contextlib.contextmanager
def force(path, chunk_size=None):
    """Runs every attention call inside the context on `path`.

    Args:
        path: str. A name in `PATHS`, whatever the lengths or the device.
        chunk_size: int, optional. Query and key rows per block of the
            chunked path. Defaults to `CHUNK_SIZE`.
    """
    if path not in PATHS:
        raise ValueError(
            f"force: `path` must be one of {sorted(PATHS)}. "
            f"Received: path={path!r}"
        )
    previous = dict(_forced)
    _forced.update(path=path, chunk_size=chunk_size)
    try:
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
    if _forced["path"] is not None:
        return _forced["path"], {"automatic choice": "a path is forced"}
    if weights:
        reason = "the weights are requested; only the reference computes them"
        return "reference", {"fused": reason, "chunked": reason}
    if runtime.is_exporting():
        # PyTorch's ONNX exporters do not translate every option of its
        # kernel (grouped-query heads); the reference math exports.
        reason = "PyTorch is tracing or exporting the program"
        return "reference", {"fused": reason, "chunked": reason}
    if has_fused_kernel():
        return _choose_with_kernel(query, value, structure)
    refused = {
        "fused": f"no fused kernel on {backends.current().device_name()}"
    }
    query_length = runtime.static_dim(query.shape[1])
    key_length = runtime.static_dim(key.shape[1])
    if query_length is None or key_length is None:
        refused["chunked"] = "the query or key length is not known statically"
    elif query_length < CHUNKED_MIN_LENGTH:
        refused["chunked"] = (
            f"{query_length} queries: below {CHUNKED_MIN_LENGTH}, the whole "
            "(T, S) matrix fits in cache and is faster"
        )
    elif key_length < CHUNK_SIZE:
        refused["chunked"] = f"{key_length} keys: fewer than one block"
    else:
        return "chunked", refused
    return "reference", refused


def _choose_with_kernel(query, value, structure):
    reason = None if value is None else refusal(query, value)
    if structure is not None and structure_refusal(structure):
        reason = structure_refusal(structure)
    if reason is None:
        return "fused", {}
    return "reference", {
        "fused": reason,
        "chunked": "not used where a fused kernel exists (not measured faster)",
    }


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
    if return_weights:
        return _core.reference(query, key, value, mask, scale, structure)
    path = choose(query, key, value, structure=structure)[0]
    lengths = (query.shape[1], key.shape[1])
    if path == "chunked" and None in map(runtime.static_dim, lengths):
        path = "reference"  # a forced chunked path needs known lengths
    return PATHS[path](query, key, value, mask, structure, scale)
