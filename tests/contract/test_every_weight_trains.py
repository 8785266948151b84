"""No dead weights: one training step moves every trainable weight.

Every public layer sits in one functional model per (length, dropout),
side by side, each with its own MSE loss against random targets; one SGD
step of `model.fit` must change every trainable weight. A weight that a
path of the library cuts off from the loss (a gradient dropped by a
rematerialised kernel, a branch that returns zeros) keeps its initial
value, and the test names it.

Paths: the one the dispatch picks for a short sequence (the reference
on TensorFlow and JAX on CPU, the fused kernel on PyTorch), and the
blockwise (chunked) path, forced with blocks of 4 rows so that a short
sequence spans several blocks and a padded last one, as a sequence past
the dispatch's length thresholds does (the forced path is the kernel
that runs from 512 queries on: the same code at a fraction of the
cost). The RNN decoders get a short target over the whole source.
Dropout 0 runs the kernels; dropout > 0 the explicit-weights path with
dropout masks. Some layers get padding masks (and causal masks), some
none.

Shape legend: B batch, T sequence (query) length, S source length,
D model dim.
"""

import contextlib

import keras
import numpy as np
import pytest

import keras_attention as ka
from keras_attention import _kernels
from tests.helpers import to_numpy

pytestmark = pytest.mark.slow  # runs early: see tests/conftest.py

MODEL_DIM = 8  # D
NUM_HEADS = 2
INTERMEDIATE_DIM = 16
BATCH = 2
TARGET_STEPS = 3  # the RNN decoders' target length
LENGTH = 6  # T and S: two blocks of CHUNK rows, the last one padded
CHUNK = 4
LEARNING_RATE = 1.0
# A weight moved if some entry changed by more than this; one exempt by
# an invariance (below) must have moved by less than 1% of the weight
# that moved least.
TOLERANCE = 1e-6


def test_forced_blocks_span_a_padded_last_block():
    assert LENGTH > CHUNK and LENGTH % CHUNK


@pytest.mark.parametrize("dropout", [0.0, 0.25], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("path", ["automatic", "chunked"])
def test_one_step_moves_every_weight(path, dropout):
    keras.utils.set_random_seed(20261129)
    forced = (
        _kernels.force("chunked", chunk_size=CHUNK)
        if path == "chunked"
        else contextlib.nullcontext()
    )
    with forced:  # the path is fixed when `fit` traces the step
        model = build_model(LENGTH, dropout)
        check_every_public_layer_is_in(model)
        model.compile(
            optimizer=keras.optimizers.SGD(LEARNING_RATE),
            loss={name: "mse" for name in model.output_names},
        )
        inputs, targets = data(model, LENGTH)
        before = [to_numpy(weight) for weight in model.trainable_weights]
        model.fit(inputs, targets, batch_size=BATCH, epochs=1, verbose=0)
    check_every_weight_moved(model, before)


def build_model(length, dropout):
    """Every public layer on the same inputs, one output (and loss) each.

    `length` is T and S; the RNN decoders' targets have `TARGET_STEPS`.
    """
    sequence = keras.Input((length, MODEL_DIM), BATCH, name="sequence")
    padding = keras.Input((length,), BATCH, "bool", name="padding")
    source = keras.Input((length, MODEL_DIM), BATCH, name="source")
    source_padding = keras.Input((length,), BATCH, "bool", name="source_pad")
    target = keras.Input((TARGET_STEPS, MODEL_DIM), BATCH, name="target")
    units = MODEL_DIM
    outputs = {}

    def bahdanau(name, **kwargs):
        return ka.BahdanauAttention(units, dropout=dropout, name=name, **kwargs)

    def luong(name, **kwargs):
        return ka.LuongAttention(dropout=dropout, name=name, **kwargs)

    # RNN attention over a whole query sequence: (B, T, D) -> (B, T, D).
    outputs["bahdanau"] = bahdanau("bahdanau")(
        sequence, source, value_mask=source_padding
    )
    outputs["bahdanau_normalized"] = bahdanau(
        "bahdanau_normalized", normalize=True
    )(sequence, source)
    # `dot` has no weight but the gain of `scale=True`.
    outputs["luong_dot"] = luong("luong_dot", score="dot", scale=True)(
        sequence, source, value_mask=source_padding
    )
    outputs["luong_general"] = luong("luong_general", score="general")(
        sequence, source
    )
    outputs["luong_concat"] = luong(
        "luong_concat", score="concat", units=units
    )(sequence, source, value_mask=source_padding)

    # RNN decoders: a short target over the whole source.
    outputs["decoder_gru_bahdanau"] = ka.AttentionDecoder(
        keras.layers.GRUCell(units, name="gru_cell"),
        bahdanau("decoder_bahdanau"),
        flow="bahdanau",
        name="decoder_gru_bahdanau",
    )(target, source, encoder_padding_mask=source_padding)
    outputs["decoder_lstm_luong"] = ka.AttentionDecoder(
        keras.layers.LSTMCell(units, name="lstm_cell"),
        luong("decoder_luong", score="general"),
        flow="luong",
        name="decoder_lstm_luong",
    )(target, source)
    # Attention with memory, through the decoders (the whole-sequence call
    # would loop over every query).
    outputs["decoder_gru_location"] = ka.AttentionDecoder(
        keras.layers.GRUCell(units, name="gru_location_cell"),
        ka.LocationSensitiveAttention(
            units, 4, 3, dropout=dropout, name="location_sensitive"
        ),
        name="decoder_gru_location",
    )(target, source, encoder_padding_mask=source_padding)
    outputs["decoder_lstm_monotonic"] = ka.AttentionDecoder(
        keras.layers.LSTMCell(units, name="lstm_monotonic_cell"),
        ka.MonotonicAttention(
            units,
            normalize=True,
            sigmoid_noise=1.0,
            dropout=dropout,
            name="monotonic",
        ),
        flow="luong",
        name="decoder_lstm_monotonic",
    )(target, source, encoder_padding_mask=source_padding)

    # Multi-head attention: padding, causal, grouped-query, rotary.
    heads = {"num_heads": NUM_HEADS, "dropout": dropout}
    outputs["self_attention"] = ka.MultiHeadSelfAttention(
        **heads, name="self_attention"
    )(sequence, padding_mask=padding)
    outputs["self_attention_gqa"] = ka.MultiHeadSelfAttention(
        **heads, num_key_value_heads=1, name="self_attention_gqa"
    )(sequence, use_causal_mask=True)
    outputs["self_attention_rotary"] = ka.MultiHeadSelfAttention(
        **heads, use_rotary=True, name="self_attention_rotary"
    )(sequence, padding_mask=padding, use_causal_mask=True)
    outputs["cross_attention"] = ka.CrossAttention(
        **heads, name="cross_attention"
    )(sequence, source, value_mask=source_padding)

    # Blocks: an encoder over learned positions, a pre-LN decoder-only
    # block over sinusoidal ones, a decoder with cross-attention,
    # grouped-query and rotary.
    blocks = {**heads, "intermediate_dim": INTERMEDIATE_DIM}
    positioned = ka.PositionEmbedding(length, name="position_embedding")(
        sequence
    )
    outputs["encoder_block"] = ka.TransformerEncoderBlock(
        **blocks, name="encoder_block"
    )(positioned, padding_mask=padding)
    # T5's learned bias (a layer given as the score mod), with a mask mod.
    bias = ka.RelativePositionBias(
        num_buckets=8, max_distance=4, embeddings_initializer="random_normal"
    )
    outputs["encoder_block_relative_bias"] = ka.TransformerEncoderBlock(
        **blocks, score_mod=bias, name="encoder_block_relative_bias"
    )(
        positioned,
        padding_mask=padding,
        mask_mod=ka.mods.sliding_window((2, 1)),
    )
    encoded = ka.PositionalEncoding(name="positional_encoding")(sequence)
    outputs["decoder_only_block"] = ka.TransformerDecoderBlock(
        **blocks, normalize_first=True, name="decoder_only_block"
    )(encoded, padding_mask=padding)
    outputs["decoder_block"] = ka.TransformerDecoderBlock(
        **blocks,
        num_key_value_heads=1,
        use_rotary=True,
        name="decoder_block",
    )(sequence, source, encoder_padding_mask=source_padding)

    inputs = {
        "sequence": sequence,
        "padding": padding,
        "source": source,
        "source_pad": source_padding,
        "target": target,
    }
    return keras.Model(inputs, outputs, name=f"every_layer_{length}")


def data(model, length):
    """Random inputs, padding masks that hide the end of the second
    sequence, and random targets of every output's shape."""
    rng = np.random.default_rng(length)
    padding = np.ones((BATCH, length), bool)
    padding[1, -(length // 3) :] = False
    source_padding = np.ones((BATCH, length), bool)
    source_padding[1, -(length // 4 + 1) :] = False

    def normal(*shape):
        return rng.normal(size=(BATCH, *shape)).astype("float32")

    inputs = {
        "sequence": normal(length, MODEL_DIM),
        "padding": padding,
        "source": normal(length, MODEL_DIM),
        "source_pad": source_padding,
        "target": normal(TARGET_STEPS, MODEL_DIM),
    }
    targets = {
        name: normal(*output.shape[1:])
        for name, output in zip(model.output_names, model.outputs, strict=True)
    }
    return inputs, targets


def check_every_public_layer_is_in(model):
    """A public layer added to the package but not to the model fails."""
    public = [
        value
        for name, value in vars(ka).items()
        if name in ka.__all__
        and isinstance(value, type)
        and issubclass(value, keras.layers.Layer)
    ]
    layers = model._flatten_layers()
    missing = [
        cls.__name__
        for cls in public
        if not any(isinstance(layer, cls) for layer in layers)
    ]
    assert len(public) >= 10 and not missing, (
        f"public layers not in the model: {missing}"
    )


def softmax_invariant_weights(model):
    """The paths of the weights whose gradient is zero by construction.

    In dot-product attention the key projection's bias `b_k` adds
    `q . b_k` to every logit of a query's row: the same number for every
    key, to which the softmax is invariant, so `b_k` gets a zero gradient
    (up to rounding) on every path. Rotary embedding rotates `b_k`
    differently at each key position, which breaks the invariance. No
    other weight is invariant: the query bias meets a different key at
    each position, the value bias adds `b_v` to the (unit-sum) weighted
    average, Bahdanau's score bias sits inside the `tanh`, and Luong's
    scores have no bias. These weights are exempt from moving, and
    checked to stay put instead.
    """
    paths = set()
    for layer in model._flatten_layers():  # every sublayer, recursively
        if not isinstance(
            layer, (ka.MultiHeadSelfAttention, ka.CrossAttention)
        ):
            continue
        if layer.use_bias and not getattr(layer, "use_rotary", False):
            paths.add(layer.key_dense.bias.path)
    return paths


def check_every_weight_moved(model, before):
    paths = [weight.path for weight in model.trainable_weights]
    assert len(set(paths)) == len(paths), "weight paths are not unique"
    invariant = softmax_invariant_weights(model)
    assert invariant, "no softmax-invariant bias found: a vacuous exemption"
    dead, not_finite, changes = [], [], {}
    for weight, old in zip(model.trainable_weights, before, strict=True):
        new = to_numpy(weight)
        if not np.all(np.isfinite(new)):
            not_finite.append(weight.path)
            continue
        changes[weight.path] = np.max(np.abs(new - old))
        if (
            weight.path not in invariant
            and not changes[weight.path] > TOLERANCE
        ):
            dead.append(f"{weight.path} ({changes[weight.path]:.1e})")
    # The invariant biases move by rounding only: far less than any other
    # weight (relative, so a kernel's rounding order cannot flip it).
    smallest = min(c for p, c in changes.items() if p not in invariant)
    moved_invariant = [
        f"{p} ({c:.1e})"
        for p, c in changes.items()
        if p in invariant and c >= 0.01 * smallest
    ]
    table = model.get_layer("position_embedding").embeddings
    index = paths.index(table.path)
    rows = np.max(np.abs(to_numpy(table) - before[index]), axis=-1)  # (T,)
    dead_rows = np.flatnonzero(~(rows > TOLERANCE))
    assert not not_finite, f"weights not finite after one step: {not_finite}"
    assert not dead, f"weights that one training step did not move: {dead}"
    assert not moved_invariant, (
        f"softmax-invariant biases that moved: {moved_invariant}"
    )
    assert not dead_rows.size, (
        f"{table.path}: rows that did not move: {dead_rows.tolist()}"
    )
