"""Greedy search, beam search and sampling against brute force."""

import itertools

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import AttentionDecoder
from keras_attention import LuongAttention
from keras_attention import TransformerDecoderBlock
from keras_attention.decoding import beam_search
from keras_attention.decoding import greedy_search
from keras_attention.decoding import sample
from tests.helpers import rng
from tests.helpers import to_numpy

V, L, SOURCE = 3, 3, 4


class PrefixModel:
    """A language model whose next-token logits depend on the whole prefix.

    The state is a code of the prefix, `code' = code · V + token + 1`, so
    beam search must reorder it correctly; logits and attention are looked
    up in fixed random tables.
    """

    def __init__(self, seed=0, sharp=2.0):
        g = rng(seed)
        self.logits = g.normal(size=(400, V)) * sharp
        attention = np.exp(g.normal(size=(400, SOURCE)) * 2)
        self.attention = attention / attention.sum(-1, keepdims=True)
        self.logits_tensor = ops.convert_to_tensor(self.logits, "float32")
        self.attention_tensor = ops.convert_to_tensor(self.attention, "float32")

    def step(self, token_ids, state):
        code = state["code"] * V + token_ids + 1
        logits = ops.take(self.logits_tensor, code, axis=0)
        attention = ops.take(self.attention_tensor, code, axis=0)
        return logits, {"code": code}, attention

    def initial_state(self, batch):
        return {"code": ops.zeros((batch,), "int32")}

    def brute_force(self, start, end_id, alpha, beta):
        """The best sequence and its score over all V^L sequences."""
        best, best_score = None, -np.inf
        for seq in itertools.product(range(V), repeat=L):
            if end_id is not None and end_id in seq:
                first = seq.index(end_id)
                if any(t != end_id for t in seq[first:]):
                    continue  # after the end only end_id may follow
                length = first + 1
            else:
                length = L
            code, total, coverage = 0, 0.0, np.zeros(SOURCE)
            token = start
            for t in range(length):
                code = code * V + token + 1
                logits = self.logits[code]
                log_probs = logits - np.log(np.exp(logits).sum())
                total += log_probs[seq[t]]
                coverage += self.attention[code]
                token = seq[t]
            score = total / (((5 + length) ** alpha) / 6**alpha)
            score += beta * np.log(np.minimum(coverage, 1.0)).sum()
            if score > best_score:
                best, best_score = seq, score
        return np.array(best), best_score


@pytest.mark.parametrize("beta", [0.0, 0.4])
@pytest.mark.parametrize("alpha", [0.0, 0.8])
@pytest.mark.parametrize("end_id", [None, 0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_equals_exhaustive_search(seed, end_id, alpha, beta):
    model = PrefixModel(seed)
    starts = np.array([1, 2])
    sequences, scores = beam_search(
        model.step,
        model.initial_state(2),
        starts,
        max_length=L,
        beam_width=V ** (L - 1),  # wide enough that nothing is pruned
        end_id=end_id,
        length_penalty=alpha,
        coverage_penalty=beta,
    )
    for row, start in enumerate(starts):
        want, want_score = model.brute_force(start, end_id, alpha, beta)
        np.testing.assert_array_equal(to_numpy(sequences)[row], want)
        assert float(to_numpy(scores)[row]) == pytest.approx(
            want_score, abs=1e-4
        )


@pytest.mark.parametrize("end_id", [None, 0])
def test_beam_width_one_equals_greedy(end_id):
    model = PrefixModel(3)
    starts = np.array([0, 1, 2])
    greedy = greedy_search(
        model.step, model.initial_state(3), starts, L, end_id=end_id
    )
    beam, _ = beam_search(
        model.step,
        model.initial_state(3),
        starts,
        L,
        beam_width=1,
        end_id=end_id,
        length_penalty=0.6,
    )
    np.testing.assert_array_equal(to_numpy(beam), to_numpy(greedy))


def test_all_beams_are_sorted_and_distinct():
    model = PrefixModel(4)
    sequences, scores = beam_search(
        model.step,
        model.initial_state(2),
        np.array([0, 1]),
        L,
        beam_width=4,
        return_all_beams=True,
    )
    sequences, scores = to_numpy(sequences), to_numpy(scores)
    assert sequences.shape == (2, 4, L) and scores.shape == (2, 4)
    assert np.all(np.diff(scores, axis=-1) <= 1e-6)
    for row in sequences:
        assert len({tuple(s) for s in row}) == 4


def test_greedy_search_by_hand():
    model = PrefixModel(5)
    got = to_numpy(greedy_search(model.step, model.initial_state(1), [2], L))
    code, token, want = 0, 2, []
    for _ in range(L):
        code = code * V + token + 1
        token = int(np.argmax(model.logits[code]))
        want.append(token)
    np.testing.assert_array_equal(got[0], want)


def test_positions_after_end_hold_end_id():
    # Always predicts ids + 1: from 0 the sequence is 1, 2, 3(end), 3, ...
    table = ops.convert_to_tensor(np.eye(5, k=1, dtype="float32") * 5)

    def step(ids, state):
        return ops.take(table, ids, axis=0), state

    for decode in (greedy_search, lambda *a, **k: sample(*a, **k, top_k=1)):
        ids = to_numpy(decode(step, (), np.array([0, 2]), 6, end_id=3))
        np.testing.assert_array_equal(
            ids, [[1, 2, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3]]
        )
    beams, _ = beam_search(step, (), np.array([0, 2]), 6, 2, end_id=3)
    np.testing.assert_array_equal(
        to_numpy(beams), [[1, 2, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3]]
    )


def test_top_k_one_sampling_equals_greedy():
    model = PrefixModel(6, sharp=0.3)
    starts = np.array([0, 1, 2, 0])
    greedy = greedy_search(model.step, model.initial_state(4), starts, L)
    sampled = sample(
        model.step, model.initial_state(4), starts, L, top_k=1, seed=3
    )
    np.testing.assert_array_equal(to_numpy(sampled), to_numpy(greedy))
    nucleus = sample(
        model.step, model.initial_state(4), starts, L, top_p=1e-6, seed=3
    )
    np.testing.assert_array_equal(to_numpy(nucleus), to_numpy(greedy))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_sampling_is_seeded_and_follows_the_distribution(jit_compile):
    probs = np.array([0.6, 0.3, 0.1])
    logits = ops.convert_to_tensor(
        np.log(probs)[None].repeat(2000, 0), "float32"
    )

    def step(ids, state):
        return logits, state

    def draw(seed, steps=1, **kwargs):
        start = np.zeros(2000, "int32")
        ids = sample(
            step, (), start, steps, seed=seed, jit_compile=jit_compile, **kwargs
        )
        return to_numpy(ids)

    first = draw(7, steps=2)
    np.testing.assert_array_equal(first, draw(7, steps=2))
    assert not np.array_equal(first, draw(8, steps=2))
    # Each step draws afresh from the same distribution.
    assert not np.array_equal(first[:, 0], first[:, 1])
    for column in first.T:
        frequencies = np.bincount(column.astype(int), minlength=3) / 2000
        np.testing.assert_allclose(frequencies, probs, atol=0.04)
    top2 = draw(7, top_k=2).ravel()
    assert set(np.unique(top2)) == {0, 1}
    hot = draw(7, temperature=0.05)
    assert np.mean(hot == 0) > 0.99


def test_decoding_an_attention_decoder():
    g = rng(8)
    embedding = keras.layers.Embedding(6, 4)
    layer = AttentionDecoder(keras.layers.GRUCell(8), LuongAttention("dot"))
    output = keras.layers.Dense(6)
    encoded = g.normal(size=(2, 5, 8)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1] * 5], bool)
    layer(embedding(np.zeros((2, 1), "int32")), encoded)

    def step(ids, state):
        # Encoder outputs and masks travel in the state, so that beam search
        # tiles and reorders them with the decoder state.
        out, decoder_state, alignment = layer.step(
            embedding(ids), state["decoder"], state["encoded"], state["mask"]
        )
        return output(out), {**state, "decoder": decoder_state}, alignment

    state = {
        "decoder": layer.get_initial_state(encoded, mask),
        "encoded": encoded,
        "mask": mask,
    }
    greedy = to_numpy(greedy_search(step, state, np.array([1, 1]), 4))
    # Teacher-forcing the greedy output reproduces its argmaxes.
    inputs = np.concatenate([[[1], [1]], greedy[:, :-1]], axis=1)
    logits = output(
        layer(embedding(inputs), encoded, encoder_padding_mask=mask)
    )
    np.testing.assert_array_equal(np.argmax(to_numpy(logits), -1), greedy)
    beams, _ = beam_search(
        step, state, np.array([1, 1]), 4, beam_width=3, coverage_penalty=0.2
    )
    assert tuple(beams.shape) == (2, 4)


def test_cached_transformer_greedy_equals_uncached():
    g = rng(9)
    embedding = keras.layers.Embedding(7, 16)
    block = TransformerDecoderBlock(2, 32, use_rotary=True)
    head = keras.layers.Dense(7)
    source = g.normal(size=(2, 5, 16)).astype("float32")
    block(embedding(np.zeros((2, 1), "int32")), source)
    steps = 5

    def cached_step(ids, state):
        hidden, cache = block(
            embedding(ids[:, None]),
            cache=state["cache"],
            cache_index=state["index"],
        )
        return head(hidden[:, 0]), {"cache": cache, "index": state["index"] + 1}

    def uncached_step(ids, state):
        prefix = ops.concatenate([state, ids[:, None]], axis=1)
        hidden = block(embedding(prefix), source)
        return head(hidden[:, -1]), prefix

    cache = block.init_cache(2, steps, encoder_outputs=source)
    start = np.array([1, 2], "int32")
    cached = greedy_search(
        cached_step, {"cache": cache, "index": 0}, start, steps
    )
    uncached = greedy_search(
        uncached_step, np.zeros((2, 0), "int32"), start, steps
    )
    np.testing.assert_array_equal(to_numpy(cached), to_numpy(uncached))


BAD = [
    (lambda s, st: beam_search(s, st, [0], 2, beam_width=0), "beam_width=0"),
    (
        lambda s, st: beam_search(
            lambda i, x: (ops.zeros((1, 3)), x), st, [0], 2, 2
        ),
        r"B·K = 2 rows.*logits.shape=\(1, 3\)",
    ),
    (lambda s, st: sample(s, st, [0], 2, temperature=0.0), "temperature=0.0"),
    (lambda s, st: sample(s, st, [0], 2, top_k=0), "top_k=0"),
    (lambda s, st: sample(s, st, [0], 2, top_p=1.5), "top_p=1.5"),
    (
        lambda s, st: beam_search(
            lambda i, x: (ops.zeros((1, 3)), x),
            st,
            [0],
            2,
            1,
            coverage_penalty=1.0,
        ),
        "2 values",
    ),
    (
        lambda s, st: greedy_search(lambda i, x: ops.zeros((1, 3)), st, [0], 2),
        "Received:",
    ),
]


@pytest.mark.parametrize("call,received", BAD)
def test_bad_arguments(call, received):
    model = PrefixModel()
    with pytest.raises(ValueError, match=received):
        call(model.step, model.initial_state(1))


@pytest.mark.parametrize("as_tensor", [False, True])
def test_beam_search_passes_scalar_state_through(as_tensor):
    """A cache position kept as a Python int or a scalar tensor is shared by
    all beams: neither tiled nor reordered."""
    table = np.log(
        np.array(
            [[0.1, 0.5, 0.4], [0.34, 0.33, 0.33], [0.9, 0.05, 0.05]],
            "float32",
        )
    )
    seen = []

    def step_fn(ids, state):
        index = state["index"]
        seen.append(int(keras.ops.convert_to_numpy(index)))
        assert len(getattr(index, "shape", ())) == 0
        logits = keras.ops.take(keras.ops.convert_to_tensor(table), ids, 0)
        return logits, {**state, "index": index + 1}

    start = keras.ops.convert_to_tensor(0, "int32") if as_tensor else 0
    ids, _ = beam_search(
        step_fn, {"index": start}, np.array([0, 0]), 3, beam_width=2
    )
    assert seen == [0, 1, 2]
    expected, _ = beam_search(
        lambda i, s: (keras.ops.take(table, i, 0), s), (), np.array([0, 0]),
        3, beam_width=2,
    )  # fmt: skip
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(ids), keras.ops.convert_to_numpy(expected)
    )


BIGRAM = np.log(
    np.array(
        [[0.1, 0.5, 0.4], [0.34, 0.33, 0.33], [0.9, 0.05, 0.05]], "float32"
    )
)


def table_step(ids, state):
    """A bigram model that reads its table from the state."""
    return ops.take(state["table"], ids, axis=0), state


@pytest.mark.parametrize(
    "state,where,shape",
    [
        ({"table": BIGRAM}, r"state leaf \['table'\]", r"\(3, 3\)"),
        (
            {"decoder": [np.zeros((2, 4)), np.zeros((5, 4))]},
            r"state leaf \['decoder'\]\[1\]",
            r"\(5, 4\)",
        ),
        (np.zeros((1, 4)), "state", r"\(1, 4\)"),
    ],
)
def test_beam_search_refuses_state_leaves_without_the_batch(
    state, where, shape
):
    # Tiling a (V, V) table to B·K rows along its first axis would give a
    # different, wrong table: the leaf must have B rows or stay in the
    # closure.
    with pytest.raises(
        ValueError,
        match=rf"beam_search: .*batch size B=2 .*Received: {where} with "
        rf"shape {shape}$",
    ):
        beam_search(table_step, state, np.array([0, 0]), 2, beam_width=2)


def test_a_shared_table_belongs_in_the_closure():
    state = {"table": ops.convert_to_tensor(BIGRAM)}
    start = np.array([0, 0])
    closure, _ = beam_search(
        lambda ids, s: (ops.take(BIGRAM, ids, 0), s), (), start, 2, 2
    )
    np.testing.assert_array_equal(to_numpy(closure), [[2, 0], [2, 0]])
    # Greedy search and sampling hand the state to the step function as
    # it is, so there a table in the state is read unchanged.
    greedy = greedy_search(table_step, state, start, 2)
    np.testing.assert_array_equal(to_numpy(greedy), [[1, 0], [1, 0]])
    sampled = sample(table_step, state, start, 2, top_k=1)
    np.testing.assert_array_equal(to_numpy(sampled), to_numpy(greedy))
