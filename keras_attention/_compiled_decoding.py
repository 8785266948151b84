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
    from keras_attention.decoding import _call

    tokens = ops.cast(ops.convert_to_tensor(start_ids), "int32")
    if any(leaf is None for leaf in keras.tree.flatten(state)):
        raise ValueError(
            f"{name}: `jit_compile=True` needs a state of tensors; leave out "
            "the `None` entries (or use `jit_compile=False`). Received: "
            f"state with None leaves: {state!r:.200}"
        )
    state = keras.tree.map_structure(ops.convert_to_tensor, state)
    signature = (
        keras.tree.map_structure(_spec, state),
        _spec(tokens),
    )
    cache_key = (step_fn, max_length, end_id, key, repr(signature))
    program = _PROGRAMS.get(cache_key)
    if program is None:
        variables = _check_step(name, step_fn, state, tokens, _call)
        program = _build(step_fn, max_length, end_id, choose, variables, _call)
        _PROGRAMS[cache_key] = program
        while len(_PROGRAMS) > _MAX_PROGRAMS:
            _PROGRAMS.popitem(last=False)
    _PROGRAMS.move_to_end(cache_key)
    loop_seed = loop_seed_generator()
    seed_state = (seed if seed is not None else loop_seed).state.value
    ids, seed_state = program(seed_state, state, tokens)
    if seed is not None:
        seed.state.assign(seed_state)
    return ids


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


def _check_step(name, step_fn, state, tokens, call):
    """One eager step: the state must keep its structure, shapes and
    dtypes. Returns the Keras variables the step reads (they become
    arguments of the JAX program)."""
    with _ReadRecorder() as recorder:
        _, new_state, _ = call(step_fn, tokens, state)
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
    return list(recorder.read.values())


def _describe(specs):
    return str(specs).replace("'", "")


def _build(step_fn, max_length, end_id, choose, variables, call):
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
                logits, state, _ = call(step_fn, tokens, state)
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
