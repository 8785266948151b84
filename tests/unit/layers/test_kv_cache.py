"""The two kinds of KV cache (`keras_attention/layers/kv_cache.py`): a raw
tensor is a plain cache whatever its length; a `RollingCache` is the only
rolling one. Each is checked against the full causal computation."""

import doctest

import keras
import numpy as np
import pytest

import keras_attention as ka
from keras_attention.layers import RollingCache
from keras_attention.layers import kv_cache
from tests.helpers import rng
from tests.helpers import to_numpy

B, D, N = 2, 8, 2
H = D // N


def _layer(**arguments):
    keras.utils.set_random_seed(0)
    layer = ka.MultiHeadSelfAttention(N, **arguments)
    layer.build((B, None, D))
    return layer


def _zeros(length):
    return np.zeros((B, 2, length, N, H), "float32")


def test_a_tensor_of_the_windows_length_is_a_plain_cache():
    """Slot p holds position p, as in any plain cache: the length of the
    window (3) no longer makes it rolling (which read slot p as position
    p - 1 here and attended over a never-written slot)."""
    layer = _layer(sliding_window=3)
    x = rng(0).normal(size=(B, 3, D)).astype("float32")
    full, full_scores = layer(
        x, use_causal_mask=True, return_attention_scores=True
    )
    # Positions 0 and 1 prefilled in the plain layout; slot 2 still empty.
    _, longer = layer(
        x[:, :2], cache=_zeros(4), cache_index=0, use_causal_mask=True
    )
    cache = longer[:, :, :3]  # (B, 2, 3, K, H): the window's length
    step, scores, cache = layer(
        x[:, 2:], cache=cache, cache_index=2, use_causal_mask=True,
        return_attention_scores=True,
    )  # fmt: skip
    assert not isinstance(cache, tuple) and tuple(cache.shape) == (
        B, 2, 3, N, H,
    )  # fmt: skip
    np.testing.assert_allclose(to_numpy(step), to_numpy(full)[:, 2:], atol=1e-5)
    # Scores over the cache's 3 slots, positions 0 .. 2.
    np.testing.assert_allclose(
        to_numpy(scores), to_numpy(full_scores)[:, :, 2:], atol=1e-6
    )
    np.testing.assert_allclose(
        to_numpy(cache)[:, :, :2], to_numpy(longer)[:, :, :2]
    )


def test_a_rolling_cache_longer_than_the_window_equals_the_full_pass():
    """R may exceed the window's reach (here 4 slots for a window of 2):
    the window hides the older keys it keeps."""
    layer = _layer(sliding_window=2, use_rotary=True)
    x = rng(1).normal(size=(B, 7, D)).astype("float32")
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = RollingCache(_zeros(4))
    steps = []
    for index in range(7):
        step, cache = layer(
            x[:, index : index + 1], cache=cache, cache_index=index,
            use_causal_mask=True,
        )  # fmt: skip
        steps.append(to_numpy(step))
    assert isinstance(cache, RollingCache)
    assert tuple(cache.kv.shape) == (B, 2, 4, N, H)
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize(
    "arguments, cache, message",
    [
        ({}, RollingCache(_zeros(3)), "Received: sliding_window=None"),
        (
            {"sliding_window": 4},
            RollingCache(_zeros(3)),
            r"hold the 4 positions.*cache.kv.shape=\(2, 2, 3, 2, 4\)",
        ),
        (
            {"sliding_window": 3},
            (_zeros(3)[:, 0], _zeros(3)[:, 1]),
            "RollingCache. Received: cache of type tuple",
        ),
    ],
    ids=["no-window", "shorter-than-the-window", "a-plain-tuple"],
)
def test_bad_caches_are_named(arguments, cache, message):
    layer = _layer(**arguments)
    x = np.zeros((B, 1, D), "float32")
    with pytest.raises(ValueError, match="MultiHeadSelfAttention") as error:
        layer(x, cache=cache, cache_index=0, use_causal_mask=True)
    assert error.match(message)


def test_rolling_cache_example_runs():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(kv_cache.RollingCache, globs=vars(kv_cache)):
        runner.run(test)
    assert runner.failures == 0 and runner.tries > 0
