"""Greedy search and sampling: one token per row and step, chosen by
`_next_tokens`, which the Python loop and the compiled loop share.

Shape legend: B batch, V vocabulary, L generated length.
"""

import keras
import numpy as np
from keras import ops

from keras_attention._core.checks import finite_number
from keras_attention._core.checks import positive_integer
from keras_attention.decoding import _compiled
from keras_attention.decoding._common import call_step
from keras_attention.decoding._common import check_end_id
from keras_attention.decoding._common import check_max_length
from keras_attention.decoding._common import check_seed
from keras_attention.decoding._common import check_start_ids
from keras_attention.decoding._common import check_step_fn
from keras_attention.decoding._common import pad
from keras_attention.decoding._common import without_gradients


@without_gradients
def greedy_search(
    step_fn,
    state,
    start_ids,
    max_length: int,
    end_id=None,
    *,
    jit_compile: bool = False,
):
    """Picks the most likely token at every step.

    Args:
        step_fn (Callable): `(token_ids, state) -> (logits, state[, attn])`.
        state (Any): A nested structure of batch-major tensors.
        start_ids (Tensor): Shape `(B,)`, integer, the first input tokens.
        max_length: Number of tokens to generate.
        end_id (int | None): Once a sequence produces it, the rest of the
            sequence is `end_id`; decoding stops when all have.
        jit_compile: Run the whole loop as one compiled program
            (`jax.jit`, `tf.function(jit_compile=True)`; eager on
            PyTorch): no per-step dispatch. The state must keep its
            structure, shapes and dtypes from step to step (a fixed-size
            KV cache) and the step function must use Keras ops only. The
            program is kept for later calls with the same `step_fn`
            object, `max_length`, `end_id` and input shapes; it reads the
            current values of the Keras variables the step function read
            when it was built (see `clear_compiled_programs`), but on JAX
            and TensorFlow a plain tensor the step function closes over
            keeps the value it had then: pass data that changes between
            calls in `state`. Defaults to `False`: a Python loop that
            accepts any step function.

    Returns:
        Tensor: The generated ids, int32 `(B, max_length)`, without
            `start_ids`.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> table = keras.ops.convert_to_tensor(np.eye(4, k=1, dtype="float32"))
        >>> def step_fn(ids, state):          # always predicts ids + 1
        ...     return keras.ops.take(table, ids, axis=0), state
        >>> ids = greedy_search(step_fn, (), np.array([0, 1]), max_length=3,
        ...                     end_id=3)
        >>> print(keras.ops.convert_to_numpy(ids))
        [[1 2 3]
         [2 3 3]]
    """

    check_step_fn("greedy_search", step_fn)
    max_length = check_max_length("greedy_search", max_length)
    start_ids = check_start_ids("greedy_search", start_ids)
    end_id = check_end_id("greedy_search", end_id)
    if jit_compile:
        return _compiled_decode(
            "greedy_search",
            step_fn,
            state,
            start_ids,
            max_length,
            end_id,
            _argmax,
            key="greedy",
            seed=None,
        )
    return _decode(
        "greedy_search", step_fn, state, start_ids, max_length, end_id, _argmax
    )


@without_gradients
def sample(
    step_fn,
    state,
    start_ids,
    max_length: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed=None,
    end_id=None,
    *,
    jit_compile: bool = False,
):
    """Draws each token from the (truncated) softmax of the logits.

    $$p(y) \\propto \\exp(\\text{logit}_y / \\tau)$$

    restricted to the `top_k` most likely tokens and/or the smallest set of
    most likely tokens whose probability reaches `top_p` (nucleus
    sampling; Holtzman et al., 2020). `top_k=1` is greedy search.

    Args:
        step_fn (Callable): `(token_ids, state) -> (logits, state[, attn])`.
        state (Any): A nested structure of batch-major tensors.
        start_ids (Tensor): Shape `(B,)`, integer.
        max_length: Number of tokens to generate.
        temperature: Greater than 0. Defaults to `1.0`.
        top_k: Keep the `top_k` most likely tokens.
        top_p: Nucleus mass, in (0, 1].
        seed (int | keras.random.SeedGenerator | None): An integer in
            `[0, 2**31)` or a generator. Same seed, same samples.
        end_id (int | None): As in `greedy_search`.
        jit_compile: As in `greedy_search`. For the same seed the
            compiled loop draws the Python loop's tokens on JAX and
            PyTorch; on TensorFlow XLA's random numbers differ from
            TensorFlow's kernels, so its samples are reproducible but
            not the Python loop's.

    Returns:
        Tensor: The generated ids, int32 `(B, max_length)`.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> def step_fn(ids, state):
        ...     return keras.ops.zeros((2, 5)), state      # uniform over 5
        >>> ids = sample(step_fn, (), np.zeros(2, "int32"), 4, seed=1)
        >>> tuple(ids.shape)
        (2, 4)
    """
    check_step_fn("sample", step_fn)
    max_length = check_max_length("sample", max_length)
    start_ids = check_start_ids("sample", start_ids)
    end_id = check_end_id("sample", end_id)
    temperature, top_k, top_p = _checked_sampling(temperature, top_k, top_p)
    seed = check_seed("sample", seed)
    if jit_compile:
        generator = _compiled.loop_seed_generator()
        return _compiled_decode(
            "sample",
            step_fn,
            state,
            start_ids,
            max_length,
            end_id,
            _sampler(temperature, top_k, top_p, generator),
            key=("sample", float(temperature), top_k, top_p),
            seed=seed,
        )
    choose = _sampler(temperature, top_k, top_p, seed)
    return _decode(
        "sample", step_fn, state, start_ids, max_length, end_id, choose
    )


def _checked_sampling(temperature, top_k, top_p):
    """The sampling arguments as Python numbers, or a `ValueError`."""
    temperature = finite_number("sample", "temperature", temperature)
    if temperature <= 0:
        raise ValueError(
            f"sample: `temperature` must be positive. "
            f"Received: temperature={temperature}"
        )
    if top_k is not None:
        top_k = positive_integer("sample", "top_k", top_k)
    if top_p is not None:
        top_p = finite_number("sample", "top_p", top_p)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(
                f"sample: `top_p` must be in (0, 1]. Received: top_p={top_p}"
            )
    return temperature, top_k, top_p


def _next_tokens(logits, finished, step, choose, end_id):
    """The one step of both loops: `choose` a token per row; a row that
    has produced `end_id` repeats it. Returns `(tokens, finished)`."""
    tokens = ops.cast(choose(logits, step), "int32")  # (B,)
    if end_id is not None:
        tokens = ops.where(finished, end_id, tokens)
        finished = ops.logical_or(finished, ops.equal(tokens, end_id))
    return tokens, finished


def _decode(name, step_fn, state, start_ids, max_length, end_id, choose):
    """The Python loop: any step function, one dispatch per step."""
    tokens = ops.cast(ops.convert_to_tensor(start_ids), "int32")
    finished = ops.zeros(ops.shape(tokens), "bool")
    generated = []
    for step in range(max_length):
        logits, state, _ = call_step(name, step_fn, tokens, state, end_id)
        tokens, finished = _next_tokens(logits, finished, step, choose, end_id)
        generated.append(tokens)
        if end_id is not None and bool(ops.convert_to_numpy(ops.all(finished))):
            break
    ids = np.stack([ops.convert_to_numpy(t) for t in generated], axis=1)
    return ops.convert_to_tensor(pad(ids, max_length, end_id), "int32")


def _compiled_decode(
    name, step_fn, state, start_ids, max_length, end_id, choose, key, seed
):
    """Runs `max_length` steps of `choose(step_fn(...))` as one program.

    `choose` draws from `loop_seed_generator()` if it samples, and `key`
    describes it (its parameters). `seed` is the caller's
    `SeedGenerator`, or `None`: its state advances as the Python loop's
    would.
    """

    def build(variables, logits, attention):
        return _build(name, step_fn, max_length, end_id, choose, variables)

    options = (max_length, end_id, key)
    program, state, tokens = _compiled.program(
        name, step_fn, state, start_ids, options, build, end_id
    )
    loop_seed = _compiled.loop_seed_generator()
    seed_state = (seed if seed is not None else loop_seed).state.value
    ids, seed_state = program(seed_state, state, tokens)
    if seed is not None:
        seed.state.assign(seed_state)
    return ids


def _build(name, step_fn, max_length, end_id, choose, variables):
    """The compiled loop: `_decode`'s steps inside one `ops.while_loop`,
    the ids written into a `(B, max_length)` buffer of `end_id`."""
    seed_variable = _compiled.loop_seed_generator().state
    taken = _compiled.taken_variables(variables)

    def cond(step, tokens, finished, ids, state, seed_state):
        going = ops.less(step, max_length)
        if end_id is not None:
            going = ops.logical_and(going, ops.logical_not(ops.all(finished)))
        return going

    def run(values, seed_state, state, tokens):
        def body(step, tokens, finished, ids, state, seed_state):
            extra = [(seed_variable, seed_state)]
            with _compiled.reading(taken, values, extra) as scope:
                logits, state, _ = call_step(
                    name, step_fn, tokens, state, end_id
                )
                tokens, finished = _next_tokens(
                    logits, finished, step, choose, end_id
                )
                seed_state = scope.get_current_value(seed_variable)
            ids = ops.slice_update(ids, (0, step), tokens[:, None])
            return step + 1, tokens, finished, ids, state, seed_state

        fill = 0 if end_id is None else end_id
        ids = ops.full((ops.shape(tokens)[0], max_length), fill, "int32")
        start = ops.convert_to_tensor(0, "int32")
        finished = ops.zeros_like(tokens, "bool")
        loop_vars = (start, tokens, finished, ids, state, seed_state)
        result = ops.while_loop(cond, body, loop_vars, max_length)
        return result[3], result[5]

    return _compiled.compile_program(run, taken)


def _argmax(logits, step):
    return ops.cast(ops.argmax(logits, axis=-1), "int32")


def _sampler(temperature, top_k, top_p, seed):
    """`choose(logits, step)` drawing from the truncated softmax."""

    def choose(logits, step):
        # Shifted to a maximum of 0, which stays 0: a small temperature
        # then sends the other logits to -inf, never the largest to inf
        # (inf - inf is NaN), and a temperature flushed to zero as a
        # float32 denormal gives no 0 / 0.
        logits = ops.cast(logits, "float32")
        logits = logits - ops.max(logits, axis=-1, keepdims=True)
        logits = ops.where(logits < 0, logits / temperature, 0.0)
        if top_k is not None:
            logits = _keep_top_k(logits, top_k)
        if top_p is not None:
            logits = _keep_top_p(logits, top_p)
        drawn = keras.random.categorical(logits, 1, seed=seed)  # (B, 1)
        return ops.cast(drawn[:, 0], "int32")

    return choose


def _keep_top_k(logits, k):
    """The `k` largest logits of each row; of logits tied with the k-th,
    the first ones (as `argmax` picks the first of ties)."""
    k = min(k, logits.shape[-1])
    kth = ops.min(ops.top_k(logits, k)[0], axis=-1, keepdims=True)  # (B, 1)
    return _keep_first(logits, kth, k)


def _keep_top_p(logits, p):
    """The fewest most likely logits of each row whose probability
    reaches `p`; of logits tied with the last of them, the first ones."""
    if p >= 1:
        return logits  # all of them (a float32 sum may reach 1 early)
    sorted_logits, _ = ops.top_k(logits, logits.shape[-1])  # (B, V) desc
    probs = ops.softmax(sorted_logits, axis=-1)
    before = ops.cumsum(probs, axis=-1) - probs  # mass of better tokens
    count = ops.sum(ops.cast(before < p, "int32"), axis=-1, keepdims=True)
    kth = ops.take_along_axis(sorted_logits, count - 1, axis=-1)  # (B, 1)
    return _keep_first(logits, kth, count)


def _keep_first(logits, kth, count):
    """Of each row, the logits above `kth`, then those tied with it in
    order, `count` in all."""
    above = logits > kth
    tied = logits == kth
    room = count - ops.sum(ops.cast(above, "int32"), axis=-1, keepdims=True)
    first_tied = ops.cumsum(ops.cast(tied, "int32"), axis=-1) <= room
    keep = ops.logical_or(above, ops.logical_and(tied, first_tied))
    return ops.where(keep, logits, _NEGATIVE)


_NEGATIVE = -1e30
