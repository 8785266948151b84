"""Luong (multiplicative) attention: dot, general and concat scores.

Shape legend: B batch, T query (decoder) steps, S source length,
Dq query dim, Dk key dim, Dv value dim, U units.
"""

import keras
from keras import ops

from keras_attention import functional
from keras_attention.layers import checks
from keras_attention.layers.attention_mechanism import AttentionMechanism
from keras_attention.layers.sublayers import built_projection
from keras_attention.layers.sublayers import call_leaf
from keras_attention.layers.sublayers import fresh

_SCORES = ("dot", "general", "concat")


@keras.saving.register_keras_serializable(package="keras_attention")
class LuongAttention(AttentionMechanism):
    """Multiplicative attention of Luong, Pham and Manning.

    Scores the current decoder state $s_t$ against each encoder state
    $h_j$ in one of three ways (Luong et al. 2015):

    $$e_j = \\begin{cases}
    s_t^\\top h_j & \\text{dot} \\\\
    s_t^\\top W_a h_j & \\text{general} \\\\
    v_a^\\top \\tanh(W_a [s_t; h_j]) & \\text{concat}
    \\end{cases}$$

    followed by the masked softmax and the weighted average of the values
    of `AttentionMechanism`. $W_a h_j$ (general) and the key half of
    $W_a [s_t; h_j]$ (concat) do not depend on the query, so
    `project_keys` computes them once per source sequence. With
    `scale=True` the score is multiplied by a learned scalar $g$
    (initialised to 1).

    Args:
        score: `"dot"` (needs `Dq == Dk`), `"general"` or `"concat"`.
            Defaults to `"general"`.
        units: Size U of the hidden layer of the `concat` score;
            required for `concat` and not accepted by the others. Defaults
            to `None`.
        scale: Learn a scalar gain on the scores. Defaults to
            `False`.
        dropout: Dropout rate on the attention weights during
            training. Defaults to `0.0`.
        kernel_initializer (str | keras.initializers.Initializer): Initializer
            of $W_a$ and $v_a$. Defaults to `"glorot_uniform"`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        query (Tensor): Shape `(B, Dq)` (one decoder step, the state $s_t$
            in Luong's flow) or `(B, T, Dq)`.
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
        >>> import keras
        >>> import numpy as np
        >>> layer = LuongAttention(score="dot")
        >>> state = np.array([[1.0, 0.0]], "float32")              # s_t
        >>> encoder = np.array([[[1.0, 0.0], [0.0, 1.0]]], "float32")
        >>> context, weights = layer(
        ...     state, encoder, return_attention_scores=True
        ... )
        >>> print(np.round(keras.ops.convert_to_numpy(weights), 4))
        [[0.7311 0.2689]]

        The general score, with key projections computed once per source
        and reused at every decoding step:

        >>> layer = LuongAttention(score="general")
        >>> encoder = np.random.rand(2, 7, 16).astype("float32")
        >>> layer.build(query_shape=(2, 16), value_shape=(2, 7, 16))
        >>> projected = layer.project_keys(encoder)            # (B, S, Dq)
        >>> for step in range(3):
        ...     state = np.random.rand(2, 16).astype("float32")
        ...     context = layer.attend(state, encoder, projected)
        >>> tuple(context.shape)
        (2, 16)

    References:
        Luong, Pham and Manning, "Effective Approaches to Attention-based
        Neural Machine Translation", EMNLP 2015.
    """

    def __init__(
        self,
        score: str = "general",
        units: int | None = None,
        scale: bool = False,
        dropout: float = 0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(
            dropout=dropout, kernel_initializer=kernel_initializer, **kwargs
        )
        if score not in _SCORES:
            raise ValueError(
                f"{self._where()}: `score` must be one of {_SCORES}. "
                f"Received: score={score!r}"
            )
        if score != "concat" and units is not None:
            raise ValueError(
                f"{self._where()}: `units` is only used by score='concat'. "
                f"Received: score={score!r}, units={units!r}"
            )
        if score == "concat" and not checks.positive_int(units):
            raise ValueError(
                f"{self._where()}: score='concat' needs `units`, a positive "
                f"integer. Received: units={units!r}"
            )
        units = None if units is None else int(units)
        checks.check_flag(self._where(), "scale", scale)
        self.score = score
        self.units = units
        self.scale = scale

    def get_config(self):
        config = super().get_config()
        config.update(
            {"score": self.score, "units": self.units, "scale": self.scale}
        )
        return config

    def project_keys(self, key):
        if self.score == "dot":
            return key  # (B, S, Dq)
        return call_leaf(
            self.key_dense, key
        )  # (B, S, Dq) general, (B, S, U) concat

    def _build_score(self, query_dim, key_dim):
        if self.score == "dot" and query_dim != key_dim:
            raise ValueError(
                f"{self._where()}: score='dot' needs queries and keys of "
                "the same feature dim. Received: "
                f"query.shape[-1]={query_dim}, key.shape[-1]={key_dim}"
            )
        if self.score != "dot":
            self.key_dense = built_projection(
                self, "key_dense", self.units or query_dim, key_dim
            )
        if self.score == "concat":
            self.query_dense = built_projection(
                self, "query_dense", self.units, query_dim
            )
            self.score_kernel = self.add_weight(
                name="score_kernel",
                shape=(self.units,),
                initializer=fresh(self.kernel_initializer),
            )
        if self.scale:
            self.score_gain = self.add_weight(
                name="score_gain", shape=(), initializer="ones"
            )

    def _score(self, query, projected_keys):
        if self.score == "concat":
            scores = functional.additive_score(
                self._project_query(query),
                projected_keys,
                ops.cast(self.score_kernel, self.compute_dtype),
            )  # (B, T, S)
        else:
            # Products of long vectors overflow in half precision.
            dtype = functional.logits_dtype(query.dtype)
            scores = ops.einsum(
                "btd,bsd->bts",
                ops.cast(query, dtype),
                ops.cast(projected_keys, dtype),
            )  # (B, T, S)
        if self.scale:
            scores = scores * ops.cast(self.score_gain, scores.dtype)
        return scores
