"""Sampling: seeded, from the (truncated) distribution, the same tokens from
the Python loop and the compiled loop."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.decoding import greedy_search
from keras_attention.decoding import sample
from tests.helpers import BACKEND
from tests.helpers import rng
from tests.helpers import to_numpy
from tests.unit.decoding.step_functions import CachedTransformer
from tests.unit.decoding.step_functions import L
from tests.unit.decoding.step_functions import PrefixModel

# XLA's random bits differ from TensorFlow's own kernels: on TensorFlow a
# compiled sampler is reproducible but does not draw the eager loop's tokens.
SAME_SAMPLES_AS_PYTHON = BACKEND != "tensorflow"


def test_top_k_one_sampling_equals_greedy():
    model = PrefixModel(6, sharp=0.3)
    starts = np.array([0, 1, 2, 0])
    greedy = greedy_search(model.step, model.initial_state(4), starts, L)
    sampled = sample(
        model.step, model.initial_state(4), starts, L, top_k=1, seed=3
    )
    np.testing.assert_array_equal(to_numpy(sampled), to_numpy(greedy))
    nucleus = sample(
        model.step, model.initial_state(4), starts, L, top_p=1e-6, seed=3
    )
    np.testing.assert_array_equal(to_numpy(nucleus), to_numpy(greedy))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_tiny_temperature_is_greedy(jit_compile):
    """At τ = 1e-38 the logits divided by τ overflow; shifted by their
    maximum first, the distribution is all on the likeliest token."""
    model = PrefixModel(6, sharp=0.3)
    starts = np.array([0, 1, 2, 0])
    greedy = greedy_search(model.step, model.initial_state(4), starts, L)
    cold = sample(
        model.step,
        model.initial_state(4),
        starts,
        L,
        temperature=1e-38,
        seed=3,
        jit_compile=jit_compile,
    )
    np.testing.assert_array_equal(to_numpy(cold), to_numpy(greedy))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_sampling_is_seeded_and_follows_the_distribution(jit_compile):
    probs = np.array([0.6, 0.3, 0.1])
    logits = ops.convert_to_tensor(
        np.log(probs)[None].repeat(2000, 0), "float32"
    )

    def step(ids, state):
        return logits, state

    def draw(seed, steps=1, **kwargs):
        start = np.zeros(2000, "int32")
        ids = sample(
            step, (), start, steps, seed=seed, jit_compile=jit_compile, **kwargs
        )
        return to_numpy(ids)

    first = draw(7, steps=2)
    np.testing.assert_array_equal(first, draw(7, steps=2))
    assert not np.array_equal(first, draw(8, steps=2))
    # Each step draws afresh from the same distribution.
    assert not np.array_equal(first[:, 0], first[:, 1])
    for column in first.T:
        frequencies = np.bincount(column.astype(int), minlength=3) / 2000
        np.testing.assert_allclose(frequencies, probs, atol=0.04)
    top2 = draw(7, top_k=2).ravel()
    assert set(np.unique(top2)) == {0, 1}
    hot = draw(7, temperature=0.05)
    assert np.mean(hot == 0) > 0.99


def test_compiled_sampling_with_a_kv_cache():
    model = CachedTransformer(seed=1)
    starts = np.array([1, 4, 7], "int32")

    def draw(seed, jit_compile, **kwargs):
        ids = sample(
            model.step,
            model.initial_state(8),
            starts,
            8,
            seed=seed,
            jit_compile=jit_compile,
            **kwargs,
        )
        return to_numpy(ids)

    first = draw(5, True)
    np.testing.assert_array_equal(draw(5, True), first)
    assert not np.array_equal(draw(6, True), first)
    if SAME_SAMPLES_AS_PYTHON:
        np.testing.assert_array_equal(first, draw(5, False))
        np.testing.assert_array_equal(
            draw(5, True, top_k=3, temperature=0.7),
            draw(5, False, top_k=3, temperature=0.7),
        )
    # One token left is greedy search, truncated by either rule.
    greedy = greedy_search(model.step, model.initial_state(8), starts, 8)
    np.testing.assert_array_equal(draw(5, True, top_k=1), to_numpy(greedy))
    np.testing.assert_array_equal(draw(5, True, top_p=1e-6), to_numpy(greedy))


def test_a_seed_generator_advances_as_in_the_python_loop():
    model = PrefixModel(2, sharp=0.5)
    starts = np.zeros(16, "int32")

    def two_draws(jit_compile):
        seed = keras.random.SeedGenerator(11)
        return [
            to_numpy(
                sample(
                    model.step,
                    model.initial_state(16),
                    starts,
                    3,
                    seed=seed,
                    jit_compile=jit_compile,
                )
            )
            for _ in range(2)
        ]

    compiled = two_draws(True)
    assert not np.array_equal(compiled[0], compiled[1])
    if SAME_SAMPLES_AS_PYTHON:
        python = two_draws(False)
        np.testing.assert_array_equal(compiled[0], python[0])
        np.testing.assert_array_equal(compiled[1], python[1])


def test_a_tensor_temperature():
    model = PrefixModel(3)
    starts = np.zeros(4, "int32")
    temperature = ops.convert_to_tensor(0.5)
    first = sample(
        model.step,
        model.initial_state(4),
        starts,
        3,
        seed=1,
        temperature=temperature,
        jit_compile=True,
    )
    again = sample(
        model.step,
        model.initial_state(4),
        starts,
        3,
        seed=1,
        temperature=0.5,
        jit_compile=True,
    )
    np.testing.assert_array_equal(to_numpy(first), to_numpy(again))


@pytest.mark.parametrize(
    "kwargs,received",
    [
        ({"temperature": 0.0}, "temperature=0.0"),
        ({"top_k": 0}, "top_k=0"),
        ({"top_p": 1.5}, "top_p=1.5"),
        ({"temperature": float("nan")}, "temperature=nan"),
        ({"temperature": None}, "temperature=None"),
        ({"top_k": 2.0}, "top_k=2.0"),
        ({"top_p": "0.9"}, "top_p='0.9'"),
    ],
)
def test_bad_arguments(kwargs, received):
    model = PrefixModel()
    with pytest.raises(ValueError, match=received):
        sample(model.step, model.initial_state(1), [0], 2, **kwargs)


def test_top_k_keeps_k_of_tied_tokens():
    """Three tokens tie for the largest logit: `top_k=1` keeps the first,
    as greedy search picks it, and `top_k=2` the first two."""
    logits = ops.convert_to_tensor(
        np.array([[1.0, 1.0, 1.0, 0.0, 0.0]] * 200, "float32")
    )

    def step(ids, state):
        return logits, state

    start = np.zeros(200, "int32")
    one = to_numpy(sample(step, (), start, 3, top_k=1, seed=0))
    assert set(np.unique(one)) == {0}
    two = to_numpy(sample(step, (), start, 3, top_k=2, seed=0))
    assert set(np.unique(two)) == {0, 1}
    four = to_numpy(sample(step, (), start, 3, top_k=4, seed=0))
    assert set(np.unique(four)) == {0, 1, 2, 3}


def test_top_p_keeps_the_fewest_tokens_of_tied_ones():
    """Four equally likely tokens: `top_p=0.3` keeps the first two (0.25
    falls short, 0.5 reaches it), `top_p=0.45` two, `top_p=0.6` three.
    With logits (1, 0, 0, 0, 0), p = 0.405 for the first: `top_p=0.5`
    keeps it and the first of the tied others."""
    cases = (
        ([0.0] * 4, 0.3, {0, 1}),
        ([0.0] * 4, 0.45, {0, 1}),
        ([0.0] * 4, 0.6, {0, 1, 2}),
        ([1.0, 0.0, 0.0, 0.0, 0.0], 0.5, {0, 1}),
    )
    for row, top_p, kept in cases:
        logits = ops.convert_to_tensor(np.array([row] * 400, "float32"))

        def step(ids, state, logits=logits):
            return logits, state

        start = np.zeros(400, "int32")
        drawn = to_numpy(sample(step, (), start, 2, top_p=top_p, seed=0))
        assert set(np.unique(drawn)) == kept, (row, top_p)


def test_top_p_of_one_keeps_every_token():
    """`top_p=1` leaves the logits as they are, also where a float32 sum
    of the probabilities reaches 1 before the last token."""
    from keras_attention.decoding.greedy import _keep_top_p

    logits = rng(0).normal(size=(200, 50)).astype("float32") * 4
    kept = to_numpy(_keep_top_p(ops.convert_to_tensor(logits), 1.0))
    np.testing.assert_array_equal(kept, logits)
