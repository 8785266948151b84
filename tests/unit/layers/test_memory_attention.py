"""Attention with memory of its past alignments: LocationSensitiveAttention
(Chorowski et al. 2015) and MonotonicAttention (Raffel et al. 2017).

NumPy references written from the papers' equations (and, for the
monotonic modes, from tensorflow-addons 0.23), hand-computed values, the
attention-state protocol, masks, gradients, the decoder and saving.

A `(B, T, Dq)` query runs a loop over T; on an eager backend each such
call costs far more than a `(B, Dq)` step, so the tests make few of them
and check them against the references, not against each other.

Shape legend: B batch, T query (decoder) steps, S source length,
Dq query dim, Dv value dim, U units, F location filters.
"""

import keras
import numpy as np
import pytest

from keras_attention import AttentionDecoder
from keras_attention import BahdanauAttention
from keras_attention import LocationSensitiveAttention
from keras_attention import LuongAttention
from keras_attention import MonotonicAttention
from keras_attention.functional import monotonic_attention
from tests.autodiff import float64_context
from tests.autodiff import value_and_grads
from tests.helpers import BACKEND
from tests.helpers import np_masked_softmax
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, S, DQ, DV, U, F = 3, 3, 6, 5, 4, 4, 3
LENGTHS = (4, S, 0)  # the third source is all padding
TINY = float(np.finfo(np.float32).tiny)

LOCATION = {
    "cumulative_k3": dict(cumulative=True, kernel_size=3),
    "previous_k5": dict(cumulative=False, kernel_size=5),
    "cumulative_smoothing_k1": dict(
        cumulative=True, smoothing=True, kernel_size=1
    ),
    "previous_smoothing_k3": dict(
        cumulative=False, smoothing=True, kernel_size=3
    ),
}
MONOTONIC = {
    "bahdanau": dict(units=U),
    "bahdanau_normalize": dict(units=U, normalize=True),
    "luong": dict(score="luong"),
    "luong_scale": dict(score="luong", scale=True),
}


def make(kind, **kwargs):
    """A fresh layer: a `LOCATION` or a `MONOTONIC` kind."""
    if kind in LOCATION:
        return LocationSensitiveAttention(
            U, filters=F, **{**LOCATION[kind], **kwargs}
        )
    return MonotonicAttention(**{**MONOTONIC[kind], **kwargs})


def case_id(kind, kwargs):
    return "-".join([kind, *map(str, kwargs.values())])


def inputs(seed=0, query_rank=3):
    """Query, value and a padding mask with lengths `LENGTHS`."""
    g = rng(seed)
    shape = (B, T, DQ) if query_rank == 3 else (B, DQ)
    query = g.normal(size=shape).astype("float32")
    value = g.normal(size=(B, S, DV)).astype("float32")
    mask = np.arange(S)[None, :] < np.array(LENGTHS)[:, None]
    return query, value, mask


def with_garbage(value, mask):
    """`value` with large numbers where it is padding."""
    garbage = value.copy()
    garbage[~mask] = 1e3
    return garbage


def build(layer):
    """Builds `layer` for `inputs()` with a one-step query (cheap)."""
    query, value, _ = inputs(query_rank=2)
    layer(query, value)
    return layer


def built(kind, seed=0, **kwargs):
    """A built layer of `kind` with weights drawn by NumPy (the same on
    every backend); gains, biases and offsets away from their initial
    values, so the references check them too."""
    layer = build(make(kind, **kwargs))
    g = rng(seed + 100)
    for variable in layer.trainable_weights:
        name = variable.path.split("/")[-1]
        if name in ("score_gain", "score_bias"):
            values = g.uniform(0.5, 1.5, size=variable.shape)
        elif name == "score_offset":
            values = np.full(variable.shape, 0.3)
        else:
            values = g.uniform(-0.7, 0.7, size=variable.shape)
        variable.assign(values)
    return layer


def clone(layer, **overrides):
    """A copy of built `layer` with some config changed, same weights."""
    copy = layer.__class__.from_config({**layer.get_config(), **overrides})
    build(copy).set_weights(layer.get_weights())
    return copy


def weight(layer, name):
    """The variable of `layer` (or of a sublayer) named `name`, a
    sublayer's kernel by the sublayer's name."""
    found = [
        w
        for w in layer.weights
        if w.path.endswith(f"/{name}") or w.path.endswith(f"/{name}/kernel")
    ]
    assert len(found) == 1, (name, [w.path for w in layer.weights])
    return found[0]


def location_kernel(layer):
    """The `(K, C, F)` location filters."""
    return weight(layer, "location_kernel")


def attend_step_by_step(layer, query, value, mask, state):
    """`attend` once per query, each step reading the state the one before
    left: the weights `(B, T, S)` as NumPy and the final state."""
    projected = layer.project_keys(value)
    stepped = []
    for t in range(query.shape[1]):
        _, weights = layer.attend(
            query[:, t],
            value,
            projected,
            value_mask=mask,
            return_attention_scores=True,
            attention_state=state,
        )
        stepped.append(to_numpy(weights))
        state = layer.next_attention_state(state, weights)
    return np.stack(stepped, 1), state


def run(layer, query, value, mask=None, **kwargs):
    """The layer's call with the weights, as float64 NumPy."""
    context, weights = layer(
        query, value, value_mask=mask, return_attention_scores=True, **kwargs
    )
    return to_numpy(context), to_numpy(weights)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# --- NumPy references ------------------------------------------------------


def np_conv1d_same(x, kernel):
    """`(B, S, C)` correlated with `(K, C, F)`, zero "same" padding:
    `out[j] = sum_k x[j + k - (K - 1) // 2] @ kernel[k]`."""
    size, length = kernel.shape[0], x.shape[1]
    left = (size - 1) // 2
    padded = np.pad(x, ((0, 0), (left, size - 1 - left), (0, 0)))
    return sum(padded[:, k : k + length] @ kernel[k] for k in range(size))


def np_location_step(layer, query, value, mask, state):
    """One step of location-sensitive attention from the layer's weights:
    `(context (B, Dv), weights (B, S), new_state)`."""
    w = {
        "W": layer.query_dense.kernel,
        "V": layer.key_dense.kernel,
        "conv": location_kernel(layer),
        "U": layer.location_dense.kernel,
        "v": layer.score_kernel,
        "b": layer.score_bias,
    }
    w = {name: to_numpy(variable) for name, variable in w.items()}
    channels = [state["alignment"]]
    if layer.cumulative:
        channels.append(state["cumulative"])
    location = np.stack(channels, axis=-1)  # (B, S, 1 or 2)
    features = np_conv1d_same(location, w["conv"])  # (B, S, F)
    hidden = (
        (query @ w["W"])[:, None] + value @ w["V"] + features @ w["U"] + w["b"]
    )
    scores = np.tanh(hidden) @ w["v"]  # (B, S)
    if layer.smoothing:
        weights = np.where(mask, sigmoid(scores), 0.0)
        total = weights.sum(-1, keepdims=True)
        weights = np.divide(
            weights, total, out=np.zeros_like(weights), where=total > 0
        )
    else:
        weights = np_masked_softmax(scores, mask)
    new_state = {"alignment": weights}
    if layer.cumulative:
        new_state["cumulative"] = state["cumulative"] + weights
    return np.einsum("bs,bsv->bv", weights, value), weights, new_state


def np_location_initial(layer, batch=B):
    state = {"alignment": np.zeros((batch, S))}
    if layer.cumulative:
        state["cumulative"] = np.zeros((batch, S))
    return state


def np_monotonic_scores(layer, query, key):
    """`e_j + r` of the monotonic layer for a `(B, Dq)` query: `(B, S)`."""
    q, k = np.asarray(query, "float64"), np.asarray(key, "float64")

    def w(name):
        return to_numpy(weight(layer, name))

    keys = k @ w("key_dense")  # (B, S, U)
    if layer.score == "bahdanau":
        v, bias = w("score_kernel"), 0.0
        if layer.normalize:
            v = w("score_gain") * v / np.linalg.norm(v)
            bias = w("score_bias")
        processed = q @ w("query_dense")  # (B, U)
        scores = np.tanh(processed[:, None] + keys + bias) @ v
    else:
        scores = np.einsum("bu,bsu->bs", q, keys)
        if layer.scale:
            scores = scores * w("score_gain")
    return scores + w("score_offset")


def np_recursive(p, previous):
    """q_0 = prev_0, q_j = (1 - p_{j-1}) q_{j-1} + prev_j; a_j = p_j q_j."""
    alpha = np.zeros_like(p)
    for b in range(p.shape[0]):
        q = 0.0
        for j in range(p.shape[1]):
            q = previous[b, j] + (q * (1.0 - p[b, j - 1]) if j else 0.0)
            alpha[b, j] = p[b, j] * q
    return alpha


def np_parallel(p, previous):
    """The closed form of tensorflow-addons' "parallel" mode."""
    logs = np.log(np.clip(1.0 - p, TINY, 1.0))
    c = np.exp(np.cumsum(logs, -1) - logs)  # exclusive cumprod of 1 - p
    return p * c * np.cumsum(previous / np.clip(c, 1e-10, 1.0), -1)


def np_hard(chosen, previous):
    """The first chosen position at or after the previous one."""
    p = chosen * np.cumsum(previous, -1)
    exclusive_cumprod = np.concatenate(
        [np.ones_like(p[:, :1]), np.cumprod(1.0 - p, -1)[:, :-1]], -1
    )
    return p * exclusive_cumprod


def np_monotonic_step(layer, mode, query, value, mask, previous, noise=0.0):
    """`(context (B, Dv), weights (B, S))` of one monotonic step."""
    scores = np_monotonic_scores(layer, query, value) + noise
    if mode == "hard":
        weights = np_hard(((scores > 0) & mask).astype("float64"), previous)
    else:
        p = np.where(mask, sigmoid(scores), 0.0)
        weights = np_recursive(p, previous)
        # The reference's two forms agree (a check of the reference).
        np.testing.assert_allclose(np_parallel(p, previous), weights, 1e-9)
    return np.einsum("bs,bsv->bv", weights, value), weights


def np_monotonic_initial(batch=B):
    return np.eye(S)[[0] * batch]  # one-hot at 0, even where masked


def np_run(layer, query, value, mask=None, state=None, mode=None):
    """The reference over the `T` steps of a `(B, T, Dq)` query: contexts
    `(B, T, Dv)` and weights `(B, T, S)`; `mode` overrides the monotonic
    layer's."""
    batch, steps = query.shape[:2]
    mask = np.ones((batch, S), bool) if mask is None else mask
    value = np.asarray(value, "float64")
    monotonic = isinstance(layer, MonotonicAttention)
    if state is None:
        state = (
            {"alignment": np_monotonic_initial(batch)}
            if monotonic
            else np_location_initial(layer, batch)
        )
    contexts, alignments = [], []
    for t in range(steps):
        q = np.asarray(query[:, t], "float64")
        if monotonic:
            context, weights = np_monotonic_step(
                layer, mode or layer.mode, q, value, mask, state["alignment"]
            )
            state = {"alignment": weights}
        else:
            context, weights, state = np_location_step(
                layer, q, value, mask, state
            )
        contexts.append(context)
        alignments.append(weights)
    return np.stack(contexts, 1), np.stack(alignments, 1)


# --- LocationSensitiveAttention --------------------------------------------


@pytest.mark.parametrize("kind", LOCATION)
def test_location_sensitive_recursion_matches_numpy(kind):
    """A 3-step recursion through the 3-D call: step t reads the state of
    the steps before it. Masked values hold garbage; one source is all
    padding, one has none."""
    query, value, mask = inputs()
    layer = built(kind)
    context, weights = run(layer, query, with_garbage(value, mask), mask)
    want_context, want_weights = np_run(layer, query, value, mask)
    np.testing.assert_allclose(weights, want_weights, atol=1e-5)
    np.testing.assert_allclose(context, want_context, atol=1e-5)
    assert np.all(weights.transpose(0, 2, 1)[~mask] == 0.0)
    assert np.all(context[2] == 0.0)
    # Not trivially so: from the initial (zero) state step 1 would differ.
    _, stateless, _ = np_location_step(
        layer, query[:, 1], value, mask, np_location_initial(layer)
    )
    assert np.abs(stateless - weights[:, 1]).max() > 1e-4


@pytest.mark.parametrize("kind", LOCATION)
def test_location_sensitive_step_with_given_state(kind):
    """`attend` of one step from a given non-zero state, the 2-D call with
    `attention_state`, and `next_attention_state`, against NumPy."""
    query, value, mask = inputs(1, query_rank=2)
    layer = built(kind)
    g = rng(7)
    state = {"alignment": np_masked_softmax(g.normal(size=(B, S)), mask)}
    if layer.cumulative:
        state["cumulative"] = state["alignment"] + g.uniform(size=(B, S))
    given = {k: v.astype("float32") for k, v in state.items()}
    want_context, want_weights, want_state = np_location_step(
        layer, query, value, mask, state
    )
    context, weights = layer.attend(
        query,
        value,
        layer.project_keys(value),
        value_mask=mask,
        return_attention_scores=True,
        attention_state=given,
    )
    np.testing.assert_allclose(to_numpy(weights), want_weights, atol=1e-5)
    np.testing.assert_allclose(to_numpy(context), want_context, atol=1e-5)
    context, weights = run(layer, query, value, mask, attention_state=given)
    np.testing.assert_allclose(weights, want_weights, atol=1e-5)
    np.testing.assert_allclose(context, want_context, atol=1e-5)
    new_state = layer.next_attention_state(given, weights.astype("float32"))
    assert set(new_state) == set(want_state)
    for key, want in want_state.items():
        np.testing.assert_allclose(to_numpy(new_state[key]), want, atol=1e-5)


def test_location_sensitive_hand_computed():
    """U = 1, W = V = 0, conv taps [0, 0, 1] (f_j = prev_{j+1}: Keras's
    Conv1D correlates), location dense 100: with prev one-hot at 1, the
    scores are [tanh(100), 0, 0, 0] = [1, 0, 0, 0] and the weights
    e / (e + 3) = 0.47537 and 1 / (e + 3) = 0.17488."""
    layer = LocationSensitiveAttention(
        1, filters=1, kernel_size=3, cumulative=False
    )
    query = np.ones((1, 2), "float32")
    value = np.eye(4, dtype="float32")[None]  # context = weights
    layer(query, value)
    layer.query_dense.kernel.assign(np.zeros((2, 1)))
    layer.key_dense.kernel.assign(np.zeros((4, 1)))
    location_kernel(layer).assign(np.array([0.0, 0.0, 1.0])[:, None, None])
    layer.location_dense.kernel.assign(np.full((1, 1), 100.0))
    layer.score_kernel.assign(np.ones((1,)))
    context, weights = run(
        layer,
        query,
        value,
        attention_state={"alignment": np.array([[0, 1, 0, 0]], "float32")},
    )
    want = [[0.47537, 0.17488, 0.17488, 0.17488]]
    np.testing.assert_allclose(weights, want, atol=1e-5)
    np.testing.assert_allclose(context, want, atol=1e-5)


def test_location_sensitive_state_protocol():
    """Initial state: zeros; a manual loop of `attend` and
    `next_attention_state` is the reference recursion."""
    query, value, mask = inputs()
    layer = built("cumulative_k3")
    state = layer.get_initial_attention_state(value, mask)
    assert set(state) == {"alignment", "cumulative"}
    for tensor in state.values():
        np.testing.assert_array_equal(to_numpy(tensor), np.zeros((B, S)))
    assert set(
        build(make("previous_k5")).get_initial_attention_state(value)
    ) == {"alignment"}
    stepped, state = attend_step_by_step(layer, query, value, mask, state)
    _, want = np_run(layer, query, value, mask)
    np.testing.assert_allclose(stepped, want, atol=1e-5)
    np.testing.assert_allclose(to_numpy(state["alignment"]), want[:, -1], 1e-5)
    np.testing.assert_allclose(
        to_numpy(state["cumulative"]), want.sum(1), atol=1e-5
    )


# --- MonotonicAttention ----------------------------------------------------

MONOTONIC_CASES = [
    ("bahdanau", {"mode": "recursive"}),
    ("bahdanau", {"mode": "parallel"}),
    ("bahdanau", {"mode": "hard"}),
    ("bahdanau_normalize", {"mode": "parallel"}),
    ("luong", {"mode": "recursive"}),
    ("luong", {"mode": "hard"}),
    ("luong_scale", {"mode": "parallel"}),
]


@pytest.mark.parametrize(
    "kind,kwargs",
    MONOTONIC_CASES,
    ids=[case_id(*case) for case in MONOTONIC_CASES],
)
def test_monotonic_recursion_matches_numpy(kind, kwargs):
    """Each score and mode over a 3-step recursion; masked values hold
    garbage, one source is all padding, one has none."""
    query, value, mask = inputs()
    layer = built(kind, **kwargs)
    context, weights = run(layer, query, with_garbage(value, mask), mask)
    want_context, want_weights = np_run(layer, query, value, mask)
    np.testing.assert_allclose(weights, want_weights, atol=1e-5)
    np.testing.assert_allclose(context, want_context, atol=1e-5)
    assert np.all(weights.transpose(0, 2, 1)[~mask] == 0.0)
    assert np.all(context[2] == 0.0)
    assert want_weights[:, 1:].max() > 0.1  # not trivially zero


@pytest.mark.parametrize("kind", MONOTONIC)
def test_monotonic_step_with_given_state(kind):
    query, value, mask = inputs(2, query_rank=2)
    layer = built(kind, mode="parallel")
    previous = np_masked_softmax(rng(8).normal(size=(B, S)), mask)
    given = {"alignment": previous.astype("float32")}
    want_context, want_weights = np_monotonic_step(
        layer, "parallel", query, value, mask, previous
    )
    context, weights = layer.attend(
        query,
        value,
        layer.project_keys(value),
        value_mask=mask,
        return_attention_scores=True,
        attention_state=given,
    )
    np.testing.assert_allclose(to_numpy(weights), want_weights, atol=1e-5)
    np.testing.assert_allclose(to_numpy(context), want_context, atol=1e-5)
    new_state = layer.next_attention_state(given, weights)
    assert set(new_state) == {"alignment"}
    np.testing.assert_allclose(
        to_numpy(new_state["alignment"]), want_weights, atol=1e-5
    )


def test_weights_are_attributes_of_the_layer():
    """The weights have their documented names and shapes: the location
    filters `(K, C, F)`, and the monotonic score's weights in its
    Bahdanau or Luong `scorer` next to the offset `r`."""
    location = build(make("cumulative_k3"))
    assert tuple(location.location_kernel.shape) == (3, 2, F)
    assert tuple(location.location_dense.kernel.shape) == (F, U)
    bahdanau = build(make("bahdanau_normalize"))
    luong = build(make("luong_scale"))
    assert tuple(bahdanau.scorer.query_dense.kernel.shape) == (DQ, U)
    assert tuple(bahdanau.scorer.key_dense.kernel.shape) == (DV, U)
    assert tuple(luong.scorer.key_dense.kernel.shape) == (DV, DQ)
    for layer, names in (
        (bahdanau, ("score_kernel", "score_gain", "score_bias")),
        (luong, ("score_gain",)),
    ):
        for name in names:
            assert getattr(layer.scorer, name) is weight(layer, name)
        assert layer.score_offset is weight(layer, "score_offset")


def test_monotonic_hand_computed():
    """Luong score of a zero query: e = 0, p = [0.5, 0.5, 0.5]. From prev
    one-hot at 0: alpha = [0.5, 0.25, 0.125]; the next step, from that
    alpha: q = [0.5, 0.5, 0.375], alpha = [0.25, 0.25, 0.1875]."""
    query = np.zeros((1, 2, 3), "float32")
    value = np.eye(3, dtype="float32")[None]  # context = weights
    want = [[[0.5, 0.25, 0.125], [0.25, 0.25, 0.1875]]]
    for mode in ("recursive", "parallel"):
        context, weights = run(
            MonotonicAttention(score="luong", mode=mode), query, value
        )
        np.testing.assert_allclose(weights, want, atol=1e-6)
        np.testing.assert_allclose(context, want, atol=1e-6)
    # Hard: e = +-1 everywhere; stay where the last step attended, or
    # attend nowhere (and then nowhere forever).
    start = {"alignment": np.array([[0.0, 1.0, 0.0]], "float32")}
    for offset, row in ((1.0, [0.0, 1.0, 0.0]), (-1.0, [0.0, 0.0, 0.0])):
        layer = MonotonicAttention(
            score="luong", mode="hard", score_bias_init=offset
        )
        _, weights = run(layer, query, value, attention_state=start)
        np.testing.assert_array_equal(weights, [[row, row]])


def test_monotonic_hard_never_moves_backwards():
    g = rng(4)
    query = g.normal(size=(B, 5, DQ)).astype("float32")
    value = g.normal(size=(B, S, DV)).astype("float32")
    mask = np.arange(S)[None, :] < np.array([[5], [S], [S]])
    layer = built("bahdanau", mode="hard")
    _, weights = run(layer, query, value, mask)
    _, want = np_run(layer, query, value, mask)
    np.testing.assert_array_equal(weights, want)
    assert set(np.unique(weights)) <= {0.0, 1.0}
    assert np.all(weights.sum(-1) <= 1.0)
    assert np.all(weights[0, :, 5:] == 0.0)
    attended = weights.sum(-1) == 1.0
    position = np.where(attended, weights.argmax(-1), S)  # S: nowhere
    assert np.all(np.diff(position, axis=1) >= 0)
    moved = (np.diff(position, axis=1) > 0) & attended[:, 1:]
    assert np.any(moved)  # it did move forward along the source
    # Without the memory the first positive score would move backwards.
    scores = np.stack(
        [np_monotonic_scores(layer, query[:, t], value) for t in range(5)],
        1,
    )
    first = np.argmax(scores > 0, -1)
    assert np.any(np.diff(first, axis=1) < 0)


def test_monotonic_state_protocol():
    """Initial state: one-hot at 0 (even where that position is masked);
    a manual loop of `attend` and `next_attention_state` is the reference
    recursion."""
    query, value, mask = inputs()
    mask[0, 0] = False
    layer = built("bahdanau", mode="recursive")
    state = layer.get_initial_attention_state(value, mask)
    assert set(state) == {"alignment"}
    np.testing.assert_array_equal(
        to_numpy(state["alignment"]), np_monotonic_initial()
    )
    stepped, state = attend_step_by_step(layer, query, value, mask, state)
    _, want = np_run(layer, query, value, mask)
    np.testing.assert_allclose(stepped, want, atol=1e-5)
    assert np.all(want[0, :, 0] == 0.0) and want[0].max() > 0.1


def test_monotonic_weights_may_sum_to_less_than_one():
    query, value, mask = inputs()
    layer = built("bahdanau", mode="parallel")
    _, weights = run(layer, query, value, mask)
    totals = weights.sum(-1)
    assert np.all(weights >= 0.0) and np.all(totals <= 1.0 + 1e-6)
    assert np.all(totals[:2] < 1.0 - 1e-4)  # mass ran off the end
    assert np.all(totals[2] == 0.0)  # the fully masked source


@pytest.mark.xfail(
    BACKEND == "torch",
    reason="Keras 3.15's torch ops.cumsum returns float32 for float64",
    strict=True,
)
def test_recursive_equals_parallel_in_float64():
    query, value, mask = inputs(3)
    with float64_context():
        parallel = built("bahdanau_normalize", mode="parallel", dtype="float64")
        recursive = clone(parallel, mode="recursive")
        query, value = query.astype("float64"), value.astype("float64")
        got, want = (
            layer(query, value, value_mask=mask, return_attention_scores=True)
            for layer in (recursive, parallel)
        )
        assert keras.backend.standardize_dtype(got[1].dtype) == "float64"
        got, want = (
            [keras.ops.convert_to_numpy(x) for x in pair]
            for pair in (got, want)
        )
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)
    assert want[1].max() > 0.1


def test_sigmoid_noise_only_in_training():
    """Noise on the scores in training only; `attend` adds a given
    `score_noise` (std 1 here) in training and ignores it otherwise."""
    query, value, mask = inputs()
    layer = built("bahdanau", mode="parallel", sigmoid_noise=1.0)
    want = np_run(layer, query, value, mask)
    got = run(layer, query, value, mask)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    _, noisy = run(layer, query, value, mask, training=True)
    assert not np.allclose(noisy, want[1], atol=1e-3)
    assert np.all(np.isfinite(noisy))
    assert np.all(noisy.transpose(0, 2, 1)[~mask] == 0.0)

    step = query[:, 0]
    noise = rng(6).normal(size=(B, S)).astype("float32")
    previous = np_monotonic_initial()
    for training, scale in ((True, 1.0), (False, 0.0), (None, 0.0)):
        _, weights = layer.attend(
            step,
            value,
            layer.project_keys(value),
            value_mask=mask,
            return_attention_scores=True,
            training=training,
            score_noise=noise,
        )
        _, expected = np_monotonic_step(
            layer, "parallel", step, value, mask, previous, scale * noise
        )
        np.testing.assert_allclose(to_numpy(weights), expected, atol=1e-5)


def test_inference_mode():
    """`inference_mode="hard"`: hard unless training, `mode` in training."""
    query, value, mask = inputs()
    layer = built("luong", mode="parallel", inference_mode="hard")
    _, inference = run(layer, query, value, mask)
    _, want = np_run(layer, query, value, mask, mode="hard")
    np.testing.assert_array_equal(inference, want)
    _, trained = run(layer, query, value, mask, training=True)
    _, want = np_run(layer, query, value, mask, mode="parallel")
    np.testing.assert_allclose(trained, want, atol=1e-5)


SATURATED_CASES = [
    ("hard", "float32"),
    ("recursive", "float32"),
    ("parallel", "float32"),
    ("recursive", "mixed_float16"),
    ("parallel", "mixed_float16"),
    ("parallel", "mixed_bfloat16"),
]


@pytest.mark.parametrize("mode,dtype", SATURATED_CASES)
def test_saturated_probabilities_give_no_nan(mode, dtype):
    """Scores +30 (first source) and -30 (second): p = 1 or 0 in float32,
    so 1 - p underflows in the parallel form's cumprod. The weights stay
    finite: all on the first position, or nowhere."""
    layer = MonotonicAttention(score="luong", mode=mode, dtype=dtype)
    value = np.zeros((B, S, DV), "float32")
    value[..., 0] = 1.0
    query = np.zeros((B, 2, DQ), "float32")
    query[0, :, 0], query[1, :, 0], query[2, :, 0] = 30.0, -30.0, 30.0
    _, _, mask = inputs()
    build(layer)
    kernel = np.zeros((DV, DQ))
    kernel[0, 0] = 1.0  # W h_j = e_0, e_j = s^T W h_j = s_0
    weight(layer, "key_dense").assign(kernel)
    _, weights = run(layer, query, value, mask)
    assert np.all(np.isfinite(weights))
    np.testing.assert_allclose(weights[0, :, 0], 1.0, atol=1e-2)
    np.testing.assert_allclose(weights[0, :, 1:], 0.0, atol=1e-6)
    np.testing.assert_allclose(weights[1], 0.0, atol=1e-6)
    assert np.all(weights[2] == 0.0)


# --- mixed precision -------------------------------------------------------

MIXED_CASES = [
    ("cumulative_k3", {}),
    ("previous_smoothing_k3", {}),
    ("bahdanau_normalize", {"mode": "parallel"}),
    ("luong", {"mode": "recursive"}),
    ("bahdanau", {"mode": "hard"}),
]


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize(
    "kind,kwargs", MIXED_CASES, ids=[case_id(*case) for case in MIXED_CASES]
)
def test_half_precision_keeps_padding_at_zero(kind, kwargs, policy):
    """float32 weights, half compute: near the reference, padding exactly
    0, the fully masked source all zeros, nothing NaN."""
    query, value, mask = inputs()
    layer = built(kind, dtype=policy, **kwargs)
    assert all(
        keras.backend.standardize_dtype(w.dtype) == "float32"
        for w in layer.weights
    )
    context, weights = layer(
        query, value, value_mask=mask, return_attention_scores=True
    )
    compute = policy.split("_")[1]
    assert keras.backend.standardize_dtype(context.dtype) == compute
    assert keras.backend.standardize_dtype(weights.dtype) == compute
    context, weights = to_numpy(context), to_numpy(weights)
    assert np.all(np.isfinite(context)) and np.all(np.isfinite(weights))
    assert np.all(weights.transpose(0, 2, 1)[~mask] == 0.0)
    assert np.all(context[2] == 0.0) and np.all(weights[2] == 0.0)
    if kwargs.get("mode") == "hard":  # a flipped sign may move a step
        assert set(np.unique(weights)) <= {0.0, 1.0}
        return
    want_context, want_weights = np_run(layer, query, value, mask)
    tolerance = 0.05 if compute == "float16" else 0.25
    np.testing.assert_allclose(weights, want_weights, atol=tolerance)
    np.testing.assert_allclose(context, want_context, atol=tolerance)


# --- gradients -------------------------------------------------------------

GRADIENT_CASES = {
    "location": [("cumulative_k3", {}), ("previous_smoothing_k3", {})],
    "bahdanau_normalize": [
        ("bahdanau_normalize", {"mode": "parallel"}),
        ("bahdanau_normalize", {"mode": "recursive"}),
    ],
    "luong_scale": [
        ("luong_scale", {"mode": "parallel"}),
        ("luong_scale", {"mode": "recursive"}),
    ],
}
NUM_WEIGHTS = {"location": 6, "bahdanau_normalize": 6, "luong_scale": 3}


@pytest.mark.parametrize("case", GRADIENT_CASES)
def test_gradients_reach_every_weight_and_input(case):
    """Over a 3-step recursion with a fully masked source, in one compiled
    program per case: every gradient exists, is finite and is not zero
    (the location convolution reads a zero state at step 0: only the
    recursion reaches its kernel), none reaches padding, and the
    recursive and parallel modes agree on values and gradients."""
    query, value, mask = inputs()
    layers = [built(kind, **kwargs) for kind, kwargs in GRADIENT_CASES[case]]
    if case != "location":  # the same weights in both modes
        layers[1].set_weights(layers[0].get_weights())

    def every_layer(*xs):
        return [
            layer(
                xs[2 * i],
                xs[2 * i + 1],
                value_mask=mask,
                return_attention_scores=True,
            )
            for i, layer in enumerate(layers)
        ]

    variables = [w for layer in layers for w in layer.trainable_weights]
    outputs, input_grads, weight_grads = value_and_grads(
        every_layer, [query, value] * 2, variables, copies=2
    )
    per_layer = len(layers[0].trainable_weights)
    for i, layer in enumerate(layers):
        assert len(layer.trainable_weights) == NUM_WEIGHTS[case]
        grads = {
            "query": input_grads[2 * i],
            "value": input_grads[2 * i + 1],
        }
        for j, w in enumerate(layer.trainable_weights):
            grads[w.path] = weight_grads[i * per_layer + j]
        for name, grad in grads.items():
            assert grad is not None, name
            assert np.all(np.isfinite(grad)), name
            assert np.abs(grad).max() > 0.0, name
        assert np.all(grads["value"][2] == 0.0)
        assert np.all(grads["value"][0, 4:] == 0.0)
    assert all(np.all(np.isfinite(o)) for o in outputs)
    if case != "location":
        for a, b in zip(outputs[:2], outputs[2:], strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)
        for a, b in zip(
            input_grads[:2] + weight_grads[:per_layer],
            input_grads[2:] + weight_grads[per_layer:],
            strict=True,
        ):
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


# --- AttentionDecoder ------------------------------------------------------

DECODER_CASES = [
    ("cumulative_k3", {}, "bahdanau"),
    ("bahdanau", {"mode": "recursive"}, "bahdanau"),
    ("luong", {"mode": "parallel"}, "luong"),
]
E, CELL = 3, 8


def decoder_inputs(seed=5):
    targets = rng(seed).normal(size=(B, T, E)).astype("float32")
    _, encoded, mask = inputs(seed)
    return targets, encoded, mask


@pytest.mark.parametrize(
    "kind,kwargs,flow",
    DECODER_CASES,
    ids=[case_id(kind, {**kw, "flow": f}) for kind, kw, f in DECODER_CASES],
)
def test_decoder_with_memory(kind, kwargs, flow):
    """Teacher forcing equals `get_initial_state` + `step`, whose state
    carries the mechanism's state under "attention". In the Bahdanau
    flow a GRU's step t scores with the output of step t - 1, so the
    reference recursion over the shifted outputs gives the alignments."""
    targets, encoded, mask = decoder_inputs()
    mechanism = make(kind, **kwargs)
    layer = AttentionDecoder(keras.layers.GRUCell(CELL), mechanism, flow=flow)
    outputs, alignments = layer(
        targets,
        encoded,
        encoder_padding_mask=mask,
        return_attention_scores=True,
    )
    outputs, alignments = to_numpy(outputs), to_numpy(alignments)
    state = layer.get_initial_state(encoded, mask)
    want = mechanism.get_initial_attention_state(encoded, mask)
    assert set(state["attention"]) == set(want) != set()
    for key, tensor in want.items():
        np.testing.assert_array_equal(
            to_numpy(state["attention"][key]), to_numpy(tensor)
        )
    for t in range(T):
        out, state, alignment = layer.step(targets[:, t], state, encoded, mask)
        np.testing.assert_allclose(to_numpy(out), outputs[:, t], atol=1e-5)
        np.testing.assert_allclose(
            to_numpy(alignment), alignments[:, t], atol=1e-6
        )
        np.testing.assert_allclose(
            to_numpy(state["attention"]["alignment"]),
            alignments[:, t],
            atol=1e-6,
        )
    if "cumulative" in state["attention"]:
        np.testing.assert_allclose(
            to_numpy(state["attention"]["cumulative"]),
            alignments.sum(1),
            atol=1e-5,
        )
    assert np.all(alignments[2] == 0.0)
    assert np.all(alignments.transpose(0, 2, 1)[~mask] == 0.0)
    if flow == "bahdanau":
        previous = np.concatenate(
            [np.zeros_like(outputs[:, :1]), outputs[:, :-1]], 1
        )
        _, want = np_run(mechanism, previous, encoded, mask)
        np.testing.assert_allclose(alignments, want, atol=1e-5)


def test_decoder_state_has_no_attention_entry_for_content_mechanisms():
    targets, encoded, mask = decoder_inputs()
    for mechanism in (BahdanauAttention(U), LuongAttention()):
        assert mechanism.get_initial_attention_state(encoded, mask) == {}
        assert mechanism.next_attention_state({}, np.ones((B, S))) == {}
        layer = AttentionDecoder(keras.layers.GRUCell(DV), mechanism)
        layer.build(targets.shape, encoded.shape)
        state = layer.get_initial_state(encoded, mask)
        assert "attention" not in state
        _, state, _ = layer.step(targets[:, 0], state, encoded, mask)
        assert "attention" not in state


# --- the layer contract ----------------------------------------------------

CONTRACT_CASES = [
    ("cumulative_k3", {}),
    ("previous_smoothing_k3", {"dropout": 0.25}),
    ("bahdanau_normalize", {"mode": "hard", "sigmoid_noise": 0.5}),
    (
        "luong_scale",
        {"mode": "parallel", "inference_mode": "hard", "score_bias_init": -1},
    ),
]


@pytest.mark.parametrize(
    "kind,kwargs",
    CONTRACT_CASES,
    ids=[case_id(*case) for case in CONTRACT_CASES],
)
def test_config_round_trip(kind, kwargs):
    query, value, mask = inputs(query_rank=2)
    layer = built(kind, **kwargs)
    config = layer.get_config()
    for key, want in kwargs.items():
        assert config[key] == want
    copy = clone(layer)
    assert copy.get_config() == config
    state = layer.get_initial_attention_state(value, mask)
    for a, b in zip(
        run(copy, query, value, mask, attention_state=state),
        run(layer, query, value, mask, attention_state=state),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_keras_save_and_load(tmp_path):
    """Both mechanisms and a decoder with monotonic attention in one
    model: identical outputs after a `.keras` round trip."""
    targets, encoded, mask = decoder_inputs()
    query, _, _ = inputs()
    query_input = keras.Input((T, DQ))
    target_input = keras.Input((T, E))
    value_input = keras.Input((S, DV))
    mask_input = keras.Input((S,), dtype="bool")
    location = make("cumulative_k3", name="location")
    monotonic = make(
        "luong_scale", mode="parallel", inference_mode="hard", name="monotonic"
    )
    decoder = AttentionDecoder(
        keras.layers.GRUCell(CELL),
        make("bahdanau_normalize", mode="recursive", sigmoid_noise=0.5),
        name="decoder",
    )
    outputs = [
        *location(
            query_input,
            value_input,
            value_mask=mask_input,
            return_attention_scores=True,
        ),
        *monotonic(
            query_input,
            value_input,
            value_mask=mask_input,
            return_attention_scores=True,
        ),
        *decoder(
            target_input,
            value_input,
            encoder_padding_mask=mask_input,
            return_attention_scores=True,
        ),
    ]
    model = keras.Model(
        [query_input, target_input, value_input, mask_input], outputs
    )
    data = [query, targets, encoded, mask]
    before = [to_numpy(x) for x in model(data)]
    assert before[1].shape == (B, T, S) and before[5].shape == (B, T, S)
    path = tmp_path / "memory.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.get_layer("location"), LocationSensitiveAttention)
    assert isinstance(loaded.get_layer("decoder").attention, MonotonicAttention)
    after = [to_numpy(x) for x in loaded(data)]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    for layer, weights in ((location, before[1]), (monotonic, before[3])):
        _, want = np_run(layer, query, encoded, mask, mode="hard")
        np.testing.assert_allclose(weights, want, atol=1e-5)


@pytest.mark.parametrize("kind", ["previous_k5", "bahdanau"])
def test_dropout_leaves_the_alignments_and_state(kind):
    """Dropout acts on the context's weights only: the returned weights and
    the state carried to the next step are taken before dropout."""
    query, value, mask = inputs()
    kwargs = {"mode": "parallel"} if kind == "bahdanau" else {}
    layer = built(kind, dropout=0.5, **kwargs)
    context, weights = run(layer, query, value, mask, training=True)
    want_context, want_weights = np_run(layer, query, value, mask)
    np.testing.assert_allclose(weights, want_weights, atol=1e-5)
    assert np.abs(context - want_context).max() > 1e-3
    assert np.all(context[2] == 0.0)


BAD = [
    (lambda: MonotonicAttention(), "units=None"),
    (lambda: MonotonicAttention(units=U, mode="soft"), "mode='soft'"),
    (lambda: MonotonicAttention(units=U, score="dot"), "score='dot'"),
    (
        lambda: MonotonicAttention(units=U, inference_mode="soft"),
        "inference_mode='soft'",
    ),
    (lambda: MonotonicAttention(units=U, dropout=1.5), "dropout=1.5"),
    (lambda: LocationSensitiveAttention(0), "units=0"),
]


@pytest.mark.parametrize("make_layer,received", BAD)
def test_bad_constructor_arguments(make_layer, received):
    with pytest.raises(ValueError) as info:
        make_layer()
    assert received in str(info.value)


def test_luong_units_must_equal_the_query_dim():
    query, value, _ = inputs(query_rank=2)
    layer = build(MonotonicAttention(score="luong"))
    assert tuple(weight(layer, "key_dense").shape) == (DV, DQ)
    build(MonotonicAttention(score="luong", units=DQ))
    with pytest.raises(ValueError, match=f"units={DQ + 1}"):
        MonotonicAttention(score="luong", units=DQ + 1)(query, value)


# --- functional.monotonic_attention ----------------------------------------


def test_parallel_form_loses_mass_past_saturated_positions():
    """Six positions the decoder all but surely stops at (p = 0.99), then
    the previous alignment on position 6 with p = 0.5: the recursion gives
    0.5 there; the closed form divides by a cumulative product floored at
    1e-10 and gives 0.99^6·... ≈ 0.005 (as tensorflow-addons does), the
    documented limit of the parallel mode."""
    p = np.array([[0.99] * 6 + [0.5]], "float32")
    previous = np.eye(7, dtype="float32")[6][None]
    recursive = to_numpy(monotonic_attention(p, previous, "recursive"))
    parallel = to_numpy(monotonic_attention(p, previous, "parallel"))
    np.testing.assert_allclose(recursive[0], [0] * 6 + [0.5], atol=1e-7)
    want = 0.5 * 0.01**6 / 1e-10  # p_6 · cumprod_6 / floor
    np.testing.assert_allclose(parallel[0, 6], want, rtol=1e-3)
    np.testing.assert_allclose(parallel[0, :6], 0.0, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("mode", ["parallel", "recursive", "hard"])
def test_monotonic_attention_in_half_precision(mode, dtype):
    """Half-precision probabilities are aligned in float32 (float16 has no
    1e-10 floor) and come back finite in their own dtype."""
    p = np.array([[1.0, 1.0, 1.0, 0.5], [0.0, 0.5, 0.0, 1.0]], "float32")
    previous = np.array([[0, 0, 0, 1], [1, 0, 0, 0]], "float32")
    want = to_numpy(monotonic_attention(p, previous, mode))
    got = monotonic_attention(
        keras.ops.cast(p, dtype), keras.ops.cast(previous, dtype), mode
    )
    assert keras.backend.standardize_dtype(got.dtype) == dtype
    assert np.all(np.isfinite(to_numpy(got)))
    np.testing.assert_allclose(to_numpy(got), want, atol=1e-2)


@pytest.mark.parametrize("offset", [-30.0, 30.0])
def test_saturated_parallel_gradients_are_finite(offset):
    """Stopping probabilities saturated at 0 or 1: the closed form's log,
    clip and division give finite gradients to every weight and input."""
    layer = built("bahdanau_normalize", mode="parallel")
    layer.score_offset.assign(offset)
    query, value, mask = inputs(2)

    def fn(q, v):
        return layer(q, v, value_mask=mask, return_attention_scores=True)

    outputs, input_grads, weight_grads = value_and_grads(
        fn, [query, value], layer.trainable_weights
    )
    for grad in [*input_grads, *weight_grads]:
        assert grad is not None
        assert np.all(np.isfinite(grad))
    assert all(np.all(np.isfinite(o)) for o in outputs)


def test_a_decoder_state_without_the_attention_state_is_refused():
    """`step` with a state that lost its 'attention' entry would restart
    the alignment at every step: a clear error instead."""
    decoder = AttentionDecoder(
        keras.layers.GRUCell(4), MonotonicAttention(score="luong")
    )
    encoded = np.ones((2, 5, 4), "float32")
    decoder(np.ones((2, 1, 3), "float32"), encoded)
    state = decoder.get_initial_state(encoded)
    state.pop("attention")
    with pytest.raises(ValueError, match="Received: state with keys"):
        decoder.step(np.ones((2, 3), "float32"), state, encoded)
