"""A learned position embedding.

Shape legend: B batch, T sequence length, D model dim, L max length.
"""

import keras
from keras import ops

from keras_attention import _core
from keras_attention.layers import checks


@keras.saving.register_keras_serializable(package="keras_attention")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position to a sequence.

    $$x'_p = x_p + E_p, \\quad E \\in \\mathbb{R}^{L \\times D}$$

    The alternative to `PositionalEncoding` used by BERT and GPT-2: one
    trainable vector per position up to `max_length`.

    Args:
        max_length: The number of positions `L` that have a vector.
        initializer (str | keras.initializers.Initializer): Initializer of `E`.
            Defaults to `"glorot_uniform"`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        inputs (Tensor): Shape `(B, T, D)`.
        start_index (int | Tensor): The position of the first
            step, for incremental decoding. Defaults to `0`;
            `start_index + T` must not exceed `max_length` (a
            `ValueError` when the index is known; one that is traced,
            inside a compiled function, or on an accelerator is clipped to
            `max_length - T`).
        positions (Tensor | None): Shape `(B, T)`, integer. Explicit positions,
            instead of `start_index + t`.
        segment_ids (Tensor | None): Shape `(B, T)`, integer. Packed sequences:
            positions restart at 0 where each sequence starts
            (`functional.segment_positions`). Positions must be below
            `max_length`.

    Returns:
        Tensor: `inputs + E[start_index : start_index + T]`, shape
            `(B, T, D)`. The Keras mask of `inputs` is passed on.

    Examples:
        >>> import numpy as np
        >>> layer = PositionEmbedding(max_length=16)
        >>> tuple(layer(np.zeros((2, 5, 8), "float32")).shape)
        (2, 5, 8)

    References:
        Devlin et al., "BERT: Pre-training of Deep Bidirectional
        Transformers for Language Understanding", 2019.
    """

    def __init__(self, max_length: int, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if (
            not isinstance(max_length, int)
            or isinstance(max_length, bool)
            or max_length < 1
        ):
            raise ValueError(
                f"PositionEmbedding (layer '{self.name}'): `max_length` must "
                f"be a positive integer. Received: max_length={max_length!r}"
            )
        self.max_length = max_length
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                f"PositionEmbedding (layer '{self.name}'): `inputs` must be "
                "(B, T, D) with a known D. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_length, inputs_shape[-1]),
            initializer=self.initializer,
        )
        self.built = True

    def call(self, inputs, start_index=0, positions=None, segment_ids=None):
        where = f"PositionEmbedding (layer '{self.name}')"
        checks.check_built_dim(
            where, "inputs", inputs, self.embeddings.shape[-1]
        )
        checks.check_start_index(where, start_index)
        positions = checks.explicit_positions(
            where, inputs, positions, segment_ids, start_index
        )
        if positions is not None:
            highest = checks.static_int(ops.max(positions))
            if highest is not None and highest >= self.max_length:
                raise ValueError(
                    f"{where}: `positions` must be below `max_length` "
                    f"({self.max_length}). Received: max(positions)={highest}"
                )
            table = ops.convert_to_tensor(self.embeddings)
            vectors = ops.take(table, positions, axis=0)  # (B, T, D)
            return inputs + ops.cast(vectors, inputs.dtype)
        start_index = checks.check_index_range(
            where,
            "start_index",
            start_index,
            inputs.shape[1],
            self.max_length,
            "the table of `max_length`",
        )
        length = ops.shape(inputs)[1]
        table = ops.convert_to_tensor(self.embeddings)
        if (
            checks.static_dim(inputs.shape[1]) is None
            or checks.static_int(start_index) is None
        ):
            # Slicing at a traced start or to a symbolic length (export)
            # compares them with the table's length: gather the rows.
            rows = start_index + _core.steps(length)  # (T,)
            positions = ops.take(table, rows, axis=0)  # (T, D)
        else:
            positions = ops.slice(
                table, (start_index, 0), (length, inputs.shape[-1])
            )  # (T, D)
        return inputs + ops.cast(positions, inputs.dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_length": self.max_length,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
