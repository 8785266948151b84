"""Property-based tests (hypothesis) of the attention invariants.

Over random shapes, head counts, masks (all-False rows and columns
included), dtypes and every layer:

* outputs are finite;
* attention rows sum to 1, or are all zero when no key is visible;
* masked positions get exactly zero weight;
* padded values never change the outputs of unpadded positions;
* causal layers never see the future;
* per-position layers (the positional ones) mix no positions.

The `ci` profile (the default, see conftest.py) is derandomised with no
example database, so every run tries the same examples; `HYPOTHESIS_PROFILE
=dev` tries many more.
"""

import functools

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import keras_attention as ka
from keras_attention.functional import masked_softmax
from keras_attention.functional import scaled_dot_product_attention
from tests.helpers import np_masked_softmax
from tests.helpers import np_sdpa
from tests.helpers import to_numpy

DTYPES = ["float32", "float16", "bfloat16"]
# Absolute tolerance against float64 references, inputs of magnitude ~1.
ATOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}
SEEDS = st.integers(0, 2**31 - 1)


def random_mask(draw, shape):
    """A boolean mask of some density, maybe with an empty row and column."""
    density = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    mask = np.random.default_rng(draw(SEEDS)).random(shape) < density
    if draw(st.booleans()):  # a query that sees no key
        mask[..., draw(st.integers(0, shape[-2] - 1)), :] = False
    if draw(st.booleans()):  # a key that no query sees
        mask[..., draw(st.integers(0, shape[-1] - 1))] = False
    return mask


def check_weights(weights, mask, normalized=True):
    """Rows sum to 1 (at most 1 unless `normalized`: monotonic attention
    may stop nowhere) or are all zero; masked entries are exactly zero."""
    weights = to_numpy(weights)
    assert np.all(np.isfinite(weights))
    assert np.all(weights >= 0)
    assert np.all(weights[~np.broadcast_to(mask, weights.shape)] == 0)
    sums = weights.sum(axis=-1)
    empty = ~np.broadcast_to(mask, weights.shape).any(axis=-1)
    np.testing.assert_array_equal(sums[empty], 0)
    if normalized:
        np.testing.assert_allclose(sums[~empty], 1, atol=2e-2)
    else:
        assert np.all(sums <= 1 + 2e-2)


@st.composite
def sdpa_cases(draw):
    batch, t, s = (draw(st.integers(1, 4)) for _ in range(3))
    kv_heads, groups = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    multi_head = draw(st.booleans())
    heads = kv_heads * groups if multi_head else None
    dim = draw(st.sampled_from([1, 4, 8]))
    # Large magnitudes give logits past float16's range (65504) unless
    # they are computed in float32, as the function promises.
    magnitude = draw(st.sampled_from([1.0, 10.0, 100.0]))
    rng = np.random.default_rng(draw(SEEDS))

    def tensor(length, n):
        shape = (batch, length, n, dim) if multi_head else (batch, length, dim)
        return rng.uniform(-1, 1, shape).astype("float32")

    mask_shape = (batch, heads, t, s) if multi_head else (batch, t, s)
    if multi_head and draw(st.booleans()):
        mask_shape = (batch, t, s)  # shared by all heads
    return {
        "query": tensor(t, heads) * magnitude,
        "key": tensor(s, kv_heads),
        "value": tensor(s, kv_heads),
        "mask": random_mask(draw, mask_shape),
        "is_causal": draw(st.booleans()),
        "dtype": draw(st.sampled_from(DTYPES)),
    }


@given(sdpa_cases())
def test_scaled_dot_product_attention_properties(case):
    dtype = case["dtype"]
    q, k, v = (
        keras.ops.cast(case[name], dtype) for name in ("query", "key", "value")
    )
    mask = case["mask"]
    out, weights = scaled_dot_product_attention(
        q, k, v, mask, case["is_causal"], return_attention_scores=True
    )
    # The fused-kernel path (taken without scores) gives the same numbers.
    fused = scaled_dot_product_attention(q, k, v, mask, case["is_causal"])
    expected_out, expected_weights = np_sdpa(
        *(to_numpy(x) for x in (q, k, v)),
        mask=mask,
        causal=case["is_causal"],
    )
    visible = np.broadcast_to(
        mask[:, None] if mask.ndim == 3 and q.ndim == 4 else mask,
        expected_weights.shape,
    )
    if case["is_causal"]:
        t, s = expected_weights.shape[-2:]
        visible = visible & np.tril(np.ones((t, s), bool))
    check_weights(weights, visible)
    assert np.all(np.isfinite(to_numpy(out)))
    atol = ATOL[dtype]
    np.testing.assert_allclose(to_numpy(weights), expected_weights, atol=atol)
    np.testing.assert_allclose(to_numpy(out), expected_out, atol=atol)
    np.testing.assert_allclose(to_numpy(fused), expected_out, atol=atol)
    empty_rows = ~visible.any(axis=-1)  # (B, [N,] T)
    if q.ndim == 4:
        empty_rows = np.moveaxis(empty_rows, 1, 2)  # (B, T, N)
    assert np.all(to_numpy(out)[empty_rows] == 0)
    assert np.all(to_numpy(fused)[empty_rows] == 0)


@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 6)),
    magnitude=st.sampled_from([1.0, 1e3, 6e4]),
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
)
def test_masked_softmax_properties(shape, magnitude, dtype, data):
    rng = np.random.default_rng(data.draw(SEEDS))
    logits = rng.uniform(-magnitude, magnitude, shape).astype("float32")
    mask = random_mask(data.draw, shape)
    logits = keras.ops.cast(logits, dtype)
    weights = masked_softmax(logits, mask)
    check_weights(weights, mask)
    expected = np_masked_softmax(to_numpy(logits), mask)
    np.testing.assert_allclose(to_numpy(weights), expected, atol=ATOL[dtype])


# --- Layers -----------------------------------------------------------------

D = 8  # model dim of the layer properties
# Few distinct shapes (masks, values and dtypes vary freely): every new
# shape costs an XLA compile per op on JAX.
BATCHES = st.sampled_from([1, 3])


def lengths_mask(draw, batch, length):
    """A `(B, S)` padding mask from random lengths, 0 included."""
    lengths = [draw(st.integers(0, length)) for _ in range(batch)]
    return np.arange(length)[None, :] < np.array(lengths)[:, None]


def replaced(x, where, seed):
    """`x` with the entries at `where` (B, T) replaced by other values."""
    junk = np.random.default_rng(seed).normal(0, 3, x.shape).astype(x.dtype)
    return np.where(where[..., None], junk, x)


def attention_dtypes(dtype):
    """The dtype policy name for a drawn dtype (half = mixed precision)."""
    return {"float32": "float32", "float16": "mixed_float16"}.get(
        dtype, "mixed_bfloat16"
    )


def make_mechanism(kind, dtype):
    if kind == "bahdanau":
        return ka.BahdanauAttention(6, dtype=dtype)
    if kind == "bahdanau-normalized":
        return ka.BahdanauAttention(6, normalize=True, dtype=dtype)
    if kind == "location-sensitive":
        return ka.LocationSensitiveAttention(6, 3, 3, dtype=dtype)
    if kind == "monotonic":
        return ka.MonotonicAttention(6, dtype=dtype)
    score = kind.split("-")[1]
    return ka.LuongAttention(
        score, units=6 if score == "concat" else None, dtype=dtype
    )


SOURCE_LAYERS = [
    "cross",
    "cross-gqa",
    "decoder-block",
    "bahdanau",
    "bahdanau-normalized",
    "luong-dot",
    "luong-general",
    "luong-concat",
    "location-sensitive",
    "monotonic",
    "attention-decoder",
]


@functools.cache
def source_layer(kind, dtype):
    """The layer of `kind` under the `dtype` policy that attends over a
    padded source, made once: its weights come from the same seed every
    time, so one layer serves every example."""
    keras.utils.set_random_seed(7)
    if kind.startswith("cross"):
        kv_heads = 1 if kind == "cross-gqa" else None
        return ka.CrossAttention(
            2, 4, num_key_value_heads=kv_heads, dtype=dtype
        )
    if kind == "decoder-block":
        return ka.TransformerDecoderBlock(2, 16, dtype=dtype)
    if kind == "attention-decoder":
        return ka.AttentionDecoder(
            keras.layers.GRUCell(6, dtype=dtype),
            ka.LuongAttention("general", dtype=dtype),
            attention_dim=5,
            dtype=dtype,
        )
    return make_mechanism(kind, dtype)


def run_source_layer(kind, dtype, query, source, source_mask):
    """Calls a layer that attends over a padded source.

    Returns `(outputs, weights)` with weights `(B, [N,] T, S)`.
    """
    layer = source_layer(kind, dtype)
    if kind.startswith("cross"):
        return layer(
            query, source, value_mask=source_mask, return_attention_scores=True
        )
    if kind == "decoder-block":
        out, scores = layer(
            query,
            source,
            encoder_padding_mask=source_mask,
            return_attention_scores=True,
        )
        return out, scores["cross"]
    if kind == "attention-decoder":
        return layer(
            query,
            source,
            encoder_padding_mask=source_mask,
            return_attention_scores=True,
        )
    return layer(
        query, source, value_mask=source_mask, return_attention_scores=True
    )


@st.composite
def source_cases(draw):
    batch, t, s = draw(BATCHES), draw(st.sampled_from([1, 4])), 5
    rng = np.random.default_rng(draw(SEEDS))
    return {
        "query": rng.normal(size=(batch, t, D)).astype("float32"),
        "source": rng.normal(size=(batch, s, D)).astype("float32"),
        "mask": lengths_mask(draw, batch, s),
        "dtype": draw(st.sampled_from(DTYPES)),
        "junk_seed": draw(SEEDS),
    }


@pytest.mark.parametrize("kind", SOURCE_LAYERS)
@given(case=source_cases())
def test_padded_source_never_changes_outputs(kind, case):
    dtype = attention_dtypes(case["dtype"])
    mask = case["mask"]
    out, weights = run_source_layer(
        kind, dtype, case["query"], case["source"], mask
    )
    junk = replaced(case["source"], ~mask, case["junk_seed"])
    out_junk, _ = run_source_layer(kind, dtype, case["query"], junk, mask)
    assert np.all(np.isfinite(to_numpy(out)))
    # (B, 1, S) or (B, 1, 1, S) against weights (B, T, S) or (B, N, T, S).
    visible = mask.reshape(mask.shape[0], *[1] * (len(weights.shape) - 2), -1)
    check_weights(weights, visible, normalized=kind != "monotonic")
    np.testing.assert_allclose(
        to_numpy(out_junk), to_numpy(out), atol=ATOL[case["dtype"]]
    )


SELF_LAYERS = [
    "self",
    "self-rotary-gqa",
    "encoder-block",
    "encoder-block-pre-ln",
    "decoder-only-block",
]


@functools.cache
def self_layer(kind, dtype):
    """The self-attention layer of `kind` under the `dtype` policy, made
    once (see `source_layer`)."""
    keras.utils.set_random_seed(7)
    if kind.startswith("self"):
        extra = (
            {"use_rotary": True, "num_key_value_heads": 1}
            if kind == "self-rotary-gqa"
            else {}
        )
        return ka.MultiHeadSelfAttention(2, 4, dtype=dtype, **extra)
    if kind.startswith("encoder-block"):
        return ka.TransformerEncoderBlock(
            2, 16, normalize_first=kind.endswith("pre-ln"), dtype=dtype
        )
    return ka.TransformerDecoderBlock(2, 16, dtype=dtype)


def run_self_layer(kind, dtype, inputs, padding_mask):
    """Calls a self-attention layer on padded inputs: `(outputs, weights)`."""
    out, scores = self_layer(kind, dtype)(
        inputs, padding_mask=padding_mask, return_attention_scores=True
    )
    if kind == "decoder-only-block":
        scores = scores["self"]  # a dict of the self and cross weights
    return out, scores


@st.composite
def self_cases(draw):
    batch, t = draw(BATCHES), draw(st.sampled_from([1, 3, 6]))
    rng = np.random.default_rng(draw(SEEDS))
    return {
        "inputs": rng.normal(size=(batch, t, D)).astype("float32"),
        "mask": lengths_mask(draw, batch, t),
        "dtype": draw(st.sampled_from(DTYPES)),
        "junk_seed": draw(SEEDS),
    }


@pytest.mark.parametrize("kind", SELF_LAYERS)
@given(case=self_cases())
def test_padding_never_changes_unpadded_outputs(kind, case):
    dtype = attention_dtypes(case["dtype"])
    mask = case["mask"]
    out, weights = run_self_layer(kind, dtype, case["inputs"], mask)
    junk = replaced(case["inputs"], ~mask, case["junk_seed"])
    out_junk, _ = run_self_layer(kind, dtype, junk, mask)
    assert np.all(np.isfinite(to_numpy(out)))
    visible = mask[:, None, None, :]  # (B, 1, 1, S)
    if kind == "decoder-only-block":
        t = mask.shape[1]
        visible = visible & np.tril(np.ones((t, t), bool))
    check_weights(weights, visible)
    np.testing.assert_allclose(
        to_numpy(out_junk)[mask],
        to_numpy(out)[mask],
        atol=ATOL[case["dtype"]],
    )


CAUSAL_LAYERS = [
    "self-causal",
    "decoder-only-block",
    "decoder-block",
    "attention-decoder-bahdanau",
    "attention-decoder-luong",
]


@functools.cache
def causal_layer(kind, dtype):
    """The causal layer of `kind` under the `dtype` policy, made once (see
    `source_layer`)."""
    keras.utils.set_random_seed(7)
    if kind == "self-causal":
        return ka.MultiHeadSelfAttention(2, 4, use_rotary=True, dtype=dtype)
    if kind.startswith("decoder"):
        return ka.TransformerDecoderBlock(2, 16, dtype=dtype)
    attention = (
        ka.BahdanauAttention(6, dtype=dtype)
        if kind.endswith("bahdanau")
        else ka.LuongAttention("dot", dtype=dtype)
    )
    return ka.AttentionDecoder(
        keras.layers.LSTMCell(D, dtype=dtype), attention, dtype=dtype
    )


def run_causal_layer(kind, dtype, inputs, source):
    layer = causal_layer(kind, dtype)
    if kind == "self-causal":
        return layer(inputs, use_causal_mask=True)
    if kind == "decoder-only-block":
        return layer(inputs)
    return layer(inputs, source)


@pytest.mark.parametrize("kind", CAUSAL_LAYERS)
@given(
    batch=BATCHES,
    t=st.sampled_from([3, 6]),
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
)
def test_causal_layers_never_see_the_future(kind, batch, t, dtype, data):
    rng = np.random.default_rng(data.draw(SEEDS))
    inputs = rng.normal(size=(batch, t, D)).astype("float32")
    source = rng.normal(size=(batch, 4, D)).astype("float32")
    cut = data.draw(st.integers(1, t - 1))
    future = np.arange(t)[None, :].repeat(batch, 0) >= cut  # (B, T)
    policy = attention_dtypes(dtype)
    out = to_numpy(run_causal_layer(kind, policy, inputs, source))
    changed = replaced(inputs, future, data.draw(SEEDS))
    out_changed = to_numpy(run_causal_layer(kind, policy, changed, source))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(
        out_changed[:, :cut], out[:, :cut], atol=ATOL[dtype]
    )


POSITION_LAYERS = ["sinusoidal", "learned", "rotary"]


@pytest.mark.parametrize("kind", POSITION_LAYERS)
@given(
    shape=st.tuples(BATCHES, st.sampled_from([1, 5])),
    start=st.integers(0, 4),
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
)
def test_positional_layers_mix_no_positions(kind, shape, start, dtype, data):
    keras.utils.set_random_seed(7)
    policy = attention_dtypes(dtype)
    layer = {
        "sinusoidal": lambda: ka.PositionalEncoding(dtype=policy),
        "learned": lambda: ka.PositionEmbedding(16, dtype=policy),
        "rotary": lambda: ka.RotaryEmbedding(dtype=policy),
    }[kind]()
    rng = np.random.default_rng(data.draw(SEEDS))
    # Rotary takes per-head tensors (B, T, N, H).
    extra = (2,) if kind == "rotary" else ()
    inputs = rng.normal(size=(*shape, *extra, D)).astype("float32")
    changed_at = data.draw(st.integers(0, shape[1] - 1))
    where = np.zeros(shape, bool)
    where[:, changed_at] = True
    if kind == "rotary":
        where = where[..., None].repeat(2, -1)
    out = to_numpy(layer(inputs, start_index=start))
    out_changed = to_numpy(
        layer(replaced(inputs, where, data.draw(SEEDS)), start_index=start)
    )
    assert np.all(np.isfinite(out))
    same = np.ones(shape[1], bool)
    same[changed_at] = False
    np.testing.assert_allclose(
        out_changed[:, same], out[:, same], atol=ATOL[dtype]
    )
    if kind == "rotary":  # a rotation keeps every pair's norm
        rounded = to_numpy(keras.ops.cast(inputs, layer.compute_dtype))
        np.testing.assert_allclose(
            np.linalg.norm(out, axis=-1),
            np.linalg.norm(rounded, axis=-1),
            rtol=4 * ATOL[dtype],
        )
