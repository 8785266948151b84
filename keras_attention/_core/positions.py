"""The angles of sinusoidal and rotary positions, `p / m^(2i/D)`.

Shape legend: B batch, T positions, D feature size.
"""

from keras import ops


def angles(positions, dim, max_wavelength):
    """Float32 angles `(..., ⌈D/2⌉)` at `positions` `(...)` (any shape of
    integer or float positions): `p / m^(2i/D)` with `m = max_wavelength`.
    """
    positions = ops.cast(positions, "float32")
    exponents = ops.arange(0, dim, 2, dtype="float32") / dim  # (⌈D/2⌉,)
    inverse = ops.power(float(max_wavelength), -exponents)
    return ops.expand_dims(positions, -1) * inverse  # (..., ⌈D/2⌉)
