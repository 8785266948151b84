"""Every backend-specific path of the library, and the rule that picks one.

`functional.py` holds the attention math in `keras.ops`; this package holds
what looks at the backend:

* the paths of dot-product attention (`PATHS`), each a named function with
  the signature `path(query, key, value, mask, structure, scale,
  reference)`: `"reference"` (the math of `functional`, which returns the
  weights too), `"chunked"` (blocks of queries and keys with an online
  softmax and a hand-written backward pass: memory O(block^2), the
  blocks that causal or windowed structure leaves empty skipped) and
  `"fused"` (the backend's own kernel);
* `structure`: the structural arguments (`is_causal`, `sliding_window`,
  `segment_ids`) checked and normalised once, for every path to lower;
* `select`, the rule that picks a path, and `force`, which overrides it
  (tests run every path on every backend through it);
* the KV-cache write (`update_kv_cache`) and the pieces of running
  programs (`runtime`).

A path is chosen only where it is faster than the reference and gives the
reference's outputs and gradients: the fused kernel on PyTorch and on JAX
with a GPU; blockwise attention for long sequences where no fused kernel
runs (TensorFlow, JAX on CPU). Every path exists on every backend, so each can
be forced and checked everywhere.
"""

import contextlib
import functools

import keras

from keras_attention._kernels import fused
from keras_attention._kernels import runtime
from keras_attention._kernels import structure as structure
from keras_attention._kernels.cache import update_kv_cache as update_kv_cache
from keras_attention._kernels.chunked import chunked_attention
from keras_attention._kernels.fused import fused_attention
from keras_attention._kernels.runtime import scan_carries as scan_carries
from keras_attention._kernels.runtime import static_dim as static_dim
from keras_attention._kernels.runtime import static_int as static_int

CHUNK_SIZE = 256  # query and key rows per block of the chunked path
CHUNKED_MIN_LENGTH = 512  # shorter queries fit the cache whole


def reference_attention(query, key, value, mask, structure, scale, reference):
    """The reference math of `functional`, on the whole `(T, S)` matrix."""
    return reference(query, key, value, mask, scale, structure)


def _chunked(query, key, value, mask, structure, scale, reference):
    return chunked_attention(
        query,
        key,
        value,
        mask,
        structure,
        scale,
        reference,
        chunk_size=_forced["chunk_size"] or CHUNK_SIZE,
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


def choose(query, key, value=None, weights=False, structure=None):
    """`(path, refused)`: the path attention takes for inputs of these
    shapes and dtypes (`weights=True`: the weights are needed too), and
    for each faster path not taken, why."""
    if _forced["path"] is not None:
        return _forced["path"], {"automatic choice": "a path is forced"}
    if weights:
        reason = "the weights are requested; only the reference computes them"
        return "reference", {"fused": reason, "chunked": reason}
    refused = {}
    if runtime.is_exporting():
        # PyTorch's ONNX exporters do not translate every option of its
        # kernel (grouped-query heads); the reference math exports.
        reason = "PyTorch is tracing or exporting the program"
        return "reference", {"fused": reason, "chunked": reason}
    if _has_fused_kernel():
        reason = None if value is None else fused.refusal(query, value)
        if structure is not None and structure.soft_cap is not None:
            reason = "logit soft-capping: the kernel has no such option"
        if reason is None:
            return "fused", refused
        refused["fused"] = reason
        refused["chunked"] = (
            "not used where a fused kernel exists (not measured faster)"
        )
        return "reference", refused
    refused["fused"] = f"no fused kernel on {_device()}"
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


def _device():
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return f"JAX ({jax.default_backend().upper()})"
    return {"tensorflow": "TensorFlow", "numpy": "NumPy"}.get(backend, backend)


def attention(query, key, value, mask, structure, scale, reference):
    """Dot-product attention on the selected path.

    Args:
        query, key, value: `(B, T, H)`, `(B, S, H)`, `(B, S, V)` or
            `(B, T, N, H)`, `(B, S, K, H)`, `(B, S, K, V)`.
        mask: boolean tensor of the weights' rank (`(B|1, T|1, S)` or
            `(B|1, N|1, T|1, S)`) or `None`.
        structure: `structure.Structure`. Causal, windowed and segment
            structure, on top of `mask`.
        scale: float. Multiplies the logits.
        reference: the reference math, `reference(query, key, value, mask,
            scale, structure)`.

    Returns:
        The output, `(B, T, V)` or `(B, T, N, V)`.
    """
    path = choose(query, key, value, structure=structure)[0]
    lengths = (query.shape[1], key.shape[1])
    if path == "chunked" and None in map(runtime.static_dim, lengths):
        path = "reference"  # a forced chunked path needs known lengths
    return PATHS[path](query, key, value, mask, structure, scale, reference)


@functools.cache
def _has_fused_kernel() -> bool:
    backend = keras.backend.backend()
    if backend == "torch":
        return True
    if backend == "jax":
        import jax

        return jax.default_backend() == "gpu"
    return False
