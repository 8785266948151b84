"""AttentionDecoder: both flows, step == teacher forcing, masks, saving."""

import keras
import numpy as np
import pytest

from keras_attention import AttentionDecoder
from keras_attention import BahdanauAttention
from keras_attention import LuongAttention
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, S, E, DE, U = 2, 5, 7, 4, 12, 12

CELLS = {
    "gru": lambda: keras.layers.GRUCell(U),
    "lstm": lambda: keras.layers.LSTMCell(U),
    "simple": lambda: keras.layers.SimpleRNNCell(U),
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


@pytest.mark.parametrize("cell", CELLS)
def test_bahdanau_flow_equations(cell):
    """s_t = RNN([y_{t-1}; c_t], s_{t-1}) with c_t scored by s_{t-1}."""
    targets, encoded, mask = inputs()
    layer = decoder(cell, "bahdanau")
    outputs = to_numpy(layer(targets, encoded, encoder_padding_mask=mask))
    state = [keras.ops.zeros((B, U)) for _ in layer._state_sizes()]
    for t in range(T):
        context = layer.attention(state[0], encoded, value_mask=mask)
        x = keras.ops.concatenate([targets[:, t], context], axis=-1)
        out, state = layer.cell(x, state)
        state = state if isinstance(state, (list, tuple)) else [state]
        np.testing.assert_allclose(to_numpy(out), outputs[:, t], atol=1e-5)


@pytest.mark.parametrize("input_feeding", [True, False])
def test_luong_flow_equations(input_feeding):
    """s̃_t = tanh(W_c [c_t; s_t]) with c_t scored by s_t, fed back."""
    targets, encoded, mask = inputs()
    layer = decoder(
        "lstm", "luong_general", attention_dim=6, input_feeding=input_feeding
    )
    outputs = to_numpy(layer(targets, encoded, encoder_padding_mask=mask))
    assert outputs.shape == (B, T, 6)
    state = [keras.ops.zeros((B, U)), keras.ops.zeros((B, U))]
    feed = np.zeros((B, 6), "float32")
    kernel = to_numpy(layer.attention_projection.kernel)
    for t in range(T):
        x = targets[:, t]
        if input_feeding:
            x = np.concatenate([x, feed], axis=-1)
        hidden, state = layer.cell(x, state)
        context = to_numpy(layer.attention(hidden, encoded, value_mask=mask))
        feed = np.tanh(
            np.concatenate([context, to_numpy(hidden)], -1) @ kernel
        ).astype("float32")
        np.testing.assert_allclose(feed, outputs[:, t], atol=1e-5)


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


def test_config_round_trip():
    layer = decoder("lstm", "luong_general", attention_dim=6)
    targets, encoded, _ = inputs()
    want = to_numpy(layer(targets, encoded))
    clone = AttentionDecoder.from_config(layer.get_config())
    assert clone.flow == "luong" and clone.attention_dim == 6
    clone(targets, encoded)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        to_numpy(clone(targets, encoded)), want, atol=1e-6
    )


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
]


@pytest.mark.parametrize("make,received", BAD)
def test_bad_arguments(make, received):
    with pytest.raises(
        ValueError, match=f"AttentionDecoder.*Received: {received}"
    ):
        make()


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
def test_mixed_precision(policy):
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
