"""The Transformer encoder block.

Shape legend: B batch, T sequence length, D model dim, N heads.
"""

import keras

from keras_attention.layers import checks
from keras_attention.layers.transformer_block_base import TransformerBlockBase


@keras.saving.register_keras_serializable(package="keras_attention")
class TransformerEncoderBlock(TransformerBlockBase):
    """Self-attention and a feed-forward net, each a residual sublayer.

    The encoder layer of the Transformer (Vaswani et al. 2017). With
    post-LN (the default, as in the paper):

    $$Z = \\operatorname{LN}(X + \\operatorname{MultiHead}(X, X, X)),
    \\quad Y = \\operatorname{LN}(Z + \\operatorname{FFN}(Z))$$

    and with `normalize_first=True` (pre-LN, more stable for deep stacks;
    Xiong et al. 2020)

    $$Z = X + \\operatorname{MultiHead}(\\operatorname{LN}(X)), \\quad
    Y = Z + \\operatorname{FFN}(\\operatorname{LN}(Z))$$

    where $\\operatorname{FFN}(z) = W_2\\,\\operatorname{act}(W_1 z + b_1)
    + b_2$. Dropout acts on the attention weights and on both residual
    branches.

    Args:
        num_heads (int): Number of attention heads N.
        intermediate_dim (int): Hidden size of the feed-forward net.
        key_dim (int | None): Head dim. Defaults to `D // num_heads`.
        dropout (float): Dropout rate. Defaults to `0.0`.
        activation (str | Callable): Feed-forward activation. Defaults to
            `"relu"`.
        layer_norm_epsilon (float): Defaults to `1e-5`.
        normalize_first (bool): Pre-LN instead of post-LN. Defaults to
            `False`.
        num_key_value_heads (int | None): Key/value heads for grouped-query
            attention. Defaults to `num_heads`.
        use_rotary (bool): Rotary position embedding in the attention.
            Defaults to `False`.
        kernel_initializer (str | keras.initializers.Initializer): Defaults to
            `"glorot_uniform"`.
        bias_initializer (str | keras.initializers.Initializer): Defaults to
            `"zeros"`.
        sliding_window (int | tuple[int, int] | None): Local
            self-attention (see `MultiHeadSelfAttention`): an int `w`
            lets each position see itself and the `w - 1` before it.
            Defaults to `None`.
        alibi (bool): ALiBi position biases in the self-attention.
            Defaults to `False`.
        logit_soft_cap (float | None): Soft cap $c$ of the self-attention
            logits $s$, which become $c \\tanh(s / c)$. Defaults to `None`.
        use_qk_norm (bool): RMS-normalised queries and keys in the
            self-attention (see `MultiHeadSelfAttention`). Defaults to
            `False`.
        score_mod (Callable | keras.Layer | None): A score mod of the
            self-attention's logits (see `MultiHeadSelfAttention`); a Keras
            layer such as `RelativePositionBias` is trained and saved with
            the block. Defaults to `None`.
        use_bias (bool): Biases in the attention projections and the
            feed-forward net. T5 and Llama have none. Defaults to `True`.
        use_rms_norm (bool): RMSNorm (Zhang and Sennrich 2019), as T5 and
            Llama use, in place of LayerNorm: $x / \\operatorname{RMS}(x)$
            times a learned scale, without centring or shift. Defaults to
            `False`.
        max_wavelength (float): Longest rotary wavelength (with
            `use_rotary`; Llama 3 uses `500000.0`). Defaults to `10000.0`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        inputs (Tensor): Shape `(B, T, D)`.
        padding_mask (Tensor): Shape `(B, T)`, boolean, `True` for real tokens.
            Defaults to the Keras mask of `inputs`.
        attention_mask (Tensor): Shape `(B, T, T)`, boolean, `True` = attend,
            or any shape that broadcasts to it, such as `(T, T)`.
        return_attention_scores (bool): Also return the weights
            `(B, N, T, T)`.
        segment_ids (Tensor | None): Shape `(B, T)`, integer. Packed sequences:
            self-attention stays within equal ids; id `0` is padding. Not with a
            `cache`.
        mask_mod (Callable | None): A mask mod for the self-attention
            (see `keras_attention.mods`), at sequence positions (also in a
            cached step). Defaults to `None`.
        score_mod (Callable | None): A score mod for the self-attention.
            Defaults to `None`.
        training (bool): Whether dropout is active.
        mask (Tensor | None): The implicit Keras mask, filled in by Keras.
        inputs_mask (Tensor | None): The same, under the name Keras also
            uses.

    Returns:
        Tensor | tuple[Tensor, Tensor]: The outputs `(B, T, D)`, or
            `(outputs, scores)`.

    Examples:
        >>> import numpy as np
        >>> block = TransformerEncoderBlock(num_heads=4, intermediate_dim=64)
        >>> x = np.random.rand(2, 10, 32).astype("float32")
        >>> padding = np.arange(10)[None, :] < np.array([[7], [10]])
        >>> tuple(block(x, padding_mask=padding).shape)
        (2, 10, 32)

    References:
        Vaswani et al., "Attention Is All You Need", 2017. Xiong et al.,
        "On Layer Normalization in the Transformer Architecture", 2020.
        Zhang and Sennrich, "Root Mean Square Layer Normalization", 2019.
    """

    def build(self, inputs_shape):
        self._check_inputs_shape(inputs_shape)
        self._build_self_attention(inputs_shape)
        self._build_feedforward(inputs_shape)
        self.built = True

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        return_attention_scores: bool = False,
        training=None,
        segment_ids=None,
        mask_mod=None,
        score_mod=None,
        mask=None,
        inputs_mask=None,
    ):
        checks.check_flag(
            self._where(), "return_attention_scores", return_attention_scores
        )
        if padding_mask is None:
            padding_mask = mask if mask is not None else inputs_mask
        self._check_built_dims(inputs)
        self._check_self_masks(
            inputs, padding_mask, attention_mask, segment_ids
        )

        def self_attention(x):
            result = self.self_attention(
                x,
                padding_mask=padding_mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                segment_ids=segment_ids,
                mask_mod=mask_mod,
                score_mod=score_mod,
                training=training,
            )
            return result if return_attention_scores else (result, None)

        x, scores = self._residual(
            self.self_attention_norm,
            self.self_attention_dropout,
            inputs,
            self_attention,
            training,
        )
        x = self._feedforward(x, training)
        if return_attention_scores:
            return x, scores
        return x

    def compute_output_shape(self, inputs_shape):
        self._check_inputs_shape(inputs_shape)
        return tuple(inputs_shape)

    def compute_output_spec(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        segment_ids=None,
        mask_mod=None,
        score_mod=None,
        mask=None,
        inputs_mask=None,
    ):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return outputs
        batch, length = inputs.shape[0], inputs.shape[1]
        scores = keras.KerasTensor(
            (batch, self.num_heads, length, length), dtype=self.compute_dtype
        )
        return outputs, scores
