"""Attention masks in the multi-head layers and blocks.

`attention_mask` takes any shape that broadcasts to `(B, T, S)`, as
Keras's `MultiHeadAttention` does: each such mask gives what the same
mask tiled to `(B, T, S)` gives, in the outputs and the gradients of the
inputs and every weight, on every path, and what Keras gives with the
same weights. The decoder block's `encoder_attention_mask` (keras-hub's)
gives each target position what a padding mask of its own row gives,
combined with `encoder_padding_mask` by logical AND, also step by step.
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


def source_masks():
    """`encoder_padding_mask` `(B, S)` and `encoder_attention_mask`
    `(B, T, S)`: target row 1 of example 0 sees no source position
    (hidden by the attention mask), row 3 of example 1 sees only
    position 2, which the padding mask hides."""
    padding = np.array([[1, 1, 1, 0], [1, 1, 0, 1]], bool)  # (B, S)
    allowed = rng(7).random((B, T, S)) < 0.6  # (B, T, S)
    allowed[:, :, 0] = True
    allowed[0, 1] = False
    allowed[1, 3] = [False, False, True, False]
    return padding, allowed


@pytest.mark.parametrize("normalize_first", [False, True])
def test_encoder_attention_mask_is_a_source_mask_per_target_row(
    normalize_first,
):
    """Target position `t` of the causal block with `encoder_attention_mask`
    `M` equals position `t` of the block with the padding mask `M[:, t] &
    P` alone: outputs and the gradients of target, source and every
    weight. Rows that see no source position are finite."""
    padding, allowed = source_masks()
    x = rng(8).standard_normal((B, T, D)).astype("float32")
    source = rng(9).standard_normal((B, S, D)).astype("float32")
    with_mask, per_row = copies(
        lambda: ka.TransformerDecoderBlock(
            N, 16, normalize_first=normalize_first
        ),
        2,
        LAYERS["TransformerDecoderBlock"][1],
        x,
        source,
    )

    def row(x, source, t):  # (B, 1, D): position t, its own source mask
        out = per_row(x, source, encoder_padding_mask=allowed[:, t] & padding)
        return out[:, t : t + 1]

    def both(x1, source1, x2, source2):
        got = with_mask(
            x1,
            source1,
            encoder_padding_mask=padding,
            encoder_attention_mask=allowed,
        )
        rows = [row(x2, source2, t) for t in range(T)]
        return got, keras.ops.concatenate(rows, axis=1)

    weights = [*with_mask.trainable_weights, *per_row.trainable_weights]
    outputs, grads, weight_grads = value_and_grads(
        both, [x, source, x, source], weights, copies=2
    )
    assert np.all(np.isfinite(outputs[0]))
    half = len(weight_grads) // 2
    assert_close(
        "decoder encoder_attention_mask",
        "float32",
        outputs[:1],
        grads[:2] + weight_grads[:half],
        outputs[1:],
        grads[2:] + weight_grads[half:],
        ["x", "source"] + [w.path for w in with_mask.trainable_weights],
    )


def test_encoder_attention_mask_hides_source_positions_in_the_scores():
    """The cross-attention weights: zero where either mask hides a source
    position, a softmax over the rest, a zero row where nothing is left;
    a `(T, S)` mask equals it tiled over the batch."""
    padding, allowed = source_masks()
    x = rng(10).standard_normal((B, T, D)).astype("float32")
    source = rng(11).standard_normal((B, S, D)).astype("float32")
    keras.utils.set_random_seed(0)
    block = ka.TransformerDecoderBlock(N, 16)
    _, scores = block(
        x,
        source,
        encoder_padding_mask=padding,
        encoder_attention_mask=allowed,
        return_attention_scores=True,
    )
    cross = to_numpy(scores["cross"])  # (B, N, T, S)
    visible = allowed & padding[:, None, :]  # (B, T, S)
    hidden = ~np.broadcast_to(visible[:, None], cross.shape)
    np.testing.assert_array_equal(cross[hidden], 0.0)
    sums = cross.sum(-1)  # (B, N, T)
    np.testing.assert_allclose(
        sums, np.broadcast_to(visible.any(-1)[:, None], sums.shape), atol=1e-6
    )
    shared = to_numpy(block(x, source, encoder_attention_mask=allowed[0]))
    tiled = to_numpy(block(x, source, encoder_attention_mask=allowed[[0, 0]]))
    np.testing.assert_allclose(shared, tiled, atol=1e-6)


def test_encoder_attention_mask_in_cached_steps():
    """Token by token over the cache (the rows of the new tokens each
    step) equals the full call."""
    padding, allowed = source_masks()
    x = rng(12).standard_normal((B, T, D)).astype("float32")
    source = rng(13).standard_normal((B, S, D)).astype("float32")
    keras.utils.set_random_seed(0)
    block = ka.TransformerDecoderBlock(N, 16, num_key_value_heads=1)
    masks = dict(encoder_padding_mask=padding)
    full = to_numpy(block(x, source, encoder_attention_mask=allowed, **masks))
    cache = block.init_cache(B, T, encoder_outputs=source)
    steps = []
    for t in range(T):
        out, cache = block(
            x[:, t : t + 1],
            cache=cache,
            cache_index=t,
            encoder_attention_mask=allowed[:, t : t + 1],
            **masks,
        )
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


KEY_MASK_LAYERS = {
    "cross": lambda: ka.CrossAttention(N),
    "bahdanau": lambda: ka.BahdanauAttention(6),
    "luong": lambda: ka.LuongAttention("concat", units=6),
    "location": lambda: ka.LocationSensitiveAttention(6, 2, 3),
    "monotonic": lambda: ka.MonotonicAttention(6),
}


@pytest.mark.parametrize("kind", KEY_MASK_LAYERS)
def test_the_keys_implicit_mask_hides_padded_keys(kind):
    """Keys that carry a Keras mask where the values do not: padded keys
    get no weight, as in Keras's
    `MultiHeadAttention`, and `key_mask` combines with `value_mask`."""
    queries = keras.Input((None,), dtype="int32")
    keys = keras.Input((None,), dtype="int32")
    query = keras.layers.Embedding(9, D)(queries)
    key = keras.layers.Embedding(9, D, mask_zero=True)(keys)
    value = keras.layers.Embedding(9, D)(keys)  # no mask
    layer = KEY_MASK_LAYERS[kind]()
    model = keras.Model([queries, keys], layer(query, value, key=key))
    ids = np.array([[1, 2, 3], [4, 5, 6]], "int32")
    source = np.array([[3, 4, 5, 2], [6, 7, 1, 8]], "int32")
    padded = np.concatenate([source, np.zeros((B, 2), "int32")], 1)
    np.testing.assert_allclose(
        to_numpy(model([ids, padded])),
        to_numpy(model([ids, source])),
        atol=1e-6,
    )
    # Called directly: key_mask and value_mask each hide their keys.
    q, v = rng(3).normal(size=(2, B, T, D)).astype("float32")
    first, second = np.ones((2, B, T), bool)
    first[:, -1], second[:, 0] = False, False
    both = to_numpy(layer(q, v, value_mask=first & second))
    got = to_numpy(layer(q, v, value_mask=first, key_mask=second))
    np.testing.assert_allclose(got, both, atol=1e-6)
