"""Checks of attention inputs, written once: shapes, masks, host data.

Every check raises a `ValueError` that names the caller (`where`), the
argument and what was received.
"""

import sys

import keras
import numpy as np
from keras import ops


def static_dim(dim):
    """A dimension's size if it is a number now, else `None`.

    A dimension is unknown (`None`) in a Keras symbolic shape, symbolic
    under export (a JAX `jax.export` dimension expression, a PyTorch
    `SymInt` or a traced size): comparing those with numbers either
    fails or bakes one size into the exported program.
    """
    if isinstance(dim, (bool, np.bool_)):
        return None
    if isinstance(dim, (int, np.integer)):
        return int(dim)
    return None


def same_size(a, b) -> bool:
    """Whether two sizes are known to be equal: as numbers, or as one
    traced size (a graph's batch, whose `==` has no truth value)."""
    if a is b:
        return a is not None
    known = static_dim(a)
    return known is not None and known == static_dim(b)


def is_tensor(x) -> bool:
    """A backend tensor or a `keras.KerasTensor` (not host data)."""
    return isinstance(x, keras.KerasTensor) or ops.is_tensor(x)


def host_integers(where, name, value):
    """Checks host data (a list, a NumPy array or number) given as integer
    ids or positions, and returns it as a NumPy array.

    What is not a numeric array (a string, `None`, a ragged list) is
    refused here rather than by the backend's conversion. Float and bool
    arrays pass: the caller names their dtype with the expected shape.
    JAX holds integers in 32 bits unless 64-bit types are enabled: values
    beyond that range would wrap into others, so they are refused there.

    Raises:
        ValueError: naming `where`, `name` and what was received.
    """
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):  # a ragged list
        array = np.asarray(None)
    if array.dtype.kind not in "biuf":
        raise ValueError(
            f"{where}: `{name}` must be an integer tensor or array. "
            f"Received: {name} of type {type(value).__name__}"
            + ("" if array.dtype.kind == "O" else f", dtype={array.dtype}")
        )
    if array.dtype.kind not in "iu" or array.size == 0:
        return array
    info = np.iinfo("int32")
    if (
        keras.backend.backend() == "jax"
        and (array.max() > info.max or array.min() < info.min)
        and not _jax_x64()
    ):
        raise ValueError(
            f"{where}: `{name}` must fit in int32 on JAX (64-bit types "
            f"are disabled). Received: {name} from {array.min()} to "
            f"{array.max()}"
        )
    return array


def _jax_x64() -> bool:
    """Whether JAX holds 64-bit integers. JAX is loaded when it is Keras's
    backend; the core reads its flag without importing a backend."""
    return bool(sys.modules["jax"].config.jax_enable_x64)


def check_flag(where: str, name: str, value):
    """A Python (or NumPy) bool: a string or `None` would be read as
    truth, a silent wrong answer."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(
            f"{where}: `{name}` must be True or False. "
            f"Received: {name}={value!r}"
        )


def real_number(value) -> bool:
    """Whether `value` is a Python or NumPy real number (not a bool)."""
    return isinstance(
        value, (int, float, np.integer, np.floating)
    ) and not isinstance(value, (bool, np.bool_))


def finite_number(where: str, name: str, value) -> float:
    """`value` as a float: a Python or NumPy real number or a concrete 0-d
    tensor holding one, not NaN or infinite."""
    if getattr(value, "shape", None) == () and not isinstance(
        value, (np.generic, keras.KerasTensor)
    ):
        value = ops.convert_to_numpy(value)[()]  # a 0-d array or tensor
    if not real_number(value) or not np.isfinite(value):
        raise ValueError(
            f"{where}: `{name}` must be a finite number. "
            f"Received: {name}={value!r}"
        )
    return float(value)


def positive_integer(
    where: str, name: str, value, is_position: bool = False
) -> int:
    """`value` as an int: a Python or NumPy integer of at least 1 (and,
    `is_position`, below 2**31: compared with int32 positions)."""
    if (
        not isinstance(value, (int, np.integer))
        or isinstance(value, (bool, np.bool_))
        or value < 1
        or (is_position and value >= 2**31)
    ):
        what = "a positive integer"
        if is_position:
            what += " below 2**31 (positions are int32)"
        raise ValueError(
            f"{where}: `{name}` must be {what}. Received: {name}={value!r}"
        )
    return int(value)


def check_length(where, name, length):
    """A length given as a number (to `structure_mask`) is an int >= 0;
    `None`, tensors and symbolic dims (lengths known when the call runs)
    pass."""
    if length is None or is_tensor(length):
        return
    if isinstance(length, np.ndarray) and length.ndim == 0:
        length = length.item()
    number = isinstance(length, (int, float, np.number, np.bool_, str))
    if not number and not isinstance(length, (bytes, list, tuple, dict)):
        return  # a symbolic dim (jax.export, torch.export)
    if (
        isinstance(length, (bool, np.bool_))
        or not isinstance(length, (int, np.integer))
        or length < 0
    ):
        raise ValueError(
            f"{where}: `{name}` must be a non-negative integer. "
            f"Received: {name}={length!r}"
        )


def check_inputs(where, query, key, value, mask):
    """Validates the ranks and dims of attention inputs and the mask;
    returns the mask as bool (or `None`)."""
    rank = len(query.shape)
    if rank not in (3, 4) or len(key.shape) != rank or len(value.shape) != rank:
        raise ValueError(
            f"{where}: `query`, `key` and `value` must all be 3-D (B, T, H) "
            "or all 4-D (B, T, N, H). Received: "
            f"query.shape={_shape(query)}, key.shape={_shape(key)}, "
            f"value.shape={_shape(value)}"
        )
    q, k, v = _shape(query), _shape(key), _shape(value)
    dtypes = [
        keras.backend.standardize_dtype(x.dtype) for x in (query, key, value)
    ]
    if any("float" not in dtype for dtype in dtypes):
        raise ValueError(
            f"{where}: `query`, `key` and `value` must be floating point. "
            f"Received: query.dtype={dtypes[0]}, key.dtype={dtypes[1]}, "
            f"value.dtype={dtypes[2]}"
        )
    if q[-1] == 0:
        raise ValueError(
            f"{where}: the query and key head dim H must be positive. "
            f"Received: query.shape={q}, key.shape={k}"
        )
    _check_dims_equal(where, "query", q, 0, "key", k, 0)
    _check_dims_equal(where, "query", q, 0, "value", v, 0)
    _check_dims_equal(where, "key", k, 1, "value", v, 1)
    _check_dims_equal(where, "query", q, -1, "key", k, -1)
    if rank == 4:
        _check_dims_equal(where, "key", k, 2, "value", v, 2)
        num_heads, num_kv_heads = query.shape[2], key.shape[2]
        if num_kv_heads and num_heads % num_kv_heads:
            raise ValueError(
                f"{where}: the number of query heads must be a multiple of "
                "the number of key/value heads. Received: "
                f"query.shape={q}, key.shape={k}"
            )
    if mask is None:
        return None
    return _check_mask(where, query, key, mask)


def _check_mask(where, query, key, mask):
    if not isinstance(mask, keras.KerasTensor):
        mask = ops.convert_to_tensor(mask)
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if dtype != "bool" and "int" not in dtype:
        raise ValueError(
            f"{where}: `mask` must be boolean (True = attend). "
            f"Received: mask.dtype={dtype}"
        )
    batch, query_length, key_length = (
        query.shape[0],
        query.shape[1],
        key.shape[1],
    )
    if len(query.shape) == 3 or len(mask.shape) == 3:
        target = (batch, query_length, key_length)
    else:
        target = (batch, query.shape[2], query_length, key_length)
    if not _broadcastable(mask.shape, target):
        raise ValueError(
            f"{where}: `mask` must broadcast to {_shape_str(target)}. "
            f"Received: mask.shape={_shape(mask)}, "
            f"query.shape={_shape(query)}, key.shape={_shape(key)}"
        )
    return ops.cast(mask, "bool")


def _check_dims_equal(where, name_a, shape_a, axis_a, name_b, shape_b, axis_b):
    dim_a, dim_b = shape_a[axis_a], shape_b[axis_b]
    if dim_a is not None and dim_b is not None and dim_a != dim_b:
        raise ValueError(
            f"{where}: `{name_a}` axis {axis_a} and `{name_b}` axis {axis_b} "
            f"must match. Received: {name_a}.shape={shape_a}, "
            f"{name_b}.shape={shape_b}"
        )


def _shape(tensor):
    return tuple(tensor.shape)


def _broadcastable(shape, target):
    if len(shape) > len(target) or len(shape) < 2:
        return False
    for dim, want in zip(reversed(shape), reversed(target), strict=False):
        if dim not in (1, None) and want is not None and dim != want:
            return False
    return True


def _shape_str(target):
    names = ("B", "T", "S") if len(target) == 3 else ("B", "N", "T", "S")
    dims = ", ".join(f"{n}={d}" for n, d in zip(names, target, strict=True))
    return f"({dims})"
