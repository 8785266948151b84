"""keras_attention.convert: Keras / keras-hub layers to ours and back."""

import keras
import numpy as np
import pytest

from keras_attention import CrossAttention
from keras_attention import MultiHeadSelfAttention
from keras_attention import RelativePositionBias
from keras_attention import TransformerDecoderBlock
from keras_attention import TransformerEncoderBlock
from keras_attention import convert
from keras_attention import decoding
from keras_attention import mods
from tests.helpers import rng
from tests.helpers import to_numpy

hub = pytest.importorskip("keras_hub")

B, T, S, D, F = 2, 5, 4, 8, 16
ATOL = 1e-5
MASKS = ["causal", "padding_causal", "attention"]


def data(seed, length=T, dim=D):
    return rng(seed).normal(size=(B, length, dim)).astype("float32")


def padding(length, real=(3, None)):
    """Right padding: row 0 has `real[0]` tokens, row 1 is full."""
    real = [length if r is None else r for r in real]
    return np.arange(length)[None, :] < np.array(real)[:, None]


def attention_mask(length, key_length, seed=3):
    mask = rng(seed).random((B, length, key_length)) < 0.6
    mask[:, :, 0] = True  # no fully masked row (Keras differs there)
    return mask


def self_masks(kind, length=T):
    """Our call arguments and Keras's for one mask kind."""
    ours, theirs = {}, {}
    if "padding" in kind:
        ours["padding_mask"] = theirs["value_mask"] = padding(length)
    if "causal" in kind:
        ours["use_causal_mask"] = theirs["use_causal_mask"] = True
    if kind == "attention":
        mask = attention_mask(length, length)
        ours["attention_mask"] = theirs["attention_mask"] = mask
    return ours, theirs


def assert_close(got, want):
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=ATOL)


def assert_same_weights(a, b):
    for x, y in zip(a.weights, b.weights, strict=True):
        np.testing.assert_array_equal(to_numpy(x), to_numpy(y))


@pytest.mark.parametrize("kind", MASKS)
def test_multi_head_attention_to_self_attention_and_back(kind):
    x = data(0)
    ours_args, keras_args = self_masks(kind)
    theirs = keras.layers.MultiHeadAttention(2, 4, name="mha")
    want = theirs(x, x, **keras_args)
    ours = convert.from_keras(theirs)
    assert isinstance(ours, MultiHeadSelfAttention) and ours.name == "mha"
    assert_close(ours(x, **ours_args), want)
    back = convert.to_keras(ours)
    assert type(back) is keras.layers.MultiHeadAttention
    assert_close(back(x, x, **keras_args), want)
    assert_same_weights(back, theirs)


@pytest.mark.parametrize("kind", ["padding", "attention"])
def test_multi_head_attention_to_cross_attention_and_back(kind):
    query, value = data(1), data(2, S, 6)
    key = data(3, S, 5)
    theirs = keras.layers.MultiHeadAttention(2, 4, value_dim=3, use_bias=False)
    ours_args, keras_args = {}, {}
    if kind == "padding":
        ours_args["value_mask"] = keras_args["value_mask"] = padding(S)
    if kind == "attention":
        mask = attention_mask(T, S)
        ours_args["attention_mask"] = keras_args["attention_mask"] = mask
    # With scores: Keras's fused path on JAX needs value_dim == key_dim.
    keras_args["return_attention_scores"] = True
    ours_args["return_attention_scores"] = True
    want = theirs(query, value, key, **keras_args)
    ours = convert.from_keras(theirs, cross_attention=True)
    assert isinstance(ours, CrossAttention)
    assert ours.value_dim == 3 and not ours.use_bias
    for got, expected in zip(
        ours(query, value, key, **ours_args), want, strict=True
    ):
        assert_close(got, expected)
    back = convert.to_keras(ours)
    for got, expected in zip(
        back(query, value, key, **keras_args), want, strict=True
    ):
        assert_close(got, expected)
    assert_same_weights(back, theirs)


@pytest.mark.parametrize(
    "cross_attention, kind", [(False, "padding_causal"), (True, "attention")]
)
def test_group_query_attention_both_directions(cross_attention, kind):
    x = data(4)
    theirs = keras.layers.GroupQueryAttention(4, 2, 1)
    ours_args, keras_args = self_masks(kind)
    want = theirs(x, x, **keras_args)
    ours = convert.from_keras(theirs, cross_attention=cross_attention)
    assert ours.num_key_value_heads == 1
    if cross_attention:  # no causal flag: the same as a mask
        mask = ours_args.pop("attention_mask", np.ones((B, T, T), bool))
        if ours_args.pop("use_causal_mask", False):
            mask = mask & np.tril(np.ones((T, T), bool))
        if "padding_mask" in ours_args:
            mask = mask & ours_args.pop("padding_mask")[:, None, :]
        got = ours(x, x, attention_mask=mask)
    else:
        got = ours(x, **ours_args)
    assert_close(got, want)
    back = convert.to_keras(ours)
    assert type(back) is keras.layers.GroupQueryAttention
    assert_close(back(x, x, **keras_args), want)


def test_sliding_window_is_a_symmetric_band():
    x = data(5)
    theirs = keras.layers.MultiHeadAttention(2, 4, sliding_window=3)
    want = theirs(x, x)
    ours = convert.from_keras(theirs)
    assert ours.sliding_window == (2, 2)
    assert_close(ours(x), want)
    assert convert.to_keras(ours).get_config()["sliding_window"] == 3


def test_cached_multi_head_attention_with_its_cache():
    x = data(6)
    theirs = hub.layers.CachedMultiHeadAttention(2, 4)
    causal = np.tril(np.ones((T, T), bool))[None]
    want = theirs(x, x, attention_mask=causal)
    ours = convert.from_keras(theirs)
    assert_close(ours(x, use_causal_mask=True), want)
    cache = np.zeros((B, 2, T, 2, 4), "float32")
    index = 2
    step_mask = (np.arange(T) <= index)[None, None]  # (1, 1, S_max)
    their_out, their_cache = theirs(
        x[:, index : index + 1],
        x[:, index : index + 1],
        attention_mask=np.broadcast_to(step_mask, (B, 1, T)),
        cache=cache,
        cache_update_index=index,
    )
    our_out, our_cache = ours(
        x[:, index : index + 1],
        cache=cache,
        cache_index=index,
        use_causal_mask=True,
    )
    assert_close(our_out, their_out)
    assert_close(our_cache, their_cache)


@pytest.mark.parametrize(
    "normalize_first, kind", [(False, "padding"), (True, "attention")]
)
def test_transformer_encoder_both_directions(normalize_first, kind):
    x = data(7)
    ours_args, _ = self_masks(kind)
    theirs = hub.layers.TransformerEncoder(
        F, 2, activation="gelu", normalize_first=normalize_first
    )
    want = theirs(x, **ours_args)  # keras-hub's names are ours
    ours = convert.from_keras(theirs)
    assert isinstance(ours, TransformerEncoderBlock)
    assert_close(ours(x, **ours_args), want)
    back = convert.to_keras(ours)
    assert type(back) is hub.layers.TransformerEncoder
    assert_close(back(x, **ours_args), want)
    assert_same_weights(back, theirs)


@pytest.mark.parametrize(
    "with_encoder, normalize_first", [(False, True), (True, False)]
)
def test_transformer_decoder_both_directions(with_encoder, normalize_first):
    target, source = data(8), data(9, S, 6)
    theirs = hub.layers.TransformerDecoder(
        F, 2, normalize_first=normalize_first
    )
    source_args = {}
    if with_encoder:  # both source masks, combined as keras-hub does
        source_args = dict(
            encoder_padding_mask=padding(S, (2, None)),
            encoder_attention_mask=attention_mask(T, S),
        )
    hub_args = dict(decoder_padding_mask=padding(T), **source_args)
    our_args = dict(padding_mask=padding(T), **source_args)
    sources = (source,) if with_encoder else ()
    want = theirs(target, *sources, **hub_args)
    ours = convert.from_keras(theirs)
    assert isinstance(ours, TransformerDecoderBlock)
    assert (ours.cross_attention is not None) == with_encoder
    assert_close(ours(target, *sources, **our_args), want)
    back = convert.to_keras(ours)
    assert_close(back(target, *sources, **hub_args), want)
    assert_same_weights(back, theirs)


def test_replaced_decoder_takes_keras_hubs_source_masks():
    """In a functional model, keras-hub's decoder arguments are renamed
    for our block, `encoder_attention_mask` included."""
    target, source = keras.Input((T, D)), keras.Input((S, 6))
    mask = keras.Input((T, S), dtype="bool")
    decoder = hub.layers.TransformerDecoder(F, 2, name="decoder")
    outputs = decoder(target, source, encoder_attention_mask=mask)
    model = keras.Model([target, source, mask], outputs)
    ours = convert.replace_transformer_layers(model)
    assert isinstance(ours.get_layer("decoder"), TransformerDecoderBlock)
    inputs = [data(16), data(17, S, 6), attention_mask(T, S, seed=18)]
    assert_close(ours(inputs), model(inputs))


def test_keras_hubs_tanh_gelu_becomes_ours_and_back():
    """GPT-2's blocks use keras-hub's registered `gelu_approximate`: the
    converted block holds ours (a config that loads without keras-hub),
    with the same outputs, and `to_keras` gives keras-hub's back."""
    hubs = keras.saving.get_registered_object("keras_hub>gelu_approximate")
    x, source = data(19), data(20, S)
    theirs = hub.layers.TransformerDecoder(F, 2, activation=hubs)
    want = theirs(x, source)
    ours = convert.from_keras(theirs)
    config = ours.get_config()["activation"]
    assert config["config"] == "keras_attention>gelu_approximate"
    assert_close(ours(x, source), want)
    back = convert.to_keras(ours)
    assert back.activation is hubs
    assert_close(back(x, source), want)


def test_round_trip_from_ours_keeps_outputs_and_weights():
    x = data(10)
    ours = TransformerDecoderBlock(2, F, normalize_first=True, name="block")
    want = ours(x)
    again = convert.from_keras(convert.to_keras(ours))
    assert again.name == "block" and again.normalize_first
    assert_close(again(x), want)
    assert_same_weights(again, ours)


def test_fully_masked_rows_differ_as_documented():
    x = data(11)
    theirs = keras.layers.MultiHeadAttention(2, 4, bias_initializer="ones")
    mask = np.ones((B, T, T), bool)
    mask[:, 0] = False  # query 0 sees nothing
    want = theirs(x, x, attention_mask=mask)
    _, their_scores = theirs(
        x, x, attention_mask=mask, return_attention_scores=True
    )
    ours = convert.from_keras(theirs)
    got, our_scores = ours(x, attention_mask=mask, return_attention_scores=True)
    assert_close(got[:, 1:], want[:, 1:])
    # Zero weights on the empty row here and on Keras's scores path...
    np.testing.assert_array_equal(to_numpy(our_scores)[:, :, 0], 0.0)
    np.testing.assert_array_equal(to_numpy(their_scores)[:, :, 0], 0.0)
    assert_close(got[:, 0], np.ones((B, D)))  # the output bias alone
    # ...uniform weights (the mean of the values) on Keras's fused path.
    values = keras.ops.mean(ours.value_dense(x), axis=1)  # (B, N, V)
    assert_close(want[:, 0], ours.output_dense(values[:, None])[:, 0])


def built_mha(**kwargs):
    layer = keras.layers.MultiHeadAttention(2, 4, **kwargs)
    layer.build((None, None, D), (None, None, D))
    return layer


@pytest.mark.parametrize(
    "layer, message",
    [
        (lambda: built_mha(output_shape=16), r"output_shape=\(16,\)"),
        (lambda: built_mha(use_gate=True), "use_gate=True"),
        (lambda: keras.layers.MultiHeadAttention(2, 4), "layer.built=False"),
        (lambda: keras.layers.Dense(3), "layer=Dense"),
    ],
)
def test_from_keras_refuses_what_it_cannot_convert(layer, message):
    with pytest.raises(ValueError, match=f"convert.from_keras.*{message}"):
        convert.from_keras(layer())


def test_from_keras_refuses_other_attention_axes():
    layer = keras.layers.MultiHeadAttention(2, 4, attention_axes=(1, 2))
    layer.build((None, 3, 3, D), (None, 3, 3, D))
    with pytest.raises(ValueError, match="Received: attention_axes="):
        convert.from_keras(layer)


def test_from_keras_needs_cross_attention_for_different_dims():
    layer = keras.layers.MultiHeadAttention(2, 4)
    layer.build((None, None, D), (None, None, 6))
    with pytest.raises(ValueError, match="Received: cross_attention=False"):
        convert.from_keras(layer)


def test_from_keras_warns_about_regularizers():
    layer = built_mha(kernel_regularizer="l2")
    with pytest.warns(UserWarning, match="kernel_regularizer"):
        ours = convert.from_keras(layer)
    assert isinstance(ours, MultiHeadSelfAttention)


@pytest.mark.parametrize(
    "layer, message",
    [
        (MultiHeadSelfAttention(2, use_rotary=True), "use_rotary=True"),
        (MultiHeadSelfAttention(2, use_qk_norm=True), "use_qk_norm=True"),
        (MultiHeadSelfAttention(2, sliding_window=3), "sliding_window=3"),
        (MultiHeadSelfAttention(2, alibi=True), "alibi=True"),
        (
            MultiHeadSelfAttention(2, score_mod=mods.soft_cap(0.5)),
            r"score_mod=soft_cap\(0.5\)",
        ),
        (
            MultiHeadSelfAttention(2, score_mod=RelativePositionBias()),
            "score_mod=<RelativePositionBias",
        ),
        (
            TransformerEncoderBlock(2, F, score_mod=mods.soft_cap(0.5)),
            "score_mod=soft_cap",
        ),
        (
            MultiHeadSelfAttention(
                2, key_dim=4, value_dim=2, num_key_value_heads=1
            ),  # fmt: skip
            "value_dim=2",
        ),
        (
            TransformerEncoderBlock(2, F, num_key_value_heads=1),
            "num_key_value_heads=1",
        ),
        (TransformerEncoderBlock(2, F, key_dim=2), "key_dim=2"),
        (TransformerEncoderBlock(2, F, use_bias=False), "use_bias=False"),
        (
            TransformerDecoderBlock(2, F, use_rms_norm=True),
            "use_rms_norm=True",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_to_keras_refuses_what_it_cannot_convert(layer, message):
    layer.build((None, None, D))
    with pytest.raises(ValueError, match=f"convert.to_keras.*{message}"):
        convert.to_keras(layer)


def test_quantized_or_lora_layers_are_refused_with_the_reason():
    lora = MultiHeadSelfAttention(2)
    lora.build((None, None, D))
    lora.enable_lora(2)
    with pytest.raises(ValueError, match="to_keras.*LoRA is enabled"):
        convert.to_keras(lora)
    quantized = built_mha()
    quantized._query_dense.quantize("int8")
    with pytest.raises(ValueError, match="from_keras.*quantized layers"):
        convert.from_keras(quantized)


# A whole backbone, built once per module (tiny: vocabulary 50, 2 layers).
CONFIG = dict(
    vocabulary_size=50,
    num_layers=2,
    num_heads=2,
    hidden_dim=8,
    intermediate_dim=16,
    max_sequence_length=8,
)


@pytest.fixture(scope="module")
def gpt2():
    backbone = hub.models.GPT2Backbone(**CONFIG)
    return backbone, convert.replace_transformer_layers(backbone)


def backbone_inputs(seed=12):
    ids = rng(seed).integers(1, 50, size=(B, 8)).astype("int32")
    mask = padding(8, (6, None)).astype("int32")
    return {"token_ids": ids, "padding_mask": mask}


def test_gpt2_backbone_with_our_blocks(gpt2):
    backbone, ours = gpt2
    names = [layer.name for layer in ours.layers]
    assert names == [layer.name for layer in backbone.layers]
    blocks = [ours.get_layer(f"transformer_layer_{i}") for i in range(2)]
    assert all(isinstance(b, TransformerDecoderBlock) for b in blocks)
    inputs = backbone_inputs()
    assert_close(ours(inputs), backbone(inputs))


def test_bert_backbone_with_our_blocks():
    backbone = hub.models.BertBackbone(**CONFIG)
    ours = convert.replace_transformer_layers(backbone)
    inputs = backbone_inputs(13)
    # Token types, not packed sequences: they must not reach our blocks.
    inputs["segment_ids"] = rng(14).integers(0, 2, (B, 8)).astype("int32")
    want, got = backbone(inputs), ours(inputs)
    assert_close(got["sequence_output"], want["sequence_output"])
    assert_close(got["pooled_output"], want["pooled_output"])


def test_bart_backbone_with_our_blocks():
    """BART calls its decoders with the sequences by name
    (`decoder_sequence=`, `encoder_sequence=`)."""
    backbone = hub.models.BartBackbone(**CONFIG)
    ours = convert.replace_transformer_layers(backbone)
    kinds = {type(layer) for layer in ours.layers}
    assert {TransformerEncoderBlock, TransformerDecoderBlock} <= kinds
    encoder, decoder = backbone_inputs(16), backbone_inputs(17)
    inputs = {f"encoder_{k}": v for k, v in encoder.items()}
    inputs.update({f"decoder_{k}": v for k, v in decoder.items()})
    inputs["encoder_padding_mask"] = padding(8, (None, 5)).astype("int32")
    want, got = backbone(inputs), ours(inputs)
    for name in ("encoder_sequence_output", "decoder_sequence_output"):
        assert_close(got[name], want[name])


def gpt2_step_fn(model):
    """A decoding step over our blocks' KV caches: `state` is
    `(caches (B, L, 2, S_max, N, H), index)`."""
    embedding = model.get_layer("token_embedding")
    positions = model.get_layer("position_embedding")
    blocks = [model.get_layer(f"transformer_layer_{i}") for i in range(2)]
    norm = model.get_layer("layer_norm")

    def step_fn(token_ids, state):
        caches, index = state
        x = embedding(token_ids[:, None])  # (B, 1, D)
        x = x + positions(x, start_index=index)
        new = []
        for i, block in enumerate(blocks):
            x, cache = block(x, cache=caches[:, i], cache_index=index)
            new.append(cache)
        logits = embedding(norm(x), reverse=True)[:, 0]  # (B, V)
        return logits, (keras.ops.stack(new, axis=1), index + 1)

    return step_fn


def test_gpt2_generates_with_our_compiled_cache_loop(gpt2):
    backbone, ours = gpt2
    prompt = rng(15).integers(1, 50, size=(B, 3)).astype("int32")
    step_fn = gpt2_step_fn(ours)
    state = (np.zeros((B, 2, 2, 8, 2, 4), "float32"), np.int32(0))
    for token in prompt[:, :-1].T:  # prefill all but the last token
        _, state = step_fn(keras.ops.convert_to_tensor(token), state)
    state = (state[0], keras.ops.convert_to_tensor(2, "int32"))
    generated = decoding.greedy_search(
        step_fn, state, prompt[:, -1], max_length=4, jit_compile=True
    )
    generated = keras.ops.convert_to_numpy(generated)
    # Teacher forcing on keras-hub's own backbone predicts the same tokens.
    tokens = np.concatenate([prompt, generated], axis=1)  # (B, 7)
    hidden = backbone(
        {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}
    )
    logits = backbone.token_embedding(hidden, reverse=True)
    expected = np.argmax(keras.ops.convert_to_numpy(logits), axis=-1)
    np.testing.assert_array_equal(generated, expected[:, 2:6])


def test_a_backbone_inside_a_model_is_replaced_too(gpt2):
    """A task model (a functional model around a backbone) gets our
    blocks in its backbone, and every weight, the embeddings included."""
    backbone, _ = gpt2
    inputs = {
        "token_ids": keras.Input((None,), dtype="int32", name="token_ids"),
        "padding_mask": keras.Input(
            (None,), dtype="int32", name="padding_mask"
        ),
    }
    head = keras.layers.Dense(3, name="head")
    theirs = keras.Model(inputs, head(backbone(inputs)))
    ours = convert.replace_transformer_layers(theirs)
    inner = ours.get_layer(backbone.name)
    assert isinstance(
        inner.get_layer("transformer_layer_0"), TransformerDecoderBlock
    )
    data = backbone_inputs(18)
    assert_close(ours(data), theirs(data))


def test_what_is_frozen_stays_frozen():
    """A frozen layer converts to a frozen one, and a frozen sublayer's
    weights stay out of training, both ways."""
    theirs = built_mha()
    theirs._query_dense.trainable = False
    ours = convert.from_keras(theirs)
    frozen = sorted(v.path for v in ours.non_trainable_weights)
    assert frozen == [
        f"{ours.name}/query_dense/{w}" for w in ("bias", "kernel")
    ]
    ours.trainable = False
    back = convert.to_keras(ours)
    assert not back.trainable and not back.trainable_weights


def test_subclasses_are_refused_by_name():
    class Tempered(keras.layers.MultiHeadAttention):
        def _compute_attention(self, query, *args, **kwargs):
            return super()._compute_attention(query * 3.0, *args, **kwargs)

    layer = Tempered(num_heads=2, key_dim=4)
    layer.build((None, None, D), (None, None, D))
    with pytest.raises(ValueError, match="Received: layer=Tempered"):
        convert.from_keras(layer)


@pytest.mark.parametrize("value", ["yes", None])
def test_cross_attention_must_be_a_bool(value):
    with pytest.raises(ValueError, match=f"cross_attention={value!r}"):
        convert.from_keras(built_mha(), cross_attention=value)


def test_a_block_takes_no_cross_attention_argument():
    block = hub.layers.TransformerEncoder(8, 2)
    block.build((None, None, D))
    with pytest.raises(ValueError, match="`cross_attention` is for"):
        convert.from_keras(block, cross_attention=True)
