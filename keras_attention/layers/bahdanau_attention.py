"""Bahdanau (additive) attention.

Shape legend: B batch, T query (decoder) steps, S source length,
Dq query dim, Dk key dim, Dv value dim, U units.
"""

import math

import keras
from keras import ops

from keras_attention import functional
from keras_attention.layers import checks
from keras_attention.layers.attention_mechanism import AttentionMechanism
from keras_attention.layers.sublayers import built_projection
from keras_attention.layers.sublayers import call_leaf
from keras_attention.layers.sublayers import fresh


@keras.saving.register_keras_serializable(package="keras_attention")
class BahdanauAttention(AttentionMechanism):
    """Additive attention of Bahdanau, Cho and Bengio.

    Decoder state $s$ and encoder states $h_j$ are projected into a shared
    space of `units` dims, added, squashed and reduced to a scalar score
    (Bahdanau et al. 2015):

    $$e_j = v_a^\\top \\tanh(W_a s + U_a h_j)$$

    followed by the masked softmax and the weighted average of the values
    of `AttentionMechanism`. $U_a h_j$ does not depend on the query, so
    `project_keys` computes it once per source sequence.

    With `normalize=True`, $v_a$ is weight-normalised and a bias is added
    inside the $\\tanh$ (Salimans and Kingma, 2016; as in
    tensorflow-addons):

    $$e_j = g \\frac{v_a^\\top}{\\lVert v_a \\rVert}
    \\tanh(W_a s + U_a h_j + b)$$

    `Model.quantize("int8")` quantizes the projections $W_a$
    (`query_dense`) and $U_a$ (`key_dense`); $v_a$, $g$ and $b$ are raw
    weights, not quantizable, and stay in the variable dtype.

    Args:
        units: Size U of the shared projection space.
        normalize: Use the weight-normalised form. Defaults to
            `False`.
        dropout: Dropout rate on the attention weights during
            training. Defaults to `0.0`.
        kernel_initializer (str | keras.initializers.Initializer): Initializer
            of $W_a$, $U_a$ and $v_a$. Defaults to `"glorot_uniform"`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        query (Tensor): Shape `(B, Dq)` (one decoder step, the state
            $s_{t-1}$ in Bahdanau's flow) or `(B, T, Dq)`.
        value (Tensor): Shape `(B, S, Dv)`, the encoder states.
        key (Tensor): Shape `(B, S, Dk)`. Defaults to `value`.
        value_mask (Tensor): Shape `(B, S)`, boolean, `True` for real source
            tokens. Defaults to the Keras mask of `value`.
        key_mask (Tensor): Shape `(B, S)`, boolean. Defaults to the Keras
            mask of `key`; a key is hidden where either mask is false.
        return_attention_scores (bool): Also return the weights.
        training (bool): Whether dropout is active.

    Returns:
        Tensor | tuple[Tensor, Tensor]: The context `(B, Dv)` or
            `(B, T, Dv)`, and with `return_attention_scores=True` also the
            weights `(B, S)` or `(B, T, S)`.

    Examples:
        >>> import numpy as np
        >>> layer = BahdanauAttention(units=8)
        >>> state = np.ones((2, 16), "float32")         # s_{t-1}: (B, Dq)
        >>> encoder = np.ones((2, 5, 32), "float32")    # h: (B, S, Dv)
        >>> context, weights = layer(
        ...     state, encoder, return_attention_scores=True
        ... )
        >>> tuple(context.shape), tuple(weights.shape)
        ((2, 32), (2, 5))

    References:
        Bahdanau, Cho and Bengio, "Neural Machine Translation by Jointly
        Learning to Align and Translate", ICLR 2015.
    """

    def __init__(
        self,
        units: int,
        normalize: bool = False,
        dropout: float = 0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(
            dropout=dropout, kernel_initializer=kernel_initializer, **kwargs
        )
        checks.check_positive_int(self._where(), "units", units)
        self.units = int(units)
        checks.check_flag(self._where(), "normalize", normalize)
        self.normalize = normalize

    def get_config(self):
        config = super().get_config()
        config.update({"units": self.units, "normalize": self.normalize})
        return config

    def project_keys(self, key):
        return call_leaf(self.key_dense, key)  # (B, S, U)

    def _build_score(self, query_dim, key_dim):
        self.query_dense = built_projection(
            self, "query_dense", self.units, query_dim
        )
        self.key_dense = built_projection(
            self, "key_dense", self.units, key_dim
        )
        self.score_kernel = self.add_weight(
            name="score_kernel",
            shape=(self.units,),
            initializer=fresh(self.kernel_initializer),
        )
        if self.normalize:
            self.score_gain = self.add_weight(
                name="score_gain",
                shape=(),
                initializer=keras.initializers.Constant(
                    math.sqrt(1.0 / self.units)
                ),
            )
            self.score_bias = self.add_weight(
                name="score_bias", shape=(self.units,), initializer="zeros"
            )

    def _score(self, query, projected_keys):
        kernel = ops.cast(self.score_kernel, self.compute_dtype)
        bias = None
        if self.normalize:
            norm = ops.sqrt(ops.sum(ops.square(self.score_kernel)))
            kernel = ops.cast(
                self.score_gain * self.score_kernel / norm, self.compute_dtype
            )
            bias = ops.cast(self.score_bias, self.compute_dtype)
        return functional.additive_score(
            self._project_query(query), projected_keys, kernel, bias
        )  # (B, T, S)
