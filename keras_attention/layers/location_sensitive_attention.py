"""Location-sensitive attention (Chorowski et al. 2015; Tacotron 2).

Shape legend: B batch, T query (decoder) steps, S source length,
Dq query dim, Dk key dim, Dv value dim, U units, F location filters,
C location channels (1 or 2).
"""

import keras
from keras import ops

from keras_attention import functional
from keras_attention.layers import checks
from keras_attention.layers.attention_mechanism import AttentionMechanism
from keras_attention.layers.sublayers import built_projection
from keras_attention.layers.sublayers import call_dense
from keras_attention.layers.sublayers import call_leaf
from keras_attention.layers.sublayers import fresh


@keras.saving.register_keras_serializable(package="keras_attention")
class LocationSensitiveAttention(AttentionMechanism):
    """Additive attention that also sees where it looked before.

    Content-only attention scores every encoder state $h_j$ by what it
    holds, so on long or repetitive inputs it can skip, repeat or lose its
    place. Location-sensitive attention (Chorowski et al. 2015) adds to the
    additive score features $f_j$ of the previous alignment, convolved
    along the source:

    $$f = F * \\alpha_{t-1}, \\quad e_{t,j} = v^\\top \\tanh(W s_t + V h_j
    + U f_j + b)$$

    With `cumulative=True` the convolution reads two channels, the previous
    alignment and the sum of all previous alignments, as in Tacotron 2
    (Shen et al. 2018), which keeps the attention from returning to what
    it has already read. The weights are the masked softmax of $e$; with
    `smoothing=True` they are $\\sigma(e_j) / \\sum_k \\sigma(e_k)$ instead,
    which lets several positions be selected at once (Chorowski et al.
    2015). The alignments start at zero.

    `Model.quantize("int8")` quantizes the $W$, $V$ and $U$ projections;
    the convolution kernel $F$, $v$ and $b$ are raw weights, not
    quantizable, and stay in the variable dtype.

    Args:
        units: Size U of the shared projection space.
        filters: Number F of location filters. Defaults to `32`.
        kernel_size: Width of the location filters along the source.
            Defaults to `31`.
        cumulative: Also convolve the cumulative alignment. Defaults to
            `True`.
        smoothing: Normalise with sigmoids instead of the softmax.
            Defaults to `False`.
        dropout: Dropout rate on the attention weights during training.
            Defaults to `0.0`.
        kernel_initializer (str | keras.initializers.Initializer): Initializer
            of the projection and convolution kernels. Defaults to
            `"glorot_uniform"`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        query (Tensor): Shape `(B, Dq)` (one decoder step) or `(B, T, Dq)`
            (T steps in order, each reading the alignment of the one before).
        value (Tensor): Shape `(B, S, Dv)`, the encoder states.
        key (Tensor): Shape `(B, S, Dk)`. Defaults to `value`.
        value_mask (Tensor): Shape `(B, S)`, boolean, `True` for real source
            tokens. Defaults to the Keras mask of `value`.
        key_mask (Tensor): Shape `(B, S)`, boolean. Defaults to the Keras
            mask of `key`; a key is hidden where either mask is false.
        return_attention_scores (bool): Also return the weights.
        training (bool): Whether dropout is active.
        attention_state (dict | None): `{"alignment": (B, S)}` and, with
            `cumulative=True`, `"cumulative": (B, S)`: the alignments before
            the first query. Defaults to zeros.

    Returns:
        Tensor | tuple[Tensor, Tensor]: The context `(B, Dv)` or
            `(B, T, Dv)`, and with `return_attention_scores=True` also the
            weights `(B, S)` or `(B, T, S)`.

    Examples:
        >>> import numpy as np
        >>> layer = LocationSensitiveAttention(units=8, kernel_size=5)
        >>> states = np.ones((2, 3, 16), "float32")     # s_1..s_3: (B, T, Dq)
        >>> encoder = np.ones((2, 5, 32), "float32")    # h: (B, S, Dv)
        >>> context, weights = layer(
        ...     states, encoder, return_attention_scores=True
        ... )
        >>> tuple(context.shape), tuple(weights.shape)
        ((2, 3, 32), (2, 3, 5))

    References:
        Chorowski, Bahdanau, Serdyuk, Cho and Bengio, "Attention-Based
        Models for Speech Recognition", NeurIPS 2015. Shen et al., "Natural
        TTS Synthesis by Conditioning WaveNet on Mel Spectrogram
        Predictions", ICASSP 2018.
    """

    def __init__(
        self,
        units: int,
        filters: int = 32,
        kernel_size: int = 31,
        cumulative: bool = True,
        smoothing: bool = False,
        dropout: float = 0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(
            dropout=dropout, kernel_initializer=kernel_initializer, **kwargs
        )
        where = self._where()
        checks.check_positive_int(where, "units", units)
        checks.check_positive_int(where, "filters", filters)
        checks.check_positive_int(where, "kernel_size", kernel_size)
        checks.check_flag(where, "cumulative", cumulative)
        checks.check_flag(where, "smoothing", smoothing)
        self.units = units
        self.filters = filters
        self.kernel_size = kernel_size
        self.cumulative = bool(cumulative)
        self.smoothing = bool(smoothing)
        self.attention_state_names = (
            ("alignment", "cumulative") if self.cumulative else ("alignment",)
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "filters": self.filters,
                "kernel_size": self.kernel_size,
                "cumulative": self.cumulative,
                "smoothing": self.smoothing,
            }
        )
        return config

    def project_keys(self, key):
        return call_leaf(self.key_dense, key)  # (B, S, U)

    def get_initial_attention_state(self, value, value_mask=None):
        zeros = ops.zeros(ops.shape(value)[:2], dtype=self._state_dtype())
        return {name: zeros for name in self.attention_state_names}

    def next_attention_state(self, attention_state, weights):
        weights = ops.cast(weights, self._state_dtype())  # (B, S)
        state = {"alignment": weights}
        if self.cumulative:
            state["cumulative"] = ops.add(
                ops.cast(attention_state["cumulative"], weights.dtype), weights
            )
        return state

    def _build_score(self, query_dim, key_dim):
        channels = len(self.attention_state_names)
        self.query_dense = built_projection(
            self, "query_dense", self.units, query_dim
        )
        self.key_dense = built_projection(
            self, "key_dense", self.units, key_dim
        )
        # A weight, not a Conv1D: the convolution casts it to the compute
        # dtype itself, whatever autocast scope the layer is called in.
        self.location_kernel = self.add_weight(
            name="location_kernel",
            shape=(self.kernel_size, channels, self.filters),
            initializer=fresh(self.kernel_initializer),
        )
        self.location_dense = built_projection(
            self, "location_dense", self.units, self.filters
        )
        self.score_kernel = self.add_weight(
            name="score_kernel",
            shape=(self.units,),
            initializer=fresh(self.kernel_initializer),
        )
        self.score_bias = self.add_weight(
            name="score_bias", shape=(self.units,), initializer="zeros"
        )

    def _scores(self, query, projected_keys, attention_state, training, noise):
        location = ops.stack(
            [attention_state[name] for name in self.attention_state_names],
            axis=-1,
        )  # (B, S, C)
        location = ops.cast(location, self.compute_dtype)
        features = ops.conv(
            location,
            ops.cast(self.location_kernel, self.compute_dtype),
            padding="same",
        )  # (B, S, F)
        keys = projected_keys + call_dense(self.location_dense, features)
        return functional.additive_score(
            self._project_query(query),
            keys,  # (B, S, U)
            ops.cast(self.score_kernel, self.compute_dtype),
            ops.cast(self.score_bias, self.compute_dtype),
        )  # (B, T, S)

    def _normalize(self, scores, mask, attention_state, training):
        if not self.smoothing:
            return functional.masked_softmax(scores, mask)
        weights = ops.sigmoid(scores)  # (B, T, S)
        if mask is not None:
            weights = ops.where(mask, weights, ops.zeros_like(weights))
        total = ops.sum(weights, axis=-1, keepdims=True)  # (B, T, 1)
        # A row with every position masked sums to 0: keep its zeros.
        return weights / ops.where(total > 0, total, ops.ones_like(total))
