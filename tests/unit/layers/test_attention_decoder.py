"""AttentionDecoder: both flows, step == teacher forcing, masks, saving."""

import re

import keras
import numpy as np
import pytest

from keras_attention import AttentionDecoder
from keras_attention import BahdanauAttention
from keras_attention import LocationSensitiveAttention
from keras_attention import LuongAttention
from keras_attention import MonotonicAttention
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, S, E, DE, U = 2, 5, 7, 4, 12, 12

CELLS = {
    "gru": lambda: keras.layers.GRUCell(U),
    "lstm": lambda: keras.layers.LSTMCell(U),
    "simple": lambda: keras.layers.SimpleRNNCell(U),
    # GNMT's stack: the Bahdanau flow scores with the first cell's state
    # (8 units), the decoder outputs the last cell's (U).
    "stacked": lambda: keras.layers.StackedRNNCells(
        [keras.layers.GRUCell(8), keras.layers.LSTMCell(U)]
    ),
}
ATTENTIONS = {
    "bahdanau": lambda: BahdanauAttention(8),
    "luong_general": lambda: LuongAttention("general"),
    "luong_dot": lambda: LuongAttention("dot"),
}


def inputs(seed=0):
    g = rng(seed)
    targets = g.normal(size=(B, T, E)).astype("float32")
    encoded = g.normal(size=(B, S, DE)).astype("float32")
    mask = np.arange(S)[None, :] < np.array([[4], [S]])
    return targets, encoded, mask


def decoder(cell="gru", attention="bahdanau", **kwargs):
    return AttentionDecoder(CELLS[cell](), ATTENTIONS[attention](), **kwargs)


FLOW_CASES = [
    (cell, attention, flow)
    for cell in CELLS
    for attention, flow in (
        ("bahdanau", "bahdanau"),
        ("luong_general", "luong"),
        ("luong_dot", "luong"),
        ("luong_general", "bahdanau"),
    )
]


@pytest.mark.parametrize("cell,attention,flow", FLOW_CASES)
def test_step_by_step_equals_teacher_forcing(cell, attention, flow):
    targets, encoded, mask = inputs()
    layer = decoder(cell, attention, flow=flow)
    outputs, alignments = layer(
        targets,
        encoded,
        encoder_padding_mask=mask,
        return_attention_scores=True,
    )
    state = layer.get_initial_state(encoded, mask)
    stepped, stepped_alignments = [], []
    for t in range(T):
        out, state, alignment = layer.step(targets[:, t], state, encoded, mask)
        stepped.append(to_numpy(out))
        stepped_alignments.append(to_numpy(alignment))
    np.testing.assert_allclose(
        np.stack(stepped, 1), to_numpy(outputs), atol=1e-5
    )
    np.testing.assert_allclose(
        np.stack(stepped_alignments, 1), to_numpy(alignments), atol=1e-6
    )


def test_a_nested_cell_state_steps_as_the_flat_one():
    """`step` takes a stacked cell's state nested per cell, as the cell
    keeps it, or flat, as `get_initial_state` returns it."""
    targets, encoded, mask = inputs()
    layer = decoder("stacked", "bahdanau")
    layer(targets, encoded)  # builds it
    state = layer.get_initial_state(encoded, mask)
    g = rng(1)
    flat = [g.normal(size=(B, n)).astype("float32") for n in (8, U, U)]
    nested = [flat[0], [flat[1], flat[2]]]
    results = [
        layer.step(targets[:, 0], {**state, "cell": cell}, encoded, mask)
        for cell in (flat, nested)
    ]
    for a, b in zip(*(keras.tree.flatten(r) for r in results), strict=True):
        np.testing.assert_array_equal(to_numpy(b), to_numpy(a))


@pytest.mark.parametrize("cell", CELLS)
def test_bahdanau_flow_equations(cell):
    """s_t = RNN([y_{t-1}; c_t], s_{t-1}) with c_t scored by s_{t-1}."""
    targets, encoded, mask = inputs()
    layer = decoder(cell, "bahdanau")
    outputs = to_numpy(layer(targets, encoded, encoder_padding_mask=mask))
    structure = layer.cell.state_size
    nested = keras.tree.is_nested(structure)
    flat = [keras.ops.zeros((B, n)) for n in keras.tree.flatten(structure)]
    for t in range(T):
        context = layer.attention(flat[0], encoded, value_mask=mask)
        x = keras.ops.concatenate([targets[:, t], context], axis=-1)
        state = keras.tree.pack_sequence_as(structure, flat) if nested else flat
        out, state = layer.cell(x, state)
        flat = keras.tree.flatten(state)
        np.testing.assert_allclose(to_numpy(out), outputs[:, t], atol=1e-5)


@pytest.mark.parametrize("activation", ["tanh", None])
@pytest.mark.parametrize("input_feeding", [True, False])
def test_luong_flow_equations(input_feeding, activation):
    """s̃_t = tanh(W_c [c_t; s_t]) (or linear) with c_t scored by s_t, fed
    back."""
    targets, encoded, mask = inputs()
    layer = decoder(
        "lstm",
        "luong_general",
        attention_dim=6,
        input_feeding=input_feeding,
        attention_activation=activation,
    )
    outputs = to_numpy(layer(targets, encoded, encoder_padding_mask=mask))
    assert outputs.shape == (B, T, 6)
    state = [keras.ops.zeros((B, U)), keras.ops.zeros((B, U))]
    feed = np.zeros((B, 6), "float32")
    kernel = to_numpy(layer.attention_projection.kernel)
    squash = np.tanh if activation == "tanh" else lambda z: z
    for t in range(T):
        x = targets[:, t]
        if input_feeding:
            x = np.concatenate([x, feed], axis=-1)
        hidden, state = layer.cell(x, state)
        context = to_numpy(layer.attention(hidden, encoded, value_mask=mask))
        feed = squash(
            np.concatenate([context, to_numpy(hidden)], -1) @ kernel
        ).astype("float32")
        np.testing.assert_allclose(feed, outputs[:, t], atol=1e-5)


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


def test_tensorflow_addons_attention_wrapper_weights_give_its_outputs():
    """tensorflow-addons' `AttentionWrapper(LSTMCell(U), BahdanauAttention(
    Ua, memory, memory_sequence_length), attention_layer_size=A,
    initial_cell_state=...)`, written out in NumPy with its weights in its
    layout, equals the Luong flow with a linear attentional layer once the
    attention layer's two row blocks are swapped: outputs and alignment
    history, step by step."""
    g = rng(3)
    units, score_units, dim = 5, 4, 6
    targets = g.normal(size=(B, T, E))
    memory = g.normal(size=(B, S, DE))
    lengths = np.array([4, S])
    valid = np.arange(S)[None, :] < lengths[:, None]
    h0, c0 = g.normal(size=(2, B, units))
    tfa = {  # TFA's variables, in its layout
        "query_layer": g.normal(size=(units, score_units)) / 2,
        "memory_layer": g.normal(size=(DE, score_units)) / 2,
        "attention_v": g.normal(size=(score_units,)),
        "attention_layer": g.normal(size=(units + DE, dim)) / 3,  # [h; c]
        "kernel": g.normal(size=(E + dim, 4 * units)) / 3,
        "recurrent_kernel": g.normal(size=(units, 4 * units)) / 3,
        "bias": g.normal(size=(4 * units,)) / 3,
    }

    # The wrapper's step: the cell on [y_t; a_{t-1}] (a_0 = 0), Bahdanau
    # scores with the new cell output, a_t = W [h_t; c_t], output a_t.
    keys = memory @ tfa["memory_layer"]
    h, c, attention = h0, c0, np.zeros((B, dim))
    want, want_alignments = [], []
    for t in range(T):
        z = (
            np.concatenate([targets[:, t], attention], -1) @ tfa["kernel"]
            + h @ tfa["recurrent_kernel"]
            + tfa["bias"]
        )
        i, f, candidate, o = np.split(z, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(candidate)
        h = _sigmoid(o) * np.tanh(c)
        score = (
            np.tanh(keys + (h @ tfa["query_layer"])[:, None])
            @ tfa["attention_v"]
        )
        score = np.where(valid, score, -np.inf)
        alignment = np.exp(score - score.max(-1, keepdims=True))
        alignment /= alignment.sum(-1, keepdims=True)
        context = np.einsum("bs,bsd->bd", alignment, memory * valid[..., None])
        attention = np.concatenate([h, context], -1) @ tfa["attention_layer"]
        want.append(attention)
        want_alignments.append(alignment)

    layer = AttentionDecoder(
        keras.layers.LSTMCell(units),
        BahdanauAttention(score_units),
        flow="luong",
        attention_dim=dim,
        attention_activation=None,
    )
    f32 = lambda a: a.astype("float32")  # noqa: E731
    layer(f32(targets), f32(memory))  # builds
    layer.cell.kernel.assign(f32(tfa["kernel"]))
    layer.cell.recurrent_kernel.assign(f32(tfa["recurrent_kernel"]))
    layer.cell.bias.assign(f32(tfa["bias"]))
    layer.attention.query_dense.kernel.assign(f32(tfa["query_layer"]))
    layer.attention.key_dense.kernel.assign(f32(tfa["memory_layer"]))
    layer.attention.score_kernel.assign(f32(tfa["attention_v"]))
    swapped = np.concatenate(  # TFA's W takes [h; c], ours [c; h]
        [tfa["attention_layer"][units:], tfa["attention_layer"][:units]]
    )
    layer.attention_projection.kernel.assign(f32(swapped))
    outputs, alignments = layer(
        f32(targets),
        f32(memory),
        encoder_padding_mask=valid,
        initial_state=[f32(h0), f32(c0)],
        return_attention_scores=True,
    )
    np.testing.assert_allclose(
        to_numpy(outputs), np.stack(want, 1), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        to_numpy(alignments), np.stack(want_alignments, 1), atol=1e-5
    )


def test_alignments_sum_to_one_with_zeros_on_padding():
    targets, encoded, mask = inputs()
    _, alignments = decoder()(
        targets,
        encoded,
        encoder_padding_mask=mask,
        return_attention_scores=True,
    )
    alignments = to_numpy(alignments)
    np.testing.assert_allclose(alignments.sum(-1), 1.0, atol=1e-5)
    assert np.all(alignments[0, :, 4:] == 0.0)


def test_initial_state_is_used():
    targets, encoded, _ = inputs()
    layer = decoder("lstm")
    zero = to_numpy(layer(targets, encoded))
    start = [np.ones((B, U), "float32"), np.ones((B, U), "float32")]
    given = to_numpy(layer(targets, encoded, initial_state=start))
    assert not np.allclose(zero, given)
    with pytest.raises(ValueError, match="initial_state"):
        layer(targets, encoded, initial_state=[start[0]])
    with pytest.raises(ValueError, match=r"initial_state shapes \[\(3, 12\)"):
        layer(targets, encoded, initial_state=[np.ones((3, U))] * 2)


def test_stacked_initial_state_nested_or_flat():
    targets, encoded, _ = inputs()
    layer = decoder("stacked")
    g = rng(5)
    gru, h, c = (g.normal(size=(B, n)).astype("float32") for n in (8, U, U))
    nested = to_numpy(layer(targets, encoded, initial_state=[[gru], [h, c]]))
    flat = to_numpy(layer(targets, encoded, initial_state=[gru, h, c]))
    np.testing.assert_array_equal(nested, flat)
    assert not np.allclose(nested, to_numpy(layer(targets, encoded)))


def seq2seq(cell="gru", attention="bahdanau"):
    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target")
    encoded = keras.layers.Embedding(10, DE, mask_zero=True)(source)
    encoded = keras.layers.GRU(DE, return_sequences=True)(encoded)
    embedded = keras.layers.Embedding(10, E, mask_zero=True)(target)
    decoded, alignments = decoder(cell, attention, name="decoder")(
        embedded, encoded, return_attention_scores=True
    )
    logits = keras.layers.Dense(10)(decoded)
    return keras.Model([source, target], [logits, alignments])


def test_implicit_encoder_mask_and_training_and_saving(tmp_path):
    model = seq2seq()
    g = rng(1)
    source = g.integers(1, 10, size=(32, 6))
    source[:16, 4:] = 0  # padding
    target = g.integers(1, 10, size=(32, 5))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=[
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            None,
        ],
    )
    history = model.fit(
        [source, target], target, epochs=6, batch_size=16, verbose=0
    )
    assert history.history["loss"][-1] < history.history["loss"][0]
    logits, alignments = model([source, target])
    alignments = to_numpy(alignments)
    # The implicit encoder mask reached the decoder: padding gets nothing.
    assert np.all(alignments[:16, :, 4:] == 0.0)
    np.testing.assert_allclose(alignments.sum(-1), 1.0, atol=1e-5)
    path = tmp_path / "seq2seq.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    for a, b in zip(
        restored([source, target]), (logits, alignments), strict=True
    ):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=1e-6)


def test_default_flows():
    assert decoder("gru", "bahdanau").flow == "bahdanau"
    assert decoder("gru", "luong_general").flow == "luong"


BAD = [
    (lambda: AttentionDecoder("gru", BahdanauAttention(4)), "cell="),
    (lambda: AttentionDecoder(keras.layers.GRUCell(4), "x"), "attention="),
    (
        lambda: AttentionDecoder(
            keras.layers.GRUCell(4), BahdanauAttention(4), flow="mixed"
        ),
        "flow='mixed'",
    ),
    (
        lambda: AttentionDecoder(
            keras.layers.GRUCell(4, dropout=0.2), BahdanauAttention(4)
        ),
        "cell.dropout=0.2",
    ),
    (
        lambda: AttentionDecoder(
            keras.layers.GRUCell(4), BahdanauAttention(4), attention_dim=5
        ),
        "attention_dim=5, flow='bahdanau'",
    ),
    (
        lambda: AttentionDecoder(
            keras.layers.GRUCell(4),
            LuongAttention("general"),
            attention_activation="squash",
        ),
        "attention_activation='squash'",
    ),
    (
        lambda: AttentionDecoder(
            keras.layers.GRUCell(4),
            BahdanauAttention(4),
            attention_activation=None,
        ),
        "attention_activation=None, flow='bahdanau'",
    ),
]


@pytest.mark.parametrize("make,received", BAD)
def test_bad_arguments(make, received):
    with pytest.raises(
        ValueError, match=f"AttentionDecoder.*Received: {received}"
    ):
        make()


@pytest.mark.parametrize(
    "targets_shape,encoded_shape",
    [
        ((B, T, E), (1, S, DE)),  # another batch
        ((B, T, E), (B, S, DE - 1)),  # another source size than built
        ((B, T, E - 1), (B, S, DE)),  # another input size than built
    ],
)
def test_calls_after_build_check_their_shapes(targets_shape, encoded_shape):
    targets, encoded, _ = inputs()
    layer = decoder()
    layer(targets, encoded)
    received = (
        rf"Received: inputs.shape={re.escape(str(targets_shape))}, "
        rf"encoder_outputs.shape={re.escape(str(encoded_shape))}"
    )
    with pytest.raises(ValueError, match=f"AttentionDecoder.*{received}"):
        layer(np.zeros(targets_shape, "float32"), np.zeros(encoded_shape))
    state = layer.get_initial_state(encoded)
    with pytest.raises(ValueError, match="inputs_t.shape="):
        layer.step(
            np.zeros(targets_shape[::2], "float32"),
            state,
            np.zeros(encoded_shape, "float32"),
        )


def test_bad_ranks():
    with pytest.raises(ValueError, match=r"inputs.shape=\(2, 4\)"):
        decoder()(np.zeros((2, 4), "float32"), np.zeros((2, S, DE), "float32"))


@pytest.mark.parametrize("input_feeding", [True, False])
def test_step_inputs_with_an_embedding_mask_raise_no_warning(input_feeding):
    # pytest turns warnings into errors: the cell must not warn that it
    # drops the mask of an Embedding(mask_zero=True) output.
    embedding = keras.layers.Embedding(10, E, mask_zero=True)
    layer = decoder("gru", "luong_general", input_feeding=input_feeding)
    targets, encoded, mask = inputs()
    layer(embedding(np.ones((B, 3), "int32")), encoded)
    state = layer.get_initial_state(encoded, mask)
    out, _, alignment = layer.step(
        embedding(np.array([3, 0])), state, encoded, mask
    )
    assert tuple(out.shape) == (B, U)
    np.testing.assert_allclose(to_numpy(alignment).sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_half_precision_keeps_padding_at_zero(policy):
    targets, encoded, mask = inputs()
    reference = decoder("lstm", "luong_general")
    want = to_numpy(reference(targets, encoded, encoder_padding_mask=mask))
    layer = AttentionDecoder.from_config(
        {**reference.get_config(), "dtype": policy}
    )
    layer(targets, encoded)
    layer.set_weights(reference.get_weights())
    out, alignments = layer(
        targets,
        encoded,
        encoder_padding_mask=mask,
        return_attention_scores=True,
    )
    compute = policy.split("_")[1]
    assert keras.backend.standardize_dtype(out.dtype) == compute
    alignments = to_numpy(alignments)
    assert np.all(alignments[0, :, 4:] == 0.0)
    tolerance = 0.05 if compute == "float16" else 0.2
    np.testing.assert_allclose(to_numpy(out), want, atol=tolerance)


# --- attention dropout -----------------------------------------------------

DROPOUT_ATTENTIONS = {
    "bahdanau": lambda rate: BahdanauAttention(8, dropout=rate),
    "luong": lambda rate: LuongAttention("general", dropout=rate),
}


def dropout_decoder(attention="bahdanau", rate=0.3):
    return AttentionDecoder(
        keras.layers.GRUCell(U), DROPOUT_ATTENTIONS[attention](rate)
    )


@pytest.mark.parametrize("attention", DROPOUT_ATTENTIONS)
def test_fit_with_attention_dropout(attention):
    # The masks are drawn outside the scan: a seed drawn inside it left a
    # tracer in the seed generator on JAX (`UnexpectedTracerError`).
    targets = keras.Input((None, E))
    encoded = keras.Input((None, DE))
    layer = dropout_decoder(attention)
    outputs = keras.layers.Dense(3)(layer(targets, encoded))
    model = keras.Model([targets, encoded], outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [to_numpy(w) for w in layer.trainable_weights]
    x, e, _ = inputs()
    y = rng(3).normal(size=(B, T, 3)).astype("float32")
    history = model.fit(
        [np.concatenate([x, x]), np.concatenate([e, e])],
        np.concatenate([y, y]),
        batch_size=B,
        epochs=1,
        verbose=0,
    )
    assert np.isfinite(history.history["loss"]).all()
    for old, new in zip(before, layer.trainable_weights, strict=True):
        assert not np.allclose(old, to_numpy(new)), new.path


def test_eager_training_calls_leave_the_attention_usable():
    targets, encoded, mask = inputs()
    layer = dropout_decoder()
    first = layer(targets, encoded, encoder_padding_mask=mask, training=True)
    second = layer(targets, encoded, encoder_padding_mask=mask, training=True)
    assert not np.allclose(to_numpy(first), to_numpy(second))  # new masks
    query = rng(2).normal(size=(B, U)).astype("float32")
    for training in (True, False):
        context = layer.attention(
            query, encoded, value_mask=mask, training=training
        )
        assert tuple(context.shape) == (B, DE)
    state = layer.get_initial_state(encoded, mask)
    out, _, _ = layer.step(targets[:, 0], state, encoded, mask, training=True)
    assert tuple(out.shape) == (B, U)


@pytest.mark.parametrize("attention", DROPOUT_ATTENTIONS)
def test_attention_dropout_acts_in_training_only(attention):
    targets, encoded, mask = inputs()
    layer = dropout_decoder(attention, rate=0.5)
    plain = dropout_decoder(attention, rate=0.0)
    layer(targets, encoded)
    plain(targets, encoded)
    plain.set_weights(layer.get_weights())
    want = to_numpy(plain(targets, encoded, encoder_padding_mask=mask))
    for training in (None, False):
        got = layer(
            targets, encoded, encoder_padding_mask=mask, training=training
        )
        np.testing.assert_allclose(to_numpy(got), want, atol=1e-6)
    trained = layer(targets, encoded, encoder_padding_mask=mask, training=True)
    assert not np.allclose(to_numpy(trained), want, atol=1e-3)


def test_attention_dropout_is_reproducible_with_the_seed():
    targets, encoded, mask = inputs()
    results = []
    for _ in range(2):
        keras.utils.set_random_seed(7)
        layer = dropout_decoder(rate=0.5)
        results.append(to_numpy(layer(targets, encoded, mask, training=True)))
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("attention", DROPOUT_ATTENTIONS)
def test_each_step_uses_its_own_dropout_mask(attention):
    """The loop draws one `(T, B, S)` keep-mask and step t uses row t."""
    targets, encoded, mask = inputs()
    layer = dropout_decoder(attention, rate=0.5)
    layer(targets, encoded)
    seed = layer.attention._dropout_layer.seed_generator.state
    start = keras.ops.convert_to_numpy(seed)
    # An unseeded generator draws from torch's global generator on torch.
    keras.utils.set_random_seed(11)
    outputs = layer(targets, encoded, mask, training=True)
    seed.assign(start)
    keras.utils.set_random_seed(11)
    masks = layer.attention.draw_loop_noise((T, B, S))["dropout_mask"]
    kept = to_numpy(masks)
    assert set(np.unique(kept)) == {0.0, 2.0}
    assert not np.array_equal(kept[0], kept[1])
    state = layer.get_initial_state(encoded, mask)
    for t in range(T):
        out, state, _ = layer._step(
            targets[:, t],
            state,
            encoded,
            mask,
            True,
            {"dropout_mask": masks[t]},
        )
        np.testing.assert_allclose(
            to_numpy(out), to_numpy(outputs[:, t]), atol=1e-5
        )


# --- shapes ----------------------------------------------------------------


@pytest.mark.parametrize(
    "attention,kwargs,dim",
    [("bahdanau", {}, U), ("luong_general", {"attention_dim": 6}, 6)],
)
def test_compute_output_shape(attention, kwargs, dim):
    layer = decoder("lstm", attention, **kwargs)
    assert layer.compute_output_shape((B, T, E), (B, S, DE)) == (B, T, dim)
    assert layer.compute_output_shape((None, None, E), (None, S, DE)) == (
        None,
        None,
        dim,
    )
    targets = keras.Input((None, E), batch_size=B)
    encoded = keras.Input((S, DE), batch_size=B)
    symbolic = layer(targets, encoded)
    assert tuple(symbolic.shape) == (B, None, dim)
    model = keras.Model([targets, encoded], symbolic)
    x, e, _ = inputs()
    assert tuple(model([x, e]).shape) == (B, T, dim)


# Every mechanism kind: content-based, with a query projection, and with
# an alignment carried in the state.
MASKED_CASES = {
    "gru-bahdanau": (CELLS["gru"], lambda: BahdanauAttention(8), "bahdanau"),
    "lstm-luong": (CELLS["lstm"], lambda: LuongAttention("general"), "luong"),
    "stacked-concat": (
        CELLS["stacked"],
        lambda: LuongAttention("concat", units=6),
        "bahdanau",
    ),
    "gru-location": (
        CELLS["gru"],
        lambda: LocationSensitiveAttention(6, filters=2, kernel_size=3),
        "bahdanau",
    ),
    "simple-monotonic": (
        CELLS["simple"],
        lambda: MonotonicAttention(6),
        "luong",
    ),
}


@pytest.mark.parametrize("case", MASKED_CASES)
def test_padding_steps_of_the_target_change_nothing(case):
    """As Keras's RNN layers: a masked target step keeps the state and
    the previous output (its alignment row is zeros), so padding before
    or after the tokens leaves the outputs at real steps as they are."""
    make_cell, make_attention, flow = MASKED_CASES[case]
    layer = AttentionDecoder(make_cell(), make_attention(), flow=flow)
    targets, encoded, source_mask = inputs(7)
    real = targets[:, :3]
    out, align = layer(real, encoded, source_mask, return_attention_scores=True)
    garbage = rng(8).normal(size=(B, 2, E)).astype("float32")
    for padded, mask, steps in (
        (np.concatenate([garbage, real], 1), [0, 0, 1, 1, 1], slice(2, 5)),
        (np.concatenate([real, garbage], 1), [1, 1, 1, 0, 0], slice(0, 3)),
    ):
        mask = np.tile(np.array(mask, bool), (B, 1))
        got, got_align = layer(
            padded,
            encoded,
            source_mask,
            return_attention_scores=True,
            mask=mask,
        )
        got, got_align = to_numpy(got), to_numpy(got_align)
        np.testing.assert_allclose(got[:, steps], to_numpy(out), atol=1e-6)
        np.testing.assert_allclose(
            got_align[:, steps], to_numpy(align), atol=1e-6
        )
        np.testing.assert_array_equal(got_align[~mask], 0.0)
        previous = np.concatenate([np.zeros_like(got[:, :1]), got[:, :-1]], 1)
        np.testing.assert_array_equal(got[~mask], previous[~mask])


def test_an_embedding_mask_on_the_target_reaches_the_decoder():
    source = keras.Input((None,), dtype="int32")
    target = keras.Input((None,), dtype="int32")
    encoded = keras.layers.Embedding(9, 6, mask_zero=True)(source)
    embedded = keras.layers.Embedding(9, E, mask_zero=True)(target)
    outputs = decoder()(embedded, encoded)
    model = keras.Model([source, target], outputs)
    ids = np.array([[3, 4, 5, 0], [6, 7, 8, 2]], "int32")
    tokens = np.array([[5, 6, 7], [1, 2, 3]], "int32")
    pre_padded = np.concatenate([np.zeros((B, 2), "int32"), tokens], 1)
    np.testing.assert_allclose(
        to_numpy(model([ids, pre_padded]))[:, 2:],
        to_numpy(model([ids, tokens])),
        atol=1e-6,
    )


def test_a_ragged_last_batch_trains_compiled():
    """`fit(jit_compile=True)` with a last batch of another size retraces
    with an unknown batch; TensorFlow's XLA could not compile the
    gradient of a step query projected on three axes."""
    targets = keras.Input((None, E))
    encoded = keras.Input((None, DE))
    outputs = [
        AttentionDecoder(make_cell(), make_attention(), flow=flow)(
            targets, encoded
        )
        for make_cell, make_attention, flow in MASKED_CASES.values()
    ]
    model = keras.Model(
        [targets, encoded],
        [keras.layers.Dense(2)(out) for out in outputs],
    )
    # PyTorch's jit_compile is torch.compile, which Keras does not
    # support for every model; XLA (TensorFlow, JAX) is what is tested.
    compiled = keras.backend.backend() != "torch"
    model.compile(optimizer="sgd", loss="mse", jit_compile=compiled)
    x, e, _ = inputs(9)
    x, e = np.concatenate([x, x[:1]]), np.concatenate([e, e[:1]])  # 3 rows
    y = [np.zeros((3, T, 2), "float32")] * len(outputs)
    history = model.fit([x, e], y, batch_size=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
