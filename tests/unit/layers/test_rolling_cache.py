"""The rolling KV cache of a sliding window: a `RollingCache` of the
window's length that keeps the last positions, so decoding runs at
constant memory past any length; cached decoding equals the full forward
pass."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention.layers import RollingCache
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, D = 2, 13, 16
PADDING = np.arange(T)[None, :] >= np.array([[3], [0]])  # row 0 left-padded

BLOCKS = {
    "window gqa rotary": dict(
        sliding_window=3, num_key_value_heads=1, use_rotary=True
    ),
    "pair alibi soft-cap": dict(
        sliding_window=(2, 0), alibi=True, logit_soft_cap=3.0
    ),
}


def _block(arguments):
    keras.utils.set_random_seed(0)
    block = ka.TransformerDecoderBlock(2, 8, normalize_first=True, **arguments)
    block.build((B, T, D))
    return block


def _decode(block, x, chunks, padding_mask=None):
    """Feeds `x` through a fresh cache in chunks of the given sizes."""
    cache = block.init_cache(B, T)
    outputs, index = [], 0
    for size in chunks:
        out, cache = block(
            x[:, index : index + size],
            padding_mask=padding_mask,
            cache=cache,
            cache_index=index,
        )
        outputs.append(to_numpy(out))
        assert isinstance(cache["self"], RollingCache)
        assert tuple(cache["self"].kv.shape) == tuple(
            block.init_cache(B, T)["self"].kv.shape
        )  # constant memory
        index += size
    return np.concatenate(outputs, axis=1)


@pytest.mark.parametrize("name", tuple(BLOCKS))
@pytest.mark.parametrize(
    "chunks", [[1] * T, [5, 1, 1, 3, 1, 2]], ids=["steps", "prefill+steps"]
)
def test_rolling_decoding_equals_the_full_pass(name, chunks):
    """13 positions through a cache of 3, one token at a time or with a
    prefill and chunks longer than the cache, row 0 left-padded."""
    block = _block(BLOCKS[name])
    assert block.init_cache(B, T)["self"].kv.shape[2] == 3
    x = rng(1).normal(size=(B, T, D)).astype("float32")
    full = to_numpy(block(x, padding_mask=PADDING))
    np.testing.assert_allclose(
        _decode(block, x, chunks, PADDING), full, atol=2e-5
    )


def test_init_cache_is_rolling_only_when_the_window_is_shorter():
    block = _block({"sliding_window": 3})
    rolling = block.init_cache(B, 8)["self"]
    assert isinstance(rolling, RollingCache) and rolling.kv.shape[2] == 3
    for max_length in (2, 3):  # the window sees them all: a plain cache
        plain = block.init_cache(B, max_length)["self"]
        assert not isinstance(plain, tuple)
        assert plain.shape[2] == max_length
    pair = _block({"sliding_window": (4, 1)}).init_cache(B, 8)["self"]
    assert pair.kv.shape[2] == 5
    assert _block({}).init_cache(B, 8)["self"].shape[2] == 8


def test_rolling_scores_cover_the_window_and_the_new_tokens():
    """Scores `(B, N, T, R + T)` over positions `index - R ...`: the
    full pass's weights at those positions, zero before position 0."""
    layer = ka.MultiHeadSelfAttention(num_heads=2, sliding_window=3)
    x = rng(2).normal(size=(B, 7, D)).astype("float32")
    _, full = layer(x, use_causal_mask=True, return_attention_scores=True)
    full = to_numpy(full)  # (B, N, 7, 7)
    cache = RollingCache(np.zeros((B, 2, 3, 2, D // 2), "float32"))
    _, scores, cache = layer(
        x[:, :2], cache=cache, cache_index=0, use_causal_mask=True,
        return_attention_scores=True,
    )  # fmt: skip
    assert tuple(scores.shape) == (B, 2, 2, 5)
    np.testing.assert_array_equal(to_numpy(scores)[..., :3], 0.0)
    np.testing.assert_allclose(
        to_numpy(scores)[..., 3:], full[:, :, :2, :2], atol=1e-6
    )  # another length: float32 rounding
    for index in range(2, 7):
        _, scores, cache = layer(
            x[:, index : index + 1], cache=cache, cache_index=index,
            use_causal_mask=True, return_attention_scores=True,
        )  # fmt: skip
        first = index - 3  # position of the cache's first slot
        expected = np.zeros((B, 2, 1, 4), "float32")
        seen = slice(max(first, 0), index + 1)
        expected[..., seen.start - first :] = full[
            :, :, index : index + 1, seen
        ]
        np.testing.assert_allclose(to_numpy(scores), expected, atol=1e-6)
    spec = layer.compute_output_spec(
        keras.KerasTensor((B, 1, D)),
        cache=RollingCache(keras.KerasTensor(cache.kv.shape)),
        cache_index=0, return_attention_scores=True,
    )  # fmt: skip
    assert tuple(spec[1].shape) == (B, 2, 1, 4)
    assert isinstance(spec[2], RollingCache)
    assert tuple(spec[2].kv.shape) == tuple(cache.kv.shape)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"attention_mask": np.ones((B, 1, 4), bool)}, "attention_mask"),
        ({"padding_mask": np.ones((B, 4), bool), "cache_index": 4}, "5 pos"),
        ({"cache_index": -1}, "cache_index=-1"),
    ],
)
def test_bad_rolling_calls_are_named(arguments, message):
    layer = ka.MultiHeadSelfAttention(num_heads=2, sliding_window=3)
    x = np.zeros((B, 1, D), "float32")
    layer(x)
    cache = RollingCache(ops.zeros((B, 2, 3, 2, D // 2)))
    arguments = {"cache_index": 0, **arguments}
    with pytest.raises(ValueError, match="MultiHeadSelfAttention") as error:
        layer(x, cache=cache, use_causal_mask=True, **arguments)
    assert message in str(error.value)
