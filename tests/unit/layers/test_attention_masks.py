"""Attention masks in the multi-head layers and blocks.

`attention_mask` takes any shape that broadcasts to `(B, T, S)`, as
Keras's `MultiHeadAttention` does: each such mask gives what the same
mask tiled to `(B, T, S)` gives, in the outputs and the gradients of the
inputs and every weight, on every path, and what Keras gives with the
same weights.
"""

import keras
import numpy as np
import pytest

import keras_attention as ka
from keras_attention import convert
from tests.autodiff import assert_close
from tests.autodiff import path_context
from tests.autodiff import value_and_grads
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, S, D, N = 2, 5, 4, 8, 2


def broadcast_forms(t, s, hidden_rows=True):
    """`{name: mask}` of each shape Keras broadcasts to `(B, t, s)`; with
    `hidden_rows`, some query rows see no key at all."""
    generator = rng(5)
    shared = generator.random((t, s)) < 0.6  # (T, S)
    shared[:, 0] = True
    keys = generator.random((B, 1, s)) < 0.6  # (B, 1, S)
    keys[:, :, 1] = True
    rows = np.ones((B, t, 1), bool)  # (B, T, 1)
    if hidden_rows:
        shared[1] = False
        rows[0, 2] = False
    forms = {
        "(T, S)": shared,
        "(1, T, S)": shared[None],
        "(B, 1, S)": keys,
    }
    if hidden_rows:
        forms["(B, T, 1)"] = rows
    return forms


LAYERS = {  # kind: (make, call on (x, source, mask), its key length)
    "MultiHeadSelfAttention": (
        lambda: ka.MultiHeadSelfAttention(N),
        lambda layer, x, source, mask: layer(x, attention_mask=mask),
        T,
    ),
    "CrossAttention": (
        lambda: ka.CrossAttention(N),
        lambda layer, x, source, mask: layer(x, source, attention_mask=mask),
        S,
    ),
    "TransformerEncoderBlock": (
        lambda: ka.TransformerEncoderBlock(N, 16),
        lambda layer, x, source, mask: layer(x, attention_mask=mask),
        T,
    ),
    "TransformerDecoderBlock": (
        lambda: ka.TransformerDecoderBlock(N, 16),
        lambda layer, x, source, mask: layer(x, source, attention_mask=mask),
        T,
    ),
}
# The layers share their masking: every path on one of them, the
# reference on the blocks (which hand the mask to their self-attention).
CASES = [
    *(("MultiHeadSelfAttention", p) for p in ("reference", "chunked", "fused")),
    ("CrossAttention", "reference"),
    ("CrossAttention", "chunked"),
    ("TransformerEncoderBlock", "reference"),
    ("TransformerDecoderBlock", "reference"),
]


def copies(make, count, call, x, source):
    """`count` built layers with the weights of the first."""
    keras.utils.set_random_seed(0)
    layers = [make() for _ in range(count)]
    for layer in layers:
        call(layer, x, source, None)
        layer.set_weights(layers[0].get_weights())
    return layers


@pytest.mark.parametrize("kind,path", CASES)
def test_a_broadcast_attention_mask_equals_it_tiled(kind, path):
    make, call, key_length = LAYERS[kind]
    forms = broadcast_forms(T, key_length)
    tiled = [np.broadcast_to(m, (B, T, key_length)) for m in forms.values()]
    masks = [*forms.values(), *(np.ascontiguousarray(m) for m in tiled)]
    x = rng(1).standard_normal((B, T, D)).astype("float32")
    source = rng(2).standard_normal((B, S, D)).astype("float32")
    inputs = (
        [x, source]
        if kind in ("CrossAttention", "TransformerDecoderBlock")
        else [x]
    )
    n = len(inputs)
    layers = copies(make, len(masks), call, x, source)

    def every_mask(*xs):
        with path_context(path):
            return [
                call(layer, *(*xs[n * i : n * i + n], None)[:2], mask)
                for i, (layer, mask) in enumerate(
                    zip(layers, masks, strict=True)
                )
            ]

    weights = [w for layer in layers for w in layer.trainable_weights]
    outputs, grads, weight_grads = value_and_grads(
        every_mask, inputs * len(masks), weights, copies=len(masks)
    )
    count, per_layer = len(forms), len(layers[0].trainable_weights)

    def of(i):  # gradients of copy i: its inputs, then its weights
        return [
            *grads[n * i : n * i + n],
            *weight_grads[i * per_layer : (i + 1) * per_layer],
        ]

    names = ["x", "source"][:n] + [w.path for w in layers[0].trainable_weights]
    for i, form in enumerate(forms):
        assert np.all(np.isfinite(outputs[i])), form
        assert_close(
            f"{kind} attention_mask {form}",
            "float32",
            [outputs[i]],
            of(i),
            [outputs[count + i]],
            of(count + i),
            names,
        )


@pytest.mark.parametrize("cross", [False, True])
def test_broadcast_masks_equal_keras(cross):
    """The shapes Keras's `MultiHeadAttention` takes, with its weights
    copied: the same outputs (rows that see a key; Keras's fused path
    gives a row that sees none the mean of the values)."""
    x = rng(3).standard_normal((B, T, D)).astype("float32")
    source = rng(4).standard_normal((B, S, D)).astype("float32")
    value = source if cross else x
    theirs = keras.layers.MultiHeadAttention(N, D // N)
    theirs(x, value)
    ours = convert.from_keras(theirs, cross_attention=cross)
    forms = broadcast_forms(T, value.shape[1], hidden_rows=False)
    forms["(B, T, S)"] = np.broadcast_to(
        forms["(B, 1, S)"], (B, T, value.shape[1])
    )
    for form, mask in forms.items():
        want = to_numpy(theirs(x, value, attention_mask=mask))
        args = (x, source) if cross else (x,)
        got = to_numpy(ours(*args, attention_mask=mask))
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=form)


def test_a_cached_step_takes_a_mask_shared_by_the_batch():
    """Step by step over a cache, a `(1, S_max)` mask row per step equals
    the same row for each example, `(B, 1, S_max)`."""
    keras.utils.set_random_seed(0)
    layer = ka.MultiHeadSelfAttention(N)
    x = rng(6).standard_normal((B, T, D)).astype("float32")
    layer(x)
    allowed = np.tril(np.ones((T, T), bool)) & (np.arange(T) != 1)
    allowed[:, 0] = True  # (T, S_max): causal, key 1 hidden
    outputs = {}
    for name, shaped in (
        ("shared", lambda row: row[None]),  # (1, S_max)
        ("tiled", lambda row: np.broadcast_to(row, (B, 1, T))),
    ):
        cache, steps = np.zeros((B, 2, T, N, D // N), "float32"), []
        for t in range(T):
            out, cache = layer(
                x[:, t : t + 1],
                attention_mask=shaped(allowed[t]),
                cache=cache,
                cache_index=t,
            )
            steps.append(to_numpy(out))
        outputs[name] = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(outputs["shared"], outputs["tiled"], atol=1e-6)
    full = to_numpy(layer(x, attention_mask=allowed))
    np.testing.assert_allclose(outputs["shared"], full, atol=1e-5)
