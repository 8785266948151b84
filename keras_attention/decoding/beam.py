"""Beam search: one `beam_step` in `keras.ops` and the two loops that
drive it, in Python (any step function) and as one compiled
`ops.while_loop` (`jit_compile=True`). Both run the same float32
arithmetic on the same tensors, so they keep the same hypotheses and
give the same scores.

Shape legend: B batch, K beams, V vocabulary, L `max_length`, S source.
"""

import functools
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from keras_attention._core.checks import check_flag
from keras_attention._core.checks import finite_number
from keras_attention._core.checks import positive_integer
from keras_attention._kernels import runtime
from keras_attention.decoding import _compiled
from keras_attention.decoding._common import call_step
from keras_attention.decoding._common import check_batch_major
from keras_attention.decoding._common import check_end_id
from keras_attention.decoding._common import check_max_length
from keras_attention.decoding._common import check_start_ids
from keras_attention.decoding._common import check_step_fn
from keras_attention.decoding._common import coverage_score
from keras_attention.decoding._common import is_shared
from keras_attention.decoding._common import length_penalty as penalty
from keras_attention.decoding._common import without_gradients


class Beams(NamedTuple):
    """The hypotheses of a search, `K` per example, in `(B, K, ...)`."""

    totals: object  # (B, K) float32, log P(Y | X)
    lengths: object  # (B, K) int32, |Y| up to and including end_id
    finished: object  # (B, K) bool, produced end_id at an earlier step
    coverage: object  # (B, K, S) float32, Σ_j p_ij (S = 1 without β)
    sequences: object  # (B, K, L) int32, end_id (or 0) past the step


@without_gradients
def beam_search(
    step_fn,
    state,
    start_ids,
    max_length: int,
    beam_width: int,
    end_id=None,
    length_penalty: float = 0.0,
    coverage_penalty: float = 0.0,
    return_all_beams: bool = False,
    *,
    jit_compile: bool = False,
):
    """Keeps the `beam_width` best partial sequences at every step.

    Hypotheses are ranked by the GNMT score (Wu et al., 2016):

    $$
    \\begin{gathered}
    s(Y, X) = \\frac{\\log P(Y \\mid X)}{lp(Y)}
    + \\mathbf{1}[Y \\text{ ended}] \\, cp(X; Y),\\\\
    lp(Y) = \\frac{(5 + |Y|)^\\alpha}{6^\\alpha}, \\quad
    cp(X; Y) = \\beta \\sum_{i} \\log \\min\\Big(\\sum_j p_{i,j}, 1\\Big)
    \\end{gathered}
    $$

    with $\\alpha$ = `length_penalty`, $\\beta$ = `coverage_penalty`, $|Y|$
    the length up to and including `end_id`, and $p_{i,j}$ the attention
    of target step $j$ on source position $i$ (source positions that never
    received attention, such as padding, are left out of the sum). As in
    tensorflow-addons' beam search, the coverage penalty ranks ended
    hypotheses: from the step after a hypothesis produces `end_id` it
    competes with $cp$ added, while live hypotheses compete on their
    normalised log-probability. The returned hypotheses (ended, or live
    at `max_length`) are ranked and scored with both penalties. The state is
    tiled to `B·K` rows and reordered after every step by the library.

    Args:
        step_fn (Callable): `(token_ids, state) -> (logits, state[, attn])`;
            `attn` `(B·K, S)` (or `(B·K, 1, S)`) is required when
            `coverage_penalty > 0`.
        state (Any): A nested structure of batch-major tensors `(B, ...)`.
            Every leaf with a leading axis must have `B` rows: it is tiled to
            `B·K` rows and reordered with the beams. Leaves of rank 0 and
            Python numbers are shared by all beams. Tables that every
            example shares belong in `step_fn`'s closure, not here.
        start_ids (Tensor): Shape `(B,)`, integer.
        max_length: Maximum number of tokens to generate.
        beam_width: K.
        end_id (int | None): Ends a hypothesis; it keeps its score and is
            padded with `end_id`.
        length_penalty: $\\alpha$; 0 disables it. Defaults to `0.0`.
        coverage_penalty: $\\beta$; 0 disables it. Defaults to `0.0`.
        return_all_beams: Return every beam, best first.
        jit_compile: Run the whole search as one compiled program,
            as in `greedy_search`. Both loops drive the same float32 step
            (the Python loop runs it as a small compiled program of its
            own on JAX and TensorFlow, built once per input shape), so
            they keep the same hypotheses, in the same order, with the
            same scores, for a step function that computes the same
            logits both ways. Finished beams stay in their slots and only
            repeat `end_id`; the loop ends when every beam has finished.
            Defaults to `False`.

    Returns:
        tuple[Tensor, Tensor]: `(sequences, scores)`, int32 `(B, L)` and
            float32 `(B,)` for the best hypothesis, or `(B, K, L)` and
            `(B, K)` with `return_all_beams=True`. `L` is `max_length`.

    Examples:
        >>> import keras
        >>> import numpy as np

        A bigram model: greedy takes the likelier first token (1) and ends
        with p = 0.5 · 0.34; the beam finds 2, 0 with p = 0.4 · 0.9.

        >>> table = keras.ops.log(keras.ops.convert_to_tensor(
        ...     [[0.1, 0.5, 0.4], [0.34, 0.33, 0.33], [0.9, 0.05, 0.05]]))
        >>> def step_fn(ids, state):
        ...     return keras.ops.take(table, ids, axis=0), state
        >>> ids, score = beam_search(step_fn, (), np.array([0]), 2,
        ...                          beam_width=2)
        >>> print(keras.ops.convert_to_numpy(ids))
        [[2 0]]
        >>> print(keras.ops.convert_to_numpy(
        ...     greedy_search(step_fn, (), np.array([0]), 2)))
        [[1 0]]
    """
    check_step_fn("beam_search", step_fn)
    max_length = check_max_length("beam_search", max_length)
    beam_width = positive_integer("beam_search", "beam_width", beam_width)
    length_penalty = finite_number(
        "beam_search", "length_penalty", length_penalty
    )
    coverage_penalty = finite_number(
        "beam_search", "coverage_penalty", coverage_penalty
    )
    check_flag("beam_search", "return_all_beams", return_all_beams)
    start = check_start_ids("beam_search", start_ids)
    end_id = check_end_id("beam_search", end_id)
    check_batch_major("beam_search", state, start.shape[0])
    state = keras.tree.map_structure(
        lambda x: x if is_shared(x) else ops.repeat(x, beam_width, axis=0),
        state,
    )  # (B·K, ...)
    tokens = np.repeat(start, beam_width)  # (B·K,)
    # Traced values, not constants, in both loops: one program serves every
    # α and β, and both loops compute the penalties alike.
    alpha = ops.convert_to_tensor(length_penalty, "float32")
    beta = None
    if coverage_penalty:
        beta = ops.convert_to_tensor(coverage_penalty, "float32")
    loop = _compiled_loop if jit_compile else _python_loop
    sequences, scores = loop(
        step_fn, state, tokens, max_length, beam_width, end_id, alpha, beta
    )  # (B, K, L), (B, K)
    if not return_all_beams:
        sequences, scores = sequences[:, 0], scores[:, 0]
    return sequences, scores


def beam_step(beams, logits, attention, step, alpha, beta, end_id):
    """Grows every hypothesis by one token and keeps the `K` best.

    Args:
        beams: `Beams` before the step.
        logits: `(B·K, V)`, the step function's logits for the beams.
        attention: `(B·K, S)` or `(B·K, 1, S)`, its alignment (read only
            with a `beta`).
        step: the index of the token produced (an int or int32 tensor).
        alpha: the length penalty α, a float32 scalar.
        beta: the coverage penalty β, a float32 scalar, or `None` for none.
        end_id: as in `beam_search`.

    Returns:
        `(beams, order, tokens)`: the kept hypotheses, the row `(B·K,)`
        each came from (to reorder the state with) and its new token
        `(B·K,)`, the step function's next input.
    """
    batch, width = beams.totals.shape
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    log_probs = ops.reshape(log_probs, (batch, width, -1))  # (B, K, V)
    vocab = log_probs.shape[-1]
    finished, coverage = beams.finished, beams.coverage
    if end_id is not None:
        # An ended hypothesis only repeats the end id, at no cost.
        only_end = ops.where(ops.arange(vocab) == end_id, 0.0, -np.inf)
        log_probs = ops.where(finished[..., None], only_end, log_probs)
    grown = ops.where(finished, beams.lengths, beams.lengths + 1)  # (B, K)
    candidates = beams.totals[..., None] + log_probs  # (B, K, V)
    scores = candidates / penalty(grown, alpha)[..., None]  # (B, K, V)
    if beta is not None:
        attention = ops.reshape(ops.cast(attention, "float32"), coverage.shape)
        coverage = coverage + ops.where(finished[..., None], 0.0, attention)
        # Coverage ranks ended hypotheses only (Wu et al.; tensorflow-addons).
        ended = ops.where(finished, beta * coverage_score(coverage), 0.0)
        scores = scores + ended[..., None]
    best = runtime.top_k(ops.reshape(scores, (batch, width * vocab)), width)[1]
    best = ops.cast(best, "int32")  # (B, K), into the flat candidates
    parent, token = best // vocab, best % vocab  # (B, K)
    order = ops.reshape(ops.arange(batch)[:, None] * width + parent, (-1,))
    flat = ops.reshape(candidates, (batch, width * vocab))
    finished = ops.take_along_axis(finished, parent, axis=1)
    if end_id is not None:
        finished = ops.logical_or(finished, ops.equal(token, end_id))
    sequences = _take_beams(beams.sequences, order)  # (B, K, L)
    beams = Beams(
        totals=ops.take_along_axis(flat, best, axis=1),
        lengths=ops.take_along_axis(grown, parent, axis=1),
        finished=finished,
        coverage=coverage if beta is None else _take_beams(coverage, order),
        sequences=ops.slice_update(sequences, (0, 0, step), token[..., None]),
    )
    return beams, order, ops.reshape(token, (-1,))


def _initial_beams(batch, width, max_length, end_id, source_length):
    """`width` empty hypotheses per example; all but the first start at
    `log P = -inf`, so the first step expands one of the equal beams."""
    first = ops.arange(width) == 0
    totals = ops.where(first, 0.0, -np.inf)[None]  # (1, K)
    fill = 0 if end_id is None else end_id
    return Beams(
        totals=ops.cast(ops.tile(totals, (batch, 1)), "float32"),
        lengths=ops.zeros((batch, width), "int32"),
        finished=ops.zeros((batch, width), "bool"),
        coverage=ops.zeros((batch, width, source_length), "float32"),
        sequences=ops.full((batch, width, max_length), fill, "int32"),
    )


def _final_beams(beams, alpha, beta):
    """Every hypothesis scored with both penalties, best first:
    `(sequences, scores)`, `(B, K, L)` and `(B, K)`."""
    batch, width = beams.totals.shape
    scores = beams.totals / penalty(beams.lengths, alpha)  # (B, K)
    if beta is not None:
        scores = scores + beta * coverage_score(beams.coverage)
    scores, ranking = runtime.top_k(scores, width)  # best first
    order = ops.arange(batch)[:, None] * width + ops.cast(ranking, "int32")
    return _take_beams(beams.sequences, ops.reshape(order, (-1,))), scores


def _python_loop(
    step_fn, state, tokens, max_length, width, end_id, alpha, beta
):
    """`beam_step` after each call of `step_fn`, in Python. The step and
    the final ranking run as the compiled loop runs them (one XLA program
    each, on JAX and TensorFlow), so that they round alike."""
    step_program, final_program = _programs(end_id)
    beams = None
    for step in range(max_length):
        logits, state, attention = call_step(
            "beam_search", step_fn, tokens, state, end_id
        )
        flat = tokens.shape[0]
        _check_attention(attention, flat, beta)
        if beams is None:
            source = 1 if beta is None else attention.shape[-1]
            beams = _initial_beams(
                flat // width, width, max_length, end_id, source
            )
        index = ops.convert_to_tensor(step, "int32")  # one program for all
        beams, order, tokens = step_program(
            beams, logits, attention, index, alpha, beta
        )
        state = _reorder(state, order)
        if end_id is not None and bool(
            ops.convert_to_numpy(ops.all(beams.finished))
        ):
            break
    return final_program(beams, alpha, beta)


@functools.lru_cache(maxsize=16)
def _programs(end_id):
    """`beam_step` and `_final_beams` for this `end_id`, each compiled."""

    def step_program(beams, logits, attention, step, alpha, beta):
        return beam_step(
            Beams(*beams), logits, attention, step, alpha, beta, end_id
        )

    def final_program(beams, alpha, beta):
        return _final_beams(Beams(*beams), alpha, beta)

    return (
        runtime.compile_function(step_program),
        runtime.compile_function(final_program),
    )


def _compiled_loop(
    step_fn, state, tokens, max_length, width, end_id, alpha, beta
):
    """The same steps inside one compiled `ops.while_loop`."""
    flat = tokens.shape[0]

    def build(variables, logits, attention):
        _check_attention(
            None if attention is None else attention[0], flat, beta
        )
        source = 1 if beta is None else attention[0][-1]
        return _build(step_fn, variables, max_length, width, end_id, source)

    key = ("beam", max_length, width, end_id, beta is None)
    program, state, tokens = _compiled.program(
        "beam_search", step_fn, state, tokens, key, build, end_id
    )
    return program(state, tokens, alpha, beta)


def _build(step_fn, variables, max_length, width, end_id, source_length):
    taken = _compiled.taken_variables(variables)

    def cond(step, tokens, beams, state):
        going = ops.less(step, max_length)
        if end_id is not None:
            finished = ops.all(beams.finished)
            going = ops.logical_and(going, ops.logical_not(finished))
        return going

    def run(values, state, tokens, alpha, beta):
        def body(step, tokens, beams, state):
            with _compiled.reading(taken, values):
                logits, state, attention = call_step(
                    "beam_search", step_fn, tokens, state, end_id
                )
            beams, order, tokens = beam_step(
                beams, logits, attention, step, alpha, beta, end_id
            )
            return step + 1, tokens, beams, _reorder(state, order)

        batch = tokens.shape[0] // width
        beams = _initial_beams(batch, width, max_length, end_id, source_length)
        start = ops.convert_to_tensor(0, "int32")
        loop_vars = (start, tokens, beams, state)
        beams = ops.while_loop(cond, body, loop_vars, max_length)[2]
        return _final_beams(Beams(*beams), alpha, beta)

    return _compiled.compile_program(run, taken)


def _check_attention(attention, flat, beta):
    """With a `beta`, the step function returns an attention `(B·K, S)`
    (or its shape, from the compiled loop's check step)."""
    if beta is None:
        return
    if attention is None:
        raise ValueError(
            "beam_search: `coverage_penalty` needs a `step_fn` that "
            "returns `(logits, state, attention)`. Received: a "
            "step_fn returning 2 values"
        )
    shape = tuple(getattr(attention, "shape", attention))
    if (
        len(shape) < 2
        or shape[0] not in (None, flat)
        or any(dim != 1 for dim in shape[1:-1])
    ):
        raise ValueError(
            "beam_search: with `coverage_penalty`, `step_fn` must return "
            f"an attention (B·K, S) over the source (or (B·K, 1, S)) for "
            f"each of the {flat} rows it is given. "
            f"Received: attention.shape={shape}"
        )


def _reorder(state, order):
    """The tiled state `(B·K, ...)` in the rows of `order` `(B·K,)`."""
    return keras.tree.map_structure(
        lambda x: x if is_shared(x) else ops.take(x, order, axis=0), state
    )


def _take_beams(tensor, order):
    """`(B, K, ...)` with its `B·K` rows taken in `order` `(B·K,)`."""
    shape = tensor.shape
    rows = ops.take(ops.reshape(tensor, (-1, *shape[2:])), order, axis=0)
    return ops.reshape(rows, shape)
