"""What the mods of `keras_attention.mods` share: argument checks, and
computing in tensors when a mod is called by hand."""

import keras
import numpy as np
from keras import ops

from keras_attention._core import is_tensor
from keras_attention._core import static_dim
from keras_attention._kernels import static_array

PACKAGE = "keras_attention"


class Configured:
    """A mod made again from its config (`keras.saving`)."""

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def tensors(*xs):
    """A mod called by hand (on NumPy arrays or ints) computes in tensors,
    as it does on every path: its indices int32."""
    tensors = [ops.convert_to_tensor(x) for x in xs]
    return [
        ops.cast(x, "int32")
        if "int" in keras.backend.standardize_dtype(x.dtype)
        else x
        for x in tensors
    ]


def check_rows(where, name, x, batch):
    """`x` must have a row for every index in `batch`. The indices are
    absolute and may be a block of the batch's rows (a device under
    `ContextParallel` holds some of them), so they are checked where
    their values are known now; a call checks its whole batch before
    (`check_sizes`)."""
    rows = static_dim(x.shape[0])
    known = None if rows is None else static_array(batch)
    if known is None or not known.size:
        return
    highest = int(known.max())
    if highest >= rows:
        raise ValueError(
            f"{where}: `{name}` must have a row for each row of the batch; "
            f"the mod is called on batch row {highest}. Received: "
            f"{name}.shape={tuple(x.shape)}"
        )


def check_shape(where, what, name, shape, expected, axes):
    """`shape` must be `expected` where both are known: a `ValueError`
    naming the call (`where`), the mod (`what`) and its argument."""
    shape = tuple(static_dim(d) for d in shape)
    if any(
        a is not None and b is not None and a != b
        for a, b in zip(shape, expected, strict=True)
    ):
        wanted = tuple("?" if d is None else d for d in expected)
        raise ValueError(
            f"{where}: `mask_mod` {what} needs `{name}` of shape {axes} = "
            f"{wanted} for this call. Received: {name}.shape={shape}"
        )


def check_reach(where, what, name, shape, batch, reach):
    """`shape` `(B, L)` has the call's `batch` rows and, where both are
    known, `L >= reach`: a cached step reads positions up to `reach - 1`
    (past the end, some backends clamp silently)."""
    check_shape(where, what, name, shape, (batch, None), "(B, L)")
    length = static_dim(shape[1])
    if reach is not None and length is not None and length < reach:
        raise ValueError(
            f"{where}: `mask_mod` {what} reads `{name}` at the sequence "
            f"positions up to {reach - 1} in this cached call; it must "
            f"cover {reach} positions. Received: {name}.shape="
            f"{tuple(static_dim(d) for d in shape)}"
        )


def integers(where, name, x, rank):
    axes = "(B, T)" if rank == 2 else "(B,)"
    if not is_tensor(x):
        array = np.asarray(x)
        if array.dtype.kind not in "iu":
            raise ValueError(
                f"{where}: `{name}` must be integers of shape {axes}. "
                f"Received: {name}={x!r}"
            )
        x = ops.convert_to_tensor(array)
    dtype = keras.backend.standardize_dtype(x.dtype)
    if "int" not in dtype or len(x.shape) != rank:
        raise ValueError(
            f"{where}: `{name}` must be integers of shape {axes}. Received: "
            f"{name}.shape={tuple(x.shape)}, dtype={dtype}"
        )
    return x


def callables(where, mods):
    if not mods or not all(callable(m) for m in mods):
        raise ValueError(
            f"{where}: expects one or more mask mods (callables). Received: "
            f"{mods!r}"
        )
    return mods


def check_heads(where, name, num_heads, head):
    heads = static_dim(head.shape[1]) if len(head.shape) == 4 else None
    check_head_count(where, name, num_heads, heads)


def check_head_count(where, name, num_heads, heads):
    """That `heads` query heads (or `None`: unknown) can take a tensor
    made for `num_heads` heads (one head takes the first)."""
    if heads is not None and heads not in (1, num_heads):
        raise ValueError(
            f"{where}: `{name}` is for {num_heads} heads; the attention has "
            f"{heads}. Received: `{name}` for {num_heads} heads in an "
            f"attention of {heads} heads"
        )
