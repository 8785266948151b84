"""MultiHeadSelfAttention and CrossAttention: references, parity, caches."""

import keras
import numpy as np
import pytest

from keras_attention import CrossAttention
from keras_attention import MultiHeadSelfAttention
from tests.helpers import BACKEND
from tests.helpers import np_rotary
from tests.helpers import np_sdpa
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, S, D = 2, 6, 5, 16


def data(seed=0, length=T, dim=D):
    return rng(seed).normal(size=(B, length, dim)).astype("float32")


def padding(length=T, lengths=(4, None)):
    lengths = [length if n is None else n for n in lengths]
    return np.arange(length)[None, :] < np.array(lengths)[:, None]


def named_weights(layer):
    """`{"sublayer/weight": value}`, also for a layer inside a block."""
    return {
        "/".join(w.path.split("/")[-2:]): to_numpy(w) for w in layer.weights
    }


def np_multi_head(
    layer,
    query,
    key_value,
    mask=None,
    causal=False,
    start=0,
    max_wavelength=10000.0,
):
    """NumPy multi-head attention from the layer's own weights."""
    w = named_weights(layer)
    q = np.einsum("btd,dnh->btnh", query, w["query_dense/kernel"])
    k = np.einsum("bsd,dkh->bskh", key_value, w["key_dense/kernel"])
    v = np.einsum("bsd,dkh->bskh", key_value, w["value_dense/kernel"])
    q = q + w["query_dense/bias"]
    k = k + w["key_dense/bias"]
    v = v + w["value_dense/bias"]
    if getattr(layer, "use_rotary", False):  # self-attention only
        q = np_rotary(q, start, max_wavelength)
        k = np_rotary(k, start, max_wavelength)
    heads, weights = np_sdpa(q, k, v, mask=mask, causal=causal)
    out = np.einsum("btnh,nhd->btd", heads, w["output_dense/kernel"])
    return out + w["output_dense/bias"], weights


SELF_CONFIGS = {
    "mha": {},
    "gqa": {"num_key_value_heads": 2},
    "mqa": {"num_key_value_heads": 1},
    "rotary": {"use_rotary": True},
    "key_dim": {"key_dim": 6, "value_dim": 3},
    "no_bias": {"use_bias": False},
}


@pytest.mark.parametrize("scores", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("config", SELF_CONFIGS)
def test_self_attention_matches_numpy(config, causal, scores):
    x = data()
    layer = MultiHeadSelfAttention(num_heads=4, **SELF_CONFIGS[config])
    pad = padding()
    attention_mask = rng(3).random((B, T, T)) > 0.2
    result = layer(
        x,
        padding_mask=pad,
        attention_mask=attention_mask,
        use_causal_mask=causal,
        return_attention_scores=scores,
    )
    mask = pad[:, None, :] & attention_mask
    if config == "no_bias":
        layer_weights = named_weights(layer)
        assert not any("bias" in name for name in layer_weights)
        return
    want_out, want_w = np_multi_head(layer, x, x, mask, causal)
    out = result[0] if scores else result
    np.testing.assert_allclose(to_numpy(out), want_out, atol=2e-5)
    if scores:
        assert tuple(result[1].shape) == (B, 4, T, T)
        np.testing.assert_allclose(to_numpy(result[1]), want_w, atol=1e-5)


@pytest.mark.parametrize("config", ["mha", "gqa"])
def test_cross_attention_matches_numpy(config):
    query, source = data(1), data(2, length=S, dim=12)
    layer = CrossAttention(num_heads=4, **SELF_CONFIGS[config])
    mask = padding(S, (3, None))
    out, weights = layer(
        query, source, value_mask=mask, return_attention_scores=True
    )
    assert tuple(out.shape) == (B, T, D)
    want_out, want_w = np_multi_head(layer, query, source, mask[:, None, :])
    np.testing.assert_allclose(to_numpy(out), want_out, atol=2e-5)
    np.testing.assert_allclose(to_numpy(weights), want_w, atol=1e-5)


def test_cross_attention_separate_key():
    query, value, key = data(1), data(2, length=S), data(3, length=S)
    layer = CrossAttention(num_heads=2)
    out = layer(query, value, key=key)
    cached = layer(query, None, cache=layer.compute_cache(value, key))
    np.testing.assert_allclose(to_numpy(out), to_numpy(cached), atol=1e-6)
    swapped = layer(query, key, key=value)
    assert not np.allclose(to_numpy(out), to_numpy(swapped))


def test_a_source_given_with_a_cache_is_not_attended_to():
    """With a cache, the cache is attended to: a source of its length
    passed along (here another one, of one row, as a beam search may keep
    the source of B rows while the cache has a row per beam) changes
    nothing."""
    query, value, other = data(1), data(2, length=S), data(3, length=S)
    layer = CrossAttention(num_heads=2)
    full = layer(query, value)
    cache = layer.compute_cache(value)
    cached = layer(query, None, cache=cache)
    along = layer(query, other[:1], cache=cache)
    np.testing.assert_array_equal(to_numpy(along), to_numpy(cached))
    np.testing.assert_allclose(to_numpy(cached), to_numpy(full), atol=1e-6)


# --- parity with Keras and PyTorch, weights copied ---------------------------


def copy_into_keras_mha(ours, theirs):
    theirs.set_weights([to_numpy(w) for w in ours.weights])


@pytest.mark.parametrize("causal", [False, True])
def test_parity_with_keras_multi_head_attention_self(causal):
    x = data()
    ours = MultiHeadSelfAttention(num_heads=4)
    theirs = keras.layers.MultiHeadAttention(num_heads=4, key_dim=D // 4)
    ours(x)
    theirs(x, x)
    copy_into_keras_mha(ours, theirs)
    attention_mask = rng(5).random((B, T, T)) > 0.3
    attention_mask[:, :, 0] = True  # keras gives masked rows uniform weights
    got, got_w = ours(
        x,
        attention_mask=attention_mask,
        use_causal_mask=causal,
        return_attention_scores=True,
    )
    want, want_w = theirs(
        x,
        x,
        attention_mask=attention_mask,
        use_causal_mask=causal,
        return_attention_scores=True,
    )
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-5)
    np.testing.assert_allclose(to_numpy(got_w), to_numpy(want_w), atol=1e-6)


def test_parity_with_keras_multi_head_attention_cross():
    query, source = data(1), data(2, length=S, dim=12)
    ours = CrossAttention(num_heads=4)
    theirs = keras.layers.MultiHeadAttention(num_heads=4, key_dim=D // 4)
    ours(query, source)
    theirs(query, source)
    copy_into_keras_mha(ours, theirs)
    mask = padding(S, (2, None))
    got = ours(query, source, value_mask=mask)
    want = theirs(
        query, source, attention_mask=np.broadcast_to(mask[:, None], (B, T, S))
    )
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-5)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.nn needs torch")
@pytest.mark.parametrize("need_weights", [False, True])
def test_parity_with_torch_multihead_attention(need_weights):
    import torch

    x = data()
    ours = MultiHeadSelfAttention(num_heads=4)
    ours(x)
    w = named_weights(ours)
    theirs = torch.nn.MultiheadAttention(D, 4, batch_first=True)
    with torch.no_grad():
        in_weight = [
            w[f"{n}_dense/kernel"].reshape(D, D).T for n in ("query", "key")
        ]
        in_weight.append(w["value_dense/kernel"].reshape(D, D).T)
        theirs.in_proj_weight.copy_(torch.tensor(np.concatenate(in_weight)))
        theirs.in_proj_bias.copy_(
            torch.tensor(
                np.concatenate(
                    [
                        w[f"{n}_dense/bias"].ravel()
                        for n in ("query", "key", "value")
                    ]
                )
            )
        )
        theirs.out_proj.weight.copy_(
            torch.tensor(w["output_dense/kernel"].reshape(D, D).T)
        )
        theirs.out_proj.bias.copy_(torch.tensor(w["output_dense/bias"]))
    theirs.eval()
    pad = padding()
    xt = torch.tensor(x)
    with torch.no_grad():
        want, want_w = theirs(
            xt,
            xt,
            xt,
            key_padding_mask=torch.tensor(~pad),  # torch: True = ignore
            need_weights=need_weights,
            average_attn_weights=False,
        )
    got, got_w = ours(x, padding_mask=pad, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(got), want.numpy(), atol=1e-5)
    if need_weights:
        np.testing.assert_allclose(to_numpy(got_w), want_w.numpy(), atol=1e-6)


# --- properties ------------------------------------------------------------


def test_self_attention_is_permutation_equivariant_without_positions():
    x = data()
    layer = MultiHeadSelfAttention(num_heads=4)
    order = rng(11).permutation(T)
    out = to_numpy(layer(x))
    permuted = to_numpy(layer(x[:, order]))
    np.testing.assert_allclose(permuted, out[:, order], atol=1e-5)


@pytest.mark.parametrize("config", ["mha", "gqa", "rotary"])
def test_no_information_flows_from_the_future(config):
    x = data()
    layer = MultiHeadSelfAttention(num_heads=4, **SELF_CONFIGS[config])
    out = to_numpy(layer(x, use_causal_mask=True))
    changed = x.copy()
    changed[:, 3:] = rng(12).normal(size=changed[:, 3:].shape) * 10
    out_changed = to_numpy(layer(changed, use_causal_mask=True))
    np.testing.assert_allclose(out_changed[:, :3], out[:, :3], atol=1e-5)
    assert not np.allclose(out_changed[:, 3:], out[:, 3:])


def test_padded_tokens_do_not_change_real_outputs():
    x = data()
    pad = padding()
    layer = MultiHeadSelfAttention(num_heads=4)
    garbage = x.copy()
    garbage[0, 4:] = 1e3
    out = to_numpy(layer(x, padding_mask=pad))
    out_garbage = to_numpy(layer(garbage, padding_mask=pad))
    np.testing.assert_allclose(out_garbage[0, :4], out[0, :4], atol=1e-4)
    np.testing.assert_allclose(out_garbage[1], out[1], atol=1e-6)


def test_causal_flag_equals_explicit_mask():
    x = data()
    layer = MultiHeadSelfAttention(num_heads=4)
    tril = np.broadcast_to(np.tril(np.ones((T, T), bool)), (B, T, T))
    np.testing.assert_allclose(
        to_numpy(layer(x, use_causal_mask=True)),
        to_numpy(layer(x, attention_mask=tril)),
        atol=1e-6,
    )


@pytest.mark.parametrize("causal", [False, True])
def test_fused_path_equals_reference_path(causal):
    """Without scores the backend's fused kernel may run; with scores the
    reference path does. Users must get the same numbers."""
    x = data()
    layer = MultiHeadSelfAttention(num_heads=4, num_key_value_heads=2)
    pad = padding(lengths=(0, 3))  # an all-padding sequence too
    fused = layer(x, padding_mask=pad, use_causal_mask=causal)
    reference, _ = layer(
        x,
        padding_mask=pad,
        use_causal_mask=causal,
        return_attention_scores=True,
    )
    np.testing.assert_allclose(to_numpy(fused), to_numpy(reference), atol=1e-5)


def test_dropout_only_in_training_and_scores_before_dropout():
    x = data()
    layer = MultiHeadSelfAttention(num_heads=4, dropout=0.5)
    eval_out, eval_w = layer(x, return_attention_scores=True)
    again = layer(x, training=False)
    np.testing.assert_allclose(to_numpy(eval_out), to_numpy(again), atol=1e-6)
    train_out, train_w = layer(x, return_attention_scores=True, training=True)
    np.testing.assert_allclose(to_numpy(train_w), to_numpy(eval_w), atol=1e-6)
    assert not np.allclose(to_numpy(train_out), to_numpy(eval_out))


# --- KV cache --------------------------------------------------------------


@pytest.mark.parametrize("steps", [(1,) * T, (2, 3, 1), (T,)])
@pytest.mark.parametrize("config", ["mha", "gqa", "mqa", "rotary"])
def test_cached_decoding_equals_full_causal_forward(config, steps):
    x = data()
    layer = MultiHeadSelfAttention(num_heads=4, **SELF_CONFIGS[config])
    full = to_numpy(layer(x, use_causal_mask=True))
    kv_heads = layer.kv_heads
    cache = np.zeros((B, 2, T + 2, kv_heads, D // 4), "float32")
    outputs, index = [], 0
    for size in steps:
        out, cache = layer(
            x[:, index : index + size],
            cache=cache,
            cache_index=index,
            use_causal_mask=True,
        )
        outputs.append(to_numpy(out))
        index += size
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, atol=1e-5)
    # The cache holds the keys and values of every position seen.
    assert np.all(to_numpy(cache)[:, :, T:] == 0.0)
    assert np.all(np.abs(to_numpy(cache)[:, :, :T]).sum(-1) > 0)


def test_cached_decoding_with_padding_and_scores():
    x = data()
    pad = padding(T + 2, (4, None))
    layer = MultiHeadSelfAttention(num_heads=4)
    full, full_w = layer(
        x,
        padding_mask=pad[:, :T],
        use_causal_mask=True,
        return_attention_scores=True,
    )
    cache = np.zeros((B, 2, T + 2, 4, 4), "float32")
    out, weights, cache = layer(
        x[:, :3],
        padding_mask=pad,
        cache=cache,
        cache_index=0,
        use_causal_mask=True,
        return_attention_scores=True,
    )
    np.testing.assert_allclose(to_numpy(out), to_numpy(full)[:, :3], atol=1e-5)
    np.testing.assert_allclose(
        to_numpy(weights)[..., :T], to_numpy(full_w)[:, :, :3], atol=1e-6
    )


# --- bad input -------------------------------------------------------------

CONSTRUCTOR_ERRORS = [
    (dict(num_heads=0), "num_heads=0"),
    (dict(num_heads=4, num_key_value_heads=3), "num_key_value_heads=3"),
    (dict(num_heads=4, key_dim=-1), "key_dim=-1"),
    (dict(num_heads=4, dropout=1.0), "dropout=1.0"),
]


@pytest.mark.parametrize("cls", [MultiHeadSelfAttention, CrossAttention])
@pytest.mark.parametrize("kwargs,received", CONSTRUCTOR_ERRORS)
def test_bad_constructor_arguments(cls, kwargs, received):
    with pytest.raises(
        ValueError, match=f"{cls.__name__}.*Received:.*{received}"
    ):
        cls(**kwargs)


def test_heads_must_divide_model_dim_without_key_dim():
    with pytest.raises(
        ValueError, match=r"divisible.*shape=\(2, 6, 16\).*num_heads=3"
    ):
        MultiHeadSelfAttention(num_heads=3)(data())
    out = MultiHeadSelfAttention(num_heads=3, key_dim=5)(data())
    assert tuple(out.shape) == (B, T, D)


def test_rotary_needs_even_head_dim():
    with pytest.raises(ValueError, match="key_dim=3"):
        MultiHeadSelfAttention(num_heads=4, key_dim=3, use_rotary=True)(data())


CALL_ERRORS = [
    (
        dict(padding_mask=np.ones((B, T + 1), bool)),
        r"padding_mask.shape=\(2, 7\)",
    ),
    (
        dict(attention_mask=np.ones((B, T, T - 1), bool)),
        r"attention_mask.shape",
    ),
    (
        dict(cache=np.zeros((B, 2, 8, 2, 4), "float32"), cache_index=0),
        r"cache.shape=\(2, 2, 8, 2, 4\)",
    ),
    (
        dict(cache=np.zeros((B, 2, 8, 4, 4), "float32")),
        "cache_index=None",
    ),
    (
        dict(cache=np.zeros((B, 2, 8, 4, 4), "float32"), cache_index=5),
        "cache_index=5",
    ),
]


@pytest.mark.parametrize("kwargs,received", CALL_ERRORS)
def test_bad_call_arguments(kwargs, received):
    layer = MultiHeadSelfAttention(num_heads=4)
    with pytest.raises(ValueError, match=f"MultiHeadSelfAttention.*{received}"):
        layer(data(), **kwargs)


def test_cross_attention_bad_inputs():
    layer = CrossAttention(num_heads=2)
    with pytest.raises(ValueError, match=r"value_mask.shape=\(2, 4\)"):
        layer(data(), data(1, S), value_mask=np.ones((B, 4), bool))
    with pytest.raises(ValueError, match=r"key.shape=\(2, 4, 16\)"):
        layer(data(), data(1, S), key=data(2, 4))
    with pytest.raises(ValueError, match=r"value.shape=\(2, 16\)"):
        CrossAttention(num_heads=2)(data(), np.zeros((2, 16), "float32"))


# --- the layer contract ----------------------------------------------------

CONTRACT_LAYERS = {
    "self_gqa_rotary": lambda: MultiHeadSelfAttention(
        4, num_key_value_heads=2, use_rotary=True, dropout=0.1
    ),
    "cross": lambda: CrossAttention(4, key_dim=6, value_dim=5),
}


def call_layer(layer, x, source, **kwargs):
    if isinstance(layer, CrossAttention):
        return layer(x, source, **kwargs)
    return layer(x, use_causal_mask=True, **kwargs)


@pytest.mark.parametrize("kind", CONTRACT_LAYERS)
def test_symbolic_model_trains_saves_and_loads(kind, tmp_path):
    x_in, source_in = keras.Input((T, D)), keras.Input((S, D))
    layer = CONTRACT_LAYERS[kind]()
    out, scores = call_layer(
        layer, x_in, source_in, return_attention_scores=True
    )
    key_length = S if kind == "cross" else T
    assert tuple(out.shape) == (None, T, D)
    assert tuple(scores.shape) == (None, 4, T, key_length)
    model = keras.Model([x_in, source_in], keras.layers.Dense(1)(out))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    x, source = data(), data(1, S)
    target = np.ones((B, T, 1), "float32")
    history = model.fit([x, source], target, epochs=10, batch_size=B, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    path = tmp_path / f"{kind}.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_array_equal(
        to_numpy(restored([x, source])), to_numpy(model([x, source]))
    )


def test_implicit_mask_equals_explicit_padding_mask():
    ids = np.array([[3, 4, 5, 0, 0, 0], [1, 2, 3, 4, 5, 6]])
    tokens = keras.Input((T,), dtype="int32")
    embed = keras.layers.Embedding(9, D, mask_zero=True, name="embed")
    layer = MultiHeadSelfAttention(4, name="attention")
    model = keras.Model(tokens, layer(embed(tokens)))
    implicit = to_numpy(model(ids))
    explicit = to_numpy(layer(embed(ids), padding_mask=ids != 0))
    np.testing.assert_allclose(implicit, explicit, atol=1e-6)
    unmasked = to_numpy(layer(embed(ids), padding_mask=np.ones_like(ids, bool)))
    assert not np.allclose(implicit[0, :3], unmasked[0, :3])


# --- CrossAttention: Keras shapes, arguments, configs ----------------------


def test_cross_attention_compute_output_shape():
    layer = CrossAttention(num_heads=2)
    assert layer.compute_output_shape((None, T, D), (None, S, 12)) == (
        None,
        T,
        D,
    )
    shapes = ((B, T, D), (B, S, 12), (B, S, 10))
    assert layer.compute_output_shape(*shapes) == (B, T, D)
    out = layer(data(), data(1, S, 12), key=data(2, S, 10))
    assert tuple(out.shape) == (B, T, D)
    with pytest.raises(
        ValueError, match=r"CrossAttention.*key.shape=\(2, 4, 10\)"
    ):
        layer.compute_output_shape((B, T, D), (B, S, 12), (B, 4, 10))
    with pytest.raises(ValueError, match=r"value.shape=\(2, 12\)"):
        layer.compute_output_shape((B, T, D), (B, 12))


@pytest.mark.parametrize(
    "name,value",
    [("use_rotary", True), ("use_rotary", False), ("max_wavelength", 500.0)],
)
def test_cross_attention_has_no_rotary_arguments(name, value):
    # Rotary positions from 0 for decoder queries and encoder keys would be
    # wrong: the layer does not take them, and Keras refuses an unknown
    # argument.
    with pytest.raises(
        ValueError,
        match=rf"Unrecognized keyword arguments.*CrossAttention.*{name}",
    ):
        CrossAttention(num_heads=2, name="cross", **{name: value})
    with pytest.raises((ValueError, TypeError), match="Unrecognized keyword"):
        CrossAttention.from_config(
            {**CrossAttention(num_heads=2).get_config(), name: value}
        )


def test_cross_attention_config_holds_only_its_arguments():
    config = CrossAttention(num_heads=2).get_config()
    assert "use_rotary" not in config
    assert "max_wavelength" not in config
    self_config = MultiHeadSelfAttention(
        2, use_rotary=True, max_wavelength=500.0
    ).get_config()
    assert self_config["use_rotary"] is True
    assert self_config["max_wavelength"] == 500.0


# --- explain: a length, or the tensors a call would take ------------------


def report_of(explanation):
    return explanation.path, explanation.refused, explanation.structure


def test_explain_takes_the_inputs_or_their_shape():
    """A tensor or a shape `(B, T, D)` given as `length` explains the call
    on that tensor: the same report as its length and batch given as
    ints (segment ids of its batch are accepted, so B is read too)."""
    x, source = data(), data(1, S, 12)
    segments = np.array([[1, 1, 1, 2, 2, 2], [1, 1, 2, 2, 2, 0]])
    layer = MultiHeadSelfAttention(4)
    layer(x)
    want = layer.explain(T, use_causal_mask=True, segment_ids=segments,
                         batch_size=B)  # fmt: skip
    for given in (x, keras.ops.convert_to_tensor(x), (B, T, D)):
        got = layer.explain(given, use_causal_mask=True, segment_ids=segments)
        assert report_of(got) == report_of(want)
    symbolic = keras.KerasTensor((None, T, D))  # an unknown batch: 1
    assert report_of(layer.explain(symbolic)) == report_of(layer.explain(T))
    cross = CrossAttention(4)
    cross(x, source)
    assert report_of(cross.explain(x, source)) == report_of(
        cross.explain(T, S, batch_size=B)
    )


@pytest.mark.parametrize(
    "given,received",
    [
        (np.zeros((B, T), "int32"), "a tensor of shape (2, 6)"),
        (keras.KerasTensor((B, None, D)), "a tensor of shape (2, None, 16)"),
        ("6", "'6'"),
        (6.0, "6.0"),
        (0, "0"),
        (None, "None"),
    ],
)
def test_explain_names_what_it_expects(given, received):
    layer = MultiHeadSelfAttention(4)
    layer(data())
    with pytest.raises(ValueError) as info:
        layer.explain(given)
    message = str(info.value)
    assert message.startswith("MultiHeadSelfAttention (layer '")
    assert "`length` must be a positive int (T), or a tensor" in message
    assert message.endswith(f"Received: length={received}")
