"""Multi-head cross-attention: queries from one sequence, keys/values from
another.

Shape legend: B batch, T query length, S key/value length, D model dim,
N query heads, K key/value heads, H head dim.
"""

import keras
from keras import ops

from keras_attention import functional
from keras_attention.layers import checks
from keras_attention.layers.multi_head_core import MultiHeadCore


@keras.saving.register_keras_serializable(package="keras_attention")
class CrossAttention(MultiHeadCore):
    """Multi-head attention of one sequence over another.

    The decoder's states ask (queries) and the encoder's states answer
    (keys and values), as in the Transformer's encoder–decoder attention:

    $$\\text{head}_n = \\operatorname{softmax}\\left(
    \\frac{Y W^Q_n (X W^K_n)^\\top}{\\sqrt{H}} + M\\right) X W^V_n,
    \\quad Z = [\\text{head}_1; \\dots; \\text{head}_N] W^O$$

    The output has the query's model dim. Keys and values do not depend on
    the queries, so a decoder computes them once per source with
    `compute_cache` and passes the result as `cache` at every step.

    There is no rotary position embedding (`use_rotary` of
    `MultiHeadSelfAttention`): queries and keys come from different
    sequences, whose positions do not correspond. Passing `use_rotary` or
    `max_wavelength` raises Keras's `ValueError` for an unknown argument.

    Args:
        num_heads: Number of query heads N.
        key_dim: Head dim H of queries and keys. Defaults to
            `Dq // num_heads` (then Dq must be divisible by N).
        value_dim: Head dim of values. Defaults to `key_dim`.
        dropout: Dropout rate on the attention weights during
            training. Defaults to `0.0`.
        use_bias: Biases in the projections. Defaults to `True`.
        num_key_value_heads: Number K of key/value heads, a divisor of
            `num_heads`. Defaults to `num_heads`.
        kernel_initializer (str | keras.initializers.Initializer): Defaults to
            `"glorot_uniform"`.
        bias_initializer (str | keras.initializers.Initializer): Defaults to
            `"zeros"`.
        sliding_window: Local attention: query `i` sees source positions `i -
            left` to `i + right` (an int `w` is `(w - 1, 0)`), as in Luong et
            al.'s local attention with monotonic alignment. Defaults to `None`.
        alibi: ALiBi position biases $-m_n |i - j|$. Defaults to
            `False`.
        logit_soft_cap: Soft cap $c$ of the logits $s$, which become
            $c \\tanh(s / c)$. Defaults to `None`.
        use_qk_norm: RMS-normalise each head's queries and keys
            (see `MultiHeadSelfAttention`). Defaults to `False`.
        score_mod: A score mod applied to every call's logits (see
            `MultiHeadSelfAttention`), a callable or a Keras layer, which is
            then tracked, trained and saved. Defaults to `None`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        query (Tensor): Shape `(B, T, Dq)`.
        value (Tensor): Shape `(B, S, Dv)`. May be `None` when `cache` is
            given; if given with it, its `S` must be the cache's.
        key (Tensor): Shape `(B, S, Dk)`. Defaults to `value`.
        value_mask (Tensor): Shape `(B, S)`, boolean, `True` for real source
            tokens. Defaults to the Keras mask of `value`.
        key_mask (Tensor): Shape `(B, S)`, boolean. Defaults to the Keras
            mask of `key`; a key is hidden where either mask is false.
        attention_mask (Tensor): Shape `(B, T, S)`, boolean, `True` = attend;
            as in Keras, any shape that broadcasts to it, such as a `(T, S)`
            mask shared by the batch.
        cache (Tensor): Shape `(B, 2, S, K, H)` from `compute_cache`: the
            projected keys and values, used instead of projecting `key`/`value`.
        return_attention_scores (bool): Also return the weights
            `(B, N, T, S)`.
        segment_ids (tuple[Tensor, Tensor] | None): Integer `(query_ids (B, T),
            source_ids (B, S))`. Packed pairs of sequences: a query attends only
            to the source positions of its own id; id `0` is padding. Defaults
            to `None`.
        mask_mod (Callable | None): A mask mod for this call (see
            `keras_attention.mods`); `q_idx` is the query's position in
            its sequence (see `start_index`), `kv_idx` indexes the source.
            Defaults to `None`.
        score_mod (Callable | None): A score mod for this call, applied
            after the layer's own. Defaults to `None`.
        training (bool): Whether dropout is active.
        start_index (int | Tensor): The position of the first query in
            its sequence, as the mods see it: in a decoding step of one
            query at position `t`, `start_index=t`. Defaults to `0`.

    Returns:
        Tensor | tuple[Tensor, Tensor]: `outputs` `(B, T, Dq)`, or
            `(outputs, scores)`.

    Examples:
        >>> import numpy as np
        >>> layer = CrossAttention(num_heads=2)
        >>> decoder = np.random.rand(2, 4, 16).astype("float32")
        >>> encoder = np.random.rand(2, 9, 24).astype("float32")
        >>> out, scores = layer(decoder, encoder, return_attention_scores=True)
        >>> tuple(out.shape), tuple(scores.shape)
        ((2, 4, 16), (2, 2, 4, 9))

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        self._build_heads(query_shape, key_shape, value_shape)
        checks.check_batch_and_length(
            self._where(), query_shape, value_shape, key_shape
        )
        self.built = True

    def call(
        self,
        query,
        value,
        key=None,
        value_mask=None,
        attention_mask=None,
        return_attention_scores: bool = False,
        training=None,
        cache=None,
        segment_ids=None,
        mask_mod=None,
        score_mod=None,
        start_index=0,
        key_mask=None,
    ):
        batch, length = query.shape[0], query.shape[1]
        checks.check_flag(
            self._where(), "return_attention_scores", return_attention_scores
        )
        checks.check_start_index(self._where(), start_index)
        if cache is None:
            names = ("value" if key is None else "key", "value")
            key = value if key is None else key
            checks.check_batch_and_length(
                self._where(), query.shape, value.shape, key.shape
            )
            key_heads, value_heads = self._project_key_value(key, value, names)
        else:
            checks.check_shape(
                self._where(),
                "cache",
                cache,
                (batch, 2, None, self.kv_heads, self._head_dim),
            )
            checks.check_cache_source(
                self._where(), cache, value=value, key=key
            )
            key_heads = ops.cast(cache[:, 0], query.dtype)  # (B, S, K, H)
            value_heads = ops.cast(cache[:, 1], query.dtype)  # (B, S, K, H)
        source_length = key_heads.shape[1]
        value_mask = checks.padding_of_keys(
            self._where(), value_mask, key_mask, (batch, source_length)
        )
        checks.check_attention_mask(
            self._where(),
            "attention_mask",
            attention_mask,
            (batch, length, source_length),
        )
        self._check_segments(segment_ids, batch, length, source_length)
        full_mask = functional.merge_masks(
            functional.padding_to_attention_mask(value_mask),
            checks.as_attention_mask(attention_mask, ops.shape(key_heads)[1]),
        )  # (B, T, S)
        outputs, scores = self._attend(
            self._project_query(query),
            key_heads,
            value_heads,
            full_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            segment_ids=segment_ids,
            mask_mod=mask_mod,
            score_mod=score_mod,
            # A cached step's queries stand at sequence positions.
            starts=(
                None
                if cache is None
                and isinstance(start_index, int)
                and start_index == 0
                else start_index,
                None,
            ),
        )
        if return_attention_scores:
            return outputs, scores
        return outputs

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        self._check_input_shapes(query_shape, key_shape, value_shape)
        checks.check_batch_and_length(
            self._where(), query_shape, value_shape, key_shape
        )
        return tuple(query_shape)

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        value_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        cache=None,
        segment_ids=None,
        mask_mod=None,
        score_mod=None,
        start_index=0,
        key_mask=None,
    ):
        outputs = keras.KerasTensor(query.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return outputs
        source_length = (value if cache is None else cache).shape[
            1 if cache is None else 2
        ]
        scores = keras.KerasTensor(
            (query.shape[0], self.num_heads, query.shape[1], source_length),
            dtype=self.compute_dtype,
        )
        return outputs, scores

    def compute_cache(self, value, key=None):
        """Projected keys and values of a source, computed once.

        Args:
            value (Tensor): Shape `(B, S, Dv)`.
            key (Tensor): Shape `(B, S, Dk)`. Defaults to `value`.

        Returns:
            Tensor: Shape `(B, 2, S, K, H)`, keys `[:, 0]`, values `[:, 1]`,
                for the `cache` argument of `call`. Needs
                `key_dim == value_dim`.
        """
        key = value if key is None else key
        if self._head_dim != self._value_head_dim:
            raise ValueError(
                f"{self._where()}: a cache needs `key_dim == value_dim`. "
                f"Received: key_dim={self._head_dim}, "
                f"value_dim={self._value_head_dim}"
            )
        key_heads, value_heads = self._project_key_value(key, value)
        return ops.stack([key_heads, value_heads], axis=1)  # (B, 2, S, K, H)
