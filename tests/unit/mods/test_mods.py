"""`keras_attention.mods`: each mod against a NumPy reference written
position by position, T5's buckets, block maps, serialization and bad
input. Their use on every path of attention is checked in
`tests/unit/kernels/test_mod_paths.py`."""

import re

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import mods
from keras_attention._kernels.blockwise import plan
from tests.helpers import gradient
from tests.helpers import np_mask_mod
from tests.helpers import np_t5_bucket
from tests.helpers import to_numpy

B, N, T, S = 2, 3, 9, 11
IDS = np.array(
    [[1, 1, 1, 2, 2, 2, 2, 3, 3, 0, 0], [4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5]]
)
PREFIX = np.array([3, 0])


def grid(batch=B, heads=N, t=T, s=S):
    """The index tensors a path calls a mod with, as NumPy int32."""
    return (
        np.arange(batch, dtype="int32").reshape(-1, 1, 1, 1),
        np.arange(heads, dtype="int32").reshape(1, -1, 1, 1),
        np.arange(t, dtype="int32").reshape(1, 1, -1, 1),
        np.arange(s, dtype="int32").reshape(1, 1, 1, -1),
    )


def evaluate(mod, batch=B, heads=N, t=T, s=S):
    indices = [ops.convert_to_tensor(x) for x in grid(batch, heads, t, s)]
    visible = ops.convert_to_numpy(mod(*indices))
    return np.broadcast_to(visible, (batch, heads, t, s))


MASK_MODS = {  # name: (mod, NumPy spec)
    "causal": (mods.causal(), ("causal", None)),
    "window 3": (mods.sliding_window(3), ("sliding_window", 3)),
    "window (2, 1)": (mods.sliding_window((2, 1)), ("sliding_window", (2, 1))),
    "document": (
        mods.document(IDS[:, :T]),
        ("document", (IDS[:, :T], IDS[:, :T])),
        T,
    ),
    "document pair": (
        mods.document((IDS[:, :T], IDS)),
        ("document", (IDS[:, :T], IDS)),
    ),
    "prefix_lm": (mods.prefix_lm(PREFIX), ("prefix_lm", PREFIX)),
    "chunked": (mods.chunked(4), ("chunked", 4)),
    "sinks or window": (
        mods.or_masks(mods.sink_tokens(2), mods.sliding_window(2)),
        ("or", [("sink_tokens", 2), ("sliding_window", 2)]),
    ),
    "causal chunks": (
        mods.and_masks(mods.causal(), mods.chunked(3)),
        ("and", [("causal", None), ("chunked", 3)]),
    ),
}


def sizes(name):
    """`(T, S)` of a case: one set of ids is for as many keys as queries."""
    return (T, T) if name == "document" else (T, S)


@pytest.mark.parametrize("name", list(MASK_MODS))
def test_mask_mods_equal_numpy_reference(name):
    mod, spec = MASK_MODS[name][:2]
    t, s = sizes(name)
    np.testing.assert_array_equal(
        evaluate(mod, t=t, s=s), np_mask_mod(spec, B, N, t, s)
    )


@pytest.mark.parametrize("name", ["document", "prefix_lm"])
def test_a_block_of_batch_rows_is_those_rows(name):
    """A path may call a mod on some rows of the batch, by their absolute
    indices (a device under `ContextParallel` holds a block of them): it
    gives those rows of the whole batch's mask. A row the mod has no data
    for is refused."""
    mod = MASK_MODS[name][0]
    t, s = sizes(name)
    whole = evaluate(mod, t=t, s=s)
    _, head, q_idx, kv_idx = grid(t=t, s=s)
    row = np.array([1], "int32").reshape(-1, 1, 1, 1)
    got = ops.convert_to_numpy(mod(row, head, q_idx, kv_idx))
    np.testing.assert_array_equal(np.broadcast_to(got, (1, N, t, s)), whole[1:])
    with pytest.raises(ValueError, match="called on batch row 2"):
        mod(row + 1, head, q_idx, kv_idx)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets, distance", [(32, 128), (8, 20), (6, 7)])
def test_relative_position_bucket_equals_t5(buckets, distance, bidirectional):
    relative = np.arange(-300, 301)
    got = ops.convert_to_numpy(
        mods.relative_position_bucket(
            relative, buckets, distance, bidirectional
        )
    )
    want = [
        np_t5_bucket(int(r), buckets, distance, bidirectional) for r in relative
    ]
    np.testing.assert_array_equal(got, want)


def test_score_mods_equal_numpy_reference():
    generator = np.random.default_rng(0)
    score = generator.standard_normal((B, N, T, S)).astype("float32")
    table = generator.standard_normal((8, N)).astype("float32")
    b, h, q, k = grid()
    capped = mods.soft_cap(1.5)(score, b, h, q, k)
    np.testing.assert_allclose(
        to_numpy(capped), 1.5 * np.tanh(score / 1.5), rtol=1e-6
    )
    # Press et al.: the slopes of 2 heads, then every other one of 4.
    slopes = [2**-4, 2**-8, 2**-2]
    biased = mods.alibi(N)(score, b, h, q, k)
    bias = np.empty((B, N, T, S))
    rel = np.empty((B, N, T, S))
    for n in range(N):
        for i in range(T):
            for j in range(S):
                bias[:, n, i, j] = -slopes[n] * abs(i - j)
                bucket = np_t5_bucket(j - i, 8, 16, False)
                rel[:, n, i, j] = table[bucket, n]
    np.testing.assert_allclose(to_numpy(biased), score + bias, atol=1e-6)
    mod = mods.relative_position_bias(table, 8, 16, bidirectional=False)
    np.testing.assert_allclose(
        to_numpy(mod(score, b, h, q, k)), score + rel, atol=1e-6
    )


def np_blocks(visible, block):
    """The block map of a `(B, N, T, S)` visibility: 0 empty, 1 partial,
    2 full, over every row of the batch and head."""
    t, s = visible.shape[2:]
    table = np.zeros((-(-t // block), -(-s // block)), "int32")
    for i in range(table.shape[0]):
        for j in range(table.shape[1]):
            piece = visible[:, :, i * block : (i + 1) * block]
            piece = piece[..., j * block : (j + 1) * block]
            table[i, j] = 2 if piece.all() else 1 if piece.any() else 0
    return table


def per_head(batch, head, q_idx, kv_idx):
    return (q_idx + kv_idx + head + 2 * batch) % 4 != 0


@pytest.mark.parametrize("block", [2, 3, 4])
@pytest.mark.parametrize("name", list(MASK_MODS))
def test_block_mask_classifies_every_block(name, block):
    mod, spec = MASK_MODS[name][:2]
    t, s = sizes(name)
    mask = mods.block_mask(mod, B, N, t, s, block_size=block)
    want = np_blocks(np_mask_mod(spec, B, N, t, s), block)
    np.testing.assert_array_equal(ops.convert_to_numpy(mask.blocks), want)
    np.testing.assert_array_equal(
        evaluate(mask, t=t, s=s), evaluate(mod, t=t, s=s)
    )


RANGED = {
    **{name: case[0] for name, case in MASK_MODS.items()},
    "sinks": mods.sink_tokens(3),
    "prefix_lm, long prefixes": mods.prefix_lm(np.array([7, 11])),
    "chunked 1": mods.chunked(1),
}


@pytest.mark.parametrize("block", [1, 2, 3, 5])
@pytest.mark.parametrize("name", list(RANGED))
def test_built_in_maps_from_ranges_are_the_evaluated_maps(name, block):
    """The block map a built-in mod's ranges give (without evaluating it)
    is the map of the mod evaluated position by position."""
    mod = RANGED[name]
    t, s = sizes(name)
    got = plan.range_kinds(mod, t, s, block)
    assert got is not None, "a built-in mod's map comes from its ranges"
    want = np_blocks(evaluate(mod, t=t, s=s), block)
    np.testing.assert_array_equal(ops.convert_to_numpy(got), want)


def test_any_other_mod_is_evaluated():
    assert plan.range_kinds(per_head, T, S, 2) is None


def test_block_mask_of_a_mod_of_batch_and_head():
    mask = mods.block_mask(per_head, B, N, T, S, block_size=2)
    want = np_blocks(evaluate(per_head), 2)
    np.testing.assert_array_equal(ops.convert_to_numpy(mask.blocks), want)
    assert (want == 1).any()  # the map has partial blocks to check


def reach_ahead(batch, head, q_idx, kv_idx):
    """Full blocks in the padded last row and column of blocks too."""
    return kv_idx <= q_idx + 3


@pytest.mark.parametrize("block", [2, 4])
def test_block_mask_of_a_function_has_full_padded_edge_blocks(block):
    """9 queries and 11 keys in blocks of 2 or 4: the last row and
    column of blocks are padded, and a block there is full where every
    real position in it is visible (the padding is hidden anyway)."""
    mask = mods.block_mask(reach_ahead, B, N, T, S, block_size=block)
    want = np_blocks(evaluate(reach_ahead), block)
    assert (want[-1] == 2).any() and (want[:, -1] == 2).any()
    np.testing.assert_array_equal(ops.convert_to_numpy(mask.blocks), want)


@pytest.mark.parametrize(
    "mod",
    [
        mods.causal(),
        mods.sliding_window((2, 1)),
        mods.chunked(3),
        mods.or_masks(mods.sink_tokens(2), mods.sliding_window(2)),
    ],
    ids=repr,
)
def test_static_mask_mods_round_trip_their_config(mod):
    config = keras.saving.serialize_keras_object(mod)
    again = keras.saving.deserialize_keras_object(config)
    assert repr(again) == repr(mod)
    np.testing.assert_array_equal(evaluate(again), evaluate(mod))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: mods.chunked(0), "chunked: `chunk_size` must be a positive"),
        (lambda: mods.sink_tokens(1.5), "sink_tokens: `num_sinks`"),
        (
            lambda: mods.chunked(2**31),
            "are int32). Received: chunk_size=2147483648",
        ),
        (
            lambda: mods.sink_tokens(2**31),
            "are int32). Received: num_sinks=2147483648",
        ),
        (lambda: mods.sliding_window(0), "sliding_window: `sliding_window`"),
        (lambda: mods.prefix_lm(np.ones((2, 3), "int32")), "shape (B,)"),
        (lambda: mods.prefix_lm(np.ones(2, "float32")), "dtype=float32"),
        (lambda: mods.document(np.ones(4, "int32")), "shape (B, T)"),
        (
            lambda: mods.document(
                (np.ones((2, 3), "int32"), np.ones((3, 3), "int32"))
            ),
            "one batch size",
        ),
        (lambda: mods.and_masks(), "and_masks: expects one or more"),
        (lambda: mods.or_masks(1), "or_masks: expects one or more"),
        (lambda: mods.soft_cap(-1.0), "soft_cap: `cap` must be"),
        (lambda: mods.soft_cap(float("inf")), "soft_cap: `cap` must be"),
        (lambda: mods.soft_cap(float("nan")), "soft_cap: `cap` must be"),
        (lambda: mods.soft_cap(np.float32(-2)), "soft_cap: `cap` must be"),
        (lambda: mods.alibi(0), "alibi: `num_heads`"),
        (
            lambda: mods.relative_position_bias(np.zeros((4, 2)), 8),
            "relative_position_bias: `table` must be",
        ),
        (
            lambda: mods.relative_position_bias(np.zeros((3, 2), "float32"), 3),
            "at least one exact distance",
        ),
        (
            lambda: mods.relative_position_bias(
                np.zeros((32, 2), "float32"), 32, 8
            ),
            "must exceed the 8 exact ones",
        ),
        (lambda: mods.prefix_lm(None), "Received: prefix_lengths=None"),
        (lambda: mods.prefix_lm([-1, 2]), "must not be negative"),
        (lambda: mods.document(None), "Received: segment_ids=None"),
        (
            lambda: mods.relative_position_bias([[0.0, 0.0]] * 32),
            "dtype=list",
        ),
        (
            lambda: mods.relative_position_bias(
                np.zeros((32, 2), "float32"), bidirectional="no"
            ),
            "`bidirectional` must be True or False",
        ),
        (
            lambda: mods.relative_position_bucket(np.arange(3), 2, 5),
            "relative_position_bucket: `num_buckets` must leave",
        ),
        (
            lambda: mods.relative_position_bucket(np.arange(3), 8, 0),
            "relative_position_bucket: `max_distance` must be a positive",
        ),
        (lambda: mods.block_mask("causal", 1, 1, 4, 4), "block_mask"),
        (
            lambda: mods.block_mask(mods.causal(), 1, 1, 4, 4, block_size=0),
            "block_mask: `block_size` must be a positive int",
        ),
        (
            lambda: mods.block_mask(
                mods.document(np.ones((2, 5), "int32")), 2, 1, 4, 4
            ),
            "block_mask: `mask_mod` document needs `segment_ids`",
        ),
        (
            lambda: mods.block_mask(mods.causal(), 1, 1, 0, 4),
            "block_mask: `query_length`",
        ),
    ],
)
def test_bad_arguments_raise(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


@pytest.mark.parametrize("form", ["grid", "per-row positions", "scalars"])
def test_relative_position_bias_in_every_call_form(form):
    """The bias and its table's gradients equal T5's position by position
    however the mod is called: on the index grid every path uses (whole
    rows of the table are gathered), with query positions per batch row
    (the flat gather), and one scalar position at a time
    (as FlexAttention calls a score mod; every 4th query and 5th key)."""
    table = np.random.default_rng(3).normal(size=(8, N)).astype("float32")
    weights = np.random.default_rng(4).normal(size=(B, N, T, S))
    weights = weights.astype("float32")
    offsets = np.array([0, 5] if form == "per-row positions" else [0, 0])
    step = (4, 5) if form == "scalars" else (1, 1)
    positions = [
        (r, n, i, j)
        for r in range(B)
        for n in range(N)
        for i in range(0, T, step[0])
        for j in range(0, S, step[1])
    ]
    expected, expected_grad = [], np.zeros((8, N))
    for r, n, i, j in positions:
        bucket = np_t5_bucket(j - i - offsets[r], 8, 16, True)
        expected.append(table[bucket, n] * weights[r, n, i, j])
        expected_grad[bucket, n] += weights[r, n, i, j]
    b, h, q, k = grid()
    if form == "per-row positions":
        q = q + offsets.reshape(B, 1, 1, 1).astype("int32")  # (B, 1, T, 1)

    def bias(table):
        mod = mods.relative_position_bias(table, 8, 16)
        if form == "scalars":
            return ops.stack([mod(0.0, *p) * weights[p] for p in positions])
        biased = mod(ops.zeros((B, N, T, S)), b, h, q, k)
        return ops.reshape(ops.multiply(biased, weights), (-1,))

    np.testing.assert_allclose(to_numpy(bias(table)), expected, atol=1e-6)
    np.testing.assert_allclose(
        gradient(bias, table), expected_grad, rtol=1e-5, atol=1e-5
    )


def test_a_numpy_cap_is_a_cap():
    """`soft_cap(np.float32(2))` caps as `soft_cap(2.0)` does, as the
    `logit_soft_cap` argument takes NumPy numbers, and its config is
    plain JSON."""
    score = ops.convert_to_tensor(np.linspace(-9, 9, 7, dtype="float32"))
    numpy_cap = mods.soft_cap(np.float32(2))
    got, want = (
        mod(score, 0, 0, 0, 0) for mod in (numpy_cap, mods.soft_cap(2.0))
    )
    np.testing.assert_array_equal(
        ops.convert_to_numpy(got), ops.convert_to_numpy(want)
    )
    assert type(numpy_cap.get_config()["cap"]) is float
