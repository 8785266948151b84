"""Decoding loops as compiled programs (`jit_compile=True`): the programs
kept, the eager check step that builds one, and what a program threads
through its loop.

The decoding functions run their loop in Python by default, which accepts
any step function, including one whose state grows. With
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
from keras_attention.decoding._common import call_step

_PROGRAMS = collections.OrderedDict()
_MAX_PROGRAMS = 8  # programs kept, least recently used dropped first
_LOOP_SEED = []  # the SeedGenerator the compiled samplers draw from


def clear_compiled_programs():
    """Forgets the programs kept by `jit_compile=True`.

    A program belongs to one step function object and reads the Keras
    variables that function read when the program was built. Call this
    after replacing a layer the step function reaches (a new head, a
    rebuilt model behind the same function), or to release the models the
    kept programs hold (up to 8 programs are kept).

    Returns:
        int: The number of programs forgotten.

    Examples:
        >>> clear_compiled_programs() >= 0
        True
    """
    count = len(_PROGRAMS)
    _PROGRAMS.clear()
    return count


def loop_seed_generator():
    """The generator compiled samplers draw from (its state is mapped to
    the caller's seed state inside the loop)."""
    if not _LOOP_SEED:
        _LOOP_SEED.append(keras.random.SeedGenerator(0, name="decoding_loop"))
    return _LOOP_SEED[0]


def program(name, step_fn, state, start_ids, options, build, end_id):
    """The program kept for this step function, options and input specs.

    Args:
        name: the public function, for error messages.
        step_fn, state, start_ids: as given to it (`state` and `start_ids`
            as the loop starts: tiled, for beam search).
        options: hashable description of everything else the program
            depends on (`max_length`, `end_id`, the sampler, ...).
        build: `build(variables, logits_spec, attention_spec)` makes the
            program when there is none: `variables` are the Keras
            variables the step function read in the eager check step, a
            spec is `(shape, dtype)` (`None` for a missing attention).
        end_id: the checked `end_id`, or `None`.

    Returns:
        `(program, state, tokens)`: the program and its tensor inputs.
    """
    tokens, state = _tensors(name, start_ids, state)
    signature = (keras.tree.map_structure(_spec, state), _spec(tokens))
    cache_key = (step_fn, options, repr(signature))
    kept = _PROGRAMS.get(cache_key)
    if kept is None:
        kept = build(*_check_step(name, step_fn, state, tokens, end_id))
        _PROGRAMS[cache_key] = kept
        while len(_PROGRAMS) > _MAX_PROGRAMS:
            _PROGRAMS.popitem(last=False)
    _PROGRAMS.move_to_end(cache_key)
    return kept, state, tokens


def taken_variables(variables):
    """The variables whose values a program takes as arguments: on JAX
    those the step function reads (a JAX program is a pure function),
    none on TensorFlow and PyTorch (their programs read variables)."""
    return list(variables) if runtime.programs_take_variables() else []


def reading(variables, values, extra=()):
    """A scope in which `variables` read `values` (and the pairs of
    `extra`): the inside of a loop body that calls the step function."""
    mapping = [*zip(variables, values, strict=True), *extra]
    return keras.StatelessScope(state_mapping=mapping)


def compile_program(run, variables):
    """`run(values, *args)` compiled as a whole, returned as
    `program(*args)` that passes the current values of `variables`."""
    compiled = runtime.compile_function(run)

    def kept_program(*args):
        return compiled([variable.value for variable in variables], *args)

    return kept_program


def _tensors(name, start_ids, state):
    tokens = ops.cast(ops.convert_to_tensor(start_ids), "int32")
    if any(leaf is None for leaf in keras.tree.flatten(state)):
        raise ValueError(
            f"{name}: `jit_compile=True` needs a state of tensors; leave out "
            "the `None` entries (or use `jit_compile=False`). Received: "
            f"state with None leaves: {state!r:.200}"
        )
    return tokens, keras.tree.map_structure(ops.convert_to_tensor, state)


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


def _check_step(name, step_fn, state, tokens, end_id):
    """One eager step: the state must keep its structure, shapes and
    dtypes. Returns the Keras variables the step reads (they become
    arguments of the JAX program) and the specs of the logits and of the
    attention it returns (`None` if it returns none)."""
    with _ReadRecorder() as recorder:
        logits, new_state, attention = call_step(
            name, step_fn, tokens, state, end_id
        )
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
