"""`jit_compile=True`: the whole loop as one program gives the Python loop's
tokens, hypotheses and scores; programs are kept, read current weights,
and refuse what they cannot run."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention import AttentionDecoder
from keras_attention import BahdanauAttention
from keras_attention.decoding import beam_search
from keras_attention.decoding import clear_compiled_programs
from keras_attention.decoding import greedy_search
from keras_attention.decoding import sample
from tests.helpers import BACKEND
from tests.helpers import rng
from tests.helpers import to_numpy
from tests.unit.decoding.step_functions import CachedTransformer
from tests.unit.decoding.step_functions import PrefixModel
from tests.unit.decoding.step_functions import V
from tests.unit.decoding.step_functions import beam_both_ways
from tests.unit.decoding.step_functions import cached_both_ways
from tests.unit.decoding.step_functions import greedy_both_ways


@pytest.mark.parametrize("sliding_window", [None, 3])
def test_greedy_transformer_with_cache(sliding_window):
    """With a window of 3 the cache is a rolling one of 3 positions, its
    index traced past them inside the program."""
    model = CachedTransformer(sliding_window=sliding_window)
    if sliding_window:
        assert model.initial_state(8)["cache"]["self"].kv.shape[2] == 3
    starts = np.array([1, 4, 7], "int32")
    python, compiled = cached_both_ways(model, starts, 8)
    np.testing.assert_array_equal(compiled, python)
    assert len(np.unique(python)) > 2  # a sequence, not one repeated id
    # An end id that some rows reach early: the loop stops when all have
    # and positions after the end hold the end id, as in the Python loop.
    end_id = int(python[0, 2])
    python, compiled = cached_both_ways(model, starts, 8, end_id=end_id)
    np.testing.assert_array_equal(compiled, python)
    assert np.all(python[0, 2:] == end_id)


def test_greedy_transformer_with_mods():
    """A score mod owned by the block (T5's bias) and a mask mod given to
    each call see the traced cache index as the query's position."""

    def every_other_past_key(batch, head, q_idx, kv_idx):
        return (kv_idx == q_idx) | (kv_idx % 2 == q_idx % 2)

    model = CachedTransformer(
        score_mod=ka.RelativePositionBias(
            num_buckets=4, max_distance=8, bidirectional=False
        ),
        mask_mod=every_other_past_key,
    )
    starts = np.array([1, 4, 7], "int32")
    python, compiled = cached_both_ways(model, starts, 6)
    np.testing.assert_array_equal(compiled, python)
    assert len(np.unique(python)) > 2


@pytest.mark.parametrize("end_id", [None, 0])
def test_greedy_prefix_model(end_id):
    model = PrefixModel(4)
    python, compiled = greedy_both_ways(
        model.step,
        lambda: model.initial_state(4),
        np.array([0, 1, 2, 0]),
        3,
        end_id=end_id,
    )
    np.testing.assert_array_equal(compiled, python)


@pytest.mark.parametrize(
    "end_id",
    [np.int64(3), np.array(3), "tensor"],
    ids=["numpy-int64", "numpy-0d", "tensor-0d"],
)
def test_an_end_id_of_any_integer_kind(end_id):
    """A NumPy or tensor end id is the Python int it holds, in every loop
    (on TensorFlow an int64 one used to reach the int32 ids buffer)."""
    if isinstance(end_id, str):
        end_id = ops.convert_to_tensor(3, "int32")

    def step(ids, state):  # predicts ids + 1, up to 3
        return ops.one_hot(ops.minimum(ids + 1, 3), 4) * 10.0, state

    starts = np.array([0, 1])
    want = [[1, 2, 3, 3, 3], [2, 3, 3, 3, 3]]
    for jit_compile in (False, True):
        for decode in (greedy_search, sample):
            ids = decode(
                step, (), starts, 5, end_id=end_id, jit_compile=jit_compile
            )
            assert to_numpy(ids).tolist() == want, (decode, jit_compile)
        ids, _ = beam_search(
            step, (), starts, 5, 2, end_id=end_id, jit_compile=jit_compile
        )
        assert to_numpy(ids).tolist() == want, ("beam", jit_compile)


def test_greedy_attention_decoder():
    g = rng(3)
    embedding = keras.layers.Embedding(9, 6)
    layer = AttentionDecoder(
        keras.layers.LSTMCell(8), BahdanauAttention(8), flow="bahdanau"
    )
    head = keras.layers.Dense(9)
    encoded = g.normal(size=(2, 5, 8)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1] * 5], bool)
    head(layer(embedding(np.zeros((2, 1), "int32")), encoded))

    def step(ids, state):
        out, decoder_state, _ = layer.step(
            embedding(ids), state["decoder"], state["encoded"], state["mask"]
        )
        return head(out), {**state, "decoder": decoder_state}

    state = {
        "decoder": layer.get_initial_state(encoded, mask),
        "encoded": encoded,
        "mask": mask,
    }
    starts = np.array([1, 2], "int32")
    python, compiled = greedy_both_ways(step, lambda: state, starts, 6)
    np.testing.assert_array_equal(compiled, python)


def test_the_program_reads_the_current_weights():
    model = CachedTransformer(seed=2)
    starts = np.array([1, 4, 7], "int32")
    before, _ = cached_both_ways(model, starts, 6)
    kernel = model.head.kernel
    kernel.assign(to_numpy(kernel)[:, ::-1].astype("float32"))
    python, compiled = cached_both_ways(model, starts, 6)
    assert not np.array_equal(python, before)
    np.testing.assert_array_equal(compiled, python)


@pytest.mark.skipif(BACKEND == "torch", reason="PyTorch runs the loop eagerly")
def test_the_program_is_reused():
    model = PrefixModel(1)
    calls = []

    def step(ids, state):
        calls.append(1)
        return model.step(ids, state)

    clear_compiled_programs()
    starts = np.array([0, 1])
    first = greedy_search(
        step, model.initial_state(2), starts, 3, jit_compile=True
    )
    traced = len(calls)
    again = greedy_search(
        step, model.initial_state(2), starts, 3, jit_compile=True
    )
    assert len(calls) == traced  # no new trace, no eager check step
    np.testing.assert_array_equal(to_numpy(again), to_numpy(first))
    greedy_search(step, model.initial_state(2), starts, 2, jit_compile=True)
    assert len(calls) > traced  # a new length is a new program


@pytest.mark.parametrize(
    "new_state,received",
    [
        (
            lambda state, ids: ops.concatenate([state, ids[:, None]], 1),
            r"\(\(2, 1\), int32\) became \(\(2, 2\), int32\)",
        ),
        (
            lambda state, ids: ops.cast(state, "float32"),
            r"\(\(2, 1\), int32\) became \(\(2, 1\), float32\)",
        ),
        (lambda state, ids: [state, state], "became"),
    ],
)
def test_a_state_that_changes_is_refused(new_state, received):
    def step(ids, state):
        return ops.zeros((2, 5)), new_state(state, ids)

    state = np.zeros((2, 1), "int32")
    with pytest.raises(ValueError, match=r"^greedy_search: `jit_compile=True`"):
        greedy_search(step, state, [0, 0], 3, jit_compile=True)
    with pytest.raises(ValueError, match=received):
        sample(step, state, [0, 0], 3, jit_compile=True)


@pytest.mark.skipif(
    BACKEND != "torch", reason="counts the steps of the eager loop"
)
def test_the_loop_stops_when_every_row_has_ended():
    calls = []

    def step(ids, state):  # predicts ids + 1, up to 3 (the end id)
        calls.append(1)
        return ops.one_hot(ops.minimum(ids + 1, 3), 4) * 10.0, state

    ids = greedy_search(
        step, (), np.array([0, 1]), 6, end_id=3, jit_compile=True
    )
    assert to_numpy(ids).tolist() == [[1, 2, 3, 3, 3, 3], [2, 3, 3, 3, 3, 3]]
    assert len(calls) == 1 + 3  # the eager check step, then three steps


def test_a_replaced_layer_needs_clear_compiled_programs():
    model = CachedTransformer(seed=5)
    starts = np.array([1, 4, 7], "int32")
    before, _ = cached_both_ways(model, starts, 5)
    model.head = keras.layers.Dense(model.vocab)  # a new layer, new weights
    model.head.build((None, 16))
    clear_compiled_programs()
    python, compiled = cached_both_ways(model, starts, 5)
    np.testing.assert_array_equal(compiled, python)
    assert not np.array_equal(python, before)


def test_none_in_the_state_is_refused_clearly():
    def step(ids, state):
        return ops.zeros((2, 5)), state

    with pytest.raises(ValueError, match="None"):
        greedy_search(
            step, {"a": None, "b": np.zeros(2)}, [0, 0], 2, jit_compile=True
        )


@pytest.mark.parametrize(
    "end_id, alpha, beta",
    [(None, 0.0, 0.0), (0, 0.8, 0.0), (0, 0.6, 0.4), (None, 0.7, 0.5)],
)
def test_beam_search_compiled_equals_the_python_loop_exactly(
    end_id, alpha, beta
):
    """Four beams over five steps of a model whose logits and attention
    depend on the whole prefix (so pruning and reordering matter), read
    from tables, so the step computes the same logits both ways: the two
    loops drive one `beam_step` and give the same hypotheses, in the same
    order, with the same float32 scores, bit for bit."""
    model = PrefixModel(5)
    starts = np.array([0, 1, 2])
    options = dict(
        beam_width=4, end_id=end_id, length_penalty=alpha,
        coverage_penalty=beta,
    )  # fmt: skip
    (python, python_scores), (compiled, compiled_scores) = beam_both_ways(
        model.step, lambda: model.initial_state(3), starts, 5, **options
    )
    np.testing.assert_array_equal(compiled, python)
    np.testing.assert_array_equal(compiled_scores, python_scores)
    assert compiled.shape == (3, 4, 5) and compiled.dtype == "int32"
    assert compiled_scores.dtype == "float32"
    if end_id is not None:  # some beams ended early and were padded
        assert np.any(python[:, :, :-1] == end_id)
    for jit_compile in (False, True):  # the best beam alone
        best, score = beam_search(
            model.step, model.initial_state(3), starts, 5,
            jit_compile=jit_compile, **options,
        )  # fmt: skip
        np.testing.assert_array_equal(ops.convert_to_numpy(best), python[:, 0])
        np.testing.assert_array_equal(
            ops.convert_to_numpy(score), python_scores[:, 0]
        )


def test_beam_search_compiled_with_a_kv_cache():
    """A cached GQA + rotary decoder block with cross-attention: the cache
    rows are reordered with the beams inside the program, and the shared
    cache position is not tiled. The block's logits round differently
    inside XLA than eagerly, so the scores agree to float32 rounding."""
    model = CachedTransformer(seed=2)
    starts = np.array([1, 4, 7], "int32")
    (python, python_scores), (compiled, compiled_scores) = beam_both_ways(
        model.step,
        lambda: model.initial_state(6),
        starts,
        6,
        beam_width=3,
        end_id=2,
        length_penalty=0.6,
    )
    np.testing.assert_array_equal(compiled, python)
    np.testing.assert_allclose(compiled_scores, python_scores, rtol=1e-5)
    best, score = beam_search(
        model.step, model.initial_state(6), starts, 6, beam_width=3,
        end_id=2, length_penalty=0.6, jit_compile=True,
    )  # fmt: skip
    np.testing.assert_array_equal(to_numpy(best), python[:, 0])
    np.testing.assert_allclose(to_numpy(score), python_scores[:, 0], 1e-5)


def test_beam_search_compiled_refuses_what_the_python_loop_refuses():
    model = PrefixModel(0)

    def two_outputs(ids, state):
        return model.step(ids, state)[:2]

    with pytest.raises(ValueError, match="`coverage_penalty` needs"):
        beam_search(
            two_outputs, model.initial_state(2), np.array([0, 1]), 3,
            beam_width=2, coverage_penalty=0.5, jit_compile=True,
        )  # fmt: skip
    table = ops.zeros((2, V))  # per-example logits in the closure

    def untiled(ids, state):
        return table, state

    with pytest.raises(ValueError, match=r"B·K = 4 rows.*\(2, 3\)"):
        beam_search(
            untiled, model.initial_state(2), np.array([0, 1]), 3,
            beam_width=2, jit_compile=True,
        )  # fmt: skip


@pytest.mark.parametrize("kind", ["location", "monotonic"])
def test_beam_search_carries_the_attention_state(kind):
    """Attention with memory in a decoder: a beam as wide as every prefix
    (5 tokens, 3 steps, 25 beams) is exhaustive, so each beam's score must
    equal the teacher-forced log-probability of its tokens: a state not
    reordered with its beam would give another one. Compiled and Python
    loops agree, and greedy search too."""
    g = rng(4)
    vocab, steps = 5, 3
    embedding = keras.layers.Embedding(vocab, 4)
    attention = (
        ka.LocationSensitiveAttention(6, filters=2, kernel_size=3)
        if kind == "location"
        else ka.MonotonicAttention(score="luong", score_bias_init=1.0)
    )
    layer = AttentionDecoder(keras.layers.GRUCell(6), attention)
    head = keras.layers.Dense(vocab)
    encoded = g.normal(size=(2, 4, 6)).astype("float32")
    mask = np.array([[1, 1, 1, 0], [1] * 4], bool)
    head(layer(embedding(np.zeros((2, 1), "int32")), encoded))

    def step(ids, state):
        out, decoder_state, alignment = layer.step(
            embedding(ids), state["decoder"], state["encoded"], state["mask"]
        )
        return head(out), {**state, "decoder": decoder_state}, alignment

    def initial_state():
        return {
            "decoder": layer.get_initial_state(encoded, mask),
            "encoded": encoded,
            "mask": mask,
        }

    starts = np.array([1, 2], "int32")
    (python, python_scores), (compiled, compiled_scores) = beam_both_ways(
        step, initial_state, starts, steps, beam_width=vocab ** (steps - 1)
    )
    np.testing.assert_array_equal(compiled, python)
    np.testing.assert_allclose(compiled_scores, python_scores, atol=1e-5)
    # Teacher forcing: every beam of each example in one batch.
    beams = python.reshape(-1, steps).astype("int32")  # (B·K, L)
    inputs = np.concatenate([np.repeat(starts, 25)[:, None], beams], 1)
    logits = head(
        layer(
            embedding(inputs[:, :-1]),
            np.repeat(encoded, 25, axis=0),
            encoder_padding_mask=np.repeat(mask, 25, axis=0),
        )
    )
    logits = to_numpy(logits).astype("float64")  # (B·K, L, V)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    chosen = np.take_along_axis(log_probs, beams[..., None], -1)[..., 0]
    np.testing.assert_allclose(
        chosen.sum(-1).reshape(2, 25), python_scores, atol=1e-4
    )
    greedy, compiled_greedy = greedy_both_ways(
        step, initial_state, starts, steps
    )
    np.testing.assert_array_equal(compiled_greedy, greedy)
    greedy = greedy.astype("int32")
    inputs = np.concatenate([starts[:, None], greedy[:, :-1]], axis=1)
    logits = head(layer(embedding(inputs), encoded, encoder_padding_mask=mask))
    np.testing.assert_array_equal(np.argmax(to_numpy(logits), -1), greedy)
    # Sampling carries the state too: one token left is greedy search.
    for jit_compile in (False, True):
        sampled = sample(
            step,
            initial_state(),
            starts,
            steps,
            seed=3,
            jit_compile=jit_compile,
            top_k=1,
        )
        np.testing.assert_array_equal(to_numpy(sampled), greedy)
