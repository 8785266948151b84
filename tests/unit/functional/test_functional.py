"""keras_attention.functional against NumPy references and hand values."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import _kernels
from keras_attention import functional as F
from tests.helpers import BACKEND
from tests.helpers import gradient
from tests.helpers import np_masked_softmax
from tests.helpers import np_sdpa
from tests.helpers import rng
from tests.helpers import to_numpy

HALF_TOLERANCE = {"float16": 5e-3, "bfloat16": 3e-2}


def sdpa(*args, **kwargs):
    return F.scaled_dot_product_attention(*args, **kwargs)


def random_qkv(q_shape, kv_shape, value_dim=None, seed=0):
    g = rng(seed)
    v_shape = (*kv_shape[:-1], value_dim or kv_shape[-1])
    return (
        g.normal(size=q_shape).astype("float32"),
        g.normal(size=kv_shape).astype("float32"),
        g.normal(size=v_shape).astype("float32"),
    )


# --- the worked example of seed 002 ----------------------------------------


@pytest.mark.parametrize("return_scores", [True, False])
def test_seed_002_worked_example(return_scores):
    # q = [2], keys [2], [1]: logits 4 and 2 (scale 1/sqrt(1) = 1), so the
    # weights are e^4 / (e^4 + e^2) = 1 / (1 + e^-2) ≈ 0.881 and ≈ 0.119,
    # and the output 10 * 0.881 + 4 * 0.119 ≈ 9.285.
    q = np.array([[[2.0]]], "float32")
    k = np.array([[[2.0], [1.0]]], "float32")
    v = np.array([[[10.0], [4.0]]], "float32")
    result = sdpa(q, k, v, return_attention_scores=return_scores)
    out = result[0] if return_scores else result
    w_first = 1.0 / (1.0 + math.exp(-2.0))
    assert to_numpy(out)[0, 0, 0] == pytest.approx(
        10 * w_first + 4 * (1 - w_first), abs=1e-5
    )
    # The seed rounds the weights first: 10 * 0.881 + 4 * 0.119 = 9.286.
    assert to_numpy(out)[0, 0, 0] == pytest.approx(9.29, abs=1e-2)
    if return_scores:
        np.testing.assert_allclose(
            to_numpy(result[1])[0, 0], [0.881, 0.119], atol=5e-4
        )


# --- NumPy references ------------------------------------------------------

LAYOUTS = {
    "3d": ((2, 3, 4), (2, 5, 4)),
    "4d": ((2, 3, 4, 8), (2, 5, 4, 8)),
    "gqa": ((2, 3, 4, 8), (2, 5, 2, 8)),
    "mqa": ((2, 4, 6, 8), (2, 4, 1, 8)),
}


def make_mask(kind, q_shape, kv_shape, seed=1):
    g = rng(seed)
    b, t, s = q_shape[0], q_shape[1], kv_shape[1]
    if kind == "none":
        return None
    if kind == "padding":  # (B, 1, S): a key padding mask for every query
        lengths = g.integers(1, s + 1, size=b)
        return (np.arange(s)[None, :] < lengths[:, None])[:, None, :]
    if kind == "full":  # (B, T, S), one query row fully masked
        mask = g.random((b, t, s)) > 0.4
        mask[0, 1] = False
        return mask
    if kind == "per_head":  # (B, N, T, S)
        return g.random((b, q_shape[2], t, s)) > 0.3
    if kind == "shared_2d":  # (T, S)
        return g.random((t, s)) > 0.3
    raise AssertionError(kind)


CASES = [
    (layout, mask_kind)
    for layout in LAYOUTS
    for mask_kind in ("none", "padding", "full", "shared_2d")
] + [("4d", "per_head"), ("gqa", "per_head")]


@pytest.mark.parametrize("return_scores", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout,mask_kind", CASES)
def test_matches_numpy(layout, mask_kind, causal, return_scores):
    q_shape, kv_shape = LAYOUTS[layout]
    q, k, v = random_qkv(q_shape, kv_shape, value_dim=5)
    mask = make_mask(mask_kind, q_shape, kv_shape)
    want_out, want_w = np_sdpa(q, k, v, mask=mask, causal=causal)
    result = sdpa(
        q,
        k,
        v,
        mask=mask,
        is_causal=causal,
        return_attention_scores=return_scores,
    )
    out = result[0] if return_scores else result
    assert tuple(out.shape) == want_out.shape
    np.testing.assert_allclose(to_numpy(out), want_out, atol=1e-5)
    if return_scores:
        assert tuple(result[1].shape) == want_w.shape
        np.testing.assert_allclose(to_numpy(result[1]), want_w, atol=1e-6)


@pytest.mark.parametrize("scale", [0.1, 1.0, 3.0])
def test_custom_scale(scale):
    q, k, v = random_qkv((2, 3, 4, 8), (2, 6, 4, 8))
    want, _ = np_sdpa(q, k, v, scale=scale)
    got = sdpa(q, k, v, scale=scale)
    np.testing.assert_allclose(to_numpy(got), want, atol=1e-5)


def test_causal_flag_equals_explicit_lower_triangular_mask():
    q, k, v = random_qkv((2, 4, 2, 8), (2, 6, 2, 8))
    tril = np.tril(np.ones((4, 6), bool))
    by_flag = sdpa(q, k, v, is_causal=True)
    by_mask = sdpa(q, k, v, mask=np.broadcast_to(tril, (2, 4, 6)))
    np.testing.assert_allclose(to_numpy(by_flag), to_numpy(by_mask), atol=1e-6)


def test_integer_mask_is_accepted_as_boolean():
    q, k, v = random_qkv((2, 3, 4), (2, 5, 4))
    mask = make_mask("full", (2, 3, 4), (2, 5, 4))
    got = sdpa(q, k, v, mask=mask.astype("int32"))
    want = sdpa(q, k, v, mask=mask)
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-6)


# --- fully masked rows -----------------------------------------------------


@pytest.mark.parametrize("return_scores", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["3d", "4d"])
def test_fully_masked_rows_give_zeros_not_nan(layout, dtype, return_scores):
    q_shape, kv_shape = LAYOUTS[layout]
    q, k, v = (ops.cast(x, dtype) for x in random_qkv(q_shape, kv_shape))
    mask = np.ones((q_shape[0], q_shape[1], kv_shape[1]), bool)
    mask[0, 1] = False  # one query with no visible key
    mask[1] = False  # a whole sequence of padding
    result = sdpa(q, k, v, mask=mask, return_attention_scores=return_scores)
    out = to_numpy(result[0] if return_scores else result)
    assert np.all(np.isfinite(out))
    assert np.all(out[0, 1] == 0.0) and np.all(out[1] == 0.0)
    assert np.any(out[0, 0] != 0.0)
    if return_scores:
        weights = to_numpy(result[1])
        assert np.all(np.isfinite(weights))
        rows = weights.sum(-1)
        empty = ~mask.any(-1)
        if layout == "4d":
            empty = np.broadcast_to(empty[:, None], rows.shape)
        np.testing.assert_allclose(rows[empty], 0.0)
        np.testing.assert_allclose(rows[~empty], 1.0, atol=1e-2)


@pytest.mark.parametrize("layout", ["3d", "4d"])
def test_gradients_finite_with_fully_masked_rows(layout):
    q_shape, kv_shape = LAYOUTS[layout]
    q, k, v = random_qkv(q_shape, kv_shape)
    mask = np.ones((q_shape[0], q_shape[1], kv_shape[1]), bool)
    mask[0, 1] = False
    mask[1] = False
    grad = gradient(lambda x: sdpa(x, k, v, mask=mask, is_causal=True), q)
    assert np.all(np.isfinite(grad))
    assert np.all(grad[0, 1] == 0.0) and np.all(grad[1] == 0.0)
    grad_v = gradient(lambda x: sdpa(q, k, x, mask=mask), v)
    assert np.all(np.isfinite(grad_v))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_matches_float32(dtype):
    q, k, v = random_qkv((2, 3, 4, 8), (2, 5, 4, 8))
    mask = make_mask("full", (2, 3, 4, 8), (2, 5, 4, 8))
    want, _ = np_sdpa(q, k, v, mask=mask)
    got = sdpa(*(ops.cast(x, dtype) for x in (q, k, v)), mask=mask)
    assert keras.backend.standardize_dtype(got.dtype) == dtype
    np.testing.assert_allclose(
        to_numpy(got), want, atol=HALF_TOLERANCE[dtype] * 4
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_large_logits_stay_finite(dtype):
    # Logits of ~1e5 overflow float16 (max 65504) unless computed in float32.
    q, k, v = random_qkv((1, 4, 64), (1, 6, 64), seed=3)
    q = np.sign(q) * 40.0
    k = np.sign(k) * 40.0
    _, want_w = np_sdpa(q, k, v)
    out, weights = sdpa(
        *(ops.cast(x, dtype) for x in (q, k, v)), return_attention_scores=True
    )
    assert np.all(np.isfinite(to_numpy(out)))
    np.testing.assert_allclose(to_numpy(weights), want_w, atol=2e-2)


# --- masked values never leak ----------------------------------------------


@pytest.mark.parametrize("return_scores", [False, True])
@pytest.mark.parametrize("layout", ["3d", "gqa"])
def test_padded_keys_and_values_do_not_change_output(layout, return_scores):
    q_shape, kv_shape = LAYOUTS[layout]
    q, k, v = random_qkv(q_shape, kv_shape)
    s = kv_shape[1]
    lengths = np.array([3, s])
    padding = np.arange(s)[None, :] < lengths[:, None]  # (B, S)
    mask = padding[:, None, :]  # (B, 1, S)
    garbage_k, garbage_v = k.copy(), v.copy()
    garbage_k[0, 3:] = 1e4
    garbage_v[0, 3:] = -1e4
    first = sdpa(q, k, v, mask=mask, return_attention_scores=return_scores)
    second = sdpa(
        q,
        garbage_k,
        garbage_v,
        mask=mask,
        return_attention_scores=return_scores,
    )
    if return_scores:
        first, second = first[0], second[0]
    np.testing.assert_allclose(to_numpy(first), to_numpy(second), atol=1e-6)


# --- fused kernel == reference path -----------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "full", "per_head"])
@pytest.mark.parametrize("layout", ["4d", "gqa"])
def test_fused_dispatch_equals_reference(layout, mask_kind, causal):
    """Where a backend's fused kernel is used (no scores requested), the
    numbers and the gradients equal the reference path's."""
    q_shape, kv_shape = LAYOUTS[layout]
    q, k, v = random_qkv(q_shape, kv_shape, value_dim=6)
    mask = make_mask(mask_kind, q_shape, kv_shape)
    assert_dispatch_equals_reference(q, k, v, mask, causal)


def assert_dispatch_equals_reference(q, k, v, mask, causal):
    """The path taken without scores (fused or chunked) gives the reference
    path's outputs and query gradients; returns the outputs."""
    fast = sdpa(q, k, v, mask=mask, is_causal=causal)
    reference, _ = sdpa(
        q, k, v, mask=mask, is_causal=causal, return_attention_scores=True
    )
    np.testing.assert_allclose(to_numpy(fast), to_numpy(reference), atol=1e-5)

    def fast_fn(x):
        return sdpa(x, k, v, mask=mask, is_causal=causal)

    def reference_fn(x):
        return sdpa(
            x, k, v, mask=mask, is_causal=causal, return_attention_scores=True
        )[0]

    np.testing.assert_allclose(
        gradient(fast_fn, q), gradient(reference_fn, q), atol=1e-5
    )
    return fast


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["3d", "gqa"])
def test_memory_efficient_path_equals_reference(layout, causal):
    """Long sequences in blocks of queries and keys, rematerialised for
    the backward pass: same numbers and gradients as the reference path,
    padding and fully masked rows included."""
    length, key_length = 600, 520  # 3 chunks, the last one partial
    if layout == "3d":
        q_shape, kv_shape = (2, length, 8), (2, key_length, 8)
    else:
        q_shape, kv_shape = (2, length, 4, 8), (2, key_length, 2, 8)
    q, k, v = random_qkv(q_shape, kv_shape, value_dim=6, seed=9)
    padding = np.arange(key_length)[None, :] < np.array([[300], [key_length]])
    mask = np.broadcast_to(padding[:, None, :], (2, length, key_length)).copy()
    mask[1, 7] = False  # a query that sees no key
    with _kernels.force("chunked"):
        fast = assert_dispatch_equals_reference(q, k, v, mask, causal)
    assert np.all(to_numpy(fast)[1, 7] == 0)


# --- building blocks -------------------------------------------------------


def test_masked_softmax_matches_numpy():
    g = rng(5)
    logits = g.normal(size=(3, 4, 7)).astype("float32") * 5
    mask = g.random((3, 4, 7)) > 0.5
    mask[1, 2] = False
    got = F.masked_softmax(logits, mask)
    np.testing.assert_allclose(
        to_numpy(got), np_masked_softmax(logits, mask), atol=1e-6
    )
    np.testing.assert_allclose(
        to_numpy(F.masked_softmax(logits)),
        np_masked_softmax(logits, np.ones_like(mask)),
        atol=1e-6,
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_large_negative_is_finite_and_underflows_exp(dtype):
    if dtype == "float64" and BACKEND == "jax":
        pytest.skip("JAX disables float64 unless jax_enable_x64 is set")
    wide = "float64" if dtype == "float64" else "float32"
    value = ops.full((), F.large_negative(dtype), dtype=dtype)
    as_wide = float(ops.convert_to_numpy(ops.cast(value, wide)))
    assert np.isfinite(as_wide) and as_wide < -1e4
    exp = ops.exp(value - ops.ones((), dtype=dtype) * 10)
    assert float(ops.convert_to_numpy(ops.cast(exp, wide))) == 0.0


def test_causal_mask_with_offset():
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(F.causal_mask(3, 3)),
        np.tril(np.ones((3, 3), bool)),
    )
    # Two new queries at positions 3 and 4 of a 5-key cache.
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(F.causal_mask(2, 5, offset=3)),
        np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool),
    )


def test_merge_and_padding_masks():
    padding = np.array([[True, True, False]])
    att = F.padding_to_attention_mask(padding, 2)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(att), np.broadcast_to(padding, (1, 2, 3))[:]
    )
    merged = F.merge_masks(att, F.causal_mask(2, 3), None)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(merged),
        np.array([[[1, 0, 0], [1, 1, 0]]], bool),
    )
    assert F.merge_masks(None, None) is None
    assert F.padding_to_attention_mask(None) is None


def test_additive_score_matches_numpy():
    g = rng(7)
    q, k = g.normal(size=(2, 3, 4)), g.normal(size=(2, 5, 4))
    v, b = g.normal(size=4), g.normal(size=4)
    want = np.tanh(q[:, :, None] + k[:, None] + b) @ v
    got = F.additive_score(*(x.astype("float32") for x in (q, k, v, b)))
    np.testing.assert_allclose(to_numpy(got), want, atol=1e-5)


def test_logits_dtype():
    assert F.logits_dtype("float16") == "float32"
    assert F.logits_dtype("bfloat16") == "float32"
    assert F.logits_dtype("float32") == "float32"


# --- bad input -------------------------------------------------------------

BAD_INPUTS = [
    ("2-D inputs", (2, 4), (2, 4), (2, 4), None, "must all be 3-D"),
    ("rank mismatch", (2, 3, 4), (2, 5, 1, 4), (2, 5, 1, 4), None, "3-D"),
    ("head dims", (2, 3, 4), (2, 5, 6), (2, 5, 6), None, "axis -1"),
    ("batch", (2, 3, 4), (3, 5, 4), (3, 5, 4), None, "axis 0"),
    ("key/value length", (2, 3, 4), (2, 5, 4), (2, 6, 4), None, "axis 1"),
    ("kv heads", (2, 3, 4, 8), (2, 5, 3, 8), (2, 5, 3, 8), None, "multiple"),
    ("kv heads k/v", (2, 3, 4, 8), (2, 5, 2, 8), (2, 5, 4, 8), None, "axis 2"),
    ("mask shape", (2, 3, 4), (2, 5, 4), (2, 5, 4), (2, 3, 4), "mask"),
    ("mask (B, S)", (2, 3, 4), (2, 5, 4), (2, 5, 4), (2, 5), "mask"),
    ("mask rank 5", (2, 3, 4), (2, 5, 4), (2, 5, 4), (1, 2, 1, 3, 5), "mask"),
]


@pytest.mark.parametrize(
    "q_shape,k_shape,v_shape,mask_shape,needle",
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_input_raises_value_error(
    q_shape, k_shape, v_shape, mask_shape, needle
):
    q, k, v = (np.zeros(s, "float32") for s in (q_shape, k_shape, v_shape))
    mask = None if mask_shape is None else np.ones(mask_shape, bool)
    with pytest.raises(ValueError) as info:
        sdpa(q, k, v, mask=mask)
    message = str(info.value)
    assert "scaled_dot_product_attention" in message
    assert "Received:" in message and needle in message
    shapes = (q_shape, k_shape, v_shape, mask_shape)
    assert any(f"shape={tuple(s)}" in message for s in shapes if s)


def test_float_mask_is_rejected():
    q, k, v = random_qkv((2, 3, 4), (2, 5, 4))
    with pytest.raises(ValueError, match="mask.dtype=float32"):
        sdpa(q, k, v, mask=np.ones((2, 3, 5), "float32"))


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's tracer")
@pytest.mark.parametrize("masked", [False, True])
def test_a_graph_traced_with_one_key_attends_over_any_number(masked):
    """PyTorch's ONNX exporter traces a length given as `None` as 1: the
    traced graph must still be attention (a softmax over the keys), not
    the sum of the values that weights of one would give."""
    import warnings

    import torch

    def attention(query, key, value, mask):
        return F.scaled_dot_product_attention(
            query, key, value, mask=mask if masked else None
        )

    def inputs(length, seed):
        generator = rng(seed)
        q, k, v = (
            torch.tensor(generator.standard_normal((2, length, 2, 4)),
                         dtype=torch.float32)
            for _ in range(3)
        )  # fmt: skip
        mask = torch.ones((2, 1, length, length), dtype=torch.bool)
        mask[1, :, :, length // 2 :] = False  # hidden keys in row 1
        mask[1, :, :, 0] = True
        return q, k, v, mask

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's own warnings
        traced = torch.jit.trace(attention, inputs(1, 0))
    got = traced(*inputs(5, 1))
    want = attention(*inputs(5, 1))
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-6)
