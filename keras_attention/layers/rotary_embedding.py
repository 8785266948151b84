"""Rotary position embedding (RoPE).

Shape legend: B batch, T sequence length, N heads, H head dim.
"""

import keras
from keras import ops

from keras_attention import _core
from keras_attention import functional
from keras_attention.layers import checks


@keras.saving.register_keras_serializable(package="keras_attention")
class RotaryEmbedding(keras.layers.Layer):
    """Rotates query/key features by angles proportional to the position.

    Feature $i$ of the first half and feature $i + H/2$ of the second half
    form a pair that is rotated at position $p$ by the angle
    $p\\,\\theta_i$, $\\theta_i = m^{-2i/H}$ ($m$ = `max_wavelength`):

    $$\\begin{pmatrix} x'_i \\\\ x'_{i+H/2} \\end{pmatrix} =
    \\begin{pmatrix} \\cos p\\theta_i & -\\sin p\\theta_i \\\\
    \\sin p\\theta_i & \\cos p\\theta_i \\end{pmatrix}
    \\begin{pmatrix} x_i \\\\ x_{i+H/2} \\end{pmatrix}$$

    Rotations compose, so the product of a rotated query at position $p$
    and a rotated key at position $r$ depends only on $p - r$: attention
    becomes relative. This is the half-split pairing of GPT-NeoX, LLaMA and
    keras-hub. Used by the attention layers with `use_rotary=True`.

    Args:
        max_wavelength: The longest wavelength $m$. Defaults to
            `10000.0`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        inputs (Tensor): Shape `(B, T, H)` or `(B, T, N, H)` with even `H`.
        start_index (int | Tensor): The position of the first
            step, for incremental decoding. Defaults to `0`.
        positions (Tensor | None): Shape `(B, T)`, integer. Explicit positions,
            instead of `start_index + t`.
        segment_ids (Tensor | None): Shape `(B, T)`, integer. Packed sequences:
            positions restart at 0 where each sequence starts
            (`functional.segment_positions`).

    Returns:
        Tensor: The rotated tensor, same shape and dtype.

    Examples:
        >>> import numpy as np
        >>> rope = RotaryEmbedding()
        >>> q = np.random.rand(1, 6, 2, 8).astype("float32")
        >>> tuple(rope(q, start_index=3).shape)
        (1, 6, 2, 8)

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position
        Embedding", 2021.
    """

    def __init__(self, max_wavelength: float = 10000.0, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = checks.check_wavelength(
            f"RotaryEmbedding (layer '{self.name}')", max_wavelength
        )
        self.supports_masking = True

    def build(self, inputs_shape):
        dim = inputs_shape[-1]
        if len(inputs_shape) not in (3, 4) or dim is None or dim % 2:
            raise ValueError(
                f"RotaryEmbedding (layer '{self.name}'): `inputs` must be "
                "(B, T, H) or (B, T, N, H) with a known, even H. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        self.built = True

    def call(self, inputs, start_index=0, positions=None, segment_ids=None):
        where = f"RotaryEmbedding (layer '{self.name}')"
        checks.check_start_index(where, start_index)
        positions = checks.explicit_positions(
            where, inputs, positions, segment_ids, start_index
        )
        length, dim = ops.shape(inputs)[1], inputs.shape[-1]
        if positions is None:
            angles = functional.position_angles(
                length, dim, start_index, self.max_wavelength
            )  # (T, H/2)
        else:
            angles = _core.angles(
                positions, dim, self.max_wavelength
            )  # (B, T, H/2)
        angles = ops.concatenate([angles, angles], axis=-1)  # (B|, T, H)
        if len(inputs.shape) == 4:
            angles = ops.expand_dims(angles, -2)  # (B|, T, 1, H)
        cos = ops.cast(ops.cos(angles), inputs.dtype)
        sin = ops.cast(ops.sin(angles), inputs.dtype)
        first, second = ops.split(inputs, 2, axis=-1)
        rotated_half = ops.concatenate([-second, first], axis=-1)
        return inputs * cos + rotated_half * sin

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config["max_wavelength"] = self.max_wavelength
        return config
