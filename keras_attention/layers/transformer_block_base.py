"""What the Transformer encoder and decoder blocks share: arguments,
residual sublayers with LayerNorm, and the position-wise feed-forward net.

Shape legend: B batch, T sequence length, D model dim, F intermediate dim.
"""

import keras

from keras_attention._core import Structure
from keras_attention._core.checks import real_number
from keras_attention._core.mods import check_mod
from keras_attention._core.mods import serialize_mod
from keras_attention.layers import checks
from keras_attention.layers import sublayers
from keras_attention.layers.multi_head_self_attention import (
    MultiHeadSelfAttention,
)
from keras_attention.layers.sublayers import LoraMixin
from keras_attention.layers.sublayers import call_leaf
from keras_attention.layers.sublayers import fresh
from keras_attention.layers.sublayers import policy_for


class TransformerBlockBase(LoraMixin, keras.layers.Layer):
    """Residual sublayers `x + Dropout(f(x))` with post- or pre-LayerNorm.

    Post-LN (the original Transformer): `LN(x + Dropout(f(x)))`. Pre-LN
    (`normalize_first=True`): `x + Dropout(f(LN(x)))`. The feed-forward
    net is `W_2 act(W_1 x + b_1) + b_2` (without the biases when
    `use_bias=False`); `use_rms_norm` puts RMSNorm where LN is.
    """

    _default_lora_targets = ("query_dense", "value_dense")

    def __init__(
        self,
        num_heads: int,
        intermediate_dim: int,
        key_dim: int | None = None,
        dropout: float = 0.0,
        activation="relu",
        layer_norm_epsilon: float = 1e-5,
        normalize_first: bool = False,
        num_key_value_heads: int | None = None,
        use_rotary: bool = False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        sliding_window: int | tuple[int, int] | None = None,
        alibi: bool = False,
        logit_soft_cap: float | None = None,
        use_qk_norm: bool = False,
        score_mod=None,
        use_bias: bool = True,
        use_rms_norm: bool = False,
        max_wavelength: float = 10000.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        where = self._where()
        if isinstance(score_mod, dict):  # from a config
            score_mod = keras.saving.deserialize_keras_object(score_mod)
        self.score_mod = check_mod(where, "score_mod", score_mod)
        if isinstance(sliding_window, list):  # from a JSON config
            sliding_window = tuple(sliding_window)
        checks.check_positive_int(where, "intermediate_dim", intermediate_dim)
        checks.check_flag(where, "use_rms_norm", use_rms_norm)
        checks.check_flag(where, "normalize_first", normalize_first)
        # The self-attention's arguments, checked here: it is made in
        # `build`, but bad arguments fail at construction.
        checks.check_head_arguments(
            where,
            num_heads,
            key_dim=key_dim,
            num_key_value_heads=num_key_value_heads,
            dropout=dropout,
            use_qk_norm=use_qk_norm,
            sliding_window=sliding_window,
            alibi=alibi,
            logit_soft_cap=logit_soft_cap,
            use_bias=use_bias,
            use_rotary=use_rotary,
        )
        if not (real_number(layer_norm_epsilon) and layer_norm_epsilon > 0):
            raise ValueError(
                f"{where}: `layer_norm_epsilon` must be positive. "
                f"Received: layer_norm_epsilon={layer_norm_epsilon}"
            )
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.key_dim = key_dim
        self.dropout = dropout
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.normalize_first = normalize_first
        self.num_key_value_heads = num_key_value_heads
        self.use_rotary = use_rotary
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.sliding_window = sliding_window
        self.alibi = alibi
        self.logit_soft_cap = logit_soft_cap
        self.use_qk_norm = use_qk_norm
        self.use_bias = bool(use_bias)
        self.use_rms_norm = bool(use_rms_norm)
        self.max_wavelength = checks.check_wavelength(where, max_wavelength)
        self.supports_masking = True

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "key_dim": self.key_dim,
                "dropout": self.dropout,
                "activation": keras.activations.serialize(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "normalize_first": self.normalize_first,
                "num_key_value_heads": self.num_key_value_heads,
                "use_rotary": self.use_rotary,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
                "sliding_window": self.sliding_window,
                "alibi": self.alibi,
                "logit_soft_cap": self.logit_soft_cap,
                "use_qk_norm": self.use_qk_norm,
                "score_mod": serialize_mod(self.score_mod),
                "use_bias": self.use_bias,
                "use_rms_norm": self.use_rms_norm,
                "max_wavelength": self.max_wavelength,
            }
        )
        return sublayers.dtype_config(self, config)

    def _where(self):
        return f"{type(self).__name__} (layer '{self.name}')"

    def _check_inputs_shape(self, inputs_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                f"{self._where()}: `inputs` must be (B, T, D) with a known D. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )

    def _check_built_dims(self, inputs, encoder_outputs=None):
        """`inputs` (and `encoder_outputs`) have the feature dims the block
        was built with, checked under its name (not a sublayer's)."""
        attention = getattr(self, "cross_attention", None)
        for name, tensor, expected in (
            ("inputs", inputs, self.self_attention._input_dims["query"]),
            (
                "encoder_outputs",
                encoder_outputs,
                attention._input_dims["key"] if attention else None,
            ),
        ):
            if tensor is not None and expected is not None:
                checks.check_built_dim(self._where(), name, tensor, expected)

    def _check_self_masks(
        self, inputs, padding_mask, attention_mask, segment_ids=None
    ):
        """The block's own masks and segment ids, checked under its name
        (not a sublayer's)."""
        batch, length = inputs.shape[0], inputs.shape[1]
        Structure.from_args(
            where=self._where(),
            batch=batch,
            query_length=length,
            key_length=length,
            segment_ids=segment_ids,
        )
        checks.check_mask(
            self._where(), "padding_mask", padding_mask, (batch, length)
        )
        checks.check_attention_mask(
            self._where(),
            "attention_mask",
            attention_mask,
            (batch, length, length),
        )

    def _build_self_attention(self, inputs_shape):
        """The self-attention sublayer, its LayerNorm and its dropout."""
        # Checked under the block's name, not the sublayer's.
        checks.head_dim(
            self._where(),
            "inputs",
            inputs_shape,
            self.num_heads,
            self.key_dim,
            self.use_rotary,
        )
        self.self_attention = MultiHeadSelfAttention(
            self.num_heads,
            key_dim=self.key_dim,
            dropout=self.dropout,
            num_key_value_heads=self.num_key_value_heads,
            use_rotary=self.use_rotary,
            max_wavelength=self.max_wavelength,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            sliding_window=self.sliding_window,
            alibi=self.alibi,
            logit_soft_cap=self.logit_soft_cap,
            use_qk_norm=self.use_qk_norm,
            score_mod=self.score_mod,
            use_bias=self.use_bias,
            dtype=policy_for(self, "self_attention"),
            name="self_attention",
        )
        self.self_attention.build(inputs_shape)
        self.self_attention_norm = self._layer_norm(
            "self_attention_norm", inputs_shape
        )
        self.self_attention_dropout = self._dropout("self_attention_dropout")

    def _build_feedforward(self, inputs_shape):
        self.feedforward_intermediate_dense = self._dense(
            self.intermediate_dim,
            self.activation,
            "feedforward_intermediate_dense",
            inputs_shape,
        )
        self.feedforward_output_dense = self._dense(
            inputs_shape[-1],
            None,
            "feedforward_output_dense",
            (*inputs_shape[:-1], self.intermediate_dim),
        )
        self.feedforward_norm = self._layer_norm(
            "feedforward_norm", inputs_shape
        )
        self.feedforward_dropout = self._dropout("feedforward_dropout")

    def _layer_norm(self, name, inputs_shape):
        """LayerNorm, or RMSNorm with `use_rms_norm`."""
        norm = (
            keras.layers.RMSNormalization
            if self.use_rms_norm
            else keras.layers.LayerNormalization
        )
        layer = norm(
            epsilon=self.layer_norm_epsilon,
            dtype=policy_for(self, name),
            name=name,
        )
        layer.build(inputs_shape)
        return layer

    def _dropout(self, name):
        layer = keras.layers.Dropout(
            self.dropout, dtype=policy_for(self, name), name=name
        )
        layer.build(None)
        return layer

    def _dense(self, units, activation, name, inputs_shape):
        layer = keras.layers.Dense(
            units,
            activation=activation,
            use_bias=self.use_bias,
            kernel_initializer=fresh(self.kernel_initializer),
            bias_initializer=fresh(self.bias_initializer),
            dtype=policy_for(self, name),
            name=name,
        )
        layer.build(inputs_shape)
        return layer

    def _residual(self, norm, dropout, x, sublayer, training):
        """`x + Dropout(sublayer(x))` with the block's LayerNorm placement.

        `sublayer` returns `(y, extra)`; returns `(x', extra)`.
        """
        y, extra = sublayer(call_leaf(norm, x) if self.normalize_first else x)
        x = x + call_leaf(dropout, y, training=training)
        return (x if self.normalize_first else call_leaf(norm, x)), extra

    def _feedforward(self, x, training):
        def feedforward(y):
            hidden = call_leaf(
                self.feedforward_intermediate_dense, y
            )  # (B,T,F)
            return call_leaf(self.feedforward_output_dense, hidden), None

        return self._residual(
            self.feedforward_norm,
            self.feedforward_dropout,
            x,
            feedforward,
            training,
        )[0]
