"""The angles of sinusoidal and rotary positions.

Shape legend: T positions, D feature size.
"""

from keras import ops

from keras_attention import _core


def position_angles(length, dim: int, start_index=0, max_wavelength=1e4):
    """The angles $p / m^{2i/D}$ of sinusoidal and rotary positions.

    Shared by `PositionalEncoding` (sines and cosines of the angles) and
    `RotaryEmbedding` (rotations by the angles). Computed in float32.

    Args:
        length (int | Tensor): T, the number of positions.
        dim: D, the feature size; there are `ceil(D / 2)` angles.
        start_index (int | Tensor): The first position. Defaults to
            `0`.
        max_wavelength (float): $m$. Defaults to `10000.0`.

    Returns:
        Tensor: Float32 angles `(T, ceil(D / 2))`; row $p$ holds
            $(\\text{start\\_index} + p) / m^{2i/D}$.

    Examples:
        >>> import keras
        >>> angles = position_angles(2, 4, start_index=1)
        >>> print(keras.ops.convert_to_numpy(angles).round(4))
        [[1.   0.01]
         [2.   0.02]]
    """
    positions = ops.cast(_core.steps(length), "float32") + ops.cast(
        start_index, "float32"
    )  # (T,)
    return _core.angles(positions, dim, max_wavelength)  # (T, ⌈D/2⌉)
