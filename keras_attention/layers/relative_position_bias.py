"""T5's relative position bias, as a layer that owns its table.

Shape legend: B batch, N heads, T query length, S key length.
"""

import keras

from keras_attention import mods
from keras_attention._core.builtins import RelativeBias
from keras_attention._core.checks import check_flag
from keras_attention.mods import scores
from keras_attention.mods._common import check_head_count
from keras_attention.mods._common import check_heads


@keras.saving.register_keras_serializable(package="keras_attention")
class RelativePositionBias(keras.layers.Layer, RelativeBias):
    """T5's learned relative position bias (Raffel et al. 2020), a score
    mod with a trainable table.

    $$s'_{b,n,i,j} = s_{b,n,i,j} + W_{\\operatorname{bucket}(j - i),\\, n}$$

    The bucket of each relative position $j - i$ is T5's
    (`keras_attention.mods.relative_position_bucket`): exact for short
    distances, logarithmic up to `max_distance`. Give the layer to an
    attention layer or block as its `score_mod`: it is built there with
    one column of the table per head, trained with it and saved with it.

    Args:
        num_buckets (int): Buckets of relative positions. Defaults to `32`.
        max_distance (int): Distances from here on share the last bucket.
            Defaults to `128`.
        bidirectional (bool): Separate buckets for keys after the query (an
            encoder); a decoder uses `False`. Defaults to `True`.
        embeddings_initializer (str | keras.initializers.Initializer): Of
            the table `(num_buckets, N)`. Defaults to `"zeros"` (attention
            starts without a bias).
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`,
            `dtype`, ...).

    Other Parameters: Call arguments:
        score (Tensor): The logits `(B, N, T, S)` or any block of them.
        batch, head, q_idx, kv_idx (Tensor): int32 indices that broadcast
            to the logits' shape (see `keras_attention.mods`).

    Returns:
        Tensor: The logits with the bias added.

    Examples:
        >>> import numpy as np
        >>> from keras_attention import MultiHeadSelfAttention
        >>> layer = MultiHeadSelfAttention(
        ...     num_heads=2, score_mod=RelativePositionBias(num_buckets=8))
        >>> out = layer(np.random.rand(1, 5, 16).astype("float32"))
        >>> tuple(layer.score_mod.table.shape)
        (8, 2)

    References:
        Raffel et al., "Exploring the Limits of Transfer Learning with a
        Unified Text-to-Text Transformer", 2020.
    """

    def __init__(
        self,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        embeddings_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        where = self._where()
        for name, value in (
            ("num_buckets", num_buckets),
            ("max_distance", max_distance),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < 2
            ):
                raise ValueError(
                    f"{where}: `{name}` must be an int of at least 2. "
                    f"Received: {name}={value!r}"
                )
        check_flag(where, "bidirectional", bidirectional)
        bidirectional = bool(bidirectional)
        scores.check_buckets(where, num_buckets, max_distance, bidirectional)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer
        )

    def build(self, score_shape):
        self.table = self.add_weight(
            name="table",
            shape=(self.num_buckets, score_shape[1]),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def call(self, score, batch, head, q_idx, kv_idx):
        if hasattr(head, "shape"):  # the mod checks it again, unnamed
            check_heads(self._where(), "table", self.table.shape[1], head)
        return self._mod()(score, batch, head, q_idx, kv_idx)

    def distance_bias(self, num_heads, distance):
        heads = self.table.shape[1]
        check_head_count(self._where(), "table", heads, num_heads)
        return self._mod().distance_bias(num_heads, distance)

    def _where(self):
        return f"RelativePositionBias (layer '{self.name}')"

    def _mod(self):
        return mods.relative_position_bias(
            self.table, self.num_buckets, self.max_distance, self.bidirectional
        )

    def compute_output_shape(self, score_shape, *index_shapes):
        return tuple(score_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_buckets": self.num_buckets,
                "max_distance": self.max_distance,
                "bidirectional": self.bidirectional,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
