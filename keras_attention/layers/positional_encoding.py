"""The fixed sinusoidal positional encoding of the Transformer.

Shape legend: B batch, T sequence length, D model dim.
"""

import keras
from keras import ops

from keras_attention import _core
from keras_attention import functional
from keras_attention.layers import checks


@keras.saving.register_keras_serializable(package="keras_attention")
class PositionalEncoding(keras.layers.Layer):
    """Adds the sinusoidal positional encoding to a sequence.

    Self-attention is blind to order (Vaswani et al. 2017), so each
    position `p` gets a fixed vector added to its features, interleaving
    sines and cosines of geometrically spaced wavelengths:

    $$PE_{p, 2i} = \\sin\\left(\\frac{p}{m^{2i/D}}\\right), \\quad
    PE_{p, 2i+1} = \\cos\\left(\\frac{p}{m^{2i/D}}\\right)$$

    with `m = max_wavelength`. The encoding has no weights, works for any
    length and is computed in float32, then cast to the input's dtype.

    Args:
        max_wavelength: The longest wavelength `m`. Defaults to
            `10000.0`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        inputs (Tensor): Shape `(B, T, D)`.
        start_index (int | Tensor): The position of the first
            step, for incremental decoding. Defaults to `0`.
        positions (Tensor | None): Shape `(B, T)`, integer. Explicit positions,
            instead of `start_index + t`.
        segment_ids (Tensor | None): Shape `(B, T)`, integer. Packed sequences:
            positions restart at 0 where each sequence starts
            (`functional.segment_positions`).

    Returns:
        Tensor: `inputs + PE[start_index : start_index + T]`, shape
            `(B, T, D)`. The Keras mask of `inputs` is passed on.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> encoded = PositionalEncoding()(np.zeros((1, 2, 4), "float32"))
        >>> print(np.round(keras.ops.convert_to_numpy(encoded)[0], 4))
        [[0.     1.     0.     1.    ]
         [0.8415 0.5403 0.01   1.    ]]

    References:
        Vaswani et al., "Attention Is All You Need", 2017, section 3.5.
    """

    def __init__(self, max_wavelength: float = 10000.0, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = checks.check_wavelength(
            f"PositionalEncoding (layer '{self.name}')", max_wavelength
        )
        self.supports_masking = True

    def build(self, inputs_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                f"PositionalEncoding (layer '{self.name}'): `inputs` must be "
                "(B, T, D) with a known D. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        self.built = True

    def call(self, inputs, start_index=0, positions=None, segment_ids=None):
        where = f"PositionalEncoding (layer '{self.name}')"
        checks.check_start_index(where, start_index)
        positions = checks.explicit_positions(
            where, inputs, positions, segment_ids, start_index
        )
        length, dim = ops.shape(inputs)[1], inputs.shape[-1]
        if positions is None:
            angles = functional.position_angles(
                length, dim, start_index, self.max_wavelength
            )[None]  # (1, T, ⌈D/2⌉)
        else:
            angles = _core.angles(
                positions, dim, self.max_wavelength
            )  # (B, T, ⌈D/2⌉)
        encoding = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)
        encoding = ops.reshape(encoding, (-1, length, 2 * angles.shape[-1]))
        encoding = encoding[:, :, :dim]  # (B|1, T, D)
        return inputs + ops.cast(encoding, inputs.dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config["max_wavelength"] = self.max_wavelength
        return config
