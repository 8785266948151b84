"""BahdanauAttention and LuongAttention: references, masks and contract."""

import keras
import numpy as np
import pytest

from keras_attention import AttentionMechanism
from keras_attention import BahdanauAttention
from keras_attention import LuongAttention
from tests.helpers import np_masked_softmax
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, S, DQ, DV = 2, 3, 5, 6, 7

LAYERS = {
    "bahdanau": lambda: BahdanauAttention(units=4),
    "bahdanau_normalize": lambda: BahdanauAttention(units=4, normalize=True),
    "luong_dot": lambda: LuongAttention(score="dot"),
    "luong_general": lambda: LuongAttention(score="general"),
    "luong_general_scale": lambda: LuongAttention(score="general", scale=True),
    "luong_concat": lambda: LuongAttention(score="concat", units=4),
}


def inputs(kind, seed=0, query_rank=3):
    """Query, value and a padding mask for layer `kind` (dot needs Dq=Dv)."""
    g = rng(seed)
    dq = DV if kind == "luong_dot" else DQ
    shape = (B, T, dq) if query_rank == 3 else (B, dq)
    query = g.normal(size=shape).astype("float32")
    value = g.normal(size=(B, S, DV)).astype("float32")
    mask = np.arange(S)[None, :] < np.array([[3], [S]])  # lengths 3 and 5
    return query, value, mask


def built_layer(kind, query, value, seed=0):
    layer = LAYERS[kind]()
    layer(query, value)
    # Non-trivial gains and biases, so the reference checks them too.
    g = rng(seed + 100)
    for weight in layer.weights:
        if weight.path.endswith(("score_gain", "score_bias")):
            weight.assign(g.uniform(0.5, 1.5, size=weight.shape))
    return layer


def weights_of(layer):
    """The layer's weights by name; a sublayer's kernel by sublayer name."""
    named = {}
    for weight in layer.weights:
        parts = weight.path.split("/")
        name = parts[-2] if parts[-1] == "kernel" else parts[-1]
        named[name] = to_numpy(weight)
    return named


def np_scores(layer, query, key):
    """The score of `layer` in NumPy, from the layer's own weights."""
    w = weights_of(layer)
    q, k = np.asarray(query, "float64"), np.asarray(key, "float64")
    if isinstance(layer, BahdanauAttention) or layer.score == "concat":
        v = w["score_kernel"]
        bias = 0.0
        if getattr(layer, "normalize", False):
            v = w["score_gain"] * v / np.linalg.norm(v)
            bias = w["score_bias"]
        hidden = (q @ w["query_dense"])[:, :, None] + (k @ w["key_dense"])[
            :, None
        ]
        scores = np.tanh(hidden + bias) @ v
    elif layer.score == "dot":
        scores = np.einsum("btd,bsd->bts", q, k)
    else:
        scores = np.einsum("btd,bsd->bts", q, k @ w["key_dense"])
    if getattr(layer, "scale", False):
        scores = scores * w["score_gain"]
    return scores


def np_attention(layer, query, value, mask=None):
    scores = np_scores(layer, query, value)
    mask = np.ones((B, 1, S), bool) if mask is None else mask[:, None, :]
    weights = np_masked_softmax(scores, mask)
    return weights @ np.asarray(value, "float64"), weights


# --- NumPy references ------------------------------------------------------


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", LAYERS)
def test_matches_numpy_reference(kind, masked):
    query, value, mask = inputs(kind)
    layer = built_layer(kind, query, value)
    mask = mask if masked else None
    context, weights = layer(
        query, value, value_mask=mask, return_attention_scores=True
    )
    want_context, want_weights = np_attention(layer, query, value, mask)
    np.testing.assert_allclose(to_numpy(weights), want_weights, atol=1e-5)
    np.testing.assert_allclose(to_numpy(context), want_context, atol=1e-5)


@pytest.mark.parametrize("kind", LAYERS)
def test_single_step_query_equals_one_step_sequence(kind):
    query, value, mask = inputs(kind, query_rank=2)
    layer = built_layer(kind, query, value)
    context, weights = layer(
        query, value, value_mask=mask, return_attention_scores=True
    )
    assert tuple(context.shape) == (B, DV) and tuple(weights.shape) == (B, S)
    want_context, want_weights = layer(
        query[:, None], value, value_mask=mask, return_attention_scores=True
    )
    np.testing.assert_allclose(
        to_numpy(context), to_numpy(want_context)[:, 0], atol=1e-6
    )
    np.testing.assert_allclose(
        to_numpy(weights), to_numpy(want_weights)[:, 0], atol=1e-6
    )


@pytest.mark.parametrize("kind", LAYERS)
def test_projected_keys_reused_across_steps_equal_call(kind):
    query, value, mask = inputs(kind, query_rank=2)
    layer = built_layer(kind, query, value)
    projected = layer.project_keys(value)  # once per source sequence
    for step in range(3):
        step_query = query * (step + 1)
        want = layer(step_query, value, value_mask=mask)
        got = layer.attend(step_query, value, projected, value_mask=mask)
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-6)


def test_separate_key_and_value():
    g = rng(3)
    query = g.normal(size=(B, T, DQ)).astype("float32")
    key = g.normal(size=(B, S, 9)).astype("float32")
    value = g.normal(size=(B, S, DV)).astype("float32")
    layer = BahdanauAttention(units=4)
    context, weights = layer(
        query, value, key=key, return_attention_scores=True
    )
    scores = np_scores(layer, query, key)
    want_weights = np_masked_softmax(scores, np.ones((B, 1, S), bool))
    np.testing.assert_allclose(to_numpy(weights), want_weights, atol=1e-5)
    np.testing.assert_allclose(
        to_numpy(context), want_weights @ value, atol=1e-5
    )


def test_luong_dot_hand_computed():
    # s = [1, 0], h_1 = [1, 0], h_2 = [0, 1]: scores 1 and 0, so the weights
    # are e / (e + 1) = 0.7311 and 0.2689.
    layer = LuongAttention(score="dot")
    context, weights = layer(
        np.array([[1.0, 0.0]], "float32"),
        np.array([[[1.0, 0.0], [0.0, 1.0]]], "float32"),
        return_attention_scores=True,
    )
    np.testing.assert_allclose(to_numpy(weights), [[0.7311, 0.2689]], atol=1e-4)
    np.testing.assert_allclose(to_numpy(context), [[0.7311, 0.2689]], atol=1e-4)


# --- masks -----------------------------------------------------------------


@pytest.mark.parametrize("kind", LAYERS)
def test_padded_values_do_not_change_the_result(kind):
    query, value, mask = inputs(kind)
    layer = built_layer(kind, query, value)
    garbage = value.copy()
    garbage[0, 3:] = 1e3
    first = layer(query, value, value_mask=mask, return_attention_scores=True)
    second = layer(
        query, garbage, value_mask=mask, return_attention_scores=True
    )
    for a, b in zip(first, second, strict=True):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=1e-5)
    np.testing.assert_array_equal(to_numpy(first[1])[0, :, 3:], 0.0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kind", LAYERS)
def test_fully_masked_source_gives_zeros(kind, dtype):
    query, value, mask = inputs(kind)
    mask[1] = False  # the second source is all padding
    layer = LAYERS[kind]()
    layer = layer.__class__.from_config({**layer.get_config(), "dtype": dtype})
    context, weights = layer(
        query, value, value_mask=mask, return_attention_scores=True
    )
    assert keras.backend.standardize_dtype(context.dtype) == dtype
    context, weights = to_numpy(context), to_numpy(weights)
    assert np.all(np.isfinite(context)) and np.all(np.isfinite(weights))
    assert np.all(context[1] == 0.0) and np.all(weights[1] == 0.0)
    np.testing.assert_allclose(weights[0].sum(-1), 1.0, atol=1e-2)


@pytest.mark.parametrize("kind", LAYERS)
def test_implicit_keras_mask_from_embedding(kind):
    tokens = np.array([[4, 2, 7, 0, 0], [1, 3, 5, 2, 6]])  # 0 = padding
    dq = 8 if kind == "luong_dot" else DQ
    query = rng(1).normal(size=(B, T, dq)).astype("float32")
    token_input = keras.Input((S,), dtype="int32")
    query_input = keras.Input((T, dq))
    embedded = keras.layers.Embedding(10, 8, mask_zero=True, name="embed")(
        token_input
    )
    layer = LAYERS[kind]()
    context, weights = layer(
        query_input, embedded, return_attention_scores=True
    )
    model = keras.Model([query_input, token_input], [context, weights])
    got_context, got_weights = model([query, tokens])
    np.testing.assert_array_equal(to_numpy(got_weights)[0, :, 3:], 0.0)

    values = model.get_layer("embed")(tokens)
    want_context, want_weights = layer(
        query, values, value_mask=tokens != 0, return_attention_scores=True
    )
    np.testing.assert_allclose(
        to_numpy(got_weights), to_numpy(want_weights), atol=1e-6
    )
    np.testing.assert_allclose(
        to_numpy(got_context), to_numpy(want_context), atol=1e-6
    )


def test_explicit_mask_wins_over_implicit_mask():
    tokens = np.array([[4, 2, 7, 0, 0], [1, 3, 5, 2, 6]])
    embedding = keras.layers.Embedding(10, DQ, mask_zero=True)
    values = embedding(tokens)
    explicit = np.array([[True, False, True, True, True]] * 2)
    layer = LuongAttention(score="dot")
    query = rng(1).normal(size=(B, DQ)).astype("float32")
    _, weights = layer(
        query, values, value_mask=explicit, return_attention_scores=True
    )
    weights = to_numpy(weights)
    assert np.all(weights[:, 1] == 0.0)
    assert np.all(weights[0, 3:] > 0.0)


def test_query_mask_propagates_to_the_output():
    # Downstream pooling must ignore padded decoder steps.
    target_tokens = np.array([[3, 1, 0], [2, 2, 2]])
    value = rng(2).normal(size=(B, S, DV)).astype("float32")
    target_input = keras.Input((T,), dtype="int32")
    value_input = keras.Input((S, DV))
    query = keras.layers.Embedding(5, DQ, mask_zero=True, name="embed")(
        target_input
    )
    context = BahdanauAttention(units=4, name="attention")(query, value_input)
    pooled = keras.layers.GlobalAveragePooling1D()(context)
    model = keras.Model([target_input, value_input], pooled)
    got = to_numpy(model([target_tokens, value]))
    steps = to_numpy(
        model.get_layer("attention")(
            model.get_layer("embed")(target_tokens), value
        )
    )
    keep = (target_tokens != 0)[..., None]
    want = (steps * keep).sum(1) / keep.sum(1)
    np.testing.assert_allclose(got, want, atol=1e-5)


# --- dropout ---------------------------------------------------------------


def test_dropout_applies_to_weights_only_in_training():
    query, value, mask = inputs("bahdanau")
    layer = BahdanauAttention(units=4, dropout=0.5)
    plain = BahdanauAttention.from_config(
        {**layer.get_config(), "dropout": 0.0}
    )
    layer(query, value)
    plain(query, value)
    plain.set_weights(layer.get_weights())
    inference = layer(query, value, value_mask=mask, training=False)
    np.testing.assert_allclose(
        to_numpy(inference),
        to_numpy(plain(query, value, value_mask=mask)),
        atol=1e-6,
    )
    trained, scores = layer(
        query,
        value,
        value_mask=mask,
        return_attention_scores=True,
        training=True,
    )
    _, plain_scores = plain(
        query, value, value_mask=mask, return_attention_scores=True
    )
    # The returned scores are taken before dropout.
    np.testing.assert_allclose(
        to_numpy(scores), to_numpy(plain_scores), atol=1e-6
    )
    assert not np.allclose(to_numpy(trained), to_numpy(inference))


@pytest.mark.parametrize("query_rank", [2, 3])
@pytest.mark.parametrize("training", [None, True])
def test_attend_applies_a_given_dropout_mask(query_rank, training):
    """A loop draws its masks itself and passes one per step to `attend`;
    the layer's own dropout is then not used."""
    query, value, mask = inputs("bahdanau", query_rank=query_rank)
    layer = BahdanauAttention(units=4, dropout=0.5)
    layer(query, value)
    shape = (*query.shape[:-1], S)
    keep = rng(5).integers(0, 2, size=shape).astype("float32") * 2.0
    context, weights = layer.attend(
        query,
        value,
        layer.project_keys(value),
        value_mask=mask,
        return_attention_scores=True,
        training=training,
        dropout_mask=keep,
    )
    spec = "bs,bsv->bv" if query_rank == 2 else "bts,bsv->btv"
    want = np.einsum(spec, to_numpy(weights) * keep, value)
    np.testing.assert_allclose(to_numpy(context), want, atol=1e-5)
    with pytest.raises(ValueError, match=r"dropout_mask.shape=\(2, 9\)"):
        layer.attend(
            query,
            value,
            layer.project_keys(value),
            dropout_mask=np.ones((2, 9), "float32"),
        )


# --- the layer contract ----------------------------------------------------


def functional_model(kind, query_rank=3):
    dq = DV if kind == "luong_dot" else DQ
    query_input = keras.Input((T, dq) if query_rank == 3 else (dq,))
    value_input = keras.Input((S, DV))
    mask_input = keras.Input((S,), dtype="bool")
    context, weights = LAYERS[kind]()(
        query_input,
        value_input,
        value_mask=mask_input,
        return_attention_scores=True,
    )
    return keras.Model(
        [query_input, value_input, mask_input], [context, weights]
    )


@pytest.mark.parametrize("query_rank", [2, 3])
@pytest.mark.parametrize("kind", LAYERS)
def test_symbolic_call_and_output_shape(kind, query_rank):
    model = functional_model(kind, query_rank)
    context, weights = model.outputs
    lead = (None, T) if query_rank == 3 else (None,)
    assert tuple(context.shape) == (*lead, DV)
    assert tuple(weights.shape) == (*lead, S)
    layer = model.layers[-1]
    dq = DV if kind == "luong_dot" else DQ
    assert layer.compute_output_shape((B, T, dq), (B, S, DV)) == (B, T, DV)
    query, value, mask = inputs(kind, query_rank=query_rank)
    eager = model([query, value, mask])
    assert tuple(eager[0].shape) == (B, *lead[1:], DV)


@pytest.mark.parametrize("kind", LAYERS)
def test_training_reduces_loss(kind):
    """A small model learns to point at the source position whose value
    matches the query; every weight of the layer receives a gradient."""
    g = rng(9)
    dq = DV if kind == "luong_dot" else DQ
    value = g.normal(size=(64, S, DV)).astype("float32")
    target = g.integers(0, S, size=64)
    query = value[np.arange(64), target]
    query_input = keras.Input((DV,))
    value_input = keras.Input((S, DV))
    state = keras.layers.Dense(dq, name="decoder_state")(query_input)
    layer = LAYERS[kind]()
    _, weights = layer(state, value_input, return_attention_scores=True)
    model = keras.Model([query_input, value_input], weights)
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(),
    )
    initial = [to_numpy(w) for w in layer.trainable_weights]
    history = model.fit(
        [query, value], target, epochs=30, batch_size=64, verbose=0
    )
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.8 * losses[0]
    assert len(initial) == len(layer.trainable_weights)
    for before, weight in zip(initial, layer.trainable_weights, strict=True):
        assert not np.allclose(before, to_numpy(weight)), weight.path


def test_global_mixed_precision_policy_training_step():
    keras.config.set_dtype_policy("mixed_float16")
    query, value, _ = inputs("bahdanau", query_rank=2)
    query_input = keras.Input((DQ,))
    value_input = keras.Input((S, DV))
    context = BahdanauAttention(units=4)(query_input, value_input)
    output = keras.layers.Dense(1, dtype="float32")(context)
    model = keras.Model([query_input, value_input], output)
    model.compile(optimizer="adam", loss="mse")
    loss = model.train_on_batch([query, value], np.ones((B, 1)))
    assert np.isfinite(loss)


# --- bad input -------------------------------------------------------------

CONSTRUCTOR_ERRORS = [
    (lambda: LuongAttention(score="cosine"), "score='cosine'"),
    (lambda: LuongAttention(score="concat"), "units=None"),
    (lambda: LuongAttention(score="concat", units=0), "units=0"),
    (lambda: LuongAttention(score="dot", units=8), "units=8"),
    (lambda: BahdanauAttention(units=0), "units=0"),
    (lambda: BahdanauAttention(units=2.5), "units=2.5"),
    (lambda: BahdanauAttention(units=4, dropout=1.5), "dropout=1.5"),
    (lambda: LuongAttention(dropout=-0.1), "dropout=-0.1"),
]


@pytest.mark.parametrize("make,received", CONSTRUCTOR_ERRORS)
def test_bad_constructor_arguments(make, received):
    with pytest.raises(ValueError) as info:
        make()
    message = str(info.value)
    assert "Attention (layer '" in message
    assert f"Received: {received}" in message or received in message


CALL_ERRORS = [
    ("luong_dot", (B, T, 6), (B, S, 7), None, "query.shape[-1]=6"),
    ("bahdanau", (B, T, 2, 6), (B, S, 7), None, "query.shape=(2, 3, 2, 6)"),
    ("bahdanau", (6,), (B, S, 7), None, "query.shape=(6,)"),
    ("luong_general", (B, T, 6), (B, 7), None, "value.shape=(2, 7)"),
    ("luong_concat", (B, T, 6), (3, S, 7), None, "value.shape=(3, 5, 7)"),
    ("bahdanau", (B, T, 6), (B, S, 7), (B, S + 1), "value_mask.shape=(2, 6)"),
    (
        "luong_dot",
        (B, T, 7),
        (B, S, 7),
        (B, T, S),
        "value_mask.shape=(2, 3, 5)",
    ),
]


@pytest.mark.parametrize(
    "kind,q_shape,v_shape,mask_shape,received", CALL_ERRORS
)
def test_bad_call_inputs(kind, q_shape, v_shape, mask_shape, received):
    layer = LAYERS[kind]()
    query = np.zeros(q_shape, "float32")
    value = np.zeros(v_shape, "float32")
    mask = None if mask_shape is None else np.ones(mask_shape, bool)
    with pytest.raises(ValueError) as info:
        layer(query, value, value_mask=mask)
    message = str(info.value)
    assert type(layer).__name__ in message and "Received:" in message
    assert received in message


def test_mask_shape_checked_on_built_layer_and_symbolic_call():
    layer = BahdanauAttention(units=4)
    layer(np.zeros((B, DQ), "float32"), np.zeros((B, S, DV), "float32"))
    with pytest.raises(ValueError, match=r"value_mask.shape=\(2, 4\)"):
        layer(
            np.zeros((B, DQ), "float32"),
            np.zeros((B, S, DV), "float32"),
            value_mask=np.ones((B, 4), bool),
        )
    with pytest.raises(ValueError, match=r"value_mask.shape=\(None, 4\)"):
        layer(
            keras.Input((DQ,)),
            keras.Input((S, DV)),
            value_mask=keras.Input((4,), dtype="bool"),
        )


def test_base_class_requires_a_score():
    layer = AttentionMechanism()
    with pytest.raises(NotImplementedError, match="_score"):
        layer(np.zeros((B, DQ), "float32"), np.zeros((B, S, DQ), "float32"))


def test_numpy_integer_sizes_are_python_ints():
    """As Keras's `Dense` does, a NumPy integer is a size: kept as an
    int, so the config is the one a Python int gives."""
    for make in (
        lambda units: BahdanauAttention(units, name="a"),
        lambda units: LuongAttention("concat", units=units, name="a"),
    ):
        config = make(np.int64(3)).get_config()
        assert config == make(3).get_config()
        assert type(config["units"]) is int
