"""Programmable structure: how every path calls a mask mod or a score mod.

A mask mod `mask_mod(batch, head, q_idx, kv_idx) -> bool` says which
keys a query may see (`True` = attend); a score mod
`score_mod(score, batch, head, q_idx, kv_idx) -> score` rewrites the
scaled logits. Both are called with int32 index tensors that broadcast to
`(B, N, R, C)`: the whole `(B, N, T, S)` grid on the reference path, one
block of `R` query rows and `C` keys on the blockwise path (absolute
indices, so a mod cannot tell the difference).

How a mod's tensors are found for the blockwise path's backward pass
is `binding`.

Shape legend: B batch, N heads, T query length, S key length, R query
rows and C keys of a block.
"""

import functools
import inspect

import keras
import numpy as np
from keras import ops

from keras_attention._core.checks import static_dim
from keras_attention._core.positions import steps

# What each kind of mod is called with.
SIGNATURES = {
    "mask_mod": "mask_mod(batch, head, q_idx, kv_idx)",
    "score_mod": "score_mod(score, batch, head, q_idx, kv_idx)",
}


def check_mod(where, name, mod):
    """`mod` if it is callable (or `None`) and can take the arguments a
    `name` is called with, else a `ValueError` (so that a score mod
    given as a mask mod, or the reverse, is named as such)."""
    if mod is not None and not callable(mod):
        raise ValueError(
            f"{where}: `{name}` must be a callable, "
            f"`{name.replace('_mod', '')}(... q_idx, kv_idx)`, or None. "
            f"Received: {name}={mod!r}"
        )
    if mod is not None and not _takes(mod, SIGNATURES[name].count(",") + 1):
        raise ValueError(
            f"{where}: `{name}` is called as `{SIGNATURES[name]}`; this "
            f"callable cannot take those arguments. Received: {name}={mod!r}"
        )
    return mod


def _takes(fn, count):
    """Whether `fn` can be called with `count` positional arguments (true
    where its signature cannot be read, and for Keras layers, which take
    `*args`). This library's mods are read once per class."""
    if isinstance(fn, keras.Layer):
        return True
    if type(fn).__module__.startswith("keras_attention."):
        return _class_takes(type(fn), count)
    try:  # a wrapper's own signature, not the one it wraps
        signature = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return True
    return _parameters_take(signature.parameters.values(), count)


@functools.cache
def _class_takes(cls, count):
    """`_takes` for the instances of `cls` (its `__call__` less `self`)."""
    parameters = list(inspect.signature(cls.__call__).parameters.values())
    return _parameters_take(parameters[1:], count)


def _parameters_take(parameters, count):
    parameters = list(parameters)
    kinds = inspect.Parameter
    if any(p.kind is kinds.VAR_POSITIONAL for p in parameters):
        most = count
    else:
        most = sum(
            p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
            for p in parameters
        )
    least = sum(
        p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        and p.default is p.empty
        for p in parameters
    )
    keyword_only = any(
        p.kind is kinds.KEYWORD_ONLY and p.default is p.empty
        for p in parameters
    )
    return least <= count <= most and not keyword_only


def check_mod_sizes(
    where, mask_mod, batch, query_length, key_length, starts=(None, None)
):
    """Mask mods that hold data per batch row and position (document ids,
    prefix lengths) must hold it for a call of `batch` rows, `T =
    query_length` queries and `S = key_length` keys (ints, or `None` or
    tensors where unknown): else they would read another row's data, or
    past the end, which some backends clamp silently. Such a mod says so
    in a `check_sizes(where, batch, query_length, key_length, exact)`
    method.

    In a cached step, `starts` gives the sequence position of the first
    query and of the first key (`None`: the mods see indices). A mod then
    indexes data of the whole sequence, which must reach the last
    position the call reads, `start + length` (not checked where a start
    is traced); `exact` says which lengths are exact. A mod wrapped in
    `Positioned` and called with no starts gets the wrapper's."""
    sizes = [
        d if isinstance(d, int) else None
        for d in (batch, query_length, key_length)
    ]

    def reach(start, size):
        if start is None:
            return size
        if not isinstance(start, int) or size is None:
            return None  # traced: the positions are not known here
        return max(start + size, 1)  # positions before 0 read position 0

    def visit(mod, starts):
        if isinstance(mod, Positioned):
            if all(start is None for start in starts):
                starts = (_static(mod.query_start), _static(mod.key_start))
            visit(mod.mod, starts)
        elif isinstance(mod, Combined):
            for part in mod.mods:
                visit(part, starts)
        elif isinstance(mod, BlockTable):
            visit(mod.mask_mod, starts)
        elif hasattr(mod, "check_sizes"):
            lengths = [
                reach(start, size)
                for start, size in zip(starts, sizes[1:], strict=True)
            ]
            exact = tuple(start is None for start in starts)
            mod.check_sizes(where, sizes[0], *lengths, exact=exact)

    visit(mask_mod, tuple(_static(start) for start in starts))


def _static(start):
    """A start as an int where it is a Python or NumPy integer, `None`
    where it is `None`, else the (traced) value itself."""
    if isinstance(start, (int, np.integer)) and not isinstance(start, bool):
        return int(start)
    return start


def serialize_mod(mod):
    """`mod`'s config for a layer's `get_config`, or `None`.

    A mod that is a Keras layer (one that owns weights, such as
    `RelativePositionBias`) may be shared by several attention layers, as
    T5's layers share one bias table. Keras marks an object it serializes
    twice in one file as shared, but only in the copies it keeps of the
    second and later configs: the first, which a layer's `get_config`
    returns before Keras copies it, would lose the mark, and the loaded
    model would hold two tables where there was one (and fail to load the
    second). While Keras saves a file, the layer's config therefore
    always carries its identity; when the file is loaded, every config
    with that identity is the same layer again. Outside (`get_config`
    called directly, `keras.models.clone_model`) the config is plain, so
    that it round-trips; a clone holds a copy of the layer per layer.
    """
    from keras_attention._kernels import runtime  # imports this module

    if mod is None:
        return None
    config = keras.saving.serialize_keras_object(mod)
    if isinstance(mod, keras.layers.Layer) and runtime.sharing_objects():
        config["shared_object_id"] = id(mod)
    return config


def grid(batch, heads, rows, cols):
    """The index tensors `(batch (B, 1, 1, 1), head (1, N, 1, 1), q_idx
    (1, 1, R, 1), kv_idx (1, 1, 1, C))`, int32, for `rows` `(R,)` and
    `cols` `(C,)` (absolute query and key indices)."""
    # `steps` and indexing with None, not `arange` and a reshape to -1:
    # an exporter with symbolic sizes (jax2onnx) can neither infer a -1
    # from a dynamic batch nor relate an `arange` of it to the input.
    batch = ops.cast(steps(batch), "int32")[:, None, None, None]
    head = ops.cast(steps(heads), "int32")[None, :, None, None]
    q_idx = ops.cast(rows, "int32")[None, None, :, None]
    kv_idx = ops.cast(cols, "int32")[None, None, None, :]
    return batch, head, q_idx, kv_idx


def visible(where, mask_mod, indices):
    """`mask_mod(*indices)`, checked: a boolean tensor that broadcasts to
    the grid of `indices` (see `grid`)."""
    result = _call(where, "mask_mod", mask_mod, indices, indices)
    if isinstance(result, bool):
        result = ops.convert_to_tensor(result)
    expected = _grid_shape(indices)
    dtype = dtype_name(result)
    if dtype != "bool" or not _broadcasts(_shape(result), expected):
        raise ValueError(
            f"{where}: `mask_mod` must return booleans that broadcast to "
            "its index tensors' grid, (B, N, T, S) or a block of it (here "
            f"{expected}). Received: a result of shape {_shape(result)} "
            f"and dtype {dtype}"
        )
    while len(result.shape) < 4:  # the grid's rank: (B|1, N|1, T|1, S|1)
        result = ops.expand_dims(result, 0)
    return result


def modified(where, score_mod, scores, indices):
    """`score_mod(scores, *indices)`, checked: new logits of the scores'
    shape, in their dtype."""
    result = _call(where, "score_mod", score_mod, (scores, *indices), indices)
    shape, dtype = _shape(result), dtype_name(result)
    if "float" not in dtype or not _same(shape, _shape(scores)):
        raise ValueError(
            f"{where}: `score_mod` must return float logits of the scores' "
            f"shape {_shape(scores)}. Received: a result of shape {shape} "
            f"and dtype {dtype}"
        )
    return ops.cast(result, scores.dtype)


def _call(where, name, mod, args, indices):
    """`mod(*args)`. An error the mod raises that is not one of this
    library's (a backend's broadcasting error, say: a mod computed from a
    tensor of the whole grid fails on a block of it) becomes a
    `ValueError` that says what the mod was given."""
    try:
        return mod(*args)
    except Exception as error:  # a backend's own error type among them
        if not _relabelled(error):
            raise
        failure = error
    raise ValueError(
        f"{where}: `{name}` failed on index tensors that broadcast to "
        f"{_grid_shape(indices)}. A mod must compute elementwise from "
        "its index tensors: a path may call it on one block of the "
        "(B, N, T, S) grid at a time. Received: "
        f"{type(failure).__name__}: {failure}"
    ) from failure


def _relabelled(error):
    """Whether an error a mod raised gets the library's explanation: not
    the library's own (they name their argument), not memory running out
    (which code may catch to retry), not JAX refusing Python control flow
    on a traced value (its own message explains that)."""
    name, text = type(error).__name__, str(error)
    out_of_memory = (
        isinstance(error, MemoryError)
        or any(word in name for word in ("ResourceExhausted", "OutOfMemory"))
        or "RESOURCE_EXHAUSTED" in text
        or "out of memory" in text.lower()
    )
    traced = "Tracer" in name or "Concretization" in name
    own = isinstance(error, ValueError) and "Received:" in text
    return not (out_of_memory or traced or own)


class BlockTable:
    """A mask mod with its block map computed once (`mods.BlockMask`).

    Attributes:
        blocks: int32 tensor `(T'/C, S'/C)`: 0 empty, 1 partial, 2 full.
        block_size, query_length, key_length, batch_size, num_heads: int.
    """

    def sizes(self):
        """The grid and block size the map was made for: a call uses it
        on the same grid only (a map of fewer batch rows or heads could
        miss what a mod does in the others), in blocks of the same size."""
        return (
            self.batch_size,
            self.num_heads,
            self.query_length,
            self.key_length,
            self.block_size,
        )


def _grid_shape(indices):
    shapes = [_shape(x) for x in indices]
    return tuple(
        None if None in dims else max(dims)
        for dims in zip(*shapes, strict=True)
    )


def _shape(x):
    return tuple(static_dim(d) for d in getattr(x, "shape", ()))


def dtype_name(x):
    if not hasattr(x, "dtype"):
        return type(x).__name__  # not a tensor: `None`, a number
    return keras.backend.standardize_dtype(x.dtype)


def _broadcasts(shape, expected):
    if len(shape) > len(expected):
        return False
    tail = expected[len(expected) - len(shape) :]
    return all(
        a in (1, b) or a is None or b is None
        for a, b in zip(shape, tail, strict=True)
    )


def _same(shape, expected):
    return len(shape) == len(expected) and all(
        a == b or a is None or b is None
        for a, b in zip(shape, expected, strict=True)
    )


class Positioned:
    """A mod called with sequence positions instead of tensor indices:
    query `i` at position `query_start + i`, key `j` at `key_start + j`
    (a cached step; a rolling cache's empty slots, before position 0, are
    given position 0, and are hidden anyway)."""

    def __init__(self, mod, query_start, key_start):
        self.mod = mod
        self.query_start, self.key_start = query_start, key_start

    def __call__(self, *args):
        *rest, q_idx, kv_idx = args
        q_idx = q_idx + ops.cast(self.query_start, "int32")
        kv_idx = ops.maximum(kv_idx + ops.cast(self.key_start, "int32"), 0)
        return self.mod(*rest, q_idx, kv_idx)

    @property
    def offset(self):
        """The query position minus the key position of equal indices."""
        if isinstance(self.key_start, int) and self.key_start == 0:
            return self.query_start
        return self.query_start - self.key_start

    def rewrapped(self, mod):
        """`mod` at the same positions."""
        return Positioned(mod, self.query_start, self.key_start)


def positioned(mod, query_start=None, key_start=None):
    """`mod` at sequence positions (see `Positioned`); as it is when both
    starts are `None` or 0."""
    if mod is None or all(
        start is None or (isinstance(start, int) and start == 0)
        for start in (query_start, key_start)
    ):
        return mod
    # A start may be a traced tensor (a compiled decoding loop's index),
    # which has no truth value.
    return Positioned(
        mod,
        0 if query_start is None else query_start,
        0 if key_start is None else key_start,
    )


class Combined:
    """Mask mods of which every one (`conjunction`) or any one must allow
    a key (`mods.and_masks`, `mods.or_masks`)."""

    def __init__(self, mods, conjunction=True):
        self.mods, self.conjunction = list(mods), conjunction

    def __call__(self, batch, head, q_idx, kv_idx):
        combine = ops.logical_and if self.conjunction else ops.logical_or
        result = None
        for mod in self.mods:
            visible = mod(batch, head, q_idx, kv_idx)
            result = visible if result is None else combine(result, visible)
        return result


class Chained:
    """Score mods applied one after the other."""

    def __init__(self, mods):
        self.mods = list(mods)

    def __call__(self, score, *indices):
        for mod in self.mods:
            score = mod(score, *indices)
        return score


def chained(*mods):
    """The score mods that are not `None`, one after the other (or the
    only one, or `None`)."""
    mods = [m for m in mods if m is not None]
    if len(mods) <= 1:
        return mods[0] if mods else None
    return Chained(mods)


def as_mod(mod):
    """A Keras layer is called through its `call` (its inputs stay
    float32 under a mixed-precision policy); any other mod as it is."""
    if isinstance(mod, keras.Layer):
        return mod.call
    return mod
