"""The whole decoding loop as one compiled program (`jit_compile=True`).

`greedy_search` and `sample` run the loop in Python by default, which
accepts any step function, including one whose state grows. With
`jit_compile=True` the loop becomes an `ops.while_loop` compiled as a
whole (`jax.jit`, `tf.function(jit_compile=True)`), so a step costs its
arithmetic and no per-step dispatch. PyTorch has no such compiler for
Keras code; there the same loop runs eagerly.

What the loop needs from the step function: a state that keeps its
structure, shapes and dtypes from step to step, and Keras ops only (it is
traced). One eager step checks the first and is run whenever a new
program is built.

Two things are threaded through the loop explicitly rather than read
from Python objects while tracing:

* on JAX, the values of the Keras variables the step function reads (found
  by that eager step), so that a program never holds stale weights;
* the sampling seed's state, so that the compiled loop draws exactly the
  tokens the Python loop draws for the same `SeedGenerator`.
"""

import collections

import keras
import numpy as np
from keras import ops

from keras_attention._kernels import runtime

_PROGRAMS = collections.OrderedDict()
_MAX_PROGRAMS = 8  # programs kept, least recently used dropped first
_LOOP_SEED = []  # the SeedGenerator the compiled samplers draw from


def clear():
    """Forgets every compiled program (and the step functions they hold);
    returns how many there were."""
    count = len(_PROGRAMS)
    _PROGRAMS.clear()
    return count


def loop_seed_generator():
    """The generator compiled samplers draw from (its state is mapped to
    the caller's seed state inside the loop)."""
    if not _LOOP_SEED:
        _LOOP_SEED.append(keras.random.SeedGenerator(0, name="decoding_loop"))
    return _LOOP_SEED[0]


def call_step(step_fn, tokens, state):
    """`step_fn(tokens, state)` as `(logits, state, attention or None)`,
    with its results checked."""
    result = step_fn(ops.convert_to_tensor(tokens, "int32"), state)
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise ValueError(
            "decoding: `step_fn` must return (logits, state) or "
            f"(logits, state, attention). Received: {type(result).__name__} "
            f"of length {len(result) if isinstance(result, tuple) else 1}"
        )
    logits, state = result[0], result[1]
    if len(logits.shape) != 2:
        raise ValueError(
            "decoding: `step_fn` logits must be (B, V). "
            f"Received: logits.shape={tuple(logits.shape)}"
        )
    return logits, state, result[2] if len(result) == 3 else None


def is_shared(leaf) -> bool:
    """A state leaf without a batch axis (a Python number, a scalar tensor
    such as a cache position): shared by all rows, never tiled."""
    return not hasattr(leaf, "shape") or len(leaf.shape) == 0


def decode(
    name, step_fn, state, start_ids, max_length, end_id, choose, key, seed
):
    """Runs `max_length` steps of `choose(step_fn(...))` as one program.

    Args:
        name: the public function, for error messages.
        step_fn, state, start_ids, max_length, end_id: as in
            `greedy_search`.
        choose: `(logits, step) -> ids (B,)`, drawing from
            `loop_seed_generator()` if it samples.
        key: hashable description of `choose` (its parameters).
        seed: the caller's `SeedGenerator`, or `None`. Its state advances
            as the Python loop's would.

    Returns:
        Int32 tensor `(B, max_length)`.
    """
    tokens, state = _tensors(name, start_ids, state)

    def build(variables, logits, attention):
        return _build(step_fn, max_length, end_id, choose, variables)

    program = _program(
        name, step_fn, state, tokens, (max_length, end_id, key), build
    )
    loop_seed = loop_seed_generator()
    seed_state = (seed if seed is not None else loop_seed).state.value
    ids, seed_state = program(seed_state, state, tokens)
    if seed is not None:
        seed.state.assign(seed_state)
    return ids


def beam_decode(
    step_fn,
    state,
    start_ids,
    max_length,
    beam_width,
    end_id,
    length_penalty,
    coverage_penalty,
):
    """`beam_search`'s loop as one program, on a state already tiled to
    `B·K` rows and `start_ids` `(B·K,)`.

    Returns:
        `(sequences, scores)`, int32 `(B, K, max_length)` and float32
        `(B, K)`, best beam first.
    """
    name = "beam_search"
    tokens, state = _tensors(name, start_ids, state)
    options = (max_length, beam_width, end_id, length_penalty,
               coverage_penalty)  # fmt: skip

    def build(variables, logits, attention):
        if logits[0][0] != tokens.shape[0]:
            raise ValueError(
                "beam_search: `step_fn` must return logits for the B·K = "
                f"{tokens.shape[0]} rows of the tiled state; keep "
                "per-example tensors in `state`, not in the closure. "
                f"Received: logits.shape={logits[0]}"
            )
        if coverage_penalty and attention is None:
            raise ValueError(
                "beam_search: `coverage_penalty` needs a `step_fn` that "
                "returns `(logits, state, attention)`. Received: a "
                "step_fn returning 2 values"
            )
        source_length = attention[0][-1] if coverage_penalty else None
        return _build_beam(step_fn, options, variables, source_length)

    program = _program(name, step_fn, state, tokens, ("beam", options), build)
    return program(state, tokens)


def _tensors(name, start_ids, state):
    tokens = ops.cast(ops.convert_to_tensor(start_ids), "int32")
    if any(leaf is None for leaf in keras.tree.flatten(state)):
        raise ValueError(
            f"{name}: `jit_compile=True` needs a state of tensors; leave out "
            "the `None` entries (or use `jit_compile=False`). Received: "
            f"state with None leaves: {state!r:.200}"
        )
    return tokens, keras.tree.map_structure(ops.convert_to_tensor, state)


def _program(name, step_fn, state, tokens, options, build):
    """The program kept for this step function, options and input specs,
    built by `build(variables, logits_spec, attention_spec)` when there
    is none."""
    signature = (keras.tree.map_structure(_spec, state), _spec(tokens))
    cache_key = (step_fn, options, repr(signature))
    program = _PROGRAMS.get(cache_key)
    if program is None:
        program = build(*_check_step(name, step_fn, state, tokens))
        _PROGRAMS[cache_key] = program
        while len(_PROGRAMS) > _MAX_PROGRAMS:
            _PROGRAMS.popitem(last=False)
    _PROGRAMS.move_to_end(cache_key)
    return program


def _spec(tensor):
    return (tuple(tensor.shape), keras.backend.standardize_dtype(tensor.dtype))


class _ReadRecorder(keras.StatelessScope):
    """Notes every Keras variable read inside it (and changes nothing)."""

    def __init__(self):
        super().__init__()
        self.read = {}

    def get_current_value(self, variable):
        self.read.setdefault(id(variable), variable)
        return None


def _check_step(name, step_fn, state, tokens):
    """One eager step: the state must keep its structure, shapes and
    dtypes. Returns the Keras variables the step reads (they become
    arguments of the JAX program) and the specs of the logits and of the
    attention it returns (`None` if it returns none)."""
    with _ReadRecorder() as recorder:
        logits, new_state, attention = call_step(step_fn, tokens, state)
    before = keras.tree.map_structure(_spec, state)
    try:
        after = keras.tree.map_structure(
            lambda x: _spec(ops.convert_to_tensor(x)), new_state
        )
        keras.tree.assert_same_structure(before, after)
        same = keras.tree.flatten(before) == keras.tree.flatten(after)
    except (ValueError, TypeError):
        same, after = False, new_state
    if not same:
        raise ValueError(
            f"{name}: `jit_compile=True` needs a step function whose state "
            "keeps its structure, shapes and dtypes from step to step (a "
            "fixed-size KV cache, not a growing sequence); run it with "
            "`jit_compile=False`. Received: state "
            f"{_describe(before)} became {_describe(after)}"
        )
    attention = None if attention is None else _spec(attention)
    return list(recorder.read.values()), _spec(logits), attention


def _describe(specs):
    return str(specs).replace("'", "")


def _build(step_fn, max_length, end_id, choose, variables):
    seed_variable = loop_seed_generator().state
    mapped = variables if runtime.programs_take_variables() else []

    def run(values, seed_state, state, tokens):
        batch = ops.shape(tokens)[0]
        fill = 0 if end_id is None else end_id
        ids = ops.full((batch, max_length), fill, "int32")
        finished = ops.zeros_like(tokens, "bool")

        def cond(step, tokens, finished, ids, state, seed_state):
            going = ops.less(step, max_length)
            if end_id is not None:
                going = ops.logical_and(
                    going, ops.logical_not(ops.all(finished))
                )
            return going

        def body(step, tokens, finished, ids, state, seed_state):
            mapping = [*zip(mapped, values, strict=True)]
            mapping.append((seed_variable, seed_state))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                logits, state, _ = call_step(step_fn, tokens, state)
                tokens = ops.cast(choose(logits, step), "int32")
                seed_state = scope.get_current_value(seed_variable)
            if end_id is not None:
                tokens = ops.where(finished, end_id, tokens)
                finished = ops.logical_or(finished, ops.equal(tokens, end_id))
            ids = ops.slice_update(ids, (0, step), tokens[:, None])
            return step + 1, tokens, finished, ids, state, seed_state

        start = ops.convert_to_tensor(0, "int32")
        loop_vars = (start, tokens, finished, ids, state, seed_state)
        result = ops.while_loop(cond, body, loop_vars, max_length)
        return result[3], result[5]

    compiled = runtime.compile_function(run)

    def program(seed_state, state, tokens):
        values = [variable.value for variable in mapped]
        return compiled(values, seed_state, state, tokens)

    return program


def _build_beam(step_fn, options, variables, source_length):
    """The beam-search program: the host loop of `beam_search` in
    `keras.ops`, scores in float32, inside one `ops.while_loop`."""
    max_length, beams, end_id, alpha, beta = options
    mapped = variables if runtime.programs_take_variables() else []
    fill = 0 if end_id is None else end_id

    def run(values, state, tokens):
        batch = tokens.shape[0] // beams
        rows = ops.arange(batch)[:, None]  # (B, 1)
        # All beams start equal: only the first is expanded.
        first = ops.arange(beams) == 0
        totals = ops.tile(ops.where(first, 0.0, -np.inf)[None], (batch, 1))
        lengths = ops.zeros((batch, beams), "int32")
        finished = ops.zeros((batch, beams), "bool")
        coverage = ops.zeros((batch, beams, source_length or 1), "float32")
        sequences = ops.full((batch, beams, max_length), fill, "int32")

        def cond(step, tokens, totals, lengths, finished, *rest):
            going = step < max_length
            if end_id is not None:
                going = ops.logical_and(
                    going, ops.logical_not(ops.all(finished))
                )
            return going

        def body(step, tokens, totals, lengths, finished, coverage,
                 sequences, state):  # fmt: skip
            with keras.StatelessScope(
                state_mapping=[*zip(mapped, values, strict=True)]
            ):
                logits, state, attention = call_step(step_fn, tokens, state)
            log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
            log_probs = ops.reshape(log_probs, (batch, beams, -1))  # (B,K,V)
            vocab = log_probs.shape[-1]
            if end_id is not None:
                # A finished beam only repeats the end id, at no cost.
                only_end = ops.where(ops.arange(vocab) == end_id, 0.0, -np.inf)
                log_probs = ops.where(finished[..., None], only_end, log_probs)
            grown = ops.where(finished, lengths, lengths + 1)  # (B, K)
            if beta:
                attention = ops.reshape(
                    ops.cast(attention, "float32"), (batch, beams, -1)
                )  # (B, K, S)
                coverage = coverage + ops.where(
                    finished[..., None], 0.0, attention
                )
            candidates = totals[..., None] + log_probs  # (B, K, V)
            scores = (
                candidates
                / length_penalty(ops.cast(grown, "float32"), alpha)[..., None]
            )
            if beta:
                scores = scores + beta * coverage_score(coverage)[..., None]
            best = ops.top_k(ops.reshape(scores, (batch, -1)), beams)[1]
            best = ops.cast(best, "int32")  # (B, K)
            parent, token = best // vocab, best % vocab  # (B, K)
            totals = ops.take_along_axis(
                ops.reshape(candidates, (batch, -1)), best, axis=1
            )
            lengths = ops.take_along_axis(grown, parent, axis=1)
            finished = ops.take_along_axis(finished, parent, axis=1)
            if end_id is not None:
                finished = ops.logical_or(finished, token == end_id)
            order = ops.reshape(rows * beams + parent, (-1,))  # (B·K,)
            if beta:
                coverage = _take_beams(coverage, order)  # (B, K, S)
            sequences = ops.slice_update(
                _take_beams(sequences, order), (0, 0, step), token[..., None]
            )  # (B, K, L)
            state = keras.tree.map_structure(
                lambda x: x if is_shared(x) else ops.take(x, order, 0), state
            )
            tokens = ops.cast(ops.reshape(token, (-1,)), "int32")
            return (step + 1, tokens, totals, lengths, finished, coverage,
                    sequences, state)  # fmt: skip

        loop_vars = (ops.convert_to_tensor(0, "int32"), tokens, totals,
                     lengths, finished, coverage, sequences, state)  # fmt: skip
        result = ops.while_loop(cond, body, loop_vars, max_length)
        totals, lengths, coverage, sequences = (result[i] for i in (2, 3, 5, 6))
        final = totals / length_penalty(ops.cast(lengths, "float32"), alpha)
        if beta:
            final = final + beta * coverage_score(coverage)
        final, ranking = ops.top_k(final, beams)  # best first, stable
        ranking = ops.cast(ranking, "int32")
        order = ops.reshape(rows * beams + ranking, (-1,))
        return _take_beams(sequences, order), final

    compiled = runtime.compile_function(run)

    def program(state, tokens):
        return compiled([v.value for v in mapped], state, tokens)

    return program


def _take_beams(tensor, order):
    """`(B, K, ...)` with its `B·K` rows taken in `order` `(B·K,)`."""
    shape = tensor.shape
    rows = ops.take(ops.reshape(tensor, (-1, *shape[2:])), order, axis=0)
    return ops.reshape(rows, shape)


def length_penalty(lengths, alpha):
    """GNMT's `((5 + |Y|) / 6) ** alpha` on NumPy arrays (the Python loop,
    in float64) or float tensors (the compiled loop); exactly 1 for
    `alpha = 0`."""
    return ((5.0 + lengths) ** alpha) / (6.0**alpha)


def coverage_score(coverage, xp=ops):
    """`Σ_i log min(coverage_i, 1)` over attended source positions, with
    `xp` `numpy` (the Python loop) or `keras.ops` (the compiled loop)."""
    clipped = xp.minimum(xp.where(coverage > 0, coverage, 1.0), 1.0)
    return xp.sum(xp.log(clipped), axis=-1)
