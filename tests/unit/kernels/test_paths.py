"""Every path of `scaled_dot_product_attention` gives the reference's
outputs and gradients.

The paths (`reference`, `chunked`, `fused`, each forced through
`_kernels.force` on every backend; the automatic choice on both sides of
the length threshold; the symbolic path of a functional model) are
checked against a float64 NumPy reference for the outputs and the
gradients of the query, key and value, taken with the backend's own
autodiff. The layers' paths are checked in `test_paths_layers.py`.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import _kernels
from keras_attention import functional as F
from keras_attention._core import Structure
from keras_attention._kernels import dispatch
from tests.autodiff import KERNEL_PATHS
from tests.autodiff import assert_close
from tests.autodiff import cotangents
from tests.autodiff import np_sdpa_grads
from tests.autodiff import path_context
from tests.autodiff import value_and_grads
from tests.helpers import np_alibi_bias
from tests.helpers import np_structure_mask
from tests.helpers import rng

SDPA_LAYOUTS = {  # query shape, key shape, value dim
    "3d": ((2, 7, 4), (2, 6, 4), 3),
    "4d": ((2, 7, 2, 4), (2, 6, 2, 4), 4),  # V = H: JAX's kernel runs
    "gqa": ((2, 7, 4, 4), (2, 6, 2, 4), 3),
    "mqa": ((2, 7, 4, 4), (2, 6, 1, 4), 3),  # one key/value head
}
MASKS = ("none", "padding", "causal", "padding+causal")
DTYPES = ("float32", "float16", "bfloat16")


def sdpa_inputs(layout, mask_kind, length=None, key_length=None, seed=0):
    q_shape, k_shape, value_dim = SDPA_LAYOUTS[layout]
    if length is not None:
        q_shape = (q_shape[0], length, *q_shape[2:])
        k_shape = (k_shape[0], key_length, *k_shape[2:])
    generator = rng(seed)
    q = generator.standard_normal(q_shape).astype("float32")
    k = generator.standard_normal(k_shape).astype("float32")
    v = generator.standard_normal((*k_shape[:-1], value_dim)).astype("float32")
    mask = None
    batch, t, s = q_shape[0], q_shape[1], k_shape[1]
    if "padding" in mask_kind:
        visible = np.array([s - 2, s])  # example 0 has two padded keys
        mask = np.arange(s)[None, None, :] < visible[:, None, None]
        mask = np.broadcast_to(mask, (batch, t, s)).copy()
        mask[1, 2] = False  # a query that sees no key
    return q, k, v, mask, "causal" in mask_kind


def sdpa_function(path, dtype, mask, causal, shapes, segment_ids=None, **kw):
    """`fn(q, k, v)` computing attention in `dtype` on `path`; `kw` are
    further arguments (`sliding_window`)."""
    if path == "symbolic":
        inputs = [keras.Input(shape[1:]) for shape in shapes]
        # Constant tensors (the mask, segment ids) enter as model inputs.
        constants = [mask] if mask is not None else []
        ids = segment_ids
        if ids is not None:
            ids = list(ids) if isinstance(ids, tuple) else [ids]
            constants += ids
        extra = [keras.Input(np.shape(x)[1:], dtype=x.dtype) for x in constants]
        cast = [ops.cast(x, dtype) for x in inputs]
        if ids is not None:
            ids = extra[-len(ids) :]
            ids = tuple(ids) if len(ids) == 2 else ids[0]
        out = F.scaled_dot_product_attention(
            *cast,
            mask=extra[0] if mask is not None else None,
            is_causal=causal,
            segment_ids=ids,
            **kw,
        )
        model = keras.Model(inputs + extra, out)
        values = [ops.convert_to_tensor(x) for x in constants]
        return lambda *qkv: model([*map(ops.convert_to_tensor, qkv), *values])

    def fn(q, k, v):
        with path_context(path):
            return F.scaled_dot_product_attention(
                *(ops.cast(x, dtype) for x in (q, k, v)),
                mask=mask,
                is_causal=causal,
                segment_ids=segment_ids,
                **kw,
            )

    return fn


def check_sdpa(cases, q, k, v, mask, causal, **structure):
    """Checks `(what, path, dtype)` cases on the same inputs, all in one
    differentiated program (one compilation on JAX, not one per case).
    `structure` are further arguments (`sliding_window`, `segment_ids`),
    checked against `np_structure_mask`."""
    shapes = (q.shape, k.shape, v.shape)
    fns = [
        sdpa_function(p, d, mask, causal, shapes, **structure)
        for _, p, d in cases
    ]

    def every_case(*qkvs):
        return [fn(*qkvs[3 * i : 3 * i + 3]) for i, fn in enumerate(fns)]

    outputs, grads, _ = value_and_grads(every_case, [q, k, v] * len(cases))
    seeds = cotangents([o.shape for o in outputs])
    transform = {
        "soft_cap": structure.pop("logit_soft_cap", None),
        "bias": None,
    }
    batch, t, s = q.shape[0], q.shape[1], k.shape[1]
    if structure.pop("alibi", False):
        heads = 1 if q.ndim == 3 else q.shape[2]
        offset = s - t if causal == "bottom_right" else 0
        transform["bias"] = np_alibi_bias(heads, t, s, offset)
    visible = np_structure_mask(batch, t, s, causal, **structure)
    if mask is not None:
        visible = visible & np.broadcast_to(mask, visible.shape)
    for i, (what, _, dtype) in enumerate(cases):
        out, dq, dk, dv = np_sdpa_grads(
            q, k, v, visible, False, seeds[i], **transform
        )
        assert_close(
            what,
            dtype,
            [outputs[i]],
            grads[3 * i : 3 * i + 3],
            [out],
            [dq, dk, dv],
            ("q", "k", "v"),
        )


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("layout", tuple(SDPA_LAYOUTS))
def test_sdpa_paths_equal_float64_reference(layout, mask_kind):
    """Every path in every dtype: outputs and q, k, v gradients."""
    q, k, v, mask, causal = sdpa_inputs(layout, mask_kind)
    cases = [
        (f"sdpa {path}", path, dtype)
        for path in (*KERNEL_PATHS, "symbolic")
        for dtype in DTYPES
    ]
    check_sdpa(cases, q, k, v, mask, causal)


@pytest.mark.parametrize("mask_kind", ["padding", "padding+causal"])
@pytest.mark.parametrize("layout", ["3d", "gqa"])
def test_sdpa_past_the_length_threshold(layout, mask_kind):
    """At 520 queries, the path the dispatch picks (the blockwise path
    for causal attention where no fused kernel runs): every gradient
    still reaches q, k, v."""
    length = _kernels.CHUNKED_MIN_LENGTH + 8
    q, k, v, mask, causal = sdpa_inputs(
        layout, mask_kind, length, _kernels.CHUNK_SIZE + 44
    )
    cases = [
        (f"sdpa {path} T={length}", path, "float32")
        for path in ("auto", "symbolic")
    ]
    check_sdpa(cases, q, k, v, mask, causal)


@pytest.mark.parametrize("length", [511, 512])
def test_dispatch_rule_at_the_threshold(length):
    """Without a fused kernel the reference runs below
    `CHUNKED_MIN_LENGTH` queries, even where its weights would be large;
    from there, weights over `REFERENCE_MAX_BYTES` take the blockwise
    path on every backend."""
    heads = 1100  # (1, 1100, 512, 512) float32 weights: over 1 GiB
    q = keras.KerasTensor((1, length, heads, 4))
    k = keras.KerasTensor((1, 512, heads, 4))
    chosen = _kernels.select(q, k)
    if _kernels.has_fused_kernel():
        assert chosen == "fused"
    else:
        assert chosen == ("chunked" if length >= 512 else "reference")
    with _kernels.force("reference"):
        assert _kernels.select(q, k) == "reference"
    assert _kernels.select(q, k) == chosen  # the override ends with it


@pytest.mark.parametrize("causal", [False, True])
def test_the_cost_model_picks_the_faster_path(causal):
    """Without a fused kernel, 1024 queries and keys: the blockwise path
    where `BLOCKWISE_COST` times the fraction of block pairs it visits
    (all of them, or 10 of 16 with the causal band) is below 1, else the
    reference; `explain` gives the estimate."""
    q = keras.KerasTensor((2, 1024, 2, 4))
    report = F.explain(q, q, q, is_causal=causal)
    if _kernels.has_fused_kernel():
        assert report.path == "fused"
        return
    backend = keras.backend.backend()
    cost = _kernels.dispatch.BLOCKWISE_COST[backend] * (0.625 if causal else 1)
    assert report.path == ("chunked" if cost < 1 else "reference")
    expected = {
        ("tensorflow", False): "reference",
        ("tensorflow", True): "chunked",
        ("jax", False): "chunked",
        ("jax", True): "chunked",
    }
    assert report.path == expected[backend, causal]
    if report.path == "reference":
        assert f"estimated {cost:.2f}x" in report.refused["chunked"]


@pytest.mark.parametrize("heads", [2, 3])
def test_the_reference_is_refused_past_its_memory(heads):
    """An unknown batch counts as `UNKNOWN_BATCH` rows: 8 x 2 heads of
    4096 x 4096 float32 weights take 1 GiB (the reference, where it is
    the faster path), 8 x 3 heads 1.5 GiB (the blockwise path)."""
    q = keras.KerasTensor((None, 4096, heads, 4))
    report = F.explain(q, q, q)
    if _kernels.has_fused_kernel():
        assert report.path == "fused"
    elif heads == 3:
        assert report.path == "chunked"
        assert "1.5 GiB" in report.refused["reference"]
    else:
        cost = _kernels.dispatch.BLOCKWISE_COST[keras.backend.backend()]
        assert report.path == ("chunked" if cost < 1 else "reference")


def test_dense_attention_takes_larger_blocks():
    """The backend's `DENSE_CHUNK_SIZE` where nothing can be skipped and
    both lengths reach `DENSE_CHUNK_MIN_LENGTH`; `CHUNK_SIZE` with a
    mask, any structure or mod, or a shorter length; a forced size
    wins."""
    dispatch = _kernels.dispatch
    long = dispatch.DENSE_CHUNK_MIN_LENGTH
    lengths = (long, long)

    def size(mask=None, lengths=lengths, **structure):
        structure = Structure.from_args(where="test", **structure)
        return dispatch.chunk_size(structure, mask, lengths)

    assert size() == dispatch.DENSE_CHUNK_SIZE[keras.backend.backend()]
    assert dispatch.DENSE_CHUNK_SIZE["jax"] == 512
    small = [
        size(mask=np.ones((1, long, long), bool)),
        size(is_causal=True),
        size(sliding_window=64),
        size(alibi=True),
        size(logit_soft_cap=30.0),
        size(score_mod=lambda score, b, h, q, k: score),
        size(lengths=(long - 1, long)),
        size(lengths=(long, None)),
        dispatch.chunk_size(),
    ]
    assert small == [_kernels.CHUNK_SIZE] * len(small)
    with _kernels.force("chunked", chunk_size=64):
        assert size() == 64
    q = keras.KerasTensor((1, long, 2, 4))
    with _kernels.force("chunked"):
        assert f"blocks of {size()} queries" in F.explain(q, q, q).structure
        causal = F.explain(q, q, q, is_causal=True).structure
        assert f"blocks of {_kernels.CHUNK_SIZE} queries" in causal


def test_large_dense_blocks_equal_the_reference():
    """The blockwise path in blocks of 512 (JAX's for long unstructured
    attention), the last block partial, GQA: the float64 reference's
    outputs and q, k, v gradients."""
    length = _kernels.dispatch.DENSE_CHUNK_MIN_LENGTH + 100
    generator = rng(5)
    q = generator.standard_normal((1, length, 2, 4)).astype("float32")
    k = generator.standard_normal((1, length, 1, 4)).astype("float32")
    v = generator.standard_normal((1, length, 1, 3)).astype("float32")

    def blockwise(q, k, v):
        with _kernels.force("chunked", chunk_size=512):
            return F.scaled_dot_product_attention(q, k, v)

    outputs, grads, _ = value_and_grads(blockwise, [q, k, v])
    (seed,) = cotangents([outputs[0].shape])
    out, dq, dk, dv = np_sdpa_grads(q, k, v, None, False, seed)
    assert_close(
        "blockwise, dense blocks",
        "float32",
        outputs,
        grads,
        [out],
        [dq, dk, dv],
        ("q", "k", "v"),
    )


def test_force_rejects_an_unknown_path():
    with (
        pytest.raises(ValueError, match="Received: path='flash'"),
        _kernels.force("flash"),
    ):
        pass


FORCED_CASES = {  # forced path, query and key shapes, arguments, path run
    "fused": ("fused", (1, 4, 2, 4), (1, 5, 2, 4), {}, "fused"),
    "fused soft cap": (
        "fused",
        (1, 4, 2, 4),
        (1, 5, 2, 4),
        {"logit_soft_cap": 3.0},
        "reference",
    ),
    "fused weights": (
        "fused",
        (1, 4, 2, 4),
        (1, 5, 2, 4),
        {"return_attention_scores": True},
        "reference",
    ),
    "chunked": ("chunked", (1, 4, 4), (1, 5, 4), {}, "chunked"),
    "chunked no queries": ("chunked", (1, 0, 4), (1, 5, 4), {}, "reference"),
    "chunked no keys": ("chunked", (1, 4, 4), (1, 0, 4), {}, "reference"),
}


@pytest.mark.parametrize("case", FORCED_CASES)
def test_explain_names_the_forced_path_that_runs(case, monkeypatch):
    """A forced path that cannot take the call (a soft cap the kernel has
    no option for, requested weights, an empty sequence) runs the
    reference, and `explain` says so and why."""
    forced, q_shape, k_shape, kwargs, runs = FORCED_CASES[case]
    ran = []
    for name, function in list(dispatch.PATHS.items()):

        def recorded(*args, _name=name, _function=function):
            ran.append(_name)
            return _function(*args)

        monkeypatch.setitem(dispatch.PATHS, name, recorded)
    q = np.ones(q_shape, "float32")
    k = np.ones(k_shape, "float32")
    with _kernels.force(forced):
        report = F.explain(q, k, k, **kwargs)
        F.scaled_dot_product_attention(q, k, k, **kwargs)
    assert report.path == runs
    assert ran == ([] if kwargs.get("return_attention_scores") else [runs])
    if runs != forced:
        assert report.refused[forced]


@pytest.mark.parametrize("mask_kind", ["causal", "padding+causal"])
def test_chunked_blocks_with_more_keys_than_queries(mask_kind):
    """Blocks of 3 over 5 queries and 11 keys: with the causal structure
    the last key blocks are seen by no query block and are skipped, and
    their keys and values get zero gradients."""
    q, k, v, mask, causal = sdpa_inputs("gqa", mask_kind, 5, 11)
    cases = [
        (f"sdpa chunked T<S {dtype}", "chunked", dtype)
        for dtype in ("float32", "bfloat16")
    ]
    check_sdpa(cases, q, k, v, mask, causal)


@pytest.mark.parametrize("path", KERNEL_PATHS)
def test_hidden_keys_get_no_weight_past_the_masking_constant(path):
    """float16 logits of ±34223, beyond float16's masking constant: the
    one visible key, whose logit is the smallest, gets all the weight;
    a row with no visible key gets zeros."""
    q = np.full((1, 3, 1, 8), 110.0)
    k = np.full((1, 3, 1, 8), 110.0)
    k[0, 0] = -110.0
    v = np.array([1.0, 5.0, 9.0]).reshape(1, 3, 1, 1) * np.ones((1, 3, 1, 8))
    mask = np.array([[[True, False, False]] * 2 + [[False] * 3]])  # (1, T, S)
    with path_context(path):
        out = F.scaled_dot_product_attention(
            *(ops.cast(x, "float16") for x in (q, k, v)), mask=mask
        )
    np.testing.assert_array_equal(
        ops.convert_to_numpy(out)[0, :, 0, 0], [1.0, 1.0, 0.0]
    )


@pytest.mark.parametrize("lengths", [(0, 5), (5, 0)])
@pytest.mark.parametrize("path", KERNEL_PATHS)
def test_empty_sequences(path, lengths):
    """No queries: no outputs; no keys: zeros for every query."""
    t, s = lengths
    q = np.ones((2, t, 4), "float32")
    k = np.ones((2, s, 4), "float32")
    with path_context(path):
        out = F.scaled_dot_product_attention(q, k, k, is_causal="bottom_right")
    np.testing.assert_array_equal(
        ops.convert_to_numpy(out), np.zeros((2, t, 4))
    )


@pytest.mark.parametrize("path", KERNEL_PATHS)
def test_variables_as_inputs(path):
    """Keras variables as the query, key and value (7 keys: the last
    block of 3 holds padding): the reference's outputs and the gradients
    of the variables."""
    q, k, v, mask, causal = sdpa_inputs("gqa", "padding+causal", 7, 7)
    variables = [keras.Variable(x) for x in (q, k, v)]

    def fn():
        with path_context(path):
            return F.scaled_dot_product_attention(
                *variables, mask=mask, is_causal=causal
            )

    outputs, _, grads = value_and_grads(fn, [], variables)
    visible = np_structure_mask(2, 7, 7, causal) & mask
    seed = cotangents([outputs[0].shape])[0]
    out, *reference = np_sdpa_grads(q, k, v, visible, False, seed)
    assert_close(
        f"variables {path}",
        "float32",
        outputs,
        grads,
        [out],
        reference,
        ("q", "k", "v"),
    )


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="only TensorFlow traces graphs whose batch size is unknown",
)
def test_chunked_path_in_a_graph_of_unknown_batch():
    """Keras's TensorFlow trainer may retrace its step with the batch axis
    unknown (`reduce_retracing`); the blockwise path runs there too."""
    import tensorflow as tf

    q, k, v, mask, _ = sdpa_inputs("gqa", "padding", 7, 6)
    spec = [tf.TensorSpec((None, *x.shape[1:])) for x in (q, k, v)]
    spec.append(tf.TensorSpec((None, *mask.shape[1:]), tf.bool))

    @tf.function(input_signature=spec)
    def attend(q, k, v, mask):
        with _kernels.force("chunked", chunk_size=3):
            return F.scaled_dot_product_attention(
                q, k, v, mask=mask, is_causal=True
            )

    with _kernels.force("reference"):
        want = F.scaled_dot_product_attention(
            q, k, v, mask=mask, is_causal=True
        )
    np.testing.assert_allclose(
        attend(q, k, v, mask).numpy(), ops.convert_to_numpy(want), atol=1e-5
    )
