"""Decoding: greedy search, beam search with GNMT penalties, sampling.

All three drive a step function, so they serve an RNN `AttentionDecoder`
and a Transformer decoder with a KV cache alike:

    step_fn(token_ids, state) -> (logits, new_state)
    step_fn(token_ids, state) -> (logits, new_state, attention)

`token_ids` is `(B,)` (the previous tokens), `logits` `(B, V)` unnormalised
scores of the next token, `attention` `(B, S)` the step's alignment over
the source (only needed by `coverage_penalty`), and `state` any nested
structure of tensors whose leading axis is the batch. Everything that is
per example (decoder states, KV caches, encoder outputs and their masks)
belongs in `state`; what all examples share (an embedding table, a
weight) belongs in the step function's closure. Beam search tiles every
state leaf that has a leading axis to `B·K` rows and reorders it after
every step, so such a leaf must have `B` rows (a `ValueError` names the
one that does not); leaves without a leading axis (Python numbers, scalar
tensors such as a cache position) are shared by all rows and passed
through. Greedy search and sampling hand the state to the step function
as it is.

Shape legend: B batch, K beams, V vocabulary, L generated length, S source.
"""

import functools

import keras
import numpy as np
from keras import ops

from keras_attention import _compiled_decoding
from keras_attention._compiled_decoding import call_step as _call
from keras_attention._compiled_decoding import coverage_score as _coverage_score
from keras_attention._compiled_decoding import is_shared as _shared
from keras_attention._compiled_decoding import length_penalty as _length_penalty
from keras_attention._kernels import runtime


def _without_gradients(decode):
    """Decoding never differentiates: on PyTorch, no autograd graph is
    recorded for its steps."""

    @functools.wraps(decode)
    def wrapper(*args, **kwargs):
        with runtime.without_gradients():
            return decode(*args, **kwargs)

    return wrapper


@_without_gradients
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
            when it was built (see `clear_compiled_programs`). Defaults
            to `False`: a Python loop that accepts any step function.

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

    _check_max_length("greedy_search", max_length)
    if jit_compile:
        return _compiled_decoding.decode(
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
    return _decode(step_fn, state, start_ids, max_length, end_id, _argmax)


@_without_gradients
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
        seed (int | keras.random.SeedGenerator | None): Same seed, same
            samples.
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
    _check_max_length("sample", max_length)
    if temperature <= 0:
        raise ValueError(
            f"sample: `temperature` must be positive. "
            f"Received: temperature={temperature}"
        )
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(
            "sample: `top_k` must be a positive integer. "
            f"Received: top_k={top_k}"
        )
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(
            f"sample: `top_p` must be in (0, 1]. Received: top_p={top_p}"
        )
    if not isinstance(seed, keras.random.SeedGenerator):
        seed = keras.random.SeedGenerator(seed)
    if jit_compile:
        generator = _compiled_decoding.loop_seed_generator()
        return _compiled_decoding.decode(
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
    return _decode(step_fn, state, start_ids, max_length, end_id, choose)


@_without_gradients
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

    $$s(Y, X) = \\frac{\\log P(Y \\mid X)}{lp(Y)} + cp(X; Y), \\quad
    lp(Y) = \\frac{(5 + |Y|)^\\alpha}{6^\\alpha}, \\quad
    cp(X; Y) = \\beta \\sum_{i} \\log \\min\\Big(\\sum_j p_{i,j}, 1\\Big)$$

    with `α = length_penalty`, `β = coverage_penalty`, `|Y|` the length up
    to and including `end_id`, and `p_{i,j}` the attention of target step
    `j` on source position `i` (source positions that never received
    attention, such as padding, are left out of the sum). The state is
    tiled to `B·K` rows and reordered after every step by the library.

    Args:
        step_fn (Callable): `(token_ids, state) -> (logits, state[, attn])`;
            `attn` `(B·K, S)` is required when `coverage_penalty > 0`.
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
        length_penalty: α; 0 disables it. Defaults to `0.0`.
        coverage_penalty: β; 0 disables it. Defaults to `0.0`.
        return_all_beams: Return every beam, best first.
        jit_compile: Run the whole search as one compiled program,
            as in `greedy_search`: the same hypotheses and scores as the
            Python loop, ranked in float32 (the Python loop ranks in
            float64, so only candidates within float32 rounding of each
            other can be ordered differently). Finished beams stay in
            their slots and only repeat `end_id`, as in the Python loop;
            the loop ends when every beam has finished. Defaults to
            `False`.

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
    _check_max_length("beam_search", max_length)
    if not isinstance(beam_width, int) or beam_width < 1:
        raise ValueError(
            "beam_search: `beam_width` must be a positive integer. "
            f"Received: beam_width={beam_width}"
        )
    start = np.asarray(ops.convert_to_numpy(start_ids)).astype("int32")
    batch, beams = start.shape[0], beam_width
    flat = batch * beams
    _check_batch_major("beam_search", state, batch)
    state = keras.tree.map_structure(
        lambda x: x if _shared(x) else ops.repeat(x, beams, axis=0), state
    )  # (B·K, ...)
    tokens = np.repeat(start, beams)
    if jit_compile:
        sequences, final = _compiled_decoding.beam_decode(
            step_fn,
            state,
            tokens,
            max_length,
            beams,
            end_id,
            length_penalty,
            coverage_penalty,
        )  # (B, K, L), (B, K)
        if not return_all_beams:
            sequences, final = sequences[:, 0], final[:, 0]
        return sequences, final
    totals = np.full((batch, beams), -np.inf)
    totals[:, 0] = 0.0  # all beams start equal: expand only the first
    lengths = np.zeros((batch, beams), "int64")
    finished = np.zeros((batch, beams), bool)
    coverage = None
    sequences = np.zeros((batch, beams, 0), "int32")
    for _ in range(max_length):
        logits, state, attention = _call(step_fn, tokens, state)
        if logits.shape[0] not in (None, flat):
            raise ValueError(
                "beam_search: `step_fn` must return logits for the B·K = "
                f"{flat} rows of the tiled state; keep per-example tensors "
                "in `state`, not in the closure. "
                f"Received: logits.shape={tuple(logits.shape)}"
            )
        log_probs = _log_softmax(logits).reshape(batch, beams, -1)  # (B,K,V)
        vocab = log_probs.shape[-1]
        if end_id is not None:
            log_probs[finished] = -np.inf
            log_probs[finished, end_id] = 0.0
        grown = np.where(finished, lengths, lengths + 1)  # (B, K)
        if coverage_penalty:
            if attention is None:
                raise ValueError(
                    "beam_search: `coverage_penalty` needs a `step_fn` that "
                    "returns `(logits, state, attention)`. Received: a "
                    "step_fn returning 2 values"
                )
            attention = np.asarray(
                ops.convert_to_numpy(ops.cast(attention, "float32")), "float64"
            ).reshape(batch, beams, -1)
            step_coverage = np.where(finished[..., None], 0.0, attention)
            coverage = (
                step_coverage if coverage is None else coverage + step_coverage
            )
        candidates = totals[..., None] + log_probs  # (B, K, V)
        scores = candidates / _length_penalty(grown, length_penalty)[..., None]
        if coverage_penalty:
            scores = (
                scores
                + coverage_penalty * _coverage_score(coverage, np)[..., None]
            )
        flat_scores = scores.reshape(batch, beams * vocab)
        best = np.argsort(-flat_scores, axis=-1, kind="stable")[:, :beams]
        parent, token = best // vocab, best % vocab  # (B, K)
        rows = np.arange(batch)[:, None]
        totals = candidates[rows, parent, token]
        lengths = grown[rows, parent]
        was_finished = finished[rows, parent]
        finished = was_finished | (
            (token == end_id) if end_id is not None else False
        )
        if coverage is not None:
            coverage = coverage[rows, parent]
        sequences = np.concatenate(
            [sequences[rows, parent], token[..., None]], axis=-1
        )
        order = (rows * beams + parent).reshape(flat)
        state = keras.tree.map_structure(
            lambda x, order=order: x if _shared(x) else ops.take(x, order, 0),
            state,
        )
        tokens = token.reshape(flat).astype("int32")
        if finished.all():
            break
    final = totals / _length_penalty(lengths, length_penalty)
    if coverage_penalty:
        final = final + coverage_penalty * _coverage_score(coverage, np)
    ranking = np.argsort(-final, axis=-1, kind="stable")
    rows = np.arange(batch)[:, None]
    sequences = _pad(sequences[rows, ranking], max_length, end_id)
    final = final[rows, ranking]
    if not return_all_beams:
        sequences, final = sequences[:, 0], final[:, 0]
    return (
        ops.convert_to_tensor(sequences, "int32"),
        ops.convert_to_tensor(final.astype("float32")),
    )


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
    return _compiled_decoding.clear()


def _argmax(logits, step):
    return ops.cast(ops.argmax(logits, axis=-1), "int32")


def _sampler(temperature, top_k, top_p, seed):
    """`choose(logits, step)` drawing from the truncated softmax."""

    def choose(logits, step):
        logits = ops.cast(logits, "float32") / temperature
        if top_k is not None:
            logits = _keep_top_k(logits, top_k)
        if top_p is not None:
            logits = _keep_top_p(logits, top_p)
        drawn = keras.random.categorical(logits, 1, seed=seed)  # (B, 1)
        return ops.cast(drawn[:, 0], "int32")

    return choose


def _check_batch_major(name, state, batch):
    """Every state leaf with a leading axis has `batch` rows: tiling a
    table `(V, V)` along its first axis would silently change it."""
    for path, leaf in keras.tree.flatten_with_path(state):
        if _shared(leaf) or leaf.shape[0] in (None, batch):
            continue
        where = "".join(f"[{key!r}]" for key in path)
        raise ValueError(
            f"{name}: every state leaf with a leading axis must have the "
            f"batch size B={batch} (it is tiled to B·K rows); keep shared "
            "tables in the step function's closure. Received: "
            f"{f'state leaf {where}' if where else 'state'} with shape "
            f"{tuple(leaf.shape)}"
        )


def _check_max_length(name, max_length):
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(
            f"{name}: `max_length` must be a positive integer. "
            f"Received: max_length={max_length!r}"
        )


def _decode(step_fn, state, start_ids, max_length, end_id, choose):
    """The loop shared by greedy search and sampling."""
    tokens = ops.cast(ops.convert_to_tensor(start_ids), "int32")
    finished = ops.zeros(ops.shape(tokens), "bool")
    generated = []
    for step in range(max_length):
        logits, state, _ = _call(step_fn, tokens, state)
        tokens = choose(logits, step)
        if end_id is not None:
            tokens = ops.where(finished, end_id, tokens)
            finished = ops.logical_or(finished, ops.equal(tokens, end_id))
        generated.append(tokens)
        if end_id is not None and bool(ops.convert_to_numpy(ops.all(finished))):
            break
    ids = np.stack([ops.convert_to_numpy(t) for t in generated], axis=1)
    return ops.convert_to_tensor(_pad(ids, max_length, end_id), "int32")


def _pad(ids, max_length, end_id):
    missing = max_length - ids.shape[-1]
    if missing <= 0:
        return ids
    fill = end_id if end_id is not None else 0
    padding = np.full((*ids.shape[:-1], missing), fill, ids.dtype)
    return np.concatenate([ids, padding], axis=-1)


def _log_softmax(logits):
    logits = np.asarray(
        ops.convert_to_numpy(ops.cast(logits, "float32")), "float64"
    )
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _keep_top_k(logits, k):
    k = min(k, logits.shape[-1])
    kth = ops.min(ops.top_k(logits, k)[0], axis=-1, keepdims=True)  # (B, 1)
    return ops.where(logits >= kth, logits, _NEGATIVE)


def _keep_top_p(logits, p):
    sorted_logits, _ = ops.top_k(logits, logits.shape[-1])  # (B, V) desc
    probs = ops.softmax(sorted_logits, axis=-1)
    before = ops.cumsum(probs, axis=-1) - probs  # mass of better tokens
    kept = ops.where(before < p, sorted_logits, np.inf)
    threshold = ops.min(kept, axis=-1, keepdims=True)  # (B, 1)
    return ops.where(logits >= threshold, logits, _NEGATIVE)


_NEGATIVE = -1e30
