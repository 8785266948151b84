"""Multi-head self-attention with masks, a KV cache and grouped-query heads.

Shape legend: B batch, T query length, S key length (S_max: cache length),
D model dim, N query heads, K key/value heads, H head dim.
"""

import keras
from keras import ops

from keras_attention import functional
from keras_attention.layers import checks
from keras_attention.layers import kv_cache
from keras_attention.layers.multi_head_core import MultiHeadCore
from keras_attention.layers.rotary_embedding import RotaryEmbedding
from keras_attention.layers.sublayers import policy_for


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
    so the cache need not grow with the text: pass a *rolling* cache,
    `keras_attention.layers.RollingCache(kv)` with `kv` of shape
    `(B, 2, R, K, H)` and `R` the window's reach (`w` positions for an int
    window `w`, `left + 1` for a pair). It holds the keys and values of
    the last `R` positions in order, every call appends the new ones and
    drops the oldest, and `cache_index` may grow without bound. Outputs
    still equal the full computation. `TransformerDecoderBlock.init_cache`
    makes one when `max_length` exceeds the window (as in Mistral, Jiang
    et al. 2023). A raw tensor is always a plain cache, whatever its
    length.

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
        logit_soft_cap (float | None): Caps the logits $s$ smoothly at
            $c$, as $c \\tanh(s / c)$ (as in Gemma 2). Defaults to
            `None`.
        use_qk_norm (bool): RMS-normalise each head's queries and keys
            over the head dim, with a learned scale, before rotary
            positions and the dot product (QK normalisation, Henry et al.
            2020; Dehghani et al. 2023): it bounds the logits and
            steadies training at high learning rates. Defaults to
            `False`.
        score_mod (Callable | keras.Layer | None): A score mod applied
            to every call's logits, `score_mod(score, batch, head, q_idx,
            kv_idx)` (see `keras_attention.mods`), with sequence positions
            as indices. A Keras layer (`RelativePositionBias`) is tracked:
            its weights train and are saved with this layer. Defaults to
            `None`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        inputs (Tensor): Shape `(B, T, D)`.
        padding_mask (Tensor): Shape `(B, T)`, boolean (`(B, S_max)` with a
            cache; with a rolling cache `(B, S)` over the absolute positions,
            `S >= cache_index + T`), `True` for real tokens; padded keys get
            zero weight. Defaults to the Keras mask of `inputs`.
        attention_mask (Tensor): Shape `(B, T, S)`, boolean, `True` = attend;
            as in Keras, any shape that broadcasts to it, such as a `(T, S)`
            mask shared by the batch. Not with a rolling cache.
        use_causal_mask (bool): Hide the keys after each query.
        return_attention_scores (bool): Also return the weights
            `(B, N, T, S)`; with a rolling cache of `R` positions
            `(B, N, T, R + T)`, over positions `cache_index - R` to
            `cache_index + T - 1`.
        cache (Tensor | RollingCache | None): A plain cache, shape
            `(B, 2, S_max, K, H)`: keys `[:, 0]` and values `[:, 1]` of
            positions `0 .. S_max - 1`; or, with a `sliding_window`, a
            `RollingCache` of the last `R` positions (see above), returned
            as a `RollingCache`. Needs `key_dim == value_dim`.
        cache_index (int | Tensor): Position of the first token
            of `inputs` in the cache. An index whose tokens do not fit the
            cache raises a `ValueError` when its value is known (an int, a
            NumPy or host tensor); one that is traced (inside a compiled
            function) or on an accelerator is clipped so that they fit.
        segment_ids (Tensor | None): Shape `(B, T)`, integer. Packed sequences:
            positions attend only within equal ids; id `0` is padding; rotary
            positions restart at each sequence. Not with a `cache`.
        mask_mod (Callable | None): A mask mod for this call,
            `mask_mod(batch, head, q_idx, kv_idx) -> bool` (see
            `keras_attention.mods`), at sequence positions (also in a
            cached step); combined with every other mask. Defaults to
            `None`.
        score_mod (Callable | None): A score mod for this call, applied
            after the layer's own. Defaults to `None`.
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

        With a window of 3, a rolling cache of 3 positions decodes past
        any length at constant memory:

        >>> from keras_attention.layers import RollingCache
        >>> local = MultiHeadSelfAttention(num_heads=4, sliding_window=3)
        >>> cache = RollingCache(np.zeros((2, 2, 3, 4, 8), "float32"))
        >>> for index in range(6):
        ...     step, cache = local(
        ...         x[:, index : index + 1], cache=cache, cache_index=index
        ...     )
        >>> type(cache).__name__, tuple(cache.kv.shape)
        ('RollingCache', (2, 2, 3, 4, 8))

    References:
        Vaswani et al., "Attention Is All You Need", 2017. Ainslie et al.,
        "GQA: Training Generalized Multi-Query Transformer Models from
        Multi-Head Checkpoints", 2023.
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int | None = None,
        value_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        num_key_value_heads: int | None = None,
        use_rotary: bool = False,
        max_wavelength: float = 10000.0,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        sliding_window: int | tuple[int, int] | None = None,
        alibi: bool = False,
        logit_soft_cap: float | None = None,
        use_qk_norm: bool = False,
        score_mod=None,
        **kwargs,
    ):
        super().__init__(
            num_heads=num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            dropout=dropout,
            use_bias=use_bias,
            num_key_value_heads=num_key_value_heads,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            sliding_window=sliding_window,
            alibi=alibi,
            logit_soft_cap=logit_soft_cap,
            use_qk_norm=use_qk_norm,
            score_mod=score_mod,
            **kwargs,
        )
        checks.check_flag(self._where(), "use_rotary", use_rotary)
        self.use_rotary = use_rotary
        self.max_wavelength = checks.check_wavelength(
            self._where(), max_wavelength
        )

    def build(self, inputs_shape):
        self._build_heads(
            inputs_shape,
            inputs_shape,
            inputs_shape,
            name="inputs",
            use_rotary=self.use_rotary,
        )
        if self.use_rotary:
            self.rotary_embedding = RotaryEmbedding(
                self.max_wavelength,
                dtype=policy_for(self, "rotary_embedding"),
                name="rotary_embedding",
            )
            # Built now: `Model.quantize` refuses an unbuilt leaf.
            self.rotary_embedding.build(
                (None, None, self.num_heads, self._head_dim)
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
        training=None,
        segment_ids=None,
        mask_mod=None,
        score_mod=None,
        mask=None,
        inputs_mask=None,
    ):
        checks.check_flag(self._where(), "use_causal_mask", use_causal_mask)
        checks.check_flag(
            self._where(), "return_attention_scores", return_attention_scores
        )
        if cache is not None:
            if segment_ids is not None:
                raise ValueError(
                    f"{self._where()}: `segment_ids` (packed sequences) "
                    "cannot be combined with a `cache`; decode each sequence "
                    "in its own row, with `padding_mask`. Received: "
                    f"segment_ids.shape={tuple(ops.shape(segment_ids))}"
                )
            return self._call_cached(
                inputs,
                cache,
                cache_index,
                padding_mask,
                attention_mask,
                use_causal_mask,
                return_attention_scores,
                training,
                (mask_mod, score_mod),
            )
        if padding_mask is None:
            padding_mask = mask if mask is not None else inputs_mask
        batch, length = inputs.shape[0], inputs.shape[1]
        self._check_mask("padding_mask", padding_mask, (batch, length))
        checks.check_attention_mask(
            self._where(),
            "attention_mask",
            attention_mask,
            (batch, length, length),
        )
        self._check_segments(segment_ids, batch, length, length)
        full_mask = functional.merge_masks(
            functional.padding_to_attention_mask(padding_mask),
            checks.as_attention_mask(attention_mask, ops.shape(inputs)[1]),
        )  # (B, T, T)
        # Packed sequences restart their rotary positions.
        query, key, value = self._project(inputs, segment_ids=segment_ids)
        outputs, scores = self._attend(
            query,
            key,
            value,
            full_mask,
            is_causal=use_causal_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            segment_ids=segment_ids,
            mask_mod=mask_mod,
            score_mod=score_mod,
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
        training=None,
        segment_ids=None,
        mask_mod=None,
        score_mod=None,
        mask=None,
        inputs_mask=None,
    ):
        batch, length = inputs.shape[0], inputs.shape[1]
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        key_length = length
        if cache is not None:
            kind = kv_cache.kind_of(cache, self._where(), self.sliding_window)
            key_length = kind.key_length(length)
        scores = keras.KerasTensor(
            (batch, self.num_heads, length, key_length),
            dtype=self.compute_dtype,
        )
        result = (outputs, scores) if return_attention_scores else (outputs,)
        if cache is not None:
            new_cache = keras.tree.map_structure(
                lambda c: keras.KerasTensor(c.shape, c.dtype), cache
            )
            result = (*result, new_cache)
        return result[0] if len(result) == 1 else result

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "use_rotary": self.use_rotary,
                "max_wavelength": self.max_wavelength,
            }
        )
        return config

    def _project(self, inputs, start_index=0, segment_ids=None):
        """Query `(B, T, N, H)`, key and value `(B, T, K, H)` heads of
        `inputs`, rotated from `start_index` (or restarting at each packed
        sequence) with `use_rotary`."""
        query = self._project_query(inputs, "inputs")
        key, value = self._project_key_value(inputs, inputs, ("inputs",) * 2)
        if self.use_rotary:
            query = self._rotate(query, start_index, segment_ids)
            key = self._rotate(key, start_index, segment_ids)
        return query, key, value

    def _rotate(self, heads, start_index, segment_ids):
        """Rotary positions; packed sequences restart at position 0."""
        if segment_ids is None:
            return self.rotary_embedding(heads, start_index=start_index)
        return self.rotary_embedding(heads, segment_ids=segment_ids)

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
        mods=(None, None),
    ):
        """One call with a KV cache of either kind (see `kv_cache`): the
        cache says what the queries attend over and what it becomes. The
        mods see the queries at positions `cache_index + i` and the keys at
        their positions (the rolling cache's start at `cache_index - R`)."""
        kind = kv_cache.kind_of(cache, self._where(), self.sliding_window)
        self._check_cache(inputs, kind.tensor, cache_index)
        cache_index = kind.check(
            inputs.shape[0],
            inputs.shape[1],
            cache_index,
            padding_mask,
            attention_mask,
        )
        query, key, value = self._project(inputs, start_index=cache_index)
        view = kind.update(
            key, value, cache_index, padding_mask, attention_mask
        )
        outputs, scores = self._attend(
            query,
            ops.cast(view.keys, query.dtype),
            ops.cast(view.values, query.dtype),
            view.visible,
            is_causal=use_causal_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            offset=view.offset,
            mask_mod=mods[0],
            score_mod=mods[1],
            starts=(cache_index, cache_index - view.offset),
        )
        if return_attention_scores:
            return outputs, scores, view.cache
        return outputs, view.cache

    def _check_cache(self, inputs, cache, cache_index):
        """What both kinds of cache need: `(B, 2, ., K, H)`, equal key and
        value head dims, and an index."""
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
