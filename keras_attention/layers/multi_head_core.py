"""The multi-head core shared by self- and cross-attention.

Shape legend: B batch, T query length, S key/value length, D model dim,
N query heads, K key/value heads, H head dim, V value head dim.
"""

import keras

from keras_attention import _core
from keras_attention import _kernels
from keras_attention import functional
from keras_attention._core import Structure
from keras_attention._core import mods as mods_
from keras_attention.layers import checks
from keras_attention.layers import sublayers
from keras_attention.layers.sublayers import LoraMixin
from keras_attention.layers.sublayers import call_leaf
from keras_attention.layers.sublayers import fresh
from keras_attention.layers.sublayers import policy_for


class MultiHeadCore(LoraMixin, keras.layers.Layer):
    """Projections to heads, attention through `functional`, output mix.

    $$\\operatorname{MultiHead}(Q, K, V) =
    \\operatorname{Concat}(\\text{head}_1, \\dots, \\text{head}_N) W^O,
    \\quad \\text{head}_n = \\operatorname{Attention}(Q W^Q_n, K W^K_n,
    V W^V_n)$$

    Not used directly: `MultiHeadSelfAttention` and `CrossAttention` add
    their call signatures. The projection kernels have the shapes of
    `keras.layers.MultiHeadAttention` (`(D, N, H)` for queries, `(N, V, D)`
    for the output), so weights can be copied between the two.
    """

    _default_lora_targets = ("query_dense", "value_dense")

    def __init__(
        self,
        num_heads: int,
        key_dim: int | None = None,
        value_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        num_key_value_heads: int | None = None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        sliding_window: int | tuple[int, int] | None = None,
        alibi: bool = False,
        logit_soft_cap: float | None = None,
        use_qk_norm: bool = False,
        score_mod=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(score_mod, dict):  # from a config
            score_mod = keras.saving.deserialize_keras_object(score_mod)
        self.score_mod = mods_.check_mod(self._where(), "score_mod", score_mod)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.num_key_value_heads = num_key_value_heads
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        if isinstance(sliding_window, list):  # from a JSON config
            sliding_window = tuple(sliding_window)
        self.sliding_window = sliding_window
        self.alibi = alibi
        self.logit_soft_cap = logit_soft_cap
        self.use_qk_norm = use_qk_norm
        checks.check_head_arguments(
            self._where(),
            num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            num_key_value_heads=num_key_value_heads,
            dropout=dropout,
            use_qk_norm=use_qk_norm,
            sliding_window=sliding_window,
            alibi=alibi,
            logit_soft_cap=logit_soft_cap,
            use_bias=use_bias,
        )
        self.supports_masking = True

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "num_key_value_heads": self.num_key_value_heads,
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
                "score_mod": mods_.serialize_mod(self.score_mod),
            }
        )
        return sublayers.dtype_config(self, config)

    @property
    def kv_heads(self) -> int:
        """K, the number of key/value heads."""
        return self.num_key_value_heads or self.num_heads

    def explain(
        self,
        length,
        key_length=None,
        use_causal_mask: bool = False,
        segment_ids=None,
        return_attention_scores: bool = False,
        training: bool = False,
        batch_size: int | None = None,
        mask_mod=None,
        score_mod=None,
    ):
        """Which attention path a call of the built layer takes, and why.

        As `keras_attention.functional.explain`, for the layer's heads,
        dtype and structure (window, ALiBi, soft cap) at `length` queries
        and `key_length` keys (defaults to `length`). Nothing is computed:
        a tensor given as `length` is read for its shape only.

        Args:
            length (int | Tensor | tuple): T, the number of queries, or the
                queries themselves (the tensor the layer would be called
                on, or its shape `(B, T, D)`), which also give B.
            key_length (int | Tensor | tuple | None): S, or the keys'
                tensor or shape `(B, S, D)`. Defaults to `length`.
            use_causal_mask: As in `call`. Defaults to `False`.
            segment_ids (Tensor | None): Shape `(batch_size, T)`, integer.
            return_attention_scores: Defaults to `False`.
            training: Attention dropout is active in training.
                Defaults to `False`.
            batch_size: B. Defaults to the batch of a tensor given as
                `length` or `key_length`, else `1`.
            mask_mod: As in `call`. Defaults to `None`.
            score_mod: As in `call` (after the layer's own). Defaults to
                `None`.

        Returns:
            Explanation: With `.path`, `.refused` and `.structure`.
        """
        if not self.built:
            raise ValueError(
                f"{self._where()}: `explain` needs a built layer (call it "
                "once or call `build`). Received: an unbuilt layer"
            )
        checks.check_flag(self._where(), "use_causal_mask", use_causal_mask)
        batch, length = checks.explain_size(
            self._where(), "length", length, "T"
        )
        key_batch, key_length = (
            (batch, length)
            if key_length is None
            else checks.explain_size(
                self._where(), "key_length", key_length, "S"
            )
        )
        known_batch = batch_size or batch or key_batch  # None: any batch
        batch_size = known_batch or 1
        dtype = self.compute_dtype
        query = keras.KerasTensor(
            (batch_size, length, self.num_heads, self._head_dim), dtype
        )
        key = keras.KerasTensor(
            (batch_size, key_length, self.kv_heads, self._head_dim), dtype
        )
        value = keras.KerasTensor(
            (batch_size, key_length, self.kv_heads, self._value_head_dim),
            dtype,
        )
        self._check_segments(segment_ids, batch_size, length, key_length)
        structure = Structure.from_args(
            where=self._where(),
            batch=known_batch,
            query_length=length,
            key_length=key_length,
            is_causal=bool(use_causal_mask),
            sliding_window=self.sliding_window,
            segment_ids=segment_ids,
            alibi=self.alibi,
            logit_soft_cap=self.logit_soft_cap,
            mask_mod=mods_.check_mod(self._where(), "mask_mod", mask_mod),
            score_mod=mods_.chained(
                mods_.as_mod(self.score_mod),
                mods_.check_mod(self._where(), "score_mod", score_mod),
            ),
        )
        dropout = self.dropout > 0 and training
        reason = None
        if dropout:
            reason = "attention dropout in training needs the weights"
        return _kernels.explain_call(
            query,
            key,
            value,
            None,
            structure,
            dropout or return_attention_scores,
            reason,
        )

    def _where(self):
        return f"{type(self).__name__} (layer '{self.name}')"

    def _build_heads(
        self, query_shape, key_shape, value_shape, name=None, use_rotary=False
    ):
        """Creates the projections for inputs of the given shapes.

        `name` is the argument error messages name for all three (a
        self-attention layer's single `inputs`); `use_rotary` asks for an
        even head dim.
        """
        self._check_input_shapes(query_shape, key_shape, value_shape, name)
        model_dim = query_shape[-1]
        self._input_dims = {
            "query": model_dim,
            "key": key_shape[-1],
            "value": value_shape[-1],
        }
        self._head_dim = checks.head_dim(
            self._where(),
            name or "query",
            query_shape,
            self.num_heads,
            self.key_dim,
            use_rotary,
        )
        self._value_head_dim = self.value_dim or self._head_dim
        n, k = self.num_heads, self.kv_heads
        h, v = self._head_dim, self._value_head_dim
        self.query_dense = self._einsum(
            "btd,dnh->btnh", (None, n, h), "nh", "query_dense", query_shape
        )
        self.key_dense = self._einsum(
            "bsd,dkh->bskh", (None, k, h), "kh", "key_dense", key_shape
        )
        self.value_dense = self._einsum(
            "bsd,dkv->bskv", (None, k, v), "kv", "value_dense", value_shape
        )
        self.output_dense = self._einsum(
            "btnv,nvd->btd",
            (None, model_dim),
            "d",
            "output_dense",
            (None, None, n, v),
        )
        if self.use_qk_norm:
            self.query_norm = self._rms_norm("query_norm", (None, None, n, h))
            self.key_norm = self._rms_norm("key_norm", (None, None, k, h))
        if isinstance(self.score_mod, keras.Layer) and not self.score_mod.built:
            self.score_mod.build((None, n, None, None))  # the scores
        self.attention_dropout = keras.layers.Dropout(
            self.dropout,
            dtype=policy_for(self, "attention_dropout"),
            name="attention_dropout",
        )

    def _check_input_shapes(
        self, query_shape, key_shape, value_shape, name=None
    ):
        """Each input is `(B, T, D)` with a known D (see `_build_heads`)."""
        for arg, shape in (
            (name or "query", query_shape),
            (name or "value", value_shape),
            (name or "key", key_shape),
        ):
            if len(shape) != 3 or shape[-1] is None:
                raise ValueError(
                    f"{self._where()}: `{arg}` must be (B, T, D) with a "
                    f"known D. Received: {arg}.shape={tuple(shape)}"
                )

    def _einsum(self, equation, output_shape, bias_axes, name, input_shape):
        layer = keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=fresh(self.kernel_initializer),
            bias_initializer=fresh(self.bias_initializer),
            dtype=policy_for(self, name),
            name=name,
        )
        # Masks are handled by this layer; the projections only pass the
        # implicit Keras mask along instead of warning that they drop it.
        layer.supports_masking = True
        layer.build(input_shape)
        return layer

    def _rms_norm(self, name, input_shape):
        """RMS normalisation over the head dim, one learned scale per
        feature shared by the heads."""
        layer = keras.layers.RMSNormalization(
            epsilon=1e-6, dtype=policy_for(self, name), name=name
        )
        layer.build(input_shape)
        return layer

    def _check_input_dim(self, projection, name, tensor):
        """`tensor` has the feature dim its projection was built for."""
        checks.check_built_dim(
            self._where(), name, tensor, self._input_dims[projection]
        )

    def _project_query(self, query, name="query"):
        self._check_input_dim("query", name, query)
        heads = call_leaf(self.query_dense, query)  # (B, T, N, H)
        if self.use_qk_norm:
            heads = call_leaf(self.query_norm, heads)
        return heads

    def _project_key_value(self, key, value, names=("key", "value")):
        self._check_input_dim("key", names[0], key)
        self._check_input_dim("value", names[1], value)
        key_heads = call_leaf(self.key_dense, key)  # (B, S, K, H)
        if self.use_qk_norm:
            key_heads = call_leaf(self.key_norm, key_heads)
        return key_heads, call_leaf(self.value_dense, value)  # (B, S, K, V)

    def _attend(
        self,
        query_heads,
        key_heads,
        value_heads,
        mask=None,
        is_causal=False,
        return_attention_scores=False,
        training=None,
        segment_ids=None,
        offset=None,
        mask_mod=None,
        score_mod=None,
        starts=(None, None),
    ):
        """Attention over heads and the output projection, with the
        layer's structure (window, ALiBi, soft cap, its score mod, then
        the call's); with `offset`, the queries stand at positions
        `offset + i` among the keys (a static-size KV cache). The mods see
        query `i` at position `starts[0] + i` and key `j` at `starts[1] +
        j` (a cached step).

        Returns `(outputs, scores)`, scores `(B, N, T, S)` or `None`.
        """
        scores = None
        mods_.check_mod(self._where(), "mask_mod", mask_mod)
        mods_.check_mod(self._where(), "score_mod", score_mod)
        if isinstance(score_mod, keras.Layer) and not score_mod.built:
            score_mod.build((None, self.num_heads, None, None))
        score_mod = mods_.chained(
            mods_.as_mod(self.score_mod), mods_.as_mod(score_mod)
        )
        structure = Structure.of_call(
            self._where(),
            query_heads,
            key_heads,
            offset=offset,
            is_causal=bool(is_causal),
            sliding_window=self.sliding_window,
            segment_ids=segment_ids,
            alibi=self.alibi,
            logit_soft_cap=self.logit_soft_cap,
            mask_mod=mods_.positioned(mask_mod, *starts),
            score_mod=mods_.positioned(score_mod, *starts),
            # A cached step: the mods index the sequence, not the call.
            starts=starts,
        )
        if self.dropout > 0 and training:
            scores = _core.reference_weights(
                query_heads, key_heads, mask, structure
            )  # (B, N, T, S)
            dropped = self.attention_dropout(scores, training=training)
            heads = functional.attend(dropped, value_heads)  # (B, T, N, V)
        else:
            heads = _kernels.attention(
                query_heads,
                key_heads,
                value_heads,
                mask,
                structure,
                return_weights=return_attention_scores,
            )  # (B, T, N, V)
            if return_attention_scores:
                heads, scores = heads
        return call_leaf(self.output_dense, heads), scores  # (B, T, D)

    def _check_segments(self, segment_ids, batch, length, key_length):
        Structure.from_args(
            where=self._where(),
            batch=batch,
            query_length=length,
            key_length=key_length,
            segment_ids=segment_ids,
        )

    def _check_mask(self, name, mask, expected):
        checks.check_mask(self._where(), name, mask, expected)
