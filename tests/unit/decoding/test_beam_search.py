"""Beam search against brute force, a NumPy beam search that ranks as
tensorflow-addons does, and searches worked by hand."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.decoding import beam_search
from keras_attention.decoding import greedy_search
from keras_attention.decoding import sample
from tests.helpers import to_numpy
from tests.unit.decoding.step_functions import BIGRAM
from tests.unit.decoding.step_functions import SOURCE
from tests.unit.decoding.step_functions import L
from tests.unit.decoding.step_functions import PrefixModel
from tests.unit.decoding.step_functions import V
from tests.unit.decoding.step_functions import table_step


def np_length_penalty(length, alpha):
    return ((5.0 + length) ** alpha) / 6.0**alpha


def np_coverage(coverage):
    """GNMT's coverage sum; positions never attended count as covered."""
    return np.log(np.minimum(np.where(coverage > 0, coverage, 1.0), 1.0)).sum()


def np_beam_search(model, start, width, steps, end_id, alpha, beta):
    """One example's search in float64, hypotheses as Python tuples.

    Candidates are ranked by `total / lp` and, for a hypothesis that ended
    at an earlier step, `+ β · cp` (tensorflow-addons' `_get_scores`);
    the returned hypotheses by `total / lp + β · cp`. Only real
    hypotheses are kept (`beam_search` also keeps `-inf` ones while there
    are fewer than `width`: after the first step when `width > V`).
    Returns `(sequences (K, steps), scores (K,))`, best first, padded
    with `end_id`.
    """
    # (tokens, code, log P, |Y|, ended, coverage)
    beams = [((), 0, 0.0, 0, False, np.zeros(SOURCE))]
    for _ in range(steps):
        candidates = []
        for tokens, code, total, length, ended, coverage in beams:
            if ended:
                score = total / np_length_penalty(length, alpha)
                score += beta * np_coverage(coverage)
                kept = (tokens + (end_id,), code, total, length, True)
                candidates.append((score, *kept, coverage))
                continue
            code = code * V + (tokens[-1] if tokens else start) + 1
            coverage = coverage + model.attention[code]
            for token, log_p in enumerate(model.log_probs(code)):
                grown = (tokens + (token,), code, total + log_p, length + 1)
                score = grown[2] / np_length_penalty(length + 1, alpha)
                candidates.append((score, *grown, token == end_id, coverage))
        candidates.sort(key=lambda candidate: -candidate[0])  # stable
        beams = [candidate[1:] for candidate in candidates[:width]]
        if all(beam[4] for beam in beams):
            break
    final = [
        (total / np_length_penalty(length, alpha) + beta * np_coverage(cov),
         tokens + (end_id,) * (steps - len(tokens)))
        for tokens, _, total, length, _, cov in beams
    ]  # fmt: skip
    final.sort(key=lambda hypothesis: -hypothesis[0])
    return np.array([f[1] for f in final]), np.array([f[0] for f in final])


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
        # Nothing is pruned, not even at the last step, where live
        # hypotheses are ranked without their coverage.
        beam_width=V**L,
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


@pytest.mark.parametrize(
    "end_id, alpha, beta",
    [(None, 0.0, 0.0), (0, 0.8, 0.0), (0, 0.6, 0.4), (None, 0.7, 0.5)],
)
def test_beam_search_equals_a_numpy_beam_search(end_id, alpha, beta):
    """Four beams over five steps (the search `test_compiled_loops` runs
    both ways): pruning keeps the hypotheses that tensorflow-addons'
    ranking keeps, and the scores are its scores. (With β > 0, charging
    cp to every hypothesis at every step keeps others in most rows.)"""
    model = PrefixModel(5)
    starts = np.array([0, 1, 2])
    sequences, scores = beam_search(
        model.step, model.initial_state(3), starts, 5, 4, end_id=end_id,
        length_penalty=alpha, coverage_penalty=beta, return_all_beams=True,
    )  # fmt: skip
    for row, start in enumerate(starts):
        want, want_scores = np_beam_search(
            model, start, 4, 5, end_id, alpha, beta
        )
        np.testing.assert_array_equal(to_numpy(sequences)[row], want)
        np.testing.assert_allclose(
            to_numpy(scores)[row], want_scores, rtol=1e-5
        )


def bigram(probabilities, attention):
    """A step function reading next-token probabilities and the step's
    attention from tables indexed by the previous token."""
    log_p = ops.convert_to_tensor(np.log(probabilities), "float32")
    attention = ops.convert_to_tensor(attention, "float32")

    def step(ids, state):
        return ops.take(log_p, ids, 0), state, ops.take(attention, ids, 0)

    return step


def test_coverage_ranks_only_ended_hypotheses():
    # Two beams, two steps, α = 0. Live: from 0 the search keeps [1] and [2];
    # their children by log P are [1, 0] .25, [1, 1] .20, [2, 0] .16, ...
    # Coverage does not rank live hypotheses, so [1, 0] and [1, 1] are kept
    # although [1, ·] attended (0.5, 0.5) + (1, 0): cp = log 0.5, while
    # [2, 0] covers both positions. (Charging cp at every step would keep
    # [2, 0], of score log .16 > log .25 + log .5.)
    step = bigram(
        [[0.1, 0.5, 0.4], [0.5, 0.4, 0.1], [0.4, 0.3, 0.3]],
        [[0.5, 0.5], [1.0, 0.0], [0.5, 0.5]],
    )
    sequences, scores = beam_search(
        step, (), np.array([0]), 2, 2, coverage_penalty=1.0,
        return_all_beams=True,
    )  # fmt: skip
    np.testing.assert_array_equal(to_numpy(sequences)[0], [[1, 0], [1, 1]])
    np.testing.assert_allclose(
        to_numpy(scores)[0], np.log([0.25 * 0.5, 0.2 * 0.5]), rtol=1e-6
    )
    # Ended: 0 is the end id, β = 2. From 2, [0] (.5, ended) and [1] (.3)
    # are kept. At step two [0] competes with β·cp of its (0.5, 0.5):
    # log .5 + 2 · 2 log .5 = log .5^5, below [1, 0] .15 and [1, 1] .12,
    # which both cover (1, 1). (Without cp, [0] would stay, at log .5.)
    step = bigram(
        [[0.98, 0.01, 0.01], [0.5, 0.4, 0.1], [0.5, 0.3, 0.2]],
        [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]],
    )
    sequences, scores = beam_search(
        step, (), np.array([2]), 2, 2, end_id=0, coverage_penalty=2.0,
        return_all_beams=True,
    )  # fmt: skip
    np.testing.assert_array_equal(to_numpy(sequences)[0], [[1, 0], [1, 1]])
    np.testing.assert_allclose(
        to_numpy(scores)[0], np.log([0.3 * 0.5, 0.3 * 0.4]), rtol=1e-6
    )


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_one_query_attention_is_the_same_coverage(jit_compile):
    """A step's attention as one query's weights `(B·K, 1, S)`, as a
    cross-attention layer returns them averaged over heads, ranks as its
    `(B·K, S)` rows do."""
    probabilities = [[0.98, 0.01, 0.01], [0.5, 0.4, 0.1], [0.5, 0.3, 0.2]]
    attention = [[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]
    flat = bigram(probabilities, attention)

    def one_query(ids, state):
        logits, state, weights = flat(ids, state)
        return logits, state, ops.expand_dims(weights, 1)

    results = [
        beam_search(
            step, (), np.array([2, 1]), 3, 2, end_id=0,
            coverage_penalty=1.0, return_all_beams=True,
            jit_compile=jit_compile,
        )
        for step in (flat, one_query)
    ]  # fmt: skip
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(to_numpy(b), to_numpy(a))


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
        coverage_penalty=0.5,
    )
    np.testing.assert_array_equal(to_numpy(beam), to_numpy(greedy))


def tied_step(ids, state):
    """Logits tied across the vocabulary but for token 2, the worst."""
    logits = ops.convert_to_tensor([[0.0, 0.0, -1.0, 0.0]], "float32")
    return ops.tile(logits, (ids.shape[0], 1)), state


@pytest.mark.parametrize("jit_compile", [False, True])
def test_ties_go_to_the_lower_index(jit_compile):
    """Among equal scores the lower index ranks first, as `argmax` picks
    (`torch.topk` keeps no order among ties): one beam is greedy search,
    and three beams over two steps are, in order, the first three of
    the nine tied best sequences."""
    starts = np.array([1, 3])
    greedy = greedy_search(tied_step, (), starts, 3, jit_compile=jit_compile)
    one, _ = beam_search(
        tied_step, (), starts, 3, beam_width=1, jit_compile=jit_compile
    )
    np.testing.assert_array_equal(to_numpy(greedy), np.zeros((2, 3)))
    np.testing.assert_array_equal(to_numpy(one), np.zeros((2, 3)))
    beams, _ = beam_search(
        tied_step,
        (),
        starts,
        2,
        beam_width=3,
        return_all_beams=True,
        jit_compile=jit_compile,
    )
    want = [[0, 0], [0, 1], [0, 3]]  # flat (beam, token) order
    np.testing.assert_array_equal(to_numpy(beams), [want, want])


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


@pytest.mark.parametrize("as_tensor", [False, True])
def test_beam_search_passes_scalar_state_through(as_tensor):
    """A cache position kept as a Python int or a scalar tensor is shared by
    all beams: neither tiled nor reordered."""
    seen = []

    def step_fn(ids, state):
        index = state["index"]
        seen.append(int(keras.ops.convert_to_numpy(index)))
        assert len(getattr(index, "shape", ())) == 0
        logits = keras.ops.take(keras.ops.convert_to_tensor(BIGRAM), ids, 0)
        return logits, {**state, "index": index + 1}

    start = keras.ops.convert_to_tensor(0, "int32") if as_tensor else 0
    ids, _ = beam_search(
        step_fn, {"index": start}, np.array([0, 0]), 3, beam_width=2
    )
    assert seen == [0, 1, 2]
    expected, _ = beam_search(
        lambda i, s: (keras.ops.take(BIGRAM, i, 0), s), (), np.array([0, 0]),
        3, beam_width=2,
    )  # fmt: skip
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(ids), keras.ops.convert_to_numpy(expected)
    )


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


def test_numpy_integers_are_sizes():
    """A beam width or length from NumPy (`lengths.max()`) is an int."""
    start = np.array([0, 0])

    def step(ids, state):
        return ops.take(BIGRAM, ids, 0), state

    expected = beam_search(step, (), start, 2, 2, length_penalty=0.6)
    given = beam_search(
        step,
        (),
        start,
        np.int64(2),
        np.int64(2),
        length_penalty=np.float32(0.6),
    )
    for a, b in zip(expected, given, strict=True):
        np.testing.assert_array_equal(to_numpy(b), to_numpy(a))
    greedy = greedy_search(step, (), start, 2)
    np.testing.assert_array_equal(
        to_numpy(greedy_search(step, (), start, np.int32(2))),
        to_numpy(greedy),
    )
    sampled = sample(step, (), start, np.int64(2), top_k=np.int64(1))
    np.testing.assert_array_equal(to_numpy(sampled), to_numpy(greedy))


def untiled_step(ids, state):
    return ops.zeros((1, 3)), state  # logits for one row, not B·K


@pytest.mark.parametrize(
    "call,received",
    [
        (lambda st: beam_search(table_step, st, [0], 2, 0), "beam_width=0"),
        (
            lambda st: beam_search(untiled_step, st, [0], 2, 2),
            r"B·K = 2 rows.*logits.shape=\(1, 3\)",
        ),
        (
            lambda st: beam_search(
                untiled_step, st, [0], 2, 1, coverage_penalty=1.0
            ),
            "2 values",
        ),
        (
            lambda st: beam_search(table_step, st, [0], 2, 2.0),
            "beam_width=2.0",
        ),
        (
            lambda st: beam_search(
                table_step, st, [0], 2, 2, length_penalty=float("nan")
            ),
            "length_penalty=nan",
        ),
        (
            lambda st: beam_search(
                table_step, st, [0], 2, 2, coverage_penalty="0.2"
            ),
            "coverage_penalty='0.2'",
        ),
        (
            lambda st: beam_search(
                table_step, st, [0], 2, 2, return_all_beams="no"
            ),
            "return_all_beams='no'",
        ),
        (lambda st: beam_search(None, st, [0], 2, 2), "step_fn=None"),
        (lambda st: greedy_search(None, st, [0], 2), "step_fn=None"),
        (lambda st: sample(None, st, [0], 2), "step_fn=None"),
        (lambda st: sample(table_step, st, [0], 2, seed=-1), "seed=-1"),
        (
            lambda st: sample(table_step, st, [0], 2, seed=2**31),
            "seed=2147483648",
        ),
        (lambda st: sample(table_step, st, [0], 2, seed="a"), "seed='a'"),
        (lambda st: sample(table_step, st, [0], 2, seed=True), "seed=True"),
    ],
)
def test_bad_arguments(call, received):
    model = PrefixModel()
    with pytest.raises(ValueError, match=received):
        call(model.initial_state(1))
