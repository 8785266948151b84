"""The angles of sinusoidal and rotary positions, `p / m^(2i/D)`.

Shape legend: B batch, T positions, D feature size.
"""

from keras import ops

from keras_attention._core.checks import is_tensor
from keras_attention._core.checks import static_dim


def steps(length):
    """The positions `0 .. length - 1`, `(T,)`, as `arange(0, length)`.

    A symbolic length (a dimension of `jax.export`, as in ONNX export from
    JAX) gives the cumulative sum of `length` ones instead: the same
    integers, but a tensor whose dimension exporters relate to the input
    it came from, where jax2onnx gives an `arange` of a symbolic length a
    dimension of its own, which then broadcasts against no other. Known
    lengths and dynamic lengths held in tensors (TensorFlow graphs) keep
    `arange`.
    """
    if static_dim(length) is not None or is_tensor(length):
        return ops.arange(0, length)
    return ops.cumsum(ops.ones((length,), "int32")) - 1  # (T,)


def angles(positions, dim, max_wavelength):
    """Float32 angles `(..., ⌈D/2⌉)` at `positions` `(...)` (any shape of
    integer or float positions): `p / m^(2i/D)` with `m = max_wavelength`.
    """
    positions = ops.cast(positions, "float32")
    exponents = ops.arange(0, dim, 2, dtype="float32") / dim  # (⌈D/2⌉,)
    inverse = ops.power(float(max_wavelength), -exponents)
    return ops.expand_dims(positions, -1) * inverse  # (..., ⌈D/2⌉)
