"""TransformerEncoderBlock and TransformerDecoderBlock."""

import keras
import numpy as np
import pytest

from keras_attention import RelativePositionBias
from keras_attention import TransformerDecoderBlock
from keras_attention import TransformerEncoderBlock
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, S, D, F = 2, 6, 5, 16, 32

# keras-hub's sublayer names, renamed to ours.
HUB_NAMES = [
    ("self_attention_layer_norm", "self_attention_norm"),
    ("cross_attention_layer_norm", "cross_attention_norm"),
    ("feedforward_layer_norm", "feedforward_norm"),
    ("self_attention_layer/", "self_attention/"),
    ("/query/", "/query_dense/"),
    ("/key/", "/key_dense/"),
    ("/value/", "/value_dense/"),
    ("/attention_output/", "/output_dense/"),
]


def data(seed=0, length=T):
    return rng(seed).normal(size=(B, length, D)).astype("float32")


def padding(length, real):
    return np.arange(length)[None, :] < np.array(real)[:, None]


def copy_from_keras_hub(theirs, ours):
    ours_by_path = {w.path.split("/", 1)[1]: w for w in ours.weights}
    for weight in theirs.weights:
        path = "/" + weight.path.split("/", 1)[1]
        for old, new in HUB_NAMES:
            path = path.replace(old, new)
        ours_by_path.pop(path.lstrip("/")).assign(to_numpy(weight))
    assert not ours_by_path, sorted(ours_by_path)


def hub():
    return pytest.importorskip("keras_hub")


@pytest.mark.parametrize("normalize_first", [False, True])
def test_encoder_parity_with_keras_hub(normalize_first):
    x = data()
    pad = padding(T, [4, T])
    theirs = hub().layers.TransformerEncoder(
        F, 4, normalize_first=normalize_first
    )
    ours = TransformerEncoderBlock(4, F, normalize_first=normalize_first)
    want = to_numpy(theirs(x, padding_mask=pad))
    got = ours(x, padding_mask=pad)
    copy_from_keras_hub(theirs, ours)
    got = to_numpy(ours(x, padding_mask=pad))
    np.testing.assert_allclose(got[0, :4], want[0, :4], atol=1e-5)
    np.testing.assert_allclose(got[1], want[1], atol=1e-5)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_decoder_parity_with_keras_hub(normalize_first):
    target, source = data(1), data(2, S)
    target_pad, source_pad = padding(T, [T, 4]), padding(S, [3, S])
    theirs = hub().layers.TransformerDecoder(
        F, 4, normalize_first=normalize_first
    )
    ours = TransformerDecoderBlock(4, F, normalize_first=normalize_first)
    want = to_numpy(
        theirs(
            target,
            source,
            decoder_padding_mask=target_pad,
            encoder_padding_mask=source_pad,
        )
    )
    ours(target, source)
    copy_from_keras_hub(theirs, ours)
    got = to_numpy(
        ours(
            target,
            source,
            padding_mask=target_pad,
            encoder_padding_mask=source_pad,
        )
    )
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
    np.testing.assert_allclose(got[1, :4], want[1, :4], atol=1e-5)


def test_decoder_only_parity_with_keras_hub():
    x = data()
    theirs = hub().layers.TransformerDecoder(F, 4)
    ours = TransformerDecoderBlock(4, F)
    want = to_numpy(theirs(x))
    ours(x)
    copy_from_keras_hub(theirs, ours)
    np.testing.assert_allclose(to_numpy(ours(x)), want, atol=1e-5)


def t5_layer(is_decoder):
    """keras-hub's T5 layer (pre-RMSNorm, no biases, T5's relative bias
    in the self-attention, unscaled logits), its weights random."""
    from keras_hub.src.models.t5.t5_transformer_layer import T5TransformerLayer

    hub()
    return T5TransformerLayer(
        is_decoder=is_decoder,
        hidden_dim=D,
        intermediate_dim=F,
        key_value_dim=D // 4,
        dropout=0.0,
        activation="relu",
        layer_norm_epsilon=1e-6,
        num_heads=4,
        use_relative_attention_bias=True,
    )


def copy_from_t5(theirs, ours):
    """T5's weights into our block: they list in the same order. T5 does
    not scale its logits, so our query kernels carry the `sqrt(H)`."""
    assert len(theirs.weights) == len(ours.weights)
    for seed, (weight, our) in enumerate(
        zip(theirs.weights, ours.weights, strict=True)
    ):
        value = rng(40 + seed).normal(size=weight.shape).astype("float32")
        weight.assign(value)
        if "query_projector" in weight.path:
            value = value * np.sqrt(D // 4)
        our.assign(value.reshape(our.shape))


# keras-hub's T5 layer passes a Keras mask to a sublayer that drops it.
@pytest.mark.filterwarnings(
    "ignore:Layer '.*_attention' .of type T5:UserWarning"
)
@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_style_block_equals_keras_hub_t5_layer(is_decoder):
    """`use_bias=False`, `use_rms_norm=True` and a `RelativePositionBias`
    make the pre-LN block T5's layer: equal outputs with T5's weights, at
    lengths past T5's exact-distance buckets, with padding."""
    length = 24  # distances up to 23: T5's logarithmic buckets too
    x, source = data(5, length), data(6, S)
    theirs = t5_layer(is_decoder)
    block = TransformerDecoderBlock if is_decoder else TransformerEncoderBlock
    ours = block(
        4,
        F,
        normalize_first=True,
        layer_norm_epsilon=1e-6,
        use_bias=False,
        use_rms_norm=True,
        score_mod=RelativePositionBias(bidirectional=not is_decoder),
    )
    if is_decoder:
        source_pad = padding(S, [3, S])
        call_theirs = dict(
            encoder_hidden_states=source,
            encoder_attention_mask=np.repeat(source_pad[:, None], length, 1),
            use_causal_mask=True,
        )
        call_ours = dict(
            encoder_outputs=source, encoder_padding_mask=source_pad
        )
        real = np.ones((B, length), bool)
    else:
        real = padding(length, [17, length])
        call_theirs = dict(attention_mask=np.repeat(real[:, None], length, 1))
        call_ours = dict(padding_mask=real)
    theirs(x, **call_theirs)
    ours(x, **call_ours)
    copy_from_t5(theirs, ours)
    want = to_numpy(theirs(x, **call_theirs)[0])
    got = to_numpy(ours(x, **call_ours))
    np.testing.assert_allclose(got[real], want[real], rtol=1e-4, atol=1e-4)


def test_blocks_without_biases_hold_no_bias_weights():
    for block in (
        TransformerEncoderBlock(4, F, use_bias=False),
        TransformerDecoderBlock(4, F, use_bias=False, use_rms_norm=True),
    ):
        if isinstance(block, TransformerDecoderBlock):
            block(data(), data(1, S))
        else:
            block(data())
        names = sorted(w.path.rsplit("/", 1)[1] for w in block.weights)
        assert "bias" not in names
        assert ("scale" in names) == block.use_rms_norm
        assert ("beta" in names) != block.use_rms_norm


def test_encoder_is_permutation_equivariant_without_positions():
    x = data()
    block = TransformerEncoderBlock(4, F)
    order = rng(8).permutation(T)
    out = to_numpy(block(x))
    np.testing.assert_allclose(
        to_numpy(block(x[:, order])), out[:, order], atol=1e-5
    )


@pytest.mark.parametrize("with_encoder", [False, True])
def test_decoder_never_sees_the_future(with_encoder):
    x, source = data(), data(3, S)
    block = TransformerDecoderBlock(4, F)
    args = (source,) if with_encoder else ()
    out = to_numpy(block(x, *args))
    changed = x.copy()
    changed[:, 4:] += 5.0
    out_changed = to_numpy(block(changed, *args))
    np.testing.assert_allclose(out_changed[:, :4], out[:, :4], atol=1e-5)
    assert not np.allclose(out_changed[:, 4:], out[:, 4:])


def test_encoder_padded_values_do_not_change_real_outputs():
    x = data()
    pad = padding(T, [3, T])
    block = TransformerEncoderBlock(4, F)
    garbage = x.copy()
    garbage[0, 3:] = 50.0
    out = to_numpy(block(x, padding_mask=pad))
    out_garbage = to_numpy(block(garbage, padding_mask=pad))
    np.testing.assert_allclose(out_garbage[0, :3], out[0, :3], atol=1e-4)


@pytest.mark.parametrize(
    "block_type", [TransformerEncoderBlock, TransformerDecoderBlock]
)
def test_rotary_wavelength_reaches_the_attention(block_type):
    """`max_wavelength` (Llama 3's 500000, here 50) sets the block's rotary
    angles: its weights are those of NumPy attention over rotated queries
    and keys with that wavelength (post-LN: the attention sees `x`)."""
    from tests.unit.layers.test_multi_head_attention import np_multi_head

    x = data()
    block = block_type(4, F, use_rotary=True, max_wavelength=50.0)
    _, scores = block(x, return_attention_scores=True)
    if isinstance(scores, dict):
        scores = scores["self"]
    causal = block_type is TransformerDecoderBlock
    want = np_multi_head(
        block.self_attention, x, x, causal=causal, max_wavelength=50.0
    )[1]
    np.testing.assert_allclose(to_numpy(scores), want, atol=1e-5)
    default = np_multi_head(block.self_attention, x, x, causal=causal)[1]
    assert np.abs(default - want).max() > 1e-3
    again = block_type.from_config(block.get_config())
    assert again.max_wavelength == 50.0


DECODER_CONFIGS = {
    "mha": {},
    "gqa": {"num_key_value_heads": 2},
    "rotary_pre_ln": {"use_rotary": True, "normalize_first": True},
}


@pytest.mark.parametrize("steps", [(1,) * T, (3, 2, 1)])
@pytest.mark.parametrize("with_encoder", [False, True])
@pytest.mark.parametrize("config", DECODER_CONFIGS)
def test_cached_decoding_equals_full_forward(config, with_encoder, steps):
    x, source = data(), data(4, S)
    source_pad = padding(S, [3, S])
    block = TransformerDecoderBlock(4, F, **DECODER_CONFIGS[config])
    kwargs = (
        {"encoder_outputs": source, "encoder_padding_mask": source_pad}
        if with_encoder
        else {}
    )
    full, full_scores = block(x, return_attention_scores=True, **kwargs)
    cache = block.init_cache(
        B, T, encoder_outputs=kwargs.get("encoder_outputs")
    )
    assert set(cache) == ({"self", "cross"} if with_encoder else {"self"})
    step_kwargs = {k: v for k, v in kwargs.items() if k != "encoder_outputs"}
    outputs, index = [], 0
    for size in steps:
        out, scores, cache = block(
            x[:, index : index + size],
            cache=cache,
            cache_index=index,
            return_attention_scores=True,
            **step_kwargs,
        )
        outputs.append(to_numpy(out))
        if with_encoder:
            np.testing.assert_allclose(
                to_numpy(scores["cross"]),
                to_numpy(full_scores["cross"])[:, :, index : index + size],
                atol=1e-5,
            )
        index += size
    np.testing.assert_allclose(
        np.concatenate(outputs, 1), to_numpy(full), atol=2e-5
    )


def test_decoder_only_block_takes_a_plain_cache_tensor():
    x = data()
    block = TransformerDecoderBlock(4, F)
    full = to_numpy(block(x))
    cache = block.init_cache(B, T)["self"]
    out, cache = block(x[:, :4], cache=cache, cache_index=0)
    out2, cache = block(x[:, 4:], cache=cache, cache_index=4)
    np.testing.assert_allclose(
        np.concatenate([to_numpy(out), to_numpy(out2)], 1), full, atol=1e-5
    )


def test_decoder_scores_dict():
    block = TransformerDecoderBlock(2, F)
    _, scores = block(data(), data(1, S), return_attention_scores=True)
    assert tuple(scores["self"].shape) == (B, 2, T, T)
    assert tuple(scores["cross"].shape) == (B, 2, T, S)
    self_scores = to_numpy(scores["self"])
    np.testing.assert_allclose(self_scores.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(self_scores[0, 0], 1) == 0.0)


def test_encoder_scores():
    block = TransformerEncoderBlock(2, F)
    pad = padding(T, [2, T])
    _, scores = block(data(), padding_mask=pad, return_attention_scores=True)
    scores = to_numpy(scores)
    assert scores.shape == (B, 2, T, T)
    assert np.all(scores[0, :, :, 2:] == 0.0)


def test_dropout_in_training_only():
    x = data()
    block = TransformerEncoderBlock(4, F, dropout=0.3)
    eval_out = to_numpy(block(x))
    np.testing.assert_allclose(
        to_numpy(block(x, training=False)), eval_out, atol=1e-6
    )
    assert not np.allclose(to_numpy(block(x, training=True)), eval_out)


def seq2seq_model(normalize_first=False):
    source_ids = keras.Input((None,), dtype="int32", name="source")
    target_ids = keras.Input((None,), dtype="int32", name="target")
    embed = keras.layers.Embedding(20, D, mask_zero=True, name="embed")
    encoded = TransformerEncoderBlock(
        4, F, normalize_first=normalize_first, name="encoder"
    )(embed(source_ids))
    decoded = TransformerDecoderBlock(
        4, F, normalize_first=normalize_first, name="decoder"
    )(embed(target_ids), encoded)
    logits = keras.layers.Dense(20, name="logits")(decoded)
    return keras.Model([source_ids, target_ids], logits)


def test_implicit_masks_in_a_seq2seq_model():
    model = seq2seq_model()
    source = np.array([[3, 4, 5, 0, 0], [1, 2, 3, 4, 5]])
    target = np.array([[6, 7, 0], [8, 9, 10]])
    out = to_numpy(model([source, target]))
    embed = model.get_layer("embed")
    encoder, decoder = model.get_layer("encoder"), model.get_layer("decoder")
    encoded = encoder(embed(source), padding_mask=source != 0)
    decoded = decoder(
        embed(target),
        encoded,
        padding_mask=target != 0,
        encoder_padding_mask=source != 0,
    )
    explicit = to_numpy(model.get_layer("logits")(decoded))
    np.testing.assert_allclose(out[0, :2], explicit[0, :2], atol=1e-5)
    np.testing.assert_allclose(out[1], explicit[1], atol=1e-5)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_seq2seq_trains_saves_and_loads(normalize_first, tmp_path):
    model = seq2seq_model(normalize_first)
    g = rng(2)
    source = g.integers(1, 20, size=(32, 5))
    target = g.integers(1, 20, size=(32, 4))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(
        [source, target], target, epochs=8, batch_size=32, verbose=0
    )
    assert history.history["loss"][-1] < 0.8 * history.history["loss"][0]
    path = tmp_path / "seq2seq.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_allclose(
        to_numpy(restored([source, target])),
        to_numpy(model([source, target])),
        atol=1e-6,
    )


BLOCK_ERRORS = [
    (lambda: TransformerEncoderBlock(3, F)(data()), "num_heads=3"),
    (
        lambda: TransformerDecoderBlock(4, F, num_key_value_heads=3),
        "num_key_value_heads=3",
    ),
    (lambda: TransformerEncoderBlock(4, 0), "intermediate_dim=0"),
    (lambda: TransformerEncoderBlock(4, F, dropout=2.0), "dropout=2.0"),
    (
        lambda: TransformerEncoderBlock(4, F)(
            data(), padding_mask=np.ones((B, T - 1), bool)
        ),
        r"padding_mask.shape=\(2, 5\)",
    ),
    (
        lambda: TransformerEncoderBlock(4, F)(np.zeros((B, D), "float32")),
        r"inputs.shape=\(2, 16\)",
    ),
]


@pytest.mark.parametrize("make,received", BLOCK_ERRORS)
def test_bad_block_arguments(make, received):
    with pytest.raises(ValueError, match=f"Received:.*{received}"):
        make()


def test_decoder_encoder_mismatch_errors():
    block = TransformerDecoderBlock(4, F)
    block(data())  # decoder-only
    with pytest.raises(ValueError, match="without cross-attention"):
        block(data(), data(1, S))
    with_cross = TransformerDecoderBlock(4, F)
    with_cross(data(), data(1, S))
    with pytest.raises(ValueError, match="with cross-attention"):
        with_cross(data())
    with pytest.raises(ValueError, match="keys"):
        with_cross(data(), cache={"selfish": 1}, cache_index=0)


# --- Keras shape inference -------------------------------------------------


def test_encoder_under_time_distributed_equals_each_slice():
    rows = 3
    x = rng(3).normal(size=(B, rows, 4, 8)).astype("float32")  # (B, R, T, D)
    block = TransformerEncoderBlock(2, 16)
    inputs = keras.Input((rows, 4, 8))
    outputs = keras.layers.TimeDistributed(block)(inputs)
    assert tuple(outputs.shape) == (None, rows, 4, 8)
    got = to_numpy(keras.Model(inputs, outputs)(x))
    assert got.shape == x.shape
    for row in range(rows):
        np.testing.assert_allclose(
            got[:, row], to_numpy(block(x[:, row])), atol=1e-5
        )


def test_blocks_in_a_sequential_model_and_its_summary():
    model = keras.Sequential(
        [
            keras.Input((3, 4, 8)),
            keras.layers.TimeDistributed(TransformerEncoderBlock(2, 16)),
            keras.layers.TimeDistributed(TransformerDecoderBlock(2, 16)),
            keras.layers.Dense(5),
        ]
    )
    assert model.output_shape == (None, 3, 4, 5)
    lines = []
    model.summary(print_fn=lines.append)
    assert "(None, 3, 4, 8)" in "\n".join(lines)


def test_blocks_compute_output_shape():
    encoder = TransformerEncoderBlock(2, 16)
    decoder = TransformerDecoderBlock(2, 16)
    assert encoder.compute_output_shape((None, 4, 8)) == (None, 4, 8)
    assert decoder.compute_output_shape((None, 4, 8)) == (None, 4, 8)
    assert decoder.compute_output_shape((B, T, D), (B, S, 6)) == (B, T, D)
    source = rng(1).normal(size=(B, S, 6)).astype("float32")
    assert tuple(decoder(data(), source).shape) == (B, T, D)
    with pytest.raises(
        ValueError, match=r"TransformerEncoderBlock.*inputs.shape=\(2, 8\)"
    ):
        encoder.compute_output_shape((2, 8))
    with pytest.raises(
        ValueError,
        match=r"TransformerDecoderBlock.*encoder_outputs.shape=\(3, 5, 6\)",
    ):
        decoder.compute_output_shape((B, T, D), (3, S, 6))
