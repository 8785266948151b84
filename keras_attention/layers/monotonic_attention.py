"""Monotonic attention (Raffel et al. 2017).

Shape legend: B batch, T query (decoder) steps, S source length,
Dq query dim, Dk key dim, Dv value dim, U units.
"""

import keras
import numpy as np
from keras import ops

from keras_attention import functional
from keras_attention.layers import checks
from keras_attention.layers.attention_mechanism import AttentionMechanism
from keras_attention.layers.bahdanau_attention import BahdanauAttention
from keras_attention.layers.luong_attention import LuongAttention
from keras_attention.layers.sublayers import fresh
from keras_attention.layers.sublayers import policy_for

_SCORES = ("bahdanau", "luong")
_MODES = ("parallel", "recursive", "hard")


@keras.saving.register_keras_serializable(package="keras_attention")
class MonotonicAttention(AttentionMechanism):
    """Attention that only moves forward along the source.

    At each output step the decoder scans the source from where it stopped
    last time and, at each position $j$, stops there with probability
    $p_{t,j} = \\sigma(e_{t,j} + r)$, where $e$ is a Bahdanau or Luong
    score and $r$ a learned offset (Raffel et al. 2017). In training the
    expected alignment over all the ways of stopping is used, which is
    differentiable:

    $$\\alpha_{t,j} = p_{t,j} \\sum_{k \\le j} \\alpha_{t-1,k}
    \\prod_{l=k}^{j-1} (1 - p_{t,l})$$

    `mode="recursive"` computes it with the recursion
    $q_{t,j} = (1 - p_{t,j-1})\\, q_{t,j-1} + \\alpha_{t-1,j}$,
    $\\alpha_{t,j} = p_{t,j}\\, q_{t,j}$;
    `mode="parallel"` in closed form with cumulative products (clipped
    inside the logarithm; float32 for half-precision inputs), which loses
    mass once the probabilities saturate (see
    `functional.monotonic_attention`); `mode="hard"` stops at the first
    position from the previous one where $e + r > 0$, so the alignment is
    one-hot (or zero when it runs off the end) and never moves backwards.
    The alignment starts one-hot on the first source position and does not
    sum to one in general: the missing mass is the probability of having
    stopped nowhere. The equations and their numbers are those of
    tensorflow-addons' `BahdanauMonotonicAttention` and
    `LuongMonotonicAttention`.

    Noise of standard deviation `sigmoid_noise` is added to the scores in
    training, which pushes the stopping probabilities towards 0 and 1 so
    that the hard alignment can replace the expected one at inference
    (`inference_mode="hard"`). tensorflow-addons adds it whenever
    `sigmoid_noise > 0`, at inference too: here it acts in training only,
    as in Raffel et al. 2017.

    Args:
        units: Size U of the projection. Required by `score="bahdanau"`;
            with `score="luong"` the keys are projected to the query's size,
            which `units` must then equal if given.
        score: `"bahdanau"` ($v^\\top \\tanh(W s + V h)$) or `"luong"`
            ($s^\\top W h$). Defaults to `"bahdanau"`.
        mode: `"parallel"`, `"recursive"` or `"hard"`. Defaults to
            `"parallel"`.
        sigmoid_noise: Standard deviation of the score noise in training.
            Defaults to `0.0`.
        score_bias_init: Initial offset $r$; a negative value makes the
            attention start by moving slowly. Defaults to `0.0`.
        normalize: Bahdanau score: weight-normalised $v$ with gain and
            bias, as `BahdanauAttention(normalize=True)`. Defaults to
            `False`.
        scale: Luong score: a learned scalar gain. Defaults to `False`.
        inference_mode: The mode used when not training, e.g. `"hard"`
            after training with `"parallel"`. Defaults to `mode`.
        dropout: Dropout rate on the attention weights during training.
            Defaults to `0.0`.
        kernel_initializer (str | keras.initializers.Initializer): Initializer
            of the projection kernels. Defaults to `"glorot_uniform"`.
        **kwargs (Any): Base `keras.layers.Layer` arguments (`name`, `dtype`,
            ...).

    Other Parameters: Call arguments:
        query (Tensor): Shape `(B, Dq)` (one decoder step) or `(B, T, Dq)`
            (T steps in order, each reading the alignment of the one before).
        value (Tensor): Shape `(B, S, Dv)`, the encoder states.
        key (Tensor): Shape `(B, S, Dk)`. Defaults to `value`.
        value_mask (Tensor): Shape `(B, S)`, boolean, `True` for real source
            tokens. Defaults to the Keras mask of `value`.
        key_mask (Tensor): Shape `(B, S)`, boolean. Defaults to the Keras
            mask of `key`; a key is hidden where either mask is false.
        return_attention_scores (bool): Also return the weights.
        training (bool): Whether dropout and score noise are active.
        attention_state (dict | None): `{"alignment": (B, S)}`, the
            alignment before the first query. Defaults to one-hot on the
            first source position.

    Returns:
        Tensor | tuple[Tensor, Tensor]: The context `(B, Dv)` or
            `(B, T, Dv)`, and with `return_attention_scores=True` also the
            weights `(B, S)` or `(B, T, S)`.

    Examples:
        >>> import numpy as np
        >>> layer = MonotonicAttention(units=8, mode="hard")
        >>> states = np.ones((2, 3, 16), "float32")     # s_1..s_3: (B, T, Dq)
        >>> encoder = np.ones((2, 5, 32), "float32")    # h: (B, S, Dv)
        >>> context, weights = layer(
        ...     states, encoder, return_attention_scores=True
        ... )
        >>> tuple(context.shape), tuple(weights.shape)
        ((2, 3, 32), (2, 3, 5))

    References:
        Raffel, Luong, Liu, Weiss and Eck, "Online and Linear-Time Attention
        by Enforcing Monotonic Alignments", ICML 2017.
    """

    attention_state_names = ("alignment",)

    def __init__(
        self,
        units: int | None = None,
        score: str = "bahdanau",
        mode: str = "parallel",
        sigmoid_noise: float = 0.0,
        score_bias_init: float = 0.0,
        normalize: bool = False,
        scale: bool = False,
        inference_mode: str | None = None,
        dropout: float = 0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(
            dropout=dropout, kernel_initializer=kernel_initializer, **kwargs
        )
        _check_arguments(
            self._where(),
            units=units,
            score=score,
            mode=mode,
            sigmoid_noise=sigmoid_noise,
            score_bias_init=score_bias_init,
            normalize=normalize,
            scale=scale,
            inference_mode=inference_mode,
        )
        self.units = units
        self.score = score
        self.mode = mode
        self.sigmoid_noise = float(sigmoid_noise)
        self.score_bias_init = float(score_bias_init)
        self.normalize = bool(normalize)
        self.scale = bool(scale)
        self.inference_mode = inference_mode
        self._noise_seed = None
        if self.sigmoid_noise:
            self._noise_seed = keras.random.SeedGenerator(
                name="score_noise_seed"
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "score": self.score,
                "mode": self.mode,
                "sigmoid_noise": self.sigmoid_noise,
                "score_bias_init": self.score_bias_init,
                "normalize": self.normalize,
                "scale": self.scale,
                "inference_mode": self.inference_mode,
            }
        )
        return config

    def project_keys(self, key):
        return self.scorer.project_keys(key)  # (B, S, U)

    def get_initial_attention_state(self, value, value_mask=None):
        # All mass on the first source position. A running count rather
        # than `one_hot(0, S)`, which needs S as a number (export).
        count = ops.cumsum(ops.ones_like(value[:, :, 0], "int32"), axis=1)
        alignment = ops.cast(ops.equal(count, 1), self._state_dtype())
        return {"alignment": alignment}  # (B, S)

    def next_attention_state(self, attention_state, weights):
        return {"alignment": ops.cast(weights, self._state_dtype())}

    def _build_score(self, query_dim, key_dim):
        if self.score == "luong" and self.units not in (None, query_dim):
            raise ValueError(
                f"{self._where()}: score='luong' projects the keys to the "
                "query's size, so `units` must equal the query dim. "
                f"Received: units={self.units}, query.shape[-1]={query_dim}"
            )
        # The score itself is Bahdanau's or Luong's, reused as a sublayer.
        if self.score == "bahdanau":
            self.scorer = BahdanauAttention(
                self.units,
                normalize=self.normalize,
                kernel_initializer=fresh(self.kernel_initializer),
                dtype=policy_for(self, "bahdanau_score"),
                name="bahdanau_score",
            )
        else:
            self.scorer = LuongAttention(
                "general",
                scale=self.scale,
                kernel_initializer=fresh(self.kernel_initializer),
                dtype=policy_for(self, "luong_score"),
                name="luong_score",
            )
        self.scorer.build((None, query_dim), (None, None, key_dim))
        self.score_offset = self.add_weight(
            name="score_offset",
            shape=(),
            initializer=keras.initializers.Constant(self.score_bias_init),
        )

    def draw_loop_noise(self, shape):
        noise = super().draw_loop_noise(shape)
        if self.sigmoid_noise:
            noise["score_noise"] = self._draw_score_noise(shape)
        return noise

    def _scores(self, query, projected_keys, attention_state, training, noise):
        scores = self.scorer._score(query, projected_keys)  # (B, T, S)
        scores = scores + ops.cast(self.score_offset, scores.dtype)
        if training and self.sigmoid_noise:
            if noise is None:
                noise = self._draw_score_noise(ops.shape(scores))
            scores = scores + ops.cast(noise, scores.dtype)
        return scores

    def _normalize(self, scores, mask, attention_state, training):
        # In float32 (or float64) whatever the compute dtype: the logits.
        previous = ops.cast(attention_state["alignment"], scores.dtype)
        previous = ops.expand_dims(previous, 1)  # (B, 1, S)
        mode = self.mode if training else self.inference_mode or self.mode
        if mode == "hard":
            chosen = ops.cast(scores > 0, scores.dtype)
        else:
            chosen = ops.sigmoid(scores)  # p: (B, T, S)
        if mask is not None:
            chosen = ops.where(mask, chosen, ops.zeros_like(chosen))
        return functional.monotonic_attention(chosen, previous, mode)

    def _draw_score_noise(self, shape):
        return self.sigmoid_noise * keras.random.normal(
            shape, dtype=self._state_dtype(), seed=self._noise_seed
        )


def _check_arguments(
    where,
    units,
    score,
    mode,
    sigmoid_noise,
    score_bias_init,
    normalize,
    scale,
    inference_mode,
):
    """The constructor's checks, before anything is built."""
    _check_choice(where, "score", score, _SCORES)
    _check_choice(where, "mode", mode, _MODES)
    if inference_mode is not None:
        _check_choice(where, "inference_mode", inference_mode, _MODES)
    checks.check_positive_int(where, "units", units, optional=score == "luong")
    checks.check_flag(where, "normalize", normalize)
    checks.check_flag(where, "scale", scale)
    if normalize and score != "bahdanau" or scale and score != "luong":
        raise ValueError(
            f"{where}: `normalize` applies to score='bahdanau' and "
            "`scale` to score='luong'. Received: "
            f"score={score!r}, normalize={normalize}, scale={scale}"
        )
    for name, number in (
        ("sigmoid_noise", sigmoid_noise),
        ("score_bias_init", score_bias_init),
    ):
        if (
            isinstance(number, bool)
            or not isinstance(number, (int, float, np.integer, np.floating))
            or not np.isfinite(number)
        ):
            raise ValueError(
                f"{where}: `{name}` must be a finite number. "
                f"Received: {name}={number!r}"
            )
    if sigmoid_noise < 0:
        raise ValueError(
            f"{where}: `sigmoid_noise` must be >= 0. "
            f"Received: sigmoid_noise={sigmoid_noise}"
        )


def _check_choice(where, name, value, choices):
    if value not in choices:
        raise ValueError(
            f"{where}: `{name}` must be one of {choices}. "
            f"Received: {name}={value!r}"
        )
