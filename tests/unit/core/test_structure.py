"""Attention structure as arguments of `scaled_dot_product_attention`:
causal alignment (`"top_left"`, `"bottom_right"`), sliding windows and
packed sequences (`segment_ids`), alone and combined with padding masks
and grouped-query heads.

Every path (reference, chunked with blocks of 3, fused, the symbolic
operation) is checked against a NumPy reference written position by
position (`np_structure_mask`), for the outputs and the gradients of the
query, key and value; gradients never reach a key its query must not
see; the blocks the chunked path visits are hand-counted.
"""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention import _kernels
from keras_attention import functional as F
from keras_attention._core import Structure
from keras_attention._core import alibi_slopes
from tests.autodiff import KERNEL_PATHS
from tests.autodiff import path_context
from tests.autodiff import value_and_grads
from tests.helpers import np_structure_mask
from tests.helpers import rng
from tests.unit.kernels.test_paths import check_sdpa
from tests.unit.kernels.test_paths import sdpa_inputs

PACKED = np.array(
    [[1, 1, 1, 2, 2, 2, 2, 3, 3, 0], [1, 1, 1, 1, 1, 1, 1, 1, 0, 0]],
    "int32",
)  # two rows of packed sequences, id 0 = padding
SORTED = np.array(
    [[1, 1, 1, 1, 2, 2, 2, 3, 3, 3], [1, 1, 1, 2, 2, 2, 2, 2, 3, 0]],
    "int32",
)  # in blocks of 3, 6 of the 16 block pairs share no id in either row

# name: (layout, T, S, mask kind, structure arguments)
STRUCTURES = {
    "bottom_right T<S": ("gqa", 5, 11, "causal", {}),
    "bottom_right T>S": ("3d", 8, 5, "padding+causal", {}),
    "causal window": ("gqa", 10, 10, "causal", {"sliding_window": 4}),
    "bidirectional window": (
        "4d",
        10,
        10,
        "padding",
        {"sliding_window": (2, 3)},
    ),
    "bottom_right window": ("gqa", 4, 10, "causal", {"sliding_window": 3}),
    "segments": ("gqa", 10, 10, "none", {"segment_ids": PACKED}),
    "segments, blocks skipped": (
        "gqa",
        10,
        10,
        "padding+causal",
        {"segment_ids": SORTED},
    ),
    "segments causal window": (
        "3d",
        10,
        10,
        "padding+causal",
        {"segment_ids": PACKED, "sliding_window": 5},
    ),
    "segments cross": (
        "gqa",
        4,
        10,
        "none",
        {"segment_ids": (PACKED[:, [0, 3, 7, 9]], PACKED)},
    ),
    "alibi causal": ("gqa", 9, 9, "causal", {"alibi": True}),
    "alibi bottom_right window": (
        "4d",
        4,
        10,
        "causal",
        {"alibi": True, "sliding_window": 5},
    ),
    "soft cap": ("3d", 7, 6, "padding", {"logit_soft_cap": 1.5}),
    "soft cap alibi segments": (
        "gqa",
        10,
        10,
        "padding+causal",
        {"logit_soft_cap": 2.0, "alibi": True, "segment_ids": PACKED},
    ),
}


def _ids(*rows):
    return np.array(rows, "int32")


BOTTOM_RIGHT = {
    "bottom_right T<S",
    "bottom_right T>S",
    "bottom_right window",
    "alibi bottom_right window",
}


def structure_case(name):
    layout, t, s, mask_kind, structure = STRUCTURES[name]
    q, k, v, mask, causal = sdpa_inputs(layout, mask_kind, t, s)
    if causal and name in BOTTOM_RIGHT:
        causal = "bottom_right"
    return q, k, v, mask, causal, structure


@pytest.mark.parametrize("name", tuple(STRUCTURES))
def test_every_path_equals_the_numpy_reference(name):
    """Outputs and q, k, v gradients on every path, float32, and on the
    chunked path in bfloat16."""
    q, k, v, mask, causal, structure = structure_case(name)
    cases = [
        (f"structure {path}", path, "float32")
        for path in (*KERNEL_PATHS, "symbolic")
    ]
    cases.append(("structure chunked", "chunked", "bfloat16"))
    check_sdpa(cases, q, k, v, mask, causal, **structure)


@pytest.mark.parametrize(
    "name",
    ["bottom_right T>S", "segments causal window", "segments, blocks skipped"],
)
def test_hidden_keys_get_exactly_zero_gradient(name):
    """For one query row at a time, the key and value gradients of every
    key the row must not see are exactly zero, on every path."""
    q, k, v, mask, causal, structure = structure_case(name)
    batch, t, s = q.shape[0], q.shape[1], k.shape[1]
    visible = np_structure_mask(batch, t, s, causal, **structure)
    if mask is not None:
        visible &= mask
    rows = (t // 2, t - 2)
    cases = [(path, row) for path in KERNEL_PATHS for row in rows]

    def fn(*qkvs):
        # Each case on its own copy of the inputs: its gradients alone.
        outputs = []
        for n, (path, row) in enumerate(cases):
            with path_context(path):
                out = F.scaled_dot_product_attention(
                    *qkvs[3 * n : 3 * n + 3],
                    mask=mask,
                    is_causal=causal,
                    **structure,
                )
            outputs.append(out[:, row])
        return outputs

    _, grads, _ = value_and_grads(fn, [q, k, v] * len(cases))
    for n, (path, row) in enumerate(cases):
        dk, dv = grads[3 * n + 1], grads[3 * n + 2]
        hidden = ~visible[:, row]  # (B, S)
        assert hidden.any()
        assert np.all(dk[hidden] == 0.0), (path, row)
        assert np.all(dv[hidden] == 0.0), (path, row)
        assert np.any(dv[~hidden] != 0.0), (path, row)


@pytest.mark.parametrize(
    "length, key_length, arguments, pairs",
    [
        (10, 10, {"is_causal": True}, 10),  # 4 x 4 blocks: 10 of 16
        (10, 4, {"is_causal": True}, 7),  # the last queries see every key
        (4, 10, {"is_causal": True}, 3),  # key blocks 2 and 3 seen by none
        (4, 10, {"is_causal": "bottom_right"}, 7),  # 2 x 4: only (0, 3) off
        (12, 12, {"is_causal": True, "sliding_window": 4}, 7),  # diagonal
        (9, 9, {"sliding_window": (1, 1)}, 7),  # the block tridiagonal
        # Packed sequences: blocks [1 1 1] [1 2 2] [2 2 2] [3 3 3], and
        # with is_causal the lower half of those.
        (12, 12, {"segment_ids": _ids([1] * 4 + [2] * 5 + [3] * 3)}, 8),
        (
            12,
            12,
            {
                "segment_ids": _ids([1] * 4 + [2] * 5 + [3] * 3),
                "is_causal": True,
            },
            6,
        ),
        # [1 1 1] [2 2 2] [2 0 0] [0 0 0]: padding reaches no block.
        (12, 12, {"segment_ids": _ids([1] * 3 + [2] * 4 + [0] * 5)}, 5),
        # Two rows: a pair is visited when either row needs it.
        (9, 9, {"segment_ids": _ids([1] * 3 + [2] * 6, [1] * 6 + [2] * 3)}, 7),
        # Ids out of order: only the pairs that share an id, not the
        # blocks between them ([1 1 1] [2 2 2] [1 1 1]).
        (9, 9, {"segment_ids": _ids([1] * 3 + [2] * 3 + [1] * 3)}, 5),
    ],
)
def test_chunked_path_visits_only_the_blocks_the_structure_reaches(
    length, key_length, arguments, pairs
):
    """Hand-counted block pairs for blocks of 3, both passes; they are
    exactly the pairs in which the reference mask sees something. On
    PyTorch, whose loops run eagerly, also the pairs computed."""
    from keras_attention._kernels.blockwise import blocks as block_ops
    from keras_attention._kernels.blockwise.plan import Plan

    batch = len(arguments.get("segment_ids", [None]))
    shape = (batch, length, 1, 2), (batch, key_length, 1, 2)
    q, k = ops.zeros(shape[0]), ops.zeros(shape[1])
    structure = Structure.from_args(
        where="test",
        batch=batch,
        query_length=length,
        key_length=key_length,
        is_causal=arguments.get("is_causal", False),
        sliding_window=arguments.get("sliding_window"),
        segment_ids=arguments.get("segment_ids"),
    )
    plan = Plan(q, k, k, None, structure, 1.0, 3)

    def blocks(lists, spans, index):
        """The blocks the loops visit for row `index`: from the block map's
        lists (segment ids), else from the band's range."""
        if not plan.by_map:
            start, end, _, _ = spans(index)
            return range(int(start), int(end))
        partial, partial_count, full, full_count = (
            ops.convert_to_numpy(x)[index] for x in lists
        )
        return [*partial[:partial_count], *full[:full_count]]

    forward = {
        (i, int(j))
        for i in range(plan.query_blocks)
        for j in blocks(plan.tensors.key_lists, plan.key_spans, i)
    }
    backward = {
        (int(i), j)
        for j in range(plan.key_blocks)
        for i in blocks(plan.tensors.query_lists, plan.query_spans, j)
    }
    visible = np_structure_mask(batch, length, key_length, **arguments)
    visible = visible.any(axis=0)  # the loops serve every row at once
    seen = {
        (i, j)
        for i in range(plan.query_blocks)
        for j in range(plan.key_blocks)
        if visible[3 * i : 3 * i + 3, 3 * j : 3 * j + 3].any()
    }
    assert len(seen) == pairs
    assert forward == backward == seen
    if keras.backend.backend() != "torch":
        return
    calls = []
    original = block_ops.hide
    try:
        block_ops.hide = lambda *a: calls.append(a[2:4]) or original(*a)
        q = ops.convert_to_tensor(rng(0).standard_normal(shape[0]), "float32")
        q.requires_grad_()
        with _kernels.force("chunked", chunk_size=3):
            out = F.scaled_dot_product_attention(q, k, k, **arguments)
        out.sum().backward()
    finally:
        block_ops.hide = original
    # Each pair once forward, once backward.
    assert len(calls) == len(forward) + len(backward)
    assert {tuple(int(x) for x in pair) for pair in calls} == (
        forward | backward
    )


def test_bottom_right_is_top_left_shifted_by_the_cache():
    """Queries that are the last T of S positions: `"bottom_right"`
    equals a top-left causal mask offset by `S - T`, and equals the last
    rows of full causal attention over all S positions."""
    generator = rng(3)
    q = generator.standard_normal((2, 9, 2, 4)).astype("float32")
    k = generator.standard_normal((2, 9, 2, 4)).astype("float32")
    full = F.scaled_dot_product_attention(q, k, k, is_causal=True)
    last = F.scaled_dot_product_attention(
        q[:, 6:], k, k, is_causal="bottom_right"
    )
    offset = F.scaled_dot_product_attention(
        q[:, 6:], k, k, mask=F.causal_mask(3, 9, offset=6)
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(last), ops.convert_to_numpy(full)[:, 6:], atol=1e-6
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(last), ops.convert_to_numpy(offset), atol=1e-6
    )


def test_alibi_slopes_follow_the_paper():
    """Powers of two `2^(-8h/n)`; 6 heads take the 4-head slopes, then
    every other slope of the 8-head set."""
    slopes = alibi_slopes
    assert slopes(8) == [2.0**-h for h in range(1, 9)]
    assert slopes(4) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]
    assert slopes(6) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    assert slopes(1) == [2.0**-8]


BAD_ARGUMENTS = [
    ({"alibi": 1}, "Received: alibi=1"),
    ({"logit_soft_cap": 0}, "Received: logit_soft_cap=0"),
    ({"logit_soft_cap": -2.0}, "Received: logit_soft_cap=-2.0"),
    ({"logit_soft_cap": float("inf")}, "Received: logit_soft_cap=inf"),
    ({"is_causal": "lower_right"}, "Received: is_causal='lower_right'"),
    ({"is_causal": 1.0}, "Received: is_causal=1.0"),
    ({"sliding_window": 0}, "at least 1.*Received: sliding_window=0"),
    ({"sliding_window": -3}, "Received: sliding_window=-3"),
    ({"sliding_window": True}, "Received: sliding_window=True"),
    ({"sliding_window": 2.5}, "Received: sliding_window=2.5"),
    ({"sliding_window": (1,)}, r"Received: sliding_window=\(1,\)"),
    ({"sliding_window": (1, -1)}, r"Received: sliding_window=\(1, -1\)"),
    (
        {"segment_ids": np.ones((2, 6), "int32")},
        r"queries must be integers of shape \(B, T\)=\(2, 5\)\. "
        r"Received: segment_ids.shape=\(2, 6\)",
    ),
    (
        {"segment_ids": np.ones((2, 5), "float32")},
        "Received: segment_ids.shape=.*dtype=float32",
    ),
    (
        {"segment_ids": (np.ones((2, 5), "int32"), np.ones((2, 5), "int32"))},
        r"keys must be integers of shape \(B, S\)=\(2, 6\)",
    ),
    (
        {"segment_ids": (np.ones((2, 5), "int32"),) * 3},
        "Received: 3 tensors",
    ),
]


@pytest.mark.parametrize("arguments, message", BAD_ARGUMENTS)
def test_bad_structure_arguments_are_named(arguments, message):
    q = np.zeros((2, 5, 4), "float32")
    k = np.zeros((2, 6, 4), "float32")
    with pytest.raises(
        ValueError, match=f"scaled_dot_product_attention: .*{message}"
    ):
        F.scaled_dot_product_attention(q, k, k, **arguments)
    symbolic = [
        keras.Input(shape, batch_size=2) for shape in ((5, 4), (6, 4), (6, 4))
    ]
    with pytest.raises(
        ValueError, match=f"^scaled_dot_product_attention: .*{message}"
    ):
        F.scaled_dot_product_attention(*symbolic, **arguments)


def test_structure_round_trips_in_a_saved_functional_model(tmp_path):
    """The symbolic operation keeps its window and alignment in its
    config; segment ids are model inputs."""
    q = keras.Input((5, 4))
    kv = keras.Input((9, 4))
    ids = (keras.Input((5,), dtype="int32"), keras.Input((9,), dtype="int32"))
    out = F.scaled_dot_product_attention(
        q, kv, kv, is_causal="bottom_right", sliding_window=(2, 0),
        segment_ids=ids,
    )  # fmt: skip
    model = keras.Model([q, kv, *ids], out)
    path = str(tmp_path / "structure.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    generator = rng(5)
    inputs = [
        generator.standard_normal((2, 5, 4)).astype("float32"),
        generator.standard_normal((2, 9, 4)).astype("float32"),
        PACKED[:, [0, 3, 4, 7, 8]],
        PACKED[:, :9],
    ]
    want = model(inputs)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(loaded(inputs)), ops.convert_to_numpy(want)
    )
    visible = np_structure_mask(
        2, 5, 9, "bottom_right", (2, 0), (inputs[2], inputs[3])
    )
    from tests.helpers import np_sdpa

    reference, _ = np_sdpa(inputs[0], inputs[1], inputs[1], visible)
    np.testing.assert_allclose(ops.convert_to_numpy(want), reference, atol=1e-5)


@pytest.mark.parametrize(
    "kind", ["self", "self cached", "cross", "encoder block", "decoder block"]
)
def test_layers_apply_structure_as_the_numpy_mask_says(kind):
    """A layer given a window and segment ids equals the same layer (same
    weights) given `np_structure_mask` as its `attention_mask`."""
    generator = rng(7)
    x = generator.standard_normal((2, 10, 8)).astype("float32")
    source = generator.standard_normal((2, 6, 8)).astype("float32")
    window = (1, 2) if kind == "cross" else 3
    causal = kind in ("self cached", "decoder block")
    if kind == "cross":
        ids = (PACKED, np.array([[1, 1, 2, 2, 3, 0], [1, 1, 1, 1, 1, 0]]))
        make = lambda w: ka.CrossAttention(2, sliding_window=w)  # noqa: E731
    elif kind == "encoder block":
        ids = PACKED
        make = lambda w: ka.TransformerEncoderBlock(  # noqa: E731
            2, 16, sliding_window=w
        )
    elif kind == "decoder block":
        ids = PACKED
        make = lambda w: ka.TransformerDecoderBlock(  # noqa: E731
            2, 16, sliding_window=w
        )
    else:
        ids = None if kind == "self cached" else PACKED
        make = lambda w: ka.MultiHeadSelfAttention(  # noqa: E731
            4, num_key_value_heads=2, sliding_window=w
        )
    windowed, plain = make(window), make(None)
    inputs = (x, source) if kind == "cross" else (x,)
    windowed(*inputs)
    plain(*inputs)
    plain.set_weights(windowed.get_weights())
    length = 10 if kind != "cross" else 6
    visible = np_structure_mask(2, 10, length, causal, window, ids)
    if kind == "cross":
        got = windowed(x, source, segment_ids=ids)
        want = plain(x, source, attention_mask=visible)
    elif kind == "self cached":
        cache = np.zeros((2, 2, 10, 2, 2), "float32")
        steps = []
        for t in range(10):
            out, cache = windowed(
                x[:, t : t + 1], use_causal_mask=True, cache=cache,
                cache_index=t,
            )  # fmt: skip
            steps.append(ops.convert_to_numpy(out))
        got = np.concatenate(steps, axis=1)
        want = plain(x, attention_mask=visible)
    else:
        got = windowed(x, segment_ids=ids)
        want = plain(x, attention_mask=visible)
    np.testing.assert_allclose(
        ops.convert_to_numpy(got), ops.convert_to_numpy(want), atol=2e-5
    )


def test_layers_name_bad_structure_arguments():
    with pytest.raises(
        ValueError,
        match=r"MultiHeadSelfAttention \(layer 'w'\): .*Received: "
        "sliding_window=0",
    ):
        ka.MultiHeadSelfAttention(2, sliding_window=0, name="w")
    with pytest.raises(
        ValueError, match=r"TransformerDecoderBlock .*sliding_window=\(2,\)"
    ):
        ka.TransformerDecoderBlock(2, 8, sliding_window=(2,))
    with pytest.raises(
        ValueError, match=r"CrossAttention .*Received: logit_soft_cap=0"
    ):
        ka.CrossAttention(2, logit_soft_cap=0)
    with pytest.raises(
        ValueError, match=r"TransformerEncoderBlock .*Received: alibi='yes'"
    ):
        ka.TransformerEncoderBlock(2, 8, alibi="yes")
    layer = ka.MultiHeadSelfAttention(2, name="s")
    x = np.zeros((2, 5, 8), "float32")
    with pytest.raises(
        ValueError,
        match=r"MultiHeadSelfAttention \(layer 's'\): `segment_ids` for the "
        r"queries .*Received: segment_ids.shape=\(2, 4\)",
    ):
        layer(x, segment_ids=np.ones((2, 4), "int32"))
    with pytest.raises(ValueError, match="cannot be combined with a `cache`"):
        layer(
            x[:, :1],
            cache=np.zeros((2, 2, 5, 2, 4), "float32"),
            cache_index=0,
            segment_ids=np.ones((2, 1), "int32"),
        )


def test_sliding_window_survives_the_config_round_trip(tmp_path):
    block = ka.TransformerDecoderBlock(
        2, 16, sliding_window=(3, 0), alibi=True, logit_soft_cap=5.0
    )
    x = rng(8).standard_normal((1, 7, 8)).astype("float32")
    model = keras.Sequential([keras.Input((7, 8)), block])
    path = str(tmp_path / "window.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.layers[0].sliding_window == (3, 0)
    assert loaded.layers[0].self_attention.sliding_window == (3, 0)
    assert loaded.layers[0].self_attention.alibi is True
    assert loaded.layers[0].self_attention.logit_soft_cap == 5.0
    np.testing.assert_array_equal(
        ops.convert_to_numpy(loaded(x)), ops.convert_to_numpy(model(x))
    )


def _recording_paths():
    """`_kernels.PATHS` wrapped to record the name of each path run."""
    ran = []
    wrapped = {
        name: (lambda *a, name=name, fn=fn: ran.append(name) or fn(*a))
        for name, fn in _kernels.PATHS.items()
    }
    return ran, wrapped


@pytest.mark.parametrize(
    "length, arguments",
    [
        (8, {}),
        (8, {"return_attention_scores": True}),
        (520, {"is_causal": True}),
        (520, {"sliding_window": 64, "is_causal": "bottom_right"}),
    ],
)
def test_explain_reports_the_path_that_runs(length, arguments, monkeypatch):
    """`explain` and the dispatch agree, and every faster path refused
    has a reason."""
    q = rng(9).standard_normal((1, length, 2, 4)).astype("float32")
    report = F.explain(q, q, q, **arguments)
    ran, wrapped = _recording_paths()
    monkeypatch.setattr(_kernels.dispatch, "PATHS", wrapped)
    F.scaled_dot_product_attention(q, q, q, **arguments)
    if arguments.get("return_attention_scores"):
        assert ran == [] and report.path == "reference"
        assert "weights are requested" in report.refused["fused"]
    else:
        assert ran == [report.path]
    faster = {"reference": {"fused", "chunked"}, "chunked": {"fused"}}
    assert faster.get(report.path, set()) <= set(report.refused)
    assert all(report.refused.values())
    assert str(report).startswith(f"path: {report.path}")


def test_layer_explain_names_dropout_and_the_window():
    layer = ka.MultiHeadSelfAttention(2, dropout=0.1, sliding_window=32)
    layer.build((1, 4, 8))
    training = layer.explain(600, training=True)
    assert training.path == "reference"
    assert "dropout" in training.refused["fused"]
    report = layer.explain(600)
    if report.path == "chunked":
        assert "band" in report.structure
    else:
        assert report.path == "fused"
        assert "dense" in report.structure
    with pytest.raises(ValueError, match="needs a built layer"):
        ka.MultiHeadSelfAttention(2).explain(8)


@pytest.mark.parametrize("length", [1, 2, 17])
def test_segment_positions_restart_at_each_sequence(length):
    ids = rng(11).integers(0, 3, (3, length))
    expected = np.zeros_like(ids)
    for b in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            same = ids[b, t] == ids[b, t - 1]
            expected[b, t] = expected[b, t - 1] + 1 if same else 0
    got = ops.convert_to_numpy(F.segment_positions(ids))
    np.testing.assert_array_equal(got, expected)


LENGTHS = (3, 5, 2)  # three sequences packed into one row of 10


def _packed(generator, dim):
    """Three sequences alone and packed into one row (then padding)."""
    alone = [
        generator.standard_normal((1, n, dim)).astype("float32")
        for n in LENGTHS
    ]
    row = np.concatenate(alone, axis=1)  # (1, 10, D)
    ids = np.repeat(np.arange(1, 4), LENGTHS)[None]  # (1, 10)
    return alone, row, ids


@pytest.mark.parametrize(
    "make",
    [
        lambda: ka.PositionEmbedding(12),
        lambda: ka.PositionalEncoding(),
        lambda: ka.RotaryEmbedding(),
        lambda: ka.MultiHeadSelfAttention(
            4, num_key_value_heads=2, use_rotary=True
        ),
        lambda: ka.TransformerDecoderBlock(2, 16, use_rotary=True),
    ],
    ids=["PositionEmbedding", "PositionalEncoding", "RotaryEmbedding",
         "MultiHeadSelfAttention", "TransformerDecoderBlock"],
)  # fmt: skip
def test_packed_sequences_equal_each_sequence_alone(make):
    """With `segment_ids`, each packed sequence gets exactly the outputs
    it gets alone: positions restart, attention stays inside it."""
    layer = make()
    alone, row, ids = _packed(rng(12), 8)
    arguments = {"segment_ids": ids}
    if isinstance(layer, ka.MultiHeadSelfAttention):
        arguments["use_causal_mask"] = True
    packed = ops.convert_to_numpy(layer(row, **arguments))
    separate = [
        ops.convert_to_numpy(
            layer(x, use_causal_mask=True)
            if isinstance(layer, ka.MultiHeadSelfAttention)
            else layer(x)
        )
        for x in alone
    ]
    np.testing.assert_allclose(
        packed, np.concatenate(separate, axis=1), atol=1e-5
    )


def test_explicit_positions_are_the_positions_used():
    layer = ka.PositionEmbedding(10)
    x = np.zeros((2, 3, 4), "float32")
    positions = np.array([[0, 5, 9], [2, 2, 1]])
    out = ops.convert_to_numpy(layer(x, positions=positions))
    table = ops.convert_to_numpy(layer.embeddings)
    np.testing.assert_allclose(out, table[positions], atol=1e-7)
    rope = ka.RotaryEmbedding()
    q = rng(13).standard_normal((1, 3, 2, 4)).astype("float32")
    shifted = rope(q, positions=np.array([[4, 5, 6]]))
    np.testing.assert_allclose(
        ops.convert_to_numpy(shifted),
        ops.convert_to_numpy(rope(q, start_index=4)),
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            {"positions": np.zeros((1, 3), "int32"),
             "segment_ids": np.ones((1, 3), "int32")},
            "not both",
        ),
        ({"positions": np.zeros((1, 4), "int32")}, r"\(B, T\)=\(1, 3\)"),
        ({"positions": np.zeros((1, 3), "float32")}, "dtype=float32"),
        ({"positions": np.array([[0, -1, 2]])}, "must be >= 0"),
        ({"positions": np.array([[0, 1, 10]])}, "below `max_length` \\(10\\)"),
    ],
)  # fmt: skip
def test_bad_positions_are_named(arguments, message):
    layer = ka.PositionEmbedding(10, name="pe")
    with pytest.raises(
        ValueError, match=rf"PositionEmbedding \(layer 'pe'\): .*{message}"
    ):
        layer(np.zeros((1, 3, 4), "float32"), **arguments)


def test_bottom_right_in_a_model_of_unknown_lengths():
    """The alignment offset is taken when the model runs."""
    q_in, k_in = keras.Input((None, 2, 4)), keras.Input((None, 2, 4))
    model = keras.Model(
        [q_in, k_in],
        F.scaled_dot_product_attention(
            q_in, k_in, k_in, is_causal="bottom_right"
        ),
    )
    generator = rng(14)
    q = generator.standard_normal((1, 3, 2, 4)).astype("float32")
    k = generator.standard_normal((1, 7, 2, 4)).astype("float32")
    want = F.scaled_dot_product_attention(q, k, k, is_causal="bottom_right")
    np.testing.assert_allclose(
        ops.convert_to_numpy(model([q, k])),
        ops.convert_to_numpy(want),
        atol=1e-6,
    )


def test_layer_explain_knows_the_soft_cap_and_alibi():
    layer = ka.MultiHeadSelfAttention(2, 4, logit_soft_cap=5.0, alibi=True)
    layer.build((1, 4, 8))
    report = layer.explain(16)
    assert report.path != "fused"
    assert "soft-capped at 5" in report.structure
    assert "ALiBi" in report.structure


@pytest.mark.parametrize("path", ["fused", "chunked"])
def test_mixed_dtypes_with_alibi_and_masks(path):
    """Queries in float32 and keys and values in bfloat16, with ALiBi, a
    causal structure and a padding mask: each path equals the reference."""
    q, k, v, mask, _ = sdpa_inputs("4d", "padding", 6, 6)
    arguments = {"mask": mask, "is_causal": True, "alibi": True}
    half = [ops.cast(x, "bfloat16") for x in (k, v)]
    with _kernels.force("reference"):
        want = F.scaled_dot_product_attention(q, *half, **arguments)
    with _kernels.force(path, chunk_size=4 if path == "chunked" else None):
        got = F.scaled_dot_product_attention(q, *half, **arguments)
    np.testing.assert_allclose(
        ops.convert_to_numpy(ops.cast(got, "float32")),
        ops.convert_to_numpy(ops.cast(want, "float32")),
        atol=4e-2,
    )


def test_numpy_bool_and_wide_segment_ids():
    """`np.bool_` is a causal flag; int64 ids past the int32 range stay
    distinct (no wrap-around into padding or another sequence)."""
    q = rng(15).standard_normal((1, 4, 4)).astype("float32")
    flag = F.scaled_dot_product_attention(q, q, q, is_causal=np.bool_(True))
    plain = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(flag), ops.convert_to_numpy(plain)
    )
    ids = np.array([[2**32, 2**32, 2**32 + 1, 1]], "int64")
    if keras.backend.backend() == "jax":
        with pytest.raises(ValueError, match="must fit in int32 on JAX"):
            F.scaled_dot_product_attention(q, q, q, segment_ids=ids)
        return
    for path in KERNEL_PATHS:
        with _kernels.force(path, chunk_size=2):
            out = F.scaled_dot_product_attention(q, q, q, segment_ids=ids)
        visible = np_structure_mask(1, 4, 4, segment_ids=ids)
        from tests.helpers import np_sdpa

        want, _ = np_sdpa(q, q, q, visible)
        np.testing.assert_allclose(
            ops.convert_to_numpy(out), want, atol=1e-5, err_msg=path
        )


def test_chunked_path_takes_a_mask_broadcast_over_keys():
    q, k, v, _, _ = sdpa_inputs("gqa", "none", 7, 6)
    rows = np.array([True, True, False, True, True, True, False])
    mask = np.broadcast_to(rows[None, :, None], (2, 7, 1))
    with _kernels.force("reference"):
        want = F.scaled_dot_product_attention(q, k, v, mask=mask)
    with _kernels.force("chunked", chunk_size=3):
        got = F.scaled_dot_product_attention(q, k, v, mask=mask)
    np.testing.assert_allclose(
        ops.convert_to_numpy(got), ops.convert_to_numpy(want), atol=1e-5
    )


def test_positions_with_a_start_index_are_refused():
    with pytest.raises(ValueError, match="cannot be combined"):
        ka.RotaryEmbedding()(
            np.zeros((1, 3, 4), "float32"),
            start_index=2,
            positions=np.zeros((1, 3), "int32"),
        )


def test_position_embedding_gradients_at_explicit_positions():
    """With explicit positions (repeated, out of order), the table's
    gradient is the cotangents added up at each position, and the
    input's is the cotangent itself."""
    from tests.autodiff import cotangents

    layer = ka.PositionEmbedding(6)
    x = rng(16).standard_normal((2, 4, 3)).astype("float32")
    layer.build(x.shape)
    positions = np.array([[5, 0, 5, 2], [1, 1, 3, 0]])
    _, (dx,), (dtable,) = value_and_grads(
        lambda x: layer(x, positions=positions), [x], [layer.embeddings]
    )
    (seed,) = cotangents([x.shape])
    want = np.zeros((6, 3))
    np.add.at(want, positions, seed)
    np.testing.assert_allclose(dtable, want, atol=1e-5)
    np.testing.assert_allclose(dx, seed, atol=1e-6)


def test_packed_translation_pairs_equal_each_pair_alone():
    """Encoder and decoder rows packed with two pairs each: with
    `encoder_segment_ids`, every target sequence sees only its own source
    and gets exactly the outputs of the pair alone."""
    keras.utils.set_random_seed(3)
    encoder = ka.TransformerEncoderBlock(2, 16, use_rotary=True)
    decoder = ka.TransformerDecoderBlock(2, 16, use_rotary=True)
    generator = rng(13)
    sources = [generator.normal(size=(1, n, 8)) for n in (3, 4)]
    targets = [generator.normal(size=(1, n, 8)) for n in (2, 5)]
    sources, targets = (
        [x.astype("float32") for x in xs] for xs in (sources, targets)
    )
    source_ids = np.array([[1, 1, 1, 2, 2, 2, 2]])
    target_ids = np.array([[1, 1, 2, 2, 2, 2, 2]])
    encoded = encoder(np.concatenate(sources, 1), segment_ids=source_ids)
    packed = decoder(
        np.concatenate(targets, 1),
        encoded,
        segment_ids=target_ids,
        encoder_segment_ids=source_ids,
    )
    alone = [
        ops.convert_to_numpy(decoder(target, encoder(source)))
        for source, target in zip(sources, targets, strict=True)
    ]
    np.testing.assert_allclose(
        ops.convert_to_numpy(packed), np.concatenate(alone, 1), atol=1e-5
    )
    with pytest.raises(ValueError, match="TransformerDecoderBlock.*needs"):
        decoder(
            np.concatenate(targets, 1),
            encoded,
            encoder_segment_ids=source_ids,
        )
    with pytest.raises(ValueError, match="TransformerDecoderBlock"):
        decoder(
            np.concatenate(targets, 1),
            encoded,
            segment_ids=target_ids,
            encoder_segment_ids=source_ids[:, :5],
        )


def test_segment_positions_keep_their_shape_in_a_compiled_step():
    """Rotary and learned positions from segment ids inside `predict`'s
    compiled function (a TensorFlow graph, a JAX trace)."""
    tokens = keras.Input((6, 8))
    ids = keras.Input((6,), dtype="int32")
    x = ka.PositionEmbedding(6)(tokens, segment_ids=ids)
    x = ka.MultiHeadSelfAttention(2, use_rotary=True)(x, segment_ids=ids)
    model = keras.Model([tokens, ids], x)
    inputs = [np.ones((2, 6, 8), "float32"), PACKED[:, :6]]
    np.testing.assert_allclose(
        model.predict(inputs, verbose=0),
        ops.convert_to_numpy(model(inputs)),
        atol=1e-5,
    )


def test_numpy_numbers_as_soft_cap_and_scale():
    """NumPy scalars (a config read with NumPy, say) are numbers."""
    g = rng(12)
    q, k, v = (g.standard_normal((1, 4, 8)).astype("float32") for _ in "qkv")
    expected = F.scaled_dot_product_attention(
        q, k, v, logit_soft_cap=2.0, scale=0.5
    )
    given = F.scaled_dot_product_attention(
        q, k, v, logit_soft_cap=np.float32(2.0), scale=np.float16(0.5)
    )
    np.testing.assert_array_equal(
        ops.convert_to_numpy(given), ops.convert_to_numpy(expected)
    )
