"""The scores and alignments of the RNN attention mechanisms: the
additive score and monotonic attention.

Shape legend: B batch, T query steps, S source length, U units.
"""

import keras
import numpy as np
from keras import ops

from keras_attention import _core
from keras_attention import _kernels


def additive_score(query, key, kernel, bias=None):
    """The additive score $e_{t,s} = v^\\top \\tanh(q_t + k_s + b)$.

    The score of Bahdanau attention and of Luong's `concat` form, written
    once. `query` and `key` are already projected to the same `units`.

    Args:
        query (Tensor): Shape `(B, T, U)`, the projected queries $W q$.
        key (Tensor): Shape `(B, S, U)`, the projected keys $U h$.
        kernel (Tensor): Shape `(U,)`, the vector $v$.
        bias (Tensor | None): Shape `(U,)`. Added inside the $\\tanh$.

    Returns:
        Tensor: The scores, `(B, T, S)`.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> q = np.zeros((1, 1, 2), "float32")
        >>> k = np.array([[[0.0, 0.0], [1.0, 1.0]]], "float32")
        >>> s = additive_score(q, k, np.ones(2, "float32"))
        >>> print(np.round(keras.ops.convert_to_numpy(s), 4))  # 2 tanh(1)
        [[[0.     1.5232]]]
    """
    # One dtype for all three (Keras's PyTorch matmul returns float32 for
    # float64 inputs, so projections may come back in another float).
    query, key = ops.cast(query, kernel.dtype), ops.cast(key, kernel.dtype)
    hidden = ops.expand_dims(query, 2) + ops.expand_dims(key, 1)  # (B,T,S,U)
    if bias is not None:
        hidden = hidden + bias
    return ops.einsum("btsu,u->bts", ops.tanh(hidden), kernel)  # (B, T, S)


def monotonic_attention(p_choose, previous_alignment, mode="parallel"):
    """The expected monotonic alignment (Raffel et al. 2017).

    Reading the source from where the previous step stopped, the decoder
    stops at position $j$ with probability $p_j$ (`p_choose[j]`):

    $$\\alpha_j = p_j \\sum_{k \\le j} \\alpha^{prev}_k
    \\prod_{l=k}^{j-1} (1 - p_l)$$

    `"recursive"` computes it with
    $q_j = (1 - p_{j-1})\\, q_{j-1} + \\alpha^{prev}_j$,
    $\\alpha_j = p_j\\, q_j$ (a scan along the source); `"parallel"` in
    closed form,
    $\\alpha = p \\cdot c \\cdot \\operatorname{cumsum}(\\alpha^{prev} / c)$
    with $c$ the exclusive cumulative product of $1 - p$, taken in log
    space and clipped (at the dtype's smallest normal number inside the
    `log`, at `1e-10` in the division) as in tensorflow-addons; `"hard"`
    expects 0/1 `p_choose` and gives a one-hot alignment at the first
    chosen position at or after the previous one, or zeros. The same
    equations and numbers as tensorflow-addons' `monotonic_attention`.

    Args:
        p_choose (Tensor): Shape `(..., S)`, the stopping probabilities
            (0 at masked positions).
        previous_alignment (Tensor): Shape `(..., S)`, broadcastable to
            `p_choose`.
        mode (str): `"parallel"`, `"recursive"` or `"hard"`.

    Returns:
        Tensor: The alignment, of `p_choose`'s shape and float dtype
            (computed in float32 for half-precision inputs); each row sums
            to at most 1 (the rest is the probability of stopping nowhere).

    The closed form loses mass when the cumulative product falls below its
    `1e-10` floor: past a run of positions that the decoder is all but
    certain to stop at ($p$ near 1), an alignment carried further along
    is under-counted, as in tensorflow-addons. The recursion is exact;
    prefer it when the stopping probabilities saturate.

    Examples:
        >>> import keras
        >>> import numpy as np
        >>> p = np.array([[0.5, 0.5, 0.5]], "float32")
        >>> first = np.array([[1.0, 0.0, 0.0]], "float32")
        >>> a = monotonic_attention(p, first, "recursive")
        >>> print(keras.ops.convert_to_numpy(a))
        [[0.5   0.25  0.125]]
    """
    if mode not in ("parallel", "recursive", "hard"):
        raise ValueError(
            "monotonic_attention: `mode` must be 'parallel', 'recursive' or "
            f"'hard'. Received: mode={mode!r}"
        )
    p_choose = ops.convert_to_tensor(p_choose)
    dtype = keras.backend.standardize_dtype(p_choose.dtype)
    if "float" not in dtype:
        raise ValueError(
            "monotonic_attention: `p_choose` must be floating point. "
            f"Received: p_choose.dtype={dtype}"
        )
    if dtype != _core.logits_dtype(dtype):
        # float16's smallest normal number and 1e-10 floor do not exist.
        alignment = monotonic_attention(
            ops.cast(p_choose, "float32"), previous_alignment, mode
        )
        return ops.cast(alignment, dtype)
    previous = ops.cast(previous_alignment, dtype)
    if mode == "recursive":
        decay = _shift_right(1.0 - p_choose, 1.0)  # (..., S)
        previous = previous * ops.ones_like(p_choose)
        steps = (ops.moveaxis(decay, -1, 0), ops.moveaxis(previous, -1, 0))

        def step(carry, inputs):
            return inputs[0] * carry + inputs[1]

        q = _kernels.scan_carries(step, ops.zeros_like(p_choose[..., 0]), steps)
        return p_choose * ops.moveaxis(q, 0, -1)
    if mode == "parallel":
        cumprod = _exclusive_cumprod(1.0 - p_choose)
        floor = ops.clip(cumprod, 1e-10, 1.0)
        return p_choose * cumprod * ops.cumsum(previous / floor, axis=-1)
    # Hard: stop at the first chosen position at or after the previous one.
    p_choose = p_choose * ops.cumsum(previous, axis=-1)
    return p_choose * _shift_right(ops.cumprod(1.0 - p_choose, axis=-1), 1.0)


def _exclusive_cumprod(x):
    """`[1, x_0, x_0 x_1, ...]` along the last axis, in log space with `x`
    clipped at its dtype's smallest normal number."""
    tiny = float(np.finfo(keras.backend.standardize_dtype(x.dtype)).tiny)
    logs = ops.log(ops.clip(x, tiny, 1.0))
    return ops.exp(_shift_right(ops.cumsum(logs, axis=-1), 0.0))


def _shift_right(x, first):
    """`[first, x_0, ..., x_{S-2}]` along the last axis."""
    head = ops.full_like(x[..., :1], first)
    return ops.concatenate([head, x[..., :-1]], axis=-1)
