"""The Transformer decoder block, also decoder-only (GPT-style).

Shape legend: B batch, T target length, S source length, S_max cache length,
D model dim, N heads, K key/value heads, H head dim.
"""

import keras

from keras_attention.layers import checks
from keras_attention.layers import decoder_checks
from keras_attention.layers import kv_cache
from keras_attention.layers.cross_attention import CrossAttention
from keras_attention.layers.sublayers import policy_for
from keras_attention.layers.transformer_block_base import TransformerBlockBase


@keras.saving.register_keras_serializable(package="keras_attention")
class TransformerDecoderBlock(TransformerBlockBase):
    """Causal self-attention, optional cross-attention, feed-forward net.

    The decoder layer of the Transformer (Vaswani et al. 2017), each
    sublayer residual with post-LN by default (`normalize_first=True` for
    pre-LN):

    $$Z_1 = \\operatorname{LN}(Y + \\operatorname{MaskedMultiHead}(Y)),
    \\quad Z_2 = \\operatorname{LN}(Z_1 + \\operatorname{MultiHead}(Z_1,
    X_{enc})), \\quad O = \\operatorname{LN}(Z_2 + \\operatorname{FFN}(Z_2))$$

    and with pre-LN each sublayer normalises its input instead:

    $$Z_1 = Y + \\operatorname{MaskedMultiHead}(\\operatorname{LN}(Y)),
    \\quad Z_2 = Z_1 + \\operatorname{MultiHead}(\\operatorname{LN}(Z_1),
    X_{enc}), \\quad O = Z_2 + \\operatorname{FFN}(\\operatorname{LN}(Z_2))$$

    Called without `encoder_outputs` on its first call, the block has no
    cross-attention: a decoder-only (GPT-style) block.

    For incremental decoding, `init_cache` makes the cache: the keys and
    values of the self-attention (filled step by step) and, with an
    encoder, the projected encoder keys and values (computed once per
    source). Each call with `cache` and `cache_index` returns the updated
    cache as well; outputs equal the full causal computation. With a
    `sliding_window` shorter than `max_length` the self-attention cache is
    a `keras_attention.layers.RollingCache` of the window's positions, so
    decoding runs past `max_length` at constant memory.

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
        use_rotary (bool): Rotary position embedding in the self-attention.
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
            self- and cross-attention (see `MultiHeadSelfAttention`).
            Defaults to `False`.
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
        inputs (Tensor): Shape `(B, T, D)`, the target sequence.
        encoder_outputs (Tensor | None): Shape `(B, S, De)`.
        padding_mask (Tensor): Shape `(B, T)`, boolean (`(B, S_max)` with a
            cache). Defaults to the Keras mask of `inputs`.
        encoder_padding_mask (Tensor): Shape `(B, S)`, boolean. Defaults to the
            Keras mask of `encoder_outputs`.
        attention_mask (Tensor): Shape `(B, T, T)`, boolean for the
            self-attention (`(B, T, S_max)` with a cache), or any shape
            that broadcasts to it, such as `(T, T)`.
        use_causal_mask (bool): Defaults to `True`.
        cache (dict | Tensor | RollingCache | None): The dict of
            `init_cache`, or for a decoder-only block just its
            self-attention cache: a tensor `(B, 2, S_max, K, H)` or, with a
            `sliding_window`, a `RollingCache` (which `init_cache` makes
            when `max_length` exceeds the window).
        cache_index (int | Tensor): Position of the first token
            of `inputs`.
        return_attention_scores (bool): Also return the weights as a dict
            `{"self": (B, N, T, T), "cross": (B, N, T, S)}`.
        segment_ids (Tensor | None): Shape `(B, T)`, integer. Packed sequences:
            self-attention stays within equal ids; id `0` is padding. Not with a
            `cache`.
        encoder_segment_ids (Tensor | None): Shape `(B, S)`, integer. With
            `segment_ids`, packed source sequences: each target token
            attends only to the source tokens of its own id (packed
            translation pairs). Without it the cross-attention sees the
            whole source row.
        mask_mod (Callable | None): A mask mod for the self-attention
            (see `keras_attention.mods`), at sequence positions (also in a
            cached step). Defaults to `None`.
        score_mod (Callable | None): A score mod for the self-attention.
            Defaults to `None`.
        training (bool): Whether dropout is active.
        mask (Tensor | None): Implicit Keras mask of `inputs`,
            filled in by Keras.
        inputs_mask (Tensor | None): The same, under the name Keras also
            uses.
        encoder_outputs_mask (Tensor | None): Implicit Keras mask of
            `encoder_outputs`, filled in by Keras.
        encoder_attention_mask (Tensor | None): Shape `(B, T, S)`, boolean,
            `True` = attend, or any shape that broadcasts to it: which
            source positions each target position's cross-attention may
            see (keras-hub's `encoder_attention_mask`); with a cache, the
            rows of the new tokens. Combined with `encoder_padding_mask`
            by logical AND: a source position is visible only where both
            allow it, and a target row that sees none gets a zero
            cross-attention context. Defaults to `None`.

    Returns:
        Tensor | tuple: `outputs` `(B, T, D)`, followed by the scores dict if
            asked and the updated cache if one was given.

    Examples:
        >>> import numpy as np
        >>> block = TransformerDecoderBlock(num_heads=2, intermediate_dim=32)
        >>> target = np.random.rand(2, 5, 16).astype("float32")
        >>> source = np.random.rand(2, 7, 16).astype("float32")
        >>> out, scores = block(target, source, return_attention_scores=True)
        >>> tuple(scores["self"].shape), tuple(scores["cross"].shape)
        ((2, 2, 5, 5), (2, 2, 5, 7))

        Step-by-step decoding with a cache:

        >>> cache = block.init_cache(2, max_length=5, encoder_outputs=source)
        >>> step, cache = block(target[:, :1], cache=cache, cache_index=0)
        >>> tuple(step.shape)
        (2, 1, 16)

    References:
        Vaswani et al., "Attention Is All You Need", 2017. Zhang and
        Sennrich, "Root Mean Square Layer Normalization", 2019.
    """

    def build(self, inputs_shape, encoder_outputs_shape=None):
        self._check_inputs_shape(inputs_shape)
        self._build_self_attention(inputs_shape)
        self.cross_attention = None
        if encoder_outputs_shape is not None:
            decoder_checks.check_encoder_outputs_shape(
                self._where(), inputs_shape, encoder_outputs_shape
            )
            self.cross_attention = CrossAttention(
                self.num_heads,
                key_dim=self.key_dim,
                dropout=self.dropout,
                num_key_value_heads=self.num_key_value_heads,
                kernel_initializer=self.kernel_initializer,
                bias_initializer=self.bias_initializer,
                use_qk_norm=self.use_qk_norm,
                use_bias=self.use_bias,
                dtype=policy_for(self, "cross_attention"),
                name="cross_attention",
            )
            self.cross_attention.build(inputs_shape, encoder_outputs_shape)
            self.cross_attention_norm = self._layer_norm(
                "cross_attention_norm", inputs_shape
            )
            self.cross_attention_dropout = self._dropout(
                "cross_attention_dropout"
            )
        self._build_feedforward(inputs_shape)
        self.built = True

    def call(
        self,
        inputs,
        encoder_outputs=None,
        padding_mask=None,
        encoder_padding_mask=None,
        attention_mask=None,
        use_causal_mask: bool = True,
        cache=None,
        cache_index=None,
        return_attention_scores: bool = False,
        training=None,
        segment_ids=None,
        encoder_segment_ids=None,
        mask_mod=None,
        score_mod=None,
        mask=None,
        inputs_mask=None,
        encoder_outputs_mask=None,
        encoder_attention_mask=None,
    ):
        checks.check_flag(
            self._where(), "return_attention_scores", return_attention_scores
        )
        if padding_mask is None and cache is None:
            padding_mask = mask if mask is not None else inputs_mask
        if encoder_padding_mask is None:
            encoder_padding_mask = encoder_outputs_mask
        self_cache, cross_cache = self._split_cache(cache)
        cross_segments = self._check_call(
            inputs,
            encoder_outputs,
            cache,
            padding_mask,
            (encoder_padding_mask, encoder_attention_mask),
            attention_mask,
            use_causal_mask,
            segment_ids,
            encoder_segment_ids,
        )
        scores = {}
        x, (scores["self"], self_cache) = self._self_residual(
            inputs,
            dict(
                padding_mask=padding_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                cache=self_cache,
                cache_index=cache_index,
                segment_ids=segment_ids,
                mask_mod=mask_mod,
                score_mod=score_mod,
            ),
            return_attention_scores,
            training,
        )
        if self.cross_attention is not None:
            x, scores["cross"] = self._cross_residual(
                x,
                encoder_outputs,
                (encoder_padding_mask, encoder_attention_mask),
                cross_cache,
                cross_segments,
                return_attention_scores,
                training,
            )
        x = self._feedforward(x, training)
        outputs = (x, scores) if return_attention_scores else (x,)
        if cache is not None:
            if isinstance(cache, dict):
                self_cache = {**cache, "self": self_cache}
            outputs = (*outputs, self_cache)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        self._check_inputs_shape(inputs_shape)
        if encoder_outputs_shape is not None:
            decoder_checks.check_encoder_outputs_shape(
                self._where(), inputs_shape, encoder_outputs_shape
            )
        return tuple(inputs_shape)

    def compute_output_spec(
        self,
        inputs,
        encoder_outputs=None,
        padding_mask=None,
        encoder_padding_mask=None,
        attention_mask=None,
        use_causal_mask=True,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
        segment_ids=None,
        encoder_segment_ids=None,
        mask_mod=None,
        score_mod=None,
        mask=None,
        inputs_mask=None,
        encoder_outputs_mask=None,
        encoder_attention_mask=None,
    ):
        outputs = [keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)]
        self_cache, cross_cache = self._split_cache(cache)
        if return_attention_scores:
            scores = {
                "self": self.self_attention.compute_output_spec(
                    inputs,
                    cache=self_cache,
                    cache_index=0,
                    return_attention_scores=True,
                )[1]
            }
            if self.cross_attention is not None:
                scores["cross"] = self.cross_attention.compute_output_spec(
                    inputs,
                    encoder_outputs,
                    cache=cross_cache,
                    return_attention_scores=True,
                )[1]
            outputs.append(scores)
        if cache is not None:
            outputs.append(
                keras.tree.map_structure(
                    lambda c: keras.KerasTensor(c.shape, c.dtype), cache
                )
            )
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def init_cache(
        self, batch_size: int, max_length: int, encoder_outputs=None, dtype=None
    ):
        """A cache for incremental decoding of up to `max_length` tokens.

        With a `sliding_window` shorter than `max_length`, the
        self-attention cache is a `keras_attention.layers.RollingCache` of
        the window's reach (`w` positions for an int window `w`, `left + 1`
        for a pair): it keeps only the positions the window can still see,
        so decoding may run past `max_length` at constant memory, with
        outputs equal to the full computation. Otherwise it is a plain
        cache tensor.

        Args:
            batch_size: B.
            max_length: S_max, the number of positions to decode.
            encoder_outputs (Tensor): Shape `(B, S, De)`, required when the
                block has cross-attention: its keys and values are projected
                here, once.
            dtype (str | DType | None): Dtype of the cache. Defaults to the
                compute dtype.

        Returns:
            dict: `{"self": zeros (B, 2, S_max, K, H)}`, or
                `{"self": RollingCache(zeros (B, 2, R, K, H))}` when the
                window's reach `R` is shorter than `max_length`; with
                cross-attention also `"cross": (B, 2, S, K, H)`.
        """
        where = f"{type(self).__name__}.init_cache (layer '{self.name}')"
        decoder_checks.check_init_cache(
            where, self.built, batch_size, max_length, dtype
        )
        attention = self.self_attention
        cache = {
            "self": kv_cache.empty(
                (batch_size, attention.kv_heads, attention._head_dim),
                max_length,
                self.sliding_window,
                dtype or self.compute_dtype,
                self._where(),
            )
        }
        decoder_checks.check_source(
            where, self.cross_attention is not None, encoder_outputs, None, None
        )
        if self.cross_attention is not None:
            decoder_checks.check_cache_source_shape(
                where,
                encoder_outputs,
                batch_size,
                self.cross_attention._input_dims["key"],
            )
            cache["cross"] = self.cross_attention.compute_cache(encoder_outputs)
        return cache

    def _check_call(
        self,
        inputs,
        encoder_outputs,
        cache,
        padding_mask,
        encoder_masks,
        attention_mask,
        use_causal_mask,
        segment_ids,
        encoder_segment_ids,
    ):
        """Checks a call under the block's name (not a sublayer's);
        `encoder_masks` is `(encoder_padding_mask,
        encoder_attention_mask)`. Returns the cross-attention's
        `segment_ids`, or `None`."""
        _, cross_cache = self._split_cache(cache)
        where = self._where()
        self._check_built_dims(inputs, encoder_outputs)
        decoder_checks.check_source(
            where,
            getattr(self, "cross_attention", None) is not None,
            encoder_outputs,
            cross_cache,
            *encoder_masks,
            length=inputs.shape[1],
        )
        checks.check_flag(where, "use_causal_mask", use_causal_mask)
        cross_segments = decoder_checks.cross_segment_ids(
            where,
            inputs,
            segment_ids,
            encoder_segment_ids,
            encoder_outputs,
            cross_cache,
        )
        if cache is None:  # with a cache, masks cover the cache's positions
            self._check_self_masks(
                inputs, padding_mask, attention_mask, segment_ids
            )
        elif segment_ids is not None:
            raise ValueError(
                f"{self._where()}: `segment_ids` (packed sequences) cannot "
                "be combined with a `cache`; decode each sequence in its own "
                "row, with `padding_mask`. Received: segment_ids.shape="
                f"{tuple(keras.ops.shape(segment_ids))}"
            )
        return cross_segments

    def _self_residual(self, x, arguments, return_attention_scores, training):
        """The self-attention sublayer, called with `arguments`:
        `(x', (scores or None, new cache or None))`."""

        def self_attention(y):
            result = self.self_attention(
                y,
                return_attention_scores=return_attention_scores,
                training=training,
                **arguments,
            )
            return _split_result(
                result, return_attention_scores, arguments["cache"]
            )

        return self._residual(
            self.self_attention_norm,
            self.self_attention_dropout,
            x,
            self_attention,
            training,
        )

    def _cross_residual(
        self,
        x,
        encoder_outputs,
        encoder_masks,
        cross_cache,
        segment_ids,
        return_attention_scores,
        training,
    ):
        """The cross-attention sublayer, with `encoder_masks`
        `(encoder_padding_mask, encoder_attention_mask)`: `(x', scores or
        None)`."""

        def cross_attention(y):
            result = self.cross_attention(
                y,
                encoder_outputs,
                value_mask=encoder_masks[0],
                attention_mask=encoder_masks[1],
                cache=cross_cache,
                segment_ids=segment_ids,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            return result if return_attention_scores else (result, None)

        return self._residual(
            self.cross_attention_norm,
            self.cross_attention_dropout,
            x,
            cross_attention,
            training,
        )

    def _split_cache(self, cache):
        return kv_cache.split_block_cache(cache, self._where())


def _split_result(result, with_scores, cache):
    """`(outputs, (scores, new_cache))` from a self-attention call."""
    result = result if cache is not None or with_scores else (result,)
    scores = result[1] if with_scores else None
    return result[0], (scores, result[-1] if cache is not None else None)
