"""Multi-head self-attention with masks, a KV cache and grouped-query heads.

Shape legend: B batch, T query length, S key length (S_max: cache length),
D model dim, N query heads, K key/value heads, H head dim.
"""

import keras
from keras import ops

from keras_attention import _kernels
from keras_attention import functional
from keras_attention._core import structure
from keras_attention.layers import checks
from keras_attention.layers.multi_head_core import MultiHeadCore


@keras.saving.register_keras_serializable(package="keras_attention")
class MultiHeadSelfAttention(MultiHeadCore):
    """Multi-head attention of a sequence over itself.

    Every position produces a query, a key and a value per head; each head
    computes scaled dot-product attention and the heads are concatenated
    and mixed by an output projection:

    $$\\text{head}_n = \\operatorname{softmax}\\left(
    \\frac{X W^Q_n (X W^K_n)^\\top}{\\sqrt{H}} + M\\right) X W^V_n,
    \\quad Y = [\\text{head}_1; \\dots; \\text{head}_N] W^O$$

    where the mask `M` hides padding, the future (`use_causal_mask`) or
    any pattern given as `attention_mask`. With `num_key_value_heads=K <
    N` groups of `N / K` query heads share one key/value head
    (grouped-query attention; `K = 1` is multi-query attention). With
    `use_rotary=True` queries and keys are rotated by `RotaryEmbedding`.

    For incremental decoding pass a `cache` of keys and values and the
    position `cache_index` of the first new token: the new keys/values are
    written into the cache, the queries attend over it, and the layer
    returns the updated cache too. Outputs equal the full causal
    computation.

    With a `sliding_window` no query looks further back than the window,
    so the cache need not grow with the text: a cache of exactly the
    window's length (`w` positions for an int window `w`, `left + 1` for
    a pair) is a *rolling* cache. It holds the keys and values of the
    last `w` positions in order, every call appends the new ones and
    drops the oldest, and `cache_index` may grow without bound. Outputs
    still equal the full computation. `TransformerDecoderBlock.init_cache`
    makes one when `max_length` exceeds the window (as in Mistral, Jiang
    et al. 2023).

    The four projections are `EinsumDense` sublayers (`query_dense`,
    `key_dense`, `value_dense`, `output_dense`): `Model.quantize("int8")`
    quantizes them (a reloaded `.keras` file keeps them quantized), and
    `enable_lora` adds low-rank adapters to chosen ones (Hu et al., 2021).

    Args:
        num_heads (int): Number of query heads N.
        key_dim (int): Head dim H of queries and keys. Defaults to
            `D // num_heads` (then D must be divisible by N).
        value_dim (int): Head dim of values. Defaults to `key_dim`.
        dropout (float): Dropout rate on the attention weights during
            training. Defaults to `0.0`.
        use_bias (bool): Biases in the projections. Defaults to `True`.
        num_key_value_heads (int): Number K of key/value heads, a divisor of
            `num_heads`. Defaults to `num_heads`.
        use_rotary (bool): Rotary position embedding of queries and keys.
            Defaults to `False`.
        max_wavelength (float): Longest rotary wavelength. Defaults to
            `10000.0`.
        kernel_initializer (str | keras.initializers.Initializer): Defaults to
            `"glorot_uniform"`.
        bias_initializer (str | keras.initializers.Initializer): Defaults to
            `"zeros"`.
        sliding_window (int | tuple[int, int] | None): Local attention: an int
            `w` lets each position see itself and the `w - 1` positions before
            it (as in Mistral); a pair sees `left` positions before and `right`
            after. With a cache the window is kept over the cached positions.
            The blockwise path skips the key blocks outside the window. Defaults
            to `None`.
        alibi (bool): Linear position biases on the logits (ALiBi, Press
            et al. 2022), one slope per head; usually instead of position
            embeddings. Defaults to `False`.
        logit_soft_cap (float | None): Caps the logits smoothly,
            `cap * tanh(logits / cap)` (as in Gemma 2). Defaults to
            `None`.
        use_qk_norm (bool): RMS-normalise each head's queries and keys
            over the head dim, with a learned scale, before rotary
            positions and the dot product (QK normalisation, Henry et al.
            2020; Dehghani et al. 2023): it bounds the logits and
            steadies training at high learning rates. Defaults to
            `False`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        inputs (Tensor): Shape `(B, T, D)`.
        padding_mask (Tensor): Shape `(B, T)`, boolean (`(B, S_max)` with a
            cache; with a rolling cache `(B, S)` over the absolute positions,
            `S >= cache_index + T`), `True` for real tokens; padded keys get
            zero weight. Defaults to the Keras mask of `inputs`.
        attention_mask (Tensor): Shape `(B, T, S)`, boolean, `True` = attend.
            Not with a rolling cache.
        use_causal_mask (bool): Hide the keys after each query.
        return_attention_scores (bool): Also return the weights
            `(B, N, T, S)`; with a rolling cache of `R` positions
            `(B, N, T, R + T)`, over positions `cache_index - R` to
            `cache_index + T - 1`.
        cache (Tensor | None): Shape `(B, 2, S_max, K, H)`: keys `[:, 0]` and
            values `[:, 1]` of the previous steps. Needs `key_dim == value_dim`.
            With a `sliding_window` of `w`, a cache of `S_max = w` positions is
            a rolling cache.
        cache_index (int | Tensor): Position of the first token
            of `inputs` in the cache. An index whose tokens do not fit the
            cache raises a `ValueError` when its value is known (an int, a
            NumPy or host tensor); one that is traced (inside a compiled
            function) or on an accelerator is clipped so that they fit.
        segment_ids (Tensor | None): Shape `(B, T)`, integer. Packed sequences:
            positions attend only within equal ids; id `0` is padding; rotary
            positions restart at each sequence. Not with a `cache`.
        training (bool): Whether dropout is active.
        mask (Tensor | None): The implicit Keras mask of `inputs`, filled in
            by Keras; not passed by hand.
        inputs_mask (Tensor | None): The same, under the name Keras also
            uses; not passed by hand.

    Returns:
        Tensor | tuple: `outputs` `(B, T, D)`; `(outputs, scores)` with
            `return_attention_scores`; `(outputs, new_cache)` or
            `(outputs, scores, new_cache)` with a `cache`.

    Examples:
        >>> import numpy as np
        >>> layer = MultiHeadSelfAttention(num_heads=4)
        >>> x = np.random.rand(2, 6, 32).astype("float32")
        >>> tuple(layer(x, use_causal_mask=True).shape)
        (2, 6, 32)

        Incremental decoding with a cache of 8 positions:

        >>> cache = np.zeros((2, 2, 8, 4, 8), "float32")   # (B,2,S_max,K,H)
        >>> step, cache = layer(x[:, :1], cache=cache, cache_index=0)
        >>> tuple(step.shape), tuple(cache.shape)
        ((2, 1, 32), (2, 2, 8, 4, 8))

    References:
        Vaswani et al., "Attention Is All You Need", 2017. Ainslie et al.,
        "GQA: Training Generalized Multi-Query Transformer Models from
        Multi-Head Checkpoints", 2023.
    """

    def build(self, inputs_shape):
        self._build_heads(
            inputs_shape, inputs_shape, inputs_shape, name="inputs"
        )
        self.built = True

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask: bool = False,
        return_attention_scores: bool = False,
        cache=None,
        cache_index=None,
        segment_ids=None,
        training=None,
        mask=None,
        inputs_mask=None,
    ):
        checks.check_flag(self._where(), "use_causal_mask", use_causal_mask)
        if cache is not None:
            if segment_ids is not None:
                raise ValueError(
                    f"{self._where()}: `segment_ids` (packed sequences) "
                    "cannot be combined with a `cache`; decode each sequence "
                    "in its own row, with `padding_mask`. Received: "
                    f"segment_ids.shape={tuple(ops.shape(segment_ids))}"
                )
            call_cached = (
                self._call_rolling
                if self._is_rolling(cache)
                else self._call_cached
            )
            return call_cached(
                inputs,
                cache,
                cache_index,
                padding_mask,
                attention_mask,
                use_causal_mask,
                return_attention_scores,
                training,
            )
        if padding_mask is None:
            padding_mask = mask if mask is not None else inputs_mask
        batch, length = inputs.shape[0], inputs.shape[1]
        self._check_mask("padding_mask", padding_mask, (batch, length))
        self._check_mask(
            "attention_mask", attention_mask, (batch, length, length)
        )
        self._check_segments(segment_ids, batch, length, length)
        full_mask = functional.merge_masks(
            functional.padding_to_attention_mask(padding_mask),
            attention_mask,
        )  # (B, T, T)
        # Packed sequences restart their rotary positions.
        query = self._project_query(inputs, segment_ids=segment_ids)
        key, value = self._project_key_value(
            inputs, inputs, segment_ids=segment_ids
        )
        outputs, scores = self._attend(
            query,
            key,
            value,
            full_mask,
            is_causal=use_causal_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            segment_ids=segment_ids,
        )
        if return_attention_scores:
            return outputs, scores
        return outputs

    def compute_output_shape(self, inputs_shape):
        self._check_input_shapes(
            inputs_shape, inputs_shape, inputs_shape, name="inputs"
        )
        return tuple(inputs_shape)

    def compute_output_spec(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        cache=None,
        cache_index=None,
        segment_ids=None,
        training=None,
        mask=None,
        inputs_mask=None,
    ):
        batch, length = inputs.shape[0], inputs.shape[1]
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        key_length = length
        if cache is not None:
            key_length = cache.shape[2]
            if self._is_rolling(cache) and length is not None:
                key_length += length
        scores = keras.KerasTensor(
            (batch, self.num_heads, length, key_length),
            dtype=self.compute_dtype,
        )
        result = (outputs, scores) if return_attention_scores else (outputs,)
        if cache is not None:
            result = (*result, keras.KerasTensor(cache.shape, cache.dtype))
        return result[0] if len(result) == 1 else result

    def _call_cached(
        self,
        inputs,
        cache,
        cache_index,
        padding_mask,
        attention_mask,
        use_causal_mask,
        return_attention_scores,
        training,
    ):
        cache_index = self._check_cache(inputs, cache, cache_index)
        batch, length = inputs.shape[0], inputs.shape[1]
        max_length = cache.shape[2]
        self._check_mask("padding_mask", padding_mask, (batch, max_length))
        self._check_mask(
            "attention_mask", attention_mask, (batch, length, max_length)
        )
        query = self._project_query(inputs, start_index=cache_index)
        key, value = self._project_key_value(
            inputs, inputs, start_index=cache_index
        )  # (B, T, K, H)
        cache, keys, values = _kernels.update_kv_cache(
            cache, key, value, cache_index
        )  # (B, 2, S_max, K, H), (B, S_max, K, H) twice
        # Slots after the new tokens hold no keys yet: always hidden. The
        # new tokens are the last of the written keys (bottom-right
        # alignment): query i stands at position cache_index + i.
        last = cache_index + ops.shape(inputs)[1]
        slots = ops.arange(0, max_length)  # (S_max,)
        written = ops.expand_dims(slots < last, 0)  # (1, S_max)
        full_mask = functional.merge_masks(
            ops.expand_dims(written, 0),  # (1, 1, S_max)
            functional.padding_to_attention_mask(padding_mask),
            attention_mask,
        )
        outputs, scores = self._attend(
            query,
            ops.cast(keys, query.dtype),
            ops.cast(values, query.dtype),
            full_mask,
            is_causal=use_causal_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            offset=cache_index,
        )
        if return_attention_scores:
            return outputs, scores, cache
        return outputs, cache

    def _rolling_length(self) -> int | None:
        """Positions a rolling cache keeps, or `None` without a window:
        no query sees further back than `left` positions (`w - 1` for an
        int window `w`), so `left + 1` are enough."""
        window = structure.window(self._where(), self.sliding_window)
        return None if window is None else window[0] + 1

    def _is_rolling(self, cache) -> bool:
        """Whether `cache` is a rolling cache: exactly `_rolling_length`."""
        size = self._rolling_length()
        return size is not None and cache.shape[2] == size

    def _call_rolling(
        self,
        inputs,
        cache,
        cache_index,
        padding_mask,
        attention_mask,
        use_causal_mask,
        return_attention_scores,
        training,
    ):
        """The cached call with a rolling cache: `cache` holds positions
        `cache_index - R ... cache_index - 1`, in order; the queries attend
        over those and the new tokens, and the last `R` of them are kept.
        """
        cache_index = self._check_rolling_cache(inputs, cache, cache_index)
        size = cache.shape[2]  # R
        batch, length = ops.shape(inputs)[0], inputs.shape[1]
        if attention_mask is not None:
            raise ValueError(
                f"{self._where()}: `attention_mask` cannot be combined with "
                f"a rolling cache (a cache of the window's {size} "
                "positions); hide padding with `padding_mask` over the "
                "absolute positions. Received: attention_mask.shape="
                f"{tuple(attention_mask.shape)}"
            )
        if padding_mask is not None:
            self._check_mask("padding_mask", padding_mask, (batch, None))
            known = _kernels.static_int(cache_index)
            needed = None if known is None else known + length
            if needed is not None and padding_mask.shape[1] < needed:
                raise ValueError(
                    f"{self._where()}: with a rolling cache, `padding_mask` "
                    "covers the absolute positions 0 .. cache_index + T - 1 "
                    f"({needed} positions). Received: padding_mask.shape="
                    f"{tuple(padding_mask.shape)}, cache_index={known}"
                )
        query = self._project_query(inputs, start_index=cache_index)
        key, value = self._project_key_value(
            inputs, inputs, start_index=cache_index
        )  # (B, T, K, H)
        new = ops.stack(
            [ops.cast(key, cache.dtype), ops.cast(value, cache.dtype)], axis=1
        )  # (B, 2, T, K, H)
        window = ops.concatenate([cache, new], axis=2)  # (B, 2, R + T, K, H)
        # Key j stands at position cache_index - R + j; the queries are the
        # last T of them (offset R). Slots before position 0 are empty.
        steps = size + ops.shape(inputs)[1]  # R + T, known or not
        positions = cache_index - size + ops.arange(0, steps)  # (R+T,)
        visible = ops.expand_dims(ops.expand_dims(positions >= 0, 0), 0)
        if padding_mask is not None:
            # Absolute positions; the empty slots read as padding.
            padded = ops.concatenate(
                [
                    ops.zeros((batch, size), "bool"),
                    ops.cast(padding_mask, "bool"),
                ],
                axis=1,
            )  # (B, R + S)
            kept = ops.take(padded, positions + size, axis=1)  # (B, R + T)
            visible = ops.logical_and(visible, ops.expand_dims(kept, 1))
        outputs, scores = self._attend(
            query,
            ops.cast(window[:, 0], query.dtype),
            ops.cast(window[:, 1], query.dtype),
            visible,  # (B|1, 1, R + T)
            is_causal=use_causal_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            offset=size,
        )
        cache = window[:, :, length:]  # the last R positions
        if return_attention_scores:
            return outputs, scores, cache
        return outputs, cache

    def _check_rolling_cache(self, inputs, cache, cache_index):
        self._check_cache(inputs, cache, cache_index, limit=None)
        known = _kernels.static_int(cache_index)
        if known is not None and known < 0:
            raise ValueError(
                f"{self._where()}: `cache_index` must be non-negative. "
                f"Received: cache_index={known}"
            )
        return cache_index if known is None else known

    def _check_cache(self, inputs, cache, cache_index, limit=-1):
        expected = (
            inputs.shape[0],
            2,
            None,
            self.kv_heads,
            self._head_dim,
        )
        checks.check_shape(self._where(), "cache", cache, expected)
        if self._head_dim != self._value_head_dim:
            raise ValueError(
                f"{self._where()}: a cache needs `key_dim == value_dim`. "
                f"Received: key_dim={self._head_dim}, "
                f"value_dim={self._value_head_dim}"
            )
        if cache_index is None:
            raise ValueError(
                f"{self._where()}: `cache_index` (the position of the first "
                "new token) is required with `cache`. Received: "
                "cache_index=None"
            )
        if limit is None:  # a rolling cache: any index from 0
            return cache_index
        return checks.check_index_range(
            self._where(),
            "cache_index",
            cache_index,
            inputs.shape[1],
            cache.shape[2],
            "the cache",
        )
