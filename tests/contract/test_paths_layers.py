"""Every path of every layer gives its reference's outputs and gradients.

Each path (the forced kernels `reference`, `chunked` and `fused`, the
inference shortcut that calls sublayers directly, the symbolic call in a
functional model, the KV-cache or step-by-step path) runs on its own copy
of the layer (same weights), all paths of a case in one differentiated
program. The outputs and the gradients of every input and every
trainable weight must equal the layer's reference path computed in
float64, in float32 and under mixed float16 / bfloat16 policies.
`scaled_dot_product_attention` itself is checked against NumPy in
`test_paths_functional.py`.
"""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention import _kernels
from keras_attention.layers import RollingCache
from tests.autodiff import assert_close
from tests.autodiff import float64_context
from tests.autodiff import path_context
from tests.autodiff import value_and_grads
from tests.helpers import rng

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


def _self_attention_steps(layer, x, masks, cache_shape, rolling=False):
    """The cached path: one token at a time through a KV cache."""
    cache = ops.zeros(cache_shape, x.dtype)
    cache = RollingCache(cache) if rolling else cache
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


def _mechanism_steps(layer, query, value, key, masks):
    """A mechanism with memory, one `attend` per query."""
    mask = masks.get("value_mask")
    keys = layer.project_keys(key)
    state = layer.get_initial_attention_state(value, mask)
    contexts = []
    for t in range(T):
        context, weights = layer.attend(
            query[:, t],
            value,
            keys,
            value_mask=mask,
            return_attention_scores=True,
            training=True,
            attention_state=state,
        )
        state = layer.next_attention_state(state, weights)
        contexts.append(context)
    return ops.stack(contexts, axis=1)  # (B, T, Dv)


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
    "MultiHeadSelfAttention causal window": dict(
        make=_mhsa(num_heads=2, sliding_window=2),
        shapes=[(B, T, D)],
        masks={"padding_mask": _padding(T, 4)},
        call=lambda layer, x, masks, training: layer(
            x, use_causal_mask=True, training=training, **masks
        ),
        kernels=True,
        steps=lambda layer, x, masks: _self_attention_steps(
            layer, x, masks, (B, 2, T, 2, D // 2)
        ),
    ),
    "MultiHeadSelfAttention alibi soft-cap window": dict(
        make=_mhsa(
            num_heads=4,
            key_dim=4,
            num_key_value_heads=2,
            alibi=True,
            logit_soft_cap=2.0,
            sliding_window=3,
        ),
        shapes=[(B, T, D)],
        masks={"padding_mask": _padding(T, 4)},
        call=lambda layer, x, masks, training: layer(
            x, use_causal_mask=True, training=training, **masks
        ),
        kernels=True,
        # A cache of the window's 3 positions: a rolling cache.
        steps=lambda layer, x, masks: _self_attention_steps(
            layer, x, masks, (B, 2, 3, 2, 4), rolling=True
        ),
    ),  # fmt: skip
    "MultiHeadSelfAttention qk-norm rotary gqa": dict(
        make=_mhsa(
            num_heads=4,
            key_dim=4,
            num_key_value_heads=2,
            use_rotary=True,
            use_qk_norm=True,
        ),
        shapes=[(B, T, D)],
        masks={"padding_mask": _padding(T, 4)},
        call=lambda layer, x, masks, training: layer(
            x, use_causal_mask=True, training=training, **masks
        ),
        kernels=True,
        steps=lambda layer, x, masks: _self_attention_steps(
            layer, x, masks, (B, 2, T, 2, 4)
        ),
    ),
    "MultiHeadSelfAttention segments gqa window": dict(
        make=_mhsa(
            num_heads=4,
            key_dim=4,
            num_key_value_heads=2,
            sliding_window=(1, 2),
            use_rotary=True,
        ),
        shapes=[(B, T, D)],
        masks={"segment_ids": np.array([[1, 1, 2, 2, 0], [3, 3, 3, 3, 3]])},
        call=lambda layer, x, masks, training: layer(
            x, training=training, **masks
        ),
        kernels=True,
    ),  # fmt: skip
    "CrossAttention segments": dict(
        make=lambda dtype: ka.CrossAttention(2, dtype=dtype),
        shapes=[(B, T, D), (B, S, 6)],
        masks={
            "segment_ids": (
                np.array([[1, 1, 2, 2, 2], [1, 2, 2, 0, 0]]),
                np.array([[1, 2, 2, 0], [1, 1, 2, 2]]),
            )
        },
        call=lambda layer, q, v, masks, training: layer(
            q, v, training=training, **masks
        ),
        kernels=True,
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
    # init_cache(B, T) makes a rolling cache of the window's 3 positions.
    "TransformerDecoderBlock window": dict(
        make=lambda dtype: ka.TransformerDecoderBlock(
            2, 16, sliding_window=3, normalize_first=True, dtype=dtype
        ),
        shapes=[(B, T, D)],
        masks={},
        call=lambda layer, x, masks, training: layer(x, training=training),
        kernels=True,
        steps=lambda layer, x, masks: _decoder_steps(layer, x, None, masks),
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
    # Attention with memory: T queries run in order, each reading the
    # alignment of the one before; the steps path loops over `attend`.
    (
        "LocationSensitiveAttention cumulative",
        lambda d: ka.LocationSensitiveAttention(5, 3, 3, dtype=d),
        3,
    ),
    (
        "LocationSensitiveAttention smoothing",
        lambda d: ka.LocationSensitiveAttention(
            5, 2, 1, cumulative=False, smoothing=True, dtype=d
        ),
        2,
    ),
    (
        "MonotonicAttention parallel normalize",
        lambda d: ka.MonotonicAttention(
            5, score_bias_init=-0.5, normalize=True, dtype=d
        ),
        3,
    ),
    (
        "MonotonicAttention recursive luong",
        lambda d: ka.MonotonicAttention(
            score="luong", mode="recursive", scale=True, dtype=d
        ),
        3,
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
    if _name.startswith(("Location", "Monotonic")) and _shape == 3:
        LAYER_CASES[_name]["steps"] = _mechanism_steps
for _name, _cell, _attention, _kwargs in (
    (
        "AttentionDecoder bahdanau flow",
        "GRUCell",
        lambda d: ka.BahdanauAttention(5, dtype=d),
        {},
    ),
    (
        "AttentionDecoder luong flow",
        "LSTMCell",
        lambda d: ka.LuongAttention(dtype=d),
        {},
    ),
    (
        "AttentionDecoder location-sensitive",
        "GRUCell",
        lambda d: ka.LocationSensitiveAttention(5, dtype=d),
        {},
    ),
    (
        "AttentionDecoder monotonic",
        "LSTMCell",
        lambda d: ka.MonotonicAttention(5, dtype=d),
        {"flow": "luong"},
    ),
    (  # tensorflow-addons' AttentionWrapper with an attention layer
        "AttentionDecoder linear attentional layer",
        "GRUCell",
        lambda d: ka.BahdanauAttention(5, dtype=d),
        {"flow": "luong", "attention_activation": None},
    ),
):
    LAYER_CASES[_name] = dict(
        make=lambda d, c=_cell, a=_attention, k=_kwargs: ka.AttentionDecoder(
            getattr(keras.layers, c)(6, dtype=d), a(d), dtype=d, **k
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


def check_layer_paths(name, policy, dtype):
    """Every path of the case under `policy` against the float64
    reference; errors recorded under the compute `dtype`."""
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
    copies = [build_copy(case, policy, inputs, weights) for _ in paths]
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
    assert per_copy == len(ref_w) > 0
    for i, path in enumerate(paths):
        grads = (
            input_grads[i * n : (i + 1) * n]
            + weight_grads[i * per_copy : (i + 1) * per_copy]
        )
        assert_close(
            f"layer {path}",
            dtype,
            [outputs[i]],
            grads,
            ref_out,
            ref_in + ref_w,
            names,
        )


@pytest.mark.parametrize("name", tuple(LAYER_CASES))
def test_layer_paths_equal_float64_reference(name):
    """Every path of the layer: the outputs and the gradients of every
    input and every trainable weight equal the float64 reference path."""
    check_layer_paths(name, "float32", "float32")


# PyTorch's CPU flash kernel differentiates bfloat16 less exactly than the
# reference path's float32 softmax: through a post-LN block its gradients
# are within 0.25 of float64 (0.03 on the reference path), beyond the
# tolerance; the block is checked in float16 and in bfloat16 through the
# single layers.
MIXED_CASES = (
    [
        (name, dtype)
        for name in (
            "MultiHeadSelfAttention causal+padding",
            "AttentionDecoder luong flow",
        )
        for dtype in ("float16", "bfloat16")
    ]
    + [
        ("LocationSensitiveAttention cumulative", "bfloat16"),
        ("MonotonicAttention parallel normalize", "float16"),
    ]
    + [("TransformerDecoderBlock encoder", "float16")]
)


@pytest.mark.parametrize("name,dtype", MIXED_CASES)
def test_mixed_precision_paths_equal_float64_reference(name, dtype):
    """Under a mixed policy (half compute, float32 weights), every path:
    outputs and every gradient near the float64 reference's."""
    check_layer_paths(name, f"mixed_{dtype}", dtype)


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
