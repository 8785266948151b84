"""What every decoding loop shares: the step call and its checks, the
argument checks, the GNMT penalties, and padding of finished rows.

Shape legend: B batch, K beams, V vocabulary, L generated length, S source.
"""

import functools

import keras
import numpy as np
from keras import ops

from keras_attention._core.checks import positive_integer
from keras_attention._kernels import runtime


def without_gradients(decode):
    """Decoding never differentiates: on PyTorch, no autograd graph is
    recorded for its steps."""

    @functools.wraps(decode)
    def wrapper(*args, **kwargs):
        with runtime.without_gradients():
            return decode(*args, **kwargs)

    return wrapper


def call_step(name, step_fn, tokens, state, end_id):
    """`step_fn(tokens, state)` as `(logits, state, attention or None)`,
    with its results checked: logits `(rows, V)` for the `rows` tokens
    given, with `end_id` (if any) in the vocabulary."""
    result = step_fn(ops.convert_to_tensor(tokens, "int32"), state)
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise ValueError(
            f"{name}: `step_fn` must return (logits, state) or "
            f"(logits, state, attention). Received: {type(result).__name__} "
            f"of length {len(result) if isinstance(result, tuple) else 1}"
        )
    logits, state = result[0], result[1]
    rows = tokens.shape[0]
    if len(logits.shape) != 2 or logits.shape[0] not in (None, rows):
        given = f"{rows} rows it is given"
        if name == "beam_search":
            given = (
                f"B·K = {rows} rows of the tiled state; keep per-example "
                "tensors in `state`, not in the closure"
            )
        raise ValueError(
            f"{name}: `step_fn` must return logits (B, V) for the {given}. "
            f"Received: logits.shape={tuple(logits.shape)}"
        )
    vocabulary = logits.shape[1]
    if end_id is not None and vocabulary is not None and end_id >= vocabulary:
        raise ValueError(
            f"{name}: `end_id` must be a token of the vocabulary, below "
            f"V={vocabulary}. Received: end_id={end_id}"
        )
    return logits, state, result[2] if len(result) == 3 else None


def check_start_ids(name, start_ids) -> np.ndarray:
    """`start_ids` as int32 NumPy `(B,)`: a non-empty vector of ids."""
    ids = np.asarray(ops.convert_to_numpy(start_ids))
    if (
        ids.ndim != 1
        or ids.size == 0
        or not np.issubdtype(ids.dtype, np.integer)
        or np.any(ids < 0)
    ):
        raise ValueError(
            f"{name}: `start_ids` must be a non-empty (B,) vector of token "
            f"ids (non-negative integers). Received: start_ids of shape "
            f"{ids.shape} and dtype {ids.dtype}: {ids!r:.80}"
        )
    return ids.astype("int32")


def check_end_id(name, end_id) -> int | None:
    """`end_id` as a Python int (a non-negative integer, or a 0-d integer
    tensor), or `None`."""
    if end_id is None:
        return None
    value = end_id
    if hasattr(value, "shape") and not isinstance(value, np.integer):
        value = np.asarray(ops.convert_to_numpy(value))
        value = value.item() if value.ndim == 0 else value
    if (
        not isinstance(value, (int, np.integer))
        or isinstance(value, (bool, np.bool_))
        or value < 0
    ):
        raise ValueError(
            f"{name}: `end_id` must be a token id (a non-negative integer) "
            f"or None. Received: end_id={end_id!r:.80}"
        )
    return int(value)


def is_shared(leaf) -> bool:
    """A state leaf without a batch axis (a Python number, a scalar tensor
    such as a cache position): shared by all rows, never tiled."""
    return not hasattr(leaf, "shape") or len(leaf.shape) == 0


def check_max_length(name, max_length) -> int:
    return positive_integer(name, "max_length", max_length)


def check_step_fn(name, step_fn):
    if not callable(step_fn):
        raise ValueError(
            f"{name}: `step_fn` must be a callable `step_fn(ids, state) -> "
            f"(logits, state)`. Received: step_fn={step_fn!r}"
        )


def check_seed(name, seed):
    """`seed` as a `keras.random.SeedGenerator`: made from `None` or an
    integer in `[0, 2**31)`, which every backend's seed state holds."""
    if isinstance(seed, keras.random.SeedGenerator):
        return seed
    if seed is not None and (
        not isinstance(seed, (int, np.integer))
        or isinstance(seed, (bool, np.bool_))
        or not 0 <= seed < 2**31
    ):
        raise ValueError(
            f"{name}: `seed` must be None, an integer in [0, 2**31) or a "
            f"keras.random.SeedGenerator. Received: seed={seed!r:.80}"
        )
    return keras.random.SeedGenerator(None if seed is None else int(seed))


def check_batch_major(name, state, batch):
    """Every state leaf with a leading axis has `batch` rows: tiling a
    table `(V, V)` along its first axis would silently change it."""
    for path, leaf in keras.tree.flatten_with_path(state):
        if is_shared(leaf) or leaf.shape[0] in (None, batch):
            continue
        where = "".join(f"[{key!r}]" for key in path)
        raise ValueError(
            f"{name}: every state leaf with a leading axis must have the "
            f"batch size B={batch} (it is tiled to B·K rows); keep shared "
            "tables in the step function's closure. Received: "
            f"{f'state leaf {where}' if where else 'state'} with shape "
            f"{tuple(leaf.shape)}"
        )


def length_penalty(lengths, alpha):
    """GNMT's `((5 + |Y|) / 6) ** alpha` of int `lengths`, float32; exactly
    1 for `alpha = 0`."""
    lengths = ops.cast(lengths, "float32")
    return ((5.0 + lengths) ** alpha) / (6.0**alpha)


def coverage_score(coverage):
    """`Σ_i log min(coverage_i, 1)` of `(..., S)` accumulated attention;
    positions that never received attention (padding) count as covered,
    as in tensorflow-addons, so they add `log 1 = 0`."""
    clipped = ops.minimum(ops.where(coverage > 0, coverage, 1.0), 1.0)
    return ops.sum(ops.log(clipped), axis=-1)


def pad(ids, max_length, end_id):
    """NumPy ids `(..., L')` padded to `(..., max_length)` with `end_id`
    (0 without one), as a loop that stopped early leaves them."""
    missing = max_length - ids.shape[-1]
    if missing <= 0:
        return ids
    fill = end_id if end_id is not None else 0
    padding = np.full((*ids.shape[:-1], missing), fill, ids.dtype)
    return np.concatenate([ids, padding], axis=-1)
