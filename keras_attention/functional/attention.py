"""Scaled dot-product attention, and its operation in functional models.

Shape legend: B batch, T query length, S key/value length, D model dim,
N query heads, K key/value heads, H head dim (query/key), V value head
dim.
"""

from collections.abc import Callable

import keras
from keras import ops

from keras_attention import _core
from keras_attention import _kernels
from keras_attention._core import Structure
from keras_attention._core.checks import check_flag
from keras_attention._core.checks import finite_number

_FN = "scaled_dot_product_attention"


def scaled_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    is_causal: bool | str = False,
    scale: float | None = None,
    return_attention_scores: bool = False,
    sliding_window: int | tuple[int, int] | None = None,
    segment_ids=None,
    alibi: bool = False,
    logit_soft_cap: float | None = None,
    mask_mod: Callable | None = None,
    score_mod: Callable | None = None,
):
    """Scaled dot-product attention, on the backend's fastest exact path.

    $$\\operatorname{Attention}(Q, K, V) =
    \\operatorname{softmax}\\left(\\frac{QK^\\top}{\\sqrt{H}}\\right)V$$

    Works on single-head `(B, T, H)` and multi-head `(B, T, N, H)` tensors.
    Multi-head keys and values may have fewer heads `K` than the queries
    (grouped-query attention, `N % K == 0`; query head `n` uses key/value
    head `n // (N // K)`).

    A query row with no visible key gets all-zero weights and an all-zero
    output in every dtype. For `float16`/`bfloat16` inputs the logits and
    the softmax are computed in `float32`.

    Without `return_attention_scores` the computation takes the fastest
    exact path the backend has: PyTorch's fused kernel (and cuDNN's on a
    JAX GPU), or, on TensorFlow and JAX on CPU for 512 queries or more
    and 256 keys or more, blockwise attention with an online softmax and
    a backward pass that recomputes each block (as in FlashAttention), so
    that memory grows with the sequence length, not its square. There it
    runs where it is estimated faster than the reference (JAX; on
    TensorFlow where the structure skips enough blocks) or where the
    reference's `(B, N, T, S)` weights would take over 1 GiB;
    `explain()` gives the estimate. On PyTorch's CPU the blockwise path
    replaces the fused kernel, from 512 queries and 256 keys, where a
    sliding window, segment ids or a mask mod leave at most 30% of the
    block pairs. With `is_causal=True` the blocks above the diagonal are
    skipped, which saves about half of the work for $T = S$; a sliding
    window skips every block outside it. Every path gives the same
    outputs and gradients; the weights, when asked for, come from the
    reference computation. On `keras.Input` tensors the function builds
    an operation of a functional model.

    Structure is given as arguments rather than as a dense mask, so that
    each path applies it without an $O(T \\times S)$ tensor where it can.
    Query $i$ stands at position $p = i$ among the keys (top-left
    alignment) or $p = i + S - T$ (bottom-right: the queries are the last
    `T` of `S` positions, as when new tokens attend to a KV cache).
    `is_causal` hides the keys after $p$; `sliding_window` keeps a band of
    keys around $p$; `segment_ids` keeps each query inside its own packed
    sequence. They combine with each other and with `mask`.

    Args:
        query (Tensor): Shape `(B, T, H)` or `(B, T, N, H)`.
        key (Tensor): Shape `(B, S, H)` or `(B, S, K, H)`.
        value (Tensor): Shape `(B, S, V)` or `(B, S, K, V)`.
        mask (Tensor | None): Boolean, `True` = attend, or `None`. For 3-D
            inputs it broadcasts to `(B, T, S)`; for 4-D inputs it broadcasts to
            `(B, N, T, S)`, and a 3-D `(B, T, S)` mask is shared by all heads.
            Defaults to `None`.
        is_causal: Also hide the keys after each query's
            position. `True` or `"top_left"`: query $i$ sees keys
            $j \\le i$ (as in `keras.ops.dot_product_attention`, PyTorch and
            JAX). `"bottom_right"`: query $i$ sees keys $j \\le i + S - T$
            (the queries are the last `T` positions). Defaults to `False`.
        scale: Multiplies the logits. Defaults to
            `1 / sqrt(H)`.
        return_attention_scores: Also return the attention weights.
            Defaults to `False`.
        sliding_window: Local attention
            around each query's position $p$ (aligned as `is_causal`
            says; top-left without it). An int $w$ keeps the $w$ keys
            $p - w < j \\le p$ (the query's own position and the $w - 1$
            before it: a causal window, as in Mistral); a pair
            `(left, right)` keeps the keys
            $p - \\text{left} \\le j \\le p + \\text{right}$ (bidirectional
            local attention). Defaults to `None` (no window).
        segment_ids (Tensor | tuple[Tensor, Tensor] | None): Integer ids
            `(B, T)`, or a tuple `(query_ids (B, T), key_ids (B, S))`. Packed
            sequences: query $i$ sees
            key $j$ only when their ids are equal; id `0` marks padding (such
            keys are hidden, such queries get zeros). One tensor serves queries
            and keys when $T = S$. Defaults to `None`.
        alibi: Adds the linear biases of ALiBi (Press et al. 2022)
            to the logits, $-m_n |p_i - j|$ with the slope $m_n$ of head
            $n$ (positions aligned as `is_causal` says). Defaults to
            `False`.
        logit_soft_cap: Caps the logits smoothly,
            $c \\tanh(s / c)$ of the logits $s$ with $c$ =
            `logit_soft_cap` (Gemma 2), before the ALiBi bias;
            in float32 for half-precision inputs. Defaults to `None`.
        mask_mod: Any visibility rule, as a function
            `mask_mod(batch, head, q_idx, kv_idx) -> bool` (`True` =
            attend) of int32 index tensors that broadcast to `(B, N, T, S)`
            (`head` is 0 for 3-D inputs): `q_idx` and `kv_idx` index the
            query and key tensors. A path may call it on any block of that
            grid, so it must be elementwise; `keras_attention.mods` has the
            common ones. Defaults to `None`.
        score_mod: Any change of the logits, as a function
            `score_mod(score, batch, head, q_idx, kv_idx) -> score` of the
            scaled logits (float32 for half-precision inputs) and the same
            indices, returning logits of the same shape; applied before
            `logit_soft_cap` and `alibi`. Tensors and Keras variables it
            holds (a bias table) get gradients on every path. Defaults to
            `None`.

    Returns:
        Tensor | tuple[Tensor, Tensor]: The output, `(B, T, V)` or
            `(B, T, N, V)`; with `return_attention_scores=True` the tuple
            `(output, weights)` with weights `(B, T, S)` or `(B, N, T, S)`.

    Examples:
        One query, two keys: the first key matches the query better and
        gets most of the weight.

        >>> import keras
        >>> import numpy as np
        >>> q = np.array([[[2.0]]], "float32")
        >>> k = np.array([[[2.0], [1.0]]], "float32")
        >>> v = np.array([[[10.0], [4.0]]], "float32")
        >>> out, w = scaled_dot_product_attention(
        ...     q, k, v, return_attention_scores=True
        ... )
        >>> print(np.round(keras.ops.convert_to_numpy(w), 3))
        [[[0.881 0.119]]]
        >>> print(np.round(keras.ops.convert_to_numpy(out), 3))
        [[[9.285]]]

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """
    arguments = dict(
        is_causal=is_causal,
        sliding_window=sliding_window,
        segment_ids=segment_ids,
        alibi=alibi,
        logit_soft_cap=logit_soft_cap,
        mask_mod=mask_mod,
        score_mod=score_mod,
    )
    check_flag(_FN, "return_attention_scores", return_attention_scores)
    if scale is not None:
        scale = finite_number(_FN, "scale", scale)
    segments = _segment_pair(segment_ids)
    if _any_symbolic(query, key, value, mask, *segments):
        _core.check_inputs(_FN, query, key, value, mask)
        Structure.of_call(_FN, query, key, **arguments)
        operation = _Attention(
            is_causal,
            scale,
            return_attention_scores,
            sliding_window,
            alibi,
            logit_soft_cap,
            mask_mod,
            score_mod,
        )
        return operation(query, key, value, mask, *segments)
    query, key, value = (ops.convert_to_tensor(x) for x in (query, key, value))
    mask = _core.check_inputs(_FN, query, key, value, mask)
    structure = Structure.of_call(_FN, query, key, **arguments)
    return _kernels.attention(
        query,
        key,
        value,
        mask,
        structure,
        scale,
        return_weights=return_attention_scores,
    )


@keras.saving.register_keras_serializable(
    package="keras_attention", name="ScaledDotProductAttention"
)
class _Attention(keras.Operation):
    """`scaled_dot_product_attention` as an operation of a functional
    model: traced on `keras.Input` by its output spec, run on the path the
    dispatch picks when the model is called."""

    def __init__(
        self,
        is_causal,
        scale,
        return_attention_scores,
        sliding_window=None,
        alibi=False,
        logit_soft_cap=None,
        mask_mod=None,
        score_mod=None,
        name=None,
    ):
        super().__init__(name=name)
        self.mask_mod = _deserialize(mask_mod)
        self.score_mod = _deserialize(score_mod)
        self.is_causal = is_causal
        self.scale = scale
        self.return_attention_scores = return_attention_scores
        self.sliding_window = sliding_window
        self.alibi = alibi
        self.logit_soft_cap = logit_soft_cap

    def call(self, query, key, value, mask=None, query_ids=None, key_ids=None):
        return scaled_dot_product_attention(
            query,
            key,
            value,
            mask=mask,
            is_causal=self.is_causal,
            scale=self.scale,
            return_attention_scores=self.return_attention_scores,
            sliding_window=self.sliding_window,
            segment_ids=_segment_argument(query_ids, key_ids),
            alibi=self.alibi,
            logit_soft_cap=self.logit_soft_cap,
            mask_mod=self.mask_mod,
            score_mod=self.score_mod,
        )

    def compute_output_spec(
        self, query, key, value, mask=None, query_ids=None, key_ids=None
    ):
        _core.check_inputs(_FN, query, key, value, mask)
        Structure.of_call(
            _FN,
            query,
            key,
            is_causal=self.is_causal,
            sliding_window=self.sliding_window,
            segment_ids=_segment_argument(query_ids, key_ids),
            alibi=self.alibi,
            logit_soft_cap=self.logit_soft_cap,
            mask_mod=self.mask_mod,
            score_mod=self.score_mod,
        )
        output = keras.KerasTensor(
            (*query.shape[:-1], value.shape[-1]),
            dtype=keras.backend.standardize_dtype(value.dtype),
        )
        if not self.return_attention_scores:
            return output
        batch, query_length = query.shape[0], query.shape[1]
        heads = () if len(query.shape) == 3 else (query.shape[2],)
        weights = keras.KerasTensor(
            (batch, *heads, query_length, key.shape[1]),
            dtype=keras.backend.standardize_dtype(query.dtype),
        )
        return output, weights

    def get_config(self):
        return {
            "name": self.name,
            "is_causal": self.is_causal,
            "scale": self.scale,
            "return_attention_scores": self.return_attention_scores,
            "sliding_window": self.sliding_window,
            "alibi": self.alibi,
            "logit_soft_cap": self.logit_soft_cap,
            "mask_mod": _serialize(self.mask_mod),
            "score_mod": _serialize(self.score_mod),
        }


def _serialize(mod):
    """A mod as Keras serializes any callable (a registered class by its
    config, a plain function by name or, unsafely, its code)."""
    return None if mod is None else keras.saving.serialize_keras_object(mod)


def _deserialize(mod):
    if isinstance(mod, dict):
        return keras.saving.deserialize_keras_object(mod)
    return mod


def _segment_pair(segment_ids):
    """`(query_ids, key_ids)`, each a tensor or `None`."""
    if isinstance(segment_ids, tuple) and len(segment_ids) == 2:
        return tuple(segment_ids)
    return segment_ids, None


def _segment_argument(query_ids, key_ids):
    """`segment_ids` as the user gave it: one tensor, a pair or `None`."""
    return query_ids if key_ids is None else (query_ids, key_ids)


def _any_symbolic(*tensors) -> bool:
    return any(isinstance(x, keras.KerasTensor) for x in tensors)
