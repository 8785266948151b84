"""Mask and score mods in the attention layers and blocks: the same
numbers as the structure arguments they can replace (outputs and the
gradients of the inputs and every weight), at sequence positions in
cached steps of both kinds of cache, and a block mask reused across
layers and steps. The mods themselves are checked in `tests/unit/mods`,
their paths in `tests/unit/kernels/test_mod_paths.py`."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention import mods
from keras_attention.layers import RollingCache
from tests.autodiff import assert_close
from tests.autodiff import path_context
from tests.autodiff import value_and_grads
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, D, N = 2, 7, 8, 2
H = D // N


def pair(mod_arguments, plain_arguments):
    """Two layers with the same weights: one given mods, one the
    equivalent arguments."""
    keras.utils.set_random_seed(0)
    with_mods = ka.MultiHeadSelfAttention(N, **mod_arguments)
    plain = ka.MultiHeadSelfAttention(N, **plain_arguments)
    for layer in (with_mods, plain):
        layer.build((B, T, D))
    plain.set_weights(with_mods.get_weights())
    return with_mods, plain


CASES = {  # mod arguments and call, argument form and call
    "causal": ({}, {"mask_mod": mods.causal()}, {}, {"use_causal_mask": True}),
    # The layer's mod first, then the call's: the cap, then the bias.
    "soft cap and alibi": (
        {"score_mod": mods.soft_cap(2.0)},
        {"score_mod": mods.alibi(N)},
        {"alibi": True, "logit_soft_cap": 2.0},
        {},
    ),
    "window": (
        {},
        {"mask_mod": mods.and_masks(mods.causal(), mods.sliding_window(3))},
        {"sliding_window": 3},
        {"use_causal_mask": True},
    ),
}


@pytest.mark.parametrize("path", ["reference", "chunked"])
@pytest.mark.parametrize("name", list(CASES))
def test_mods_give_what_the_arguments_give(name, path):
    """Outputs and the gradients of the input and of every weight."""
    mod_init, mod_call, plain_init, plain_call = CASES[name]
    with_mods, plain = pair(mod_init, plain_init)
    x = rng(0).standard_normal((B, T, D)).astype("float32")

    def both(x1, x2):
        with path_context(path):
            return with_mods(x1, **mod_call), plain(x2, **plain_call)

    weights = [*with_mods.trainable_weights, *plain.trainable_weights]
    outputs, grads, weight_grads = value_and_grads(
        both, [x, x], weights, copies=2
    )
    half = len(weight_grads) // 2
    assert_close(
        f"layer mods {name}",
        "float32",
        outputs[:1],
        grads[:1] + weight_grads[:half],
        outputs[1:],
        grads[1:] + weight_grads[half:],
        ["x"] + [w.path for w in with_mods.trainable_weights],
    )


def per_position(batch, head, q_idx, kv_idx):
    """Depends on the positions, so a step must see the right ones."""
    return (kv_idx <= q_idx) & ((q_idx - kv_idx) % 3 != 2)


def distance_bias(score, batch, head, q_idx, kv_idx):
    return score - 0.1 * ops.cast(q_idx - kv_idx, score.dtype)


@pytest.mark.parametrize("window", [None, 4])
def test_cached_steps_see_sequence_positions(window):
    """Token by token with a plain cache (or a rolling one, with a window):
    the mods see each query's position in the sequence, and the steps give
    the full call's outputs."""
    arguments = {} if window is None else {"sliding_window": window}
    keras.utils.set_random_seed(0)
    layer = ka.MultiHeadSelfAttention(N, **arguments)
    layer.build((B, T, D))
    x = rng(1).standard_normal((B, T, D)).astype("float32")
    # Document ids of the whole sequence: each step reads them at its
    # positions (its own length is 1, the cache's `T` or `window`).
    documents = mods.document(np.array([[1, 1, 1, 2, 2, 2, 2], [3] * T]))
    call = {
        "mask_mod": mods.and_masks(per_position, documents),
        "score_mod": distance_bias,
    }
    full = to_numpy(layer(x, use_causal_mask=True, **call))
    if window is None:
        cache = np.zeros((B, 2, T, N, H), "float32")
    else:
        cache = RollingCache(np.zeros((B, 2, window, N, H), "float32"))
    steps = []
    for t in range(T):
        out, cache = layer(
            x[:, t : t + 1],
            cache=cache,
            cache_index=t,
            use_causal_mask=True,
            **call,
        )
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_a_block_mask_serves_layers_and_steps():
    """One `block_mask` in two layers of a model and in cached steps gives
    the numbers of the mod it was made from, on the blockwise path with
    the map's blocks."""
    mod = mods.or_masks(mods.sink_tokens(2), mods.sliding_window(3))
    mask = mods.block_mask(mod, B, N, T, T, block_size=3)
    keras.utils.set_random_seed(0)
    first = ka.TransformerDecoderBlock(N, 16, normalize_first=True)
    second = ka.TransformerDecoderBlock(N, 16, normalize_first=True)
    x = rng(2).standard_normal((B, T, D)).astype("float32")

    def stack(mask_mod):
        y = first(x, use_causal_mask=False, mask_mod=mask_mod)
        return to_numpy(second(y, use_causal_mask=False, mask_mod=mask_mod))

    with path_context("chunked"):
        want, got = stack(mod), stack(mask)
    np.testing.assert_allclose(got, want, atol=1e-5)
    cache = first.init_cache(B, T)
    steps = []
    for t in range(T):
        out, cache = first(
            x[:, t : t + 1],
            cache=cache,
            cache_index=t,
            use_causal_mask=False,
            mask_mod=mods.and_masks(mask, mods.causal()),
        )
        steps.append(to_numpy(out))
    causal_full = to_numpy(first(x, use_causal_mask=True, mask_mod=mask))
    np.testing.assert_allclose(np.concatenate(steps, 1), causal_full, atol=1e-5)


def test_a_block_mask_of_a_cached_step_is_not_read_at_other_positions():
    """A step of 3 tokens at `cache_index=3` over a cache of 7 slots, on
    the blockwise path in blocks of 3, given a `block_mask` of exactly
    those sizes: its map was made at positions 0-2, the step's queries
    stand at 3-5, so the mod decides (not the map), and the step gives the
    plain mod's outputs."""
    keras.utils.set_random_seed(0)
    layer = ka.MultiHeadSelfAttention(N)
    layer.build((B, T, D))
    x = rng(5).standard_normal((B, T, D)).astype("float32")
    mask = mods.block_mask(per_position, B, N, 3, T, block_size=3)
    cache = np.zeros((B, 2, T, N, H), "float32")
    _, cache = layer(
        x[:, :3], cache=cache, cache_index=0, mask_mod=per_position
    )
    with path_context("chunked"):
        got, want = (
            layer(x[:, 3:6], cache=cache, cache_index=3, mask_mod=mod)[0]
            for mod in (mask, per_position)
        )
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-5)


def test_prefix_lm_in_a_decoder_block():
    """A prefix-LM decoder: `prefix_lm` alone (without the causal flag)
    equals the explicit `(B, T, T)` attention mask."""
    keras.utils.set_random_seed(0)
    block = ka.TransformerDecoderBlock(N, 16)
    x = rng(3).standard_normal((B, T, D)).astype("float32")
    prefix = np.array([3, 5])
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    dense = (j < prefix[:, None, None]) | (j <= i)  # (B, T, T)
    got = block(x, use_causal_mask=False, mask_mod=mods.prefix_lm(prefix))
    want = block(x, use_causal_mask=False, attention_mask=dense)
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-6)


def test_a_bias_shared_by_layers_stays_shared_when_saved(tmp_path):
    """T5's layers share one bias table. One `RelativePositionBias` given
    to an attention layer and two blocks is one table: `fit` trains it
    once, and a `.keras` file loads it as one table again, with the same
    outputs, also after a further step of both models."""
    bias = ka.RelativePositionBias(num_buckets=8, max_distance=16)
    inputs = keras.Input((T, D))
    x = inputs + ka.MultiHeadSelfAttention(N, score_mod=bias)(inputs)
    for _ in range(2):
        x = ka.TransformerEncoderBlock(N, 16, score_mod=bias)(x)
    model = keras.Model(inputs, x)
    data = rng(1).normal(size=(B, T, D)).astype("float32")
    target = rng(2).normal(size=(B, T, D)).astype("float32")
    model.compile(optimizer="sgd", loss="mse")
    model.fit(data, target, epochs=1, verbose=0)
    assert np.abs(to_numpy(bias.table)).max() > 0  # it starts at zeros

    model.save(tmp_path / "shared.keras")
    loaded = keras.saving.load_model(tmp_path / "shared.keras")
    mods_held = {
        id(layer.score_mod)
        for layer in loaded.layers
        if getattr(layer, "score_mod", None) is not None
    }
    tables = [w for w in loaded.weights if w.path.endswith("/table")]
    assert len(mods_held) == 1 and len(tables) == 1
    np.testing.assert_array_equal(to_numpy(tables[0]), to_numpy(bias.table))
    np.testing.assert_allclose(
        to_numpy(loaded(data)), to_numpy(model(data)), atol=1e-6
    )
    loaded.compile(optimizer="sgd", loss="mse")
    for trained in (model, loaded):
        trained.train_on_batch(data, target)
    np.testing.assert_allclose(
        to_numpy(loaded(data)), to_numpy(model(data)), atol=1e-5
    )


def test_cross_attention_steps_see_query_positions():
    """Cached cross-attention, one query at a time with `start_index`:
    a mod of the query's position gives the full call's outputs."""
    x = rng(3).normal(size=(B, T, D)).astype("float32")
    source = rng(4).normal(size=(B, 5, D)).astype("float32")
    layer = ka.CrossAttention(N)

    def mod(batch, head, q_idx, kv_idx):
        return kv_idx <= q_idx // 2  # query 0 sees one key, query 6 four

    full = to_numpy(layer(x, source, mask_mod=mod))
    cache = layer.compute_cache(source)
    steps = [
        to_numpy(
            layer(
                x[:, t : t + 1], None, cache=cache, mask_mod=mod, start_index=t
            )  # fmt: skip
        )
        for t in range(T)
    ]
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)
    with pytest.raises(ValueError, match="start_index=-1"):
        layer(x, source, start_index=-1)


def test_a_unidirectional_bias_round_trips_in_a_layer(tmp_path):
    """A decoder's bias (`bidirectional=False`: keys after the query share
    bucket 0) in an attention layer: its config and a `.keras` file give
    it back with the same buckets, so the same outputs as the layer
    saved."""
    bias = ka.RelativePositionBias(
        num_buckets=8, max_distance=16, bidirectional=False
    )
    inputs = keras.Input((T, D))
    model = keras.Model(
        inputs, ka.MultiHeadSelfAttention(N, score_mod=bias)(inputs)
    )
    bias.table.assign(rng(6).normal(size=(8, N)).astype("float32"))
    data = rng(7).normal(size=(B, T, D)).astype("float32")
    want = to_numpy(model(data))
    layer = model.layers[-1]
    again = ka.MultiHeadSelfAttention.from_config(layer.get_config())
    again.build((B, T, D))
    again.set_weights(layer.get_weights())
    model.save(tmp_path / "bias.keras")
    loaded = keras.saving.load_model(tmp_path / "bias.keras")
    for got in (again(data), loaded(data)):
        np.testing.assert_allclose(to_numpy(got), want, atol=1e-6)


def test_explain_without_a_batch_size_takes_per_row_mods():
    """`explain()` with no batch size given explains a call of any batch:
    a document mod of two rows is not refused for the batch of one it
    evaluates, and one given the batch size is checked against it."""
    layer = ka.MultiHeadSelfAttention(N)
    layer.build((B, T, D))
    documents = mods.document(np.array([[1, 1, 1, 2, 2, 2, 2], [3] * T]))
    report = layer.explain(T, mask_mod=documents)
    assert "document(segment_ids)" in str(report)
    with pytest.raises(ValueError, match=r"\(B, T\) = \(3, 7\)"):
        layer.explain(T, mask_mod=documents, batch_size=3)


class _HalvedBias(ka.RelativePositionBias):
    """A bias layer with a call of its own: the blockwise path must call
    it, not lay its table's biases along the blocks' diagonals."""

    def call(self, score, batch, head, q_idx, kv_idx):
        return 0.5 * super().call(score, batch, head, q_idx, kv_idx)


@pytest.mark.parametrize("bias_class", [ka.RelativePositionBias, _HalvedBias])
def test_a_bias_layer_on_the_blockwise_path_and_in_cached_steps(bias_class):
    """A `RelativePositionBias` layer in an attention layer: on the
    blockwise path in blocks of 3 (where its biases are laid along each
    block's diagonals, over padded blocks) the outputs and the gradients
    of the input and of every weight, the table's among them, are the
    reference path's; cached steps on that path (4 tokens, then one at a
    time) see sequence positions and give the full call's outputs."""
    keras.utils.set_random_seed(0)
    bias = bias_class(num_buckets=8, max_distance=6)
    layer = ka.MultiHeadSelfAttention(N, score_mod=bias)
    layer.build((B, T, D))
    bias.table.assign(rng(8).normal(size=(8, N)).astype("float32"))
    x = rng(9).standard_normal((B, T, D)).astype("float32")
    weights = layer.trainable_weights
    assert any(w is bias.table for w in weights)

    def run(path):
        def fn(x):
            with path_context(path):
                return layer(x, use_causal_mask=True)

        return value_and_grads(fn, [x], weights)

    (want, want_grads, want_weights), (got, grads, weight_grads) = (
        run("reference"),
        run("chunked"),
    )
    assert_close(
        f"bias layer {bias_class.__name__}",
        "float32",
        got,
        grads + weight_grads,
        want,
        want_grads + want_weights,
        ["x"] + [w.path for w in weights],
    )
    cache = np.zeros((B, 2, T, N, H), "float32")
    steps = []
    with path_context("chunked"):
        for start, end in [(0, 4), (4, 5), (5, 6), (6, 7)]:
            out, cache = layer(
                x[:, start:end],
                cache=cache,
                cache_index=start,
                use_causal_mask=True,
            )
            steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), want[0], atol=1e-5)


@pytest.mark.parametrize("slots", [6, 7])
def test_a_prefill_given_the_whole_sequences_ids_at_index_zero(slots):
    """A prefill of 3 tokens at `cache_index=0`, `mods.document` holding
    the ids of all 7 positions: the blockwise path (blocks of 3) gives the
    reference path's outputs and input gradients, with a cache whose
    length is a whole number of blocks (6) or not (7)."""
    keras.utils.set_random_seed(0)
    layer = ka.MultiHeadSelfAttention(N)
    layer.build((B, T, D))
    x = rng(6).standard_normal((B, 3, D)).astype("float32")
    ids = np.array([[1, 1, 2, 2, 2, 3, 3], [1, 1, 1, 1, 2, 2, 2]], "int32")
    mod = mods.document(ids[:, :slots])
    cache = np.zeros((B, 2, slots, N, H), "float32")

    def prefill(x):
        return layer(
            x, cache=cache, cache_index=0, use_causal_mask=True, mask_mod=mod
        )[0]

    results = {}
    for path in ("reference", "chunked"):
        with path_context(path):
            results[path] = value_and_grads(prefill, [x])
    (want, [want_dx], _), (got, [got_dx], _) = results.values()
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
    np.testing.assert_allclose(got_dx, want_dx, atol=1e-5)
