"""Every path gives the reference's outputs and gradients.

The paths of `scaled_dot_product_attention` (`reference`, `chunked`,
`fused`, each forced through `_kernels.force` on every backend, the
automatic choice on both sides of the length threshold, and the symbolic
path of a functional model) are checked against a float64 NumPy reference
for the outputs and the gradients of the query, key and value. The layers'
paths (forced kernels, the inference shortcut, the KV-cache step, the
symbolic call) are checked against the layer's reference path in float64
on the gradients of every input and every trainable weight. Gradients are
taken with the backend's own autodiff.
"""

import contextlib

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention import _kernels
from keras_attention import functional as F
from tests.autodiff import assert_close
from tests.autodiff import cotangents
from tests.autodiff import float64_context
from tests.autodiff import np_sdpa_grads
from tests.autodiff import value_and_grads
from tests.helpers import rng

KERNEL_PATHS = tuple(_kernels.PATHS)  # reference, chunked, fused
SMALL_CHUNK = 3  # several chunks, the last one partial, at short lengths

SDPA_LAYOUTS = {  # query shape, key shape, value dim
    "3d": ((2, 7, 4), (2, 6, 4), 3),
    "4d": ((2, 7, 2, 4), (2, 6, 2, 4), 3),
    "gqa": ((2, 7, 4, 4), (2, 6, 2, 4), 3),
}
MASKS = ("none", "padding", "causal", "padding+causal")
DTYPES = ("float32", "float16", "bfloat16")


def path_context(path):
    """Forces a kernel path; `auto` and `symbolic` use the dispatch."""
    if path in KERNEL_PATHS:
        chunk = SMALL_CHUNK if path == "chunked" else None
        return _kernels.force(path, chunk_size=chunk)
    return contextlib.nullcontext()


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


def sdpa_function(path, dtype, mask, causal, shapes):
    """`fn(q, k, v)` computing attention in `dtype` on `path`."""
    if path == "symbolic":
        inputs = [keras.Input(shape[1:]) for shape in shapes]
        mask_input = None
        if mask is not None:
            mask_input = keras.Input(mask.shape[1:], dtype="bool")
        cast = [ops.cast(x, dtype) for x in inputs]
        out = F.scaled_dot_product_attention(
            *cast, mask=mask_input, is_causal=causal
        )
        model = keras.Model(
            inputs + ([mask_input] if mask is not None else []), out
        )
        extra = [ops.convert_to_tensor(mask)] if mask is not None else []
        return lambda *qkv: model([*map(ops.convert_to_tensor, qkv), *extra])

    def fn(q, k, v):
        with path_context(path):
            return F.scaled_dot_product_attention(
                *(ops.cast(x, dtype) for x in (q, k, v)),
                mask=mask,
                is_causal=causal,
            )

    return fn


def check_sdpa(cases, q, k, v, mask, causal):
    """Checks `(what, path, dtype)` cases on the same inputs, all in one
    differentiated program (one compilation on JAX, not one per case)."""
    shapes = (q.shape, k.shape, v.shape)
    fns = [sdpa_function(p, d, mask, causal, shapes) for _, p, d in cases]

    def every_case(*qkvs):
        return [fn(*qkvs[3 * i : 3 * i + 3]) for i, fn in enumerate(fns)]

    outputs, grads, _ = value_and_grads(every_case, [q, k, v] * len(cases))
    seeds = cotangents([o.shape for o in outputs])
    for i, (what, _, dtype) in enumerate(cases):
        out, dq, dk, dv = np_sdpa_grads(q, k, v, mask, causal, seeds[i])
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
    """At 520 queries TensorFlow and JAX on CPU choose the chunked path
    (the fused kernel elsewhere): every gradient still reaches q, k, v."""
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
    q = ops.zeros((1, length, 2, 4))
    k = ops.zeros((1, _kernels.CHUNK_SIZE, 2, 4))
    chosen = _kernels.select(q, k)
    if _kernels._has_fused_kernel():
        assert chosen == "fused"
    else:
        assert chosen == ("chunked" if length >= 512 else "reference")
    with _kernels.force("reference"):
        assert _kernels.select(q, k) == "reference"
    assert _kernels.select(q, k) == chosen  # the override ends with it


def test_force_rejects_an_unknown_path():
    with (
        pytest.raises(ValueError, match="Received: path='flash'"),
        _kernels.force("flash"),
    ):
        pass


# --- layers ----------------------------------------------------------------
#
# A case is a layer, its float inputs (differentiated) and constant masks,
# and how it is called. Each path runs on its own copy of the layer (same
# weights), all paths of a case in one differentiated program; the
# reference is the layer's reference path in float64.

B, T, S, D = 2, 5, 4, 8


def _padding(length, visible_first):
    """`(B, length)`: example 0 sees its first `visible_first` positions."""
    return np.arange(length)[None, :] < np.array([[visible_first], [length]])


def _attention_mask():
    """`(B, T, T)` causal, with a query of example 1 that sees no key."""
    mask = np.broadcast_to(np.tril(np.ones((T, T), bool)), (B, T, T)).copy()
    mask[1, 2] = False
    return mask


def _self_attention_steps(layer, x, masks, cache_shape):
    """The cached path: one token at a time through a KV cache."""
    cache = ops.zeros(cache_shape, x.dtype)
    outputs = []
    for t in range(T):
        out, cache = layer(
            x[:, t : t + 1],
            padding_mask=masks.get("padding_mask"),
            use_causal_mask=True,
            cache=cache,
            cache_index=t,
            training=True,
        )
        outputs.append(out)
    return ops.concatenate(outputs, axis=1)


def _decoder_steps(layer, x, enc, masks):
    cache = layer.init_cache(B, T, encoder_outputs=enc, dtype=x.dtype)
    outputs = []
    for t in range(T):
        out, cache = layer(
            x[:, t : t + 1],
            padding_mask=masks.get("padding_mask"),
            encoder_padding_mask=masks.get("encoder_padding_mask"),
            cache=cache,
            cache_index=t,
            training=True,
        )
        outputs.append(out)
    return ops.concatenate(outputs, axis=1)


def _rnn_steps(layer, targets, encoded, masks):
    mask = masks.get("encoder_padding_mask")
    state = layer.get_initial_state(encoded, mask)
    outputs = []
    for t in range(T):
        out, state, _ = layer.step(
            targets[:, t], state, encoded, mask, training=True
        )
        outputs.append(out)
    return ops.stack(outputs, axis=1)


def _mhsa(**kwargs):
    return lambda dtype: ka.MultiHeadSelfAttention(dtype=dtype, **kwargs)


LAYER_CASES = {
    "MultiHeadSelfAttention causal+padding": dict(
        make=_mhsa(num_heads=2),
        shapes=[(B, T, D)],
        masks={"padding_mask": _padding(T, 3)},
        call=lambda layer, x, masks, training: layer(
            x, use_causal_mask=True, training=training, **masks
        ),
        kernels=True,
        steps=lambda layer, x, masks: _self_attention_steps(
            layer, x, masks, (B, 2, T, 2, D // 2)
        ),
    ),
    "MultiHeadSelfAttention gqa+rotary": dict(
        make=_mhsa(
            num_heads=4, key_dim=4, num_key_value_heads=2, use_rotary=True
        ),
        shapes=[(B, T, D)],
        masks={"attention_mask": _attention_mask()},
        call=lambda layer, x, masks, training: layer(
            x, training=training, **masks
        ),
        kernels=True,
    ),
    "MultiHeadSelfAttention gqa+rotary causal": dict(
        make=_mhsa(
            num_heads=4, key_dim=4, num_key_value_heads=2, use_rotary=True
        ),
        shapes=[(B, T, D)],
        masks={},
        call=lambda layer, x, masks, training: layer(
            x, use_causal_mask=True, training=training
        ),
        kernels=True,
        steps=lambda layer, x, masks: _self_attention_steps(
            layer, x, masks, (B, 2, T, 2, 4)
        ),
    ),
    "CrossAttention value_mask": dict(
        make=lambda dtype: ka.CrossAttention(2, dtype=dtype),
        shapes=[(B, T, D), (B, S, 6)],
        masks={"value_mask": np.array([[1, 1, 0, 0], [0, 0, 0, 0]], bool)},
        call=lambda layer, q, v, masks, training: layer(
            q, v, training=training, **masks
        ),
        kernels=True,
    ),
    "CrossAttention gqa key": dict(
        make=lambda dtype: ka.CrossAttention(
            4, key_dim=4, num_key_value_heads=2, dtype=dtype
        ),
        shapes=[(B, T, D), (B, S, 6), (B, S, 5)],
        masks={},
        call=lambda layer, q, v, k, masks, training: layer(
            q, v, key=k, training=training
        ),
        kernels=True,
    ),
    "TransformerEncoderBlock post-LN": dict(
        make=lambda dtype: ka.TransformerEncoderBlock(2, 16, dtype=dtype),
        shapes=[(B, T, D)],
        masks={"padding_mask": _padding(T, 3)},
        call=lambda layer, x, masks, training: layer(
            x, training=training, **masks
        ),
        kernels=True,
    ),
    "TransformerEncoderBlock pre-LN gqa": dict(
        make=lambda dtype: ka.TransformerEncoderBlock(
            4,
            16,
            key_dim=4,
            num_key_value_heads=2,
            normalize_first=True,
            dtype=dtype,
        ),
        shapes=[(B, T, D)],
        masks={"attention_mask": _attention_mask()},
        call=lambda layer, x, masks, training: layer(
            x, training=training, **masks
        ),
        kernels=True,
    ),
    "TransformerDecoderBlock encoder": dict(
        make=lambda dtype: ka.TransformerDecoderBlock(2, 16, dtype=dtype),
        shapes=[(B, T, D), (B, S, D)],
        masks={
            "padding_mask": _padding(T, 4),
            "encoder_padding_mask": _padding(S, 2),
        },
        call=lambda layer, x, enc, masks, training: layer(
            x, enc, training=training, **masks
        ),
        kernels=True,
        steps=_decoder_steps,
    ),
    "TransformerDecoderBlock decoder-only": dict(
        make=lambda dtype: ka.TransformerDecoderBlock(
            4,
            16,
            key_dim=4,
            num_key_value_heads=2,
            use_rotary=True,
            normalize_first=True,
            dtype=dtype,
        ),
        shapes=[(B, T, D)],
        masks={},
        call=lambda layer, x, masks, training: layer(x, training=training),
        kernels=True,
        steps=lambda layer, x, masks: _decoder_steps(layer, x, None, masks),
    ),
}
for _name, _make, _shape in (
    ("BahdanauAttention", lambda d: ka.BahdanauAttention(5, dtype=d), 3),
    (
        "BahdanauAttention normalize",
        lambda d: ka.BahdanauAttention(5, normalize=True, dtype=d),
        2,
    ),
    (
        "LuongAttention dot",
        lambda d: ka.LuongAttention("dot", scale=True, dtype=d),
        3,
    ),
    ("LuongAttention general", lambda d: ka.LuongAttention(dtype=d), 3),
    (
        "LuongAttention concat",
        lambda d: ka.LuongAttention("concat", units=5, dtype=d),
        2,
    ),
):
    LAYER_CASES[_name] = dict(
        make=_make,
        shapes=[(B, T, 6) if _shape == 3 else (B, 6), (B, S, 6), (B, S, 6)],
        masks={"value_mask": np.array([[1, 1, 0, 0], [0, 0, 0, 0]], bool)},
        call=lambda layer, q, v, k, masks, training: layer(
            q, v, key=k, training=training, **masks
        ),
        kernels=False,
    )
for _name, _cell, _attention in (
    ("AttentionDecoder bahdanau flow", "GRUCell", "BahdanauAttention"),
    ("AttentionDecoder luong flow", "LSTMCell", "LuongAttention"),
):
    LAYER_CASES[_name] = dict(
        make=lambda d, c=_cell, a=_attention: ka.AttentionDecoder(
            getattr(keras.layers, c)(6, dtype=d),
            getattr(ka, a)(dtype=d)
            if a == "LuongAttention"
            else getattr(ka, a)(5, dtype=d),
            dtype=d,
        ),
        shapes=[(B, T, 3), (B, S, 6)],
        masks={"encoder_padding_mask": _padding(S, 2)},
        call=lambda layer, x, enc, masks, training: layer(
            x, enc, training=training, **masks
        ),
        kernels=False,
        steps=_rnn_steps,
    )


def layer_paths(case):
    paths = ["reference", "inference", "symbolic"]
    if case["kernels"]:
        paths += ["chunked", "fused"]
    if "steps" in case:
        paths.append("steps")
    return paths


def build_copy(case, dtype, inputs, weights=None):
    """A built layer of the case in `dtype`, with `weights` if given."""
    layer = case["make"](dtype)
    case["call"](layer, *inputs, case["masks"], False)
    if weights is not None:
        layer.set_weights(weights)
    return layer


def path_function(case, path, layer, inputs):
    """`fn(*inputs)` running the layer on `path`."""
    masks = case["masks"]
    if path == "symbolic":
        symbolic = [keras.Input(x.shape[1:]) for x in inputs]
        model = keras.Model(
            symbolic, case["call"](layer, *symbolic, masks, True)
        )
        return lambda *xs: model([*map(ops.convert_to_tensor, xs)])
    if path == "steps":
        return lambda *xs: case["steps"](layer, *xs, masks)
    training = path != "inference"

    def fn(*xs):
        with path_context("reference" if path == "inference" else path):
            return case["call"](layer, *xs, masks, training)

    return fn


def float64_reference(case, inputs, weights):
    with float64_context():
        layer = build_copy(case, "float64", inputs, weights)
        fn = path_function(case, "reference", layer, inputs)
        return value_and_grads(fn, inputs, layer.trainable_weights)


@pytest.mark.parametrize("name", tuple(LAYER_CASES))
def test_layer_paths_equal_float64_reference(name):
    """Every path of the layer: the outputs and the gradients of every
    input and every trainable weight equal the float64 reference path."""
    case = LAYER_CASES[name]
    generator = rng(1)
    inputs = [
        generator.standard_normal(shape).astype("float32")
        for shape in case["shapes"]
    ]
    base = build_copy(case, "float32", inputs)
    weights = base.get_weights()
    ref_out, ref_in, ref_w = float64_reference(case, inputs, weights)
    paths = layer_paths(case)
    copies = [build_copy(case, "float32", inputs, weights) for _ in paths]
    fns = [
        path_function(case, path, layer, inputs)
        for path, layer in zip(paths, copies, strict=True)
    ]
    n = len(inputs)

    def every_path(*xs):
        return [fn(*xs[i * n : (i + 1) * n]) for i, fn in enumerate(fns)]

    variables = [w for layer in copies for w in layer.trainable_weights]
    outputs, input_grads, weight_grads = value_and_grads(
        every_path, inputs * len(paths), variables, copies=len(paths)
    )
    names = [f"input {i}" for i in range(n)] + [
        w.path for w in base.trainable_weights
    ]
    per_copy = len(base.trainable_weights)
    assert per_copy == len(ref_w) and per_copy > 0 or name.startswith("Luong")
    for i, path in enumerate(paths):
        grads = (
            input_grads[i * n : (i + 1) * n]
            + weight_grads[i * per_copy : (i + 1) * per_copy]
        )
        assert_close(
            f"layer {path}",
            "float32",
            [outputs[i]],
            grads,
            ref_out,
            ref_in + ref_w,
            names,
        )


def test_layer_past_the_length_threshold():
    """A self-attention layer at 520 positions on the path the dispatch
    picks (chunked on TensorFlow and JAX on CPU): every weight's gradient
    equals the float64 reference's."""
    length = _kernels.CHUNKED_MIN_LENGTH + 8
    case = dict(
        LAYER_CASES["MultiHeadSelfAttention causal+padding"],
        masks={"padding_mask": np.arange(length)[None, :] < 500},
    )
    x = rng(3).standard_normal((1, length, D)).astype("float32")
    base = build_copy(case, "float32", [x])
    ref_out, ref_in, ref_w = float64_reference(case, [x], base.get_weights())
    fn = path_function(case, "auto", base, [x])
    outputs, input_grads, weight_grads = value_and_grads(
        fn, [x], base.trainable_weights
    )
    assert_close(
        f"layer auto T={length}",
        "float32",
        outputs,
        input_grads + weight_grads,
        ref_out,
        ref_in + ref_w,
        ["input"] + [w.path for w in base.trainable_weights],
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "name",
    [
        "MultiHeadSelfAttention causal+padding",
        "CrossAttention value_mask",
        "TransformerDecoderBlock encoder",
        "BahdanauAttention",
        "AttentionDecoder luong flow",
    ],
)
def test_mixed_precision_layer_equals_float64_reference(name, dtype):
    """Under a mixed policy (half compute, float32 weights) on the
    automatic path: outputs and every gradient near the float64 ones."""
    case = LAYER_CASES[name]
    generator = rng(2)
    inputs = [
        generator.standard_normal(shape).astype("float32")
        for shape in case["shapes"]
    ]
    base = build_copy(case, "float32", inputs)
    weights = base.get_weights()
    ref_out, ref_in, ref_w = float64_reference(case, inputs, weights)
    layer = build_copy(case, f"mixed_{dtype}", inputs, weights)
    fn = path_function(case, "auto", layer, inputs)
    outputs, input_grads, weight_grads = value_and_grads(
        fn, inputs, layer.trainable_weights
    )
    names = [f"input {i}" for i in range(len(inputs))] + [
        w.path for w in layer.trainable_weights
    ]
    assert_close(
        "layer auto (mixed precision)",
        dtype,
        outputs,
        input_grads + weight_grads,
        ref_out,
        ref_in + ref_w,
        names,
    )
