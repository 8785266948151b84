"""The backward pass, as in FlashAttention-2 (Dao 2023): for each key
block, the query blocks that see it, with each block's weights recomputed
from the forward pass's log-sum-exps.

Shape legend: B batch, T query length, S key length, C block rows,
N query heads, K key/value heads, G = N // K queries per key/value head,
H head dim, V value head dim, P = B x K.
"""

from keras import ops

from keras_attention._kernels import backends
from keras_attention._kernels.blockwise import blocks


def backward(plan, query, key, value, tensors, captures, outputs, lse, grad):
    """Gradients of the blocked query, key and value (the query's without
    the scale), in the compute dtype, and of the score mod's floating
    tensors `captures`."""
    c, groups = plan.block, plan.groups
    delta = ops.sum(grad * outputs, axis=-1)  # (T'/C, P, G*C)

    def key_block(j, carry, padded):
        grad_query, grad_key, grad_value, grad_captures = carry
        k, v = blocks.rows(key, j), blocks.rows(value, j)  # (P, C, H|V)

        def query_block(i, state, edge):
            grad_query, grad_k, grad_v, grad_captures = state
            q = blocks.rows(query, i)  # (P, G*C, H)
            do = blocks.rows(grad, i)  # (P, G*C, V)
            logits = ops.matmul(q, ops.swapaxes(k, 1, 2))  # (P, G*C, C)
            logits, pullback = _scored(plan, tensors, captures, i, j, logits)
            logits, slope = blocks.transform(plan, i, j, logits)
            logits = blocks.hide(plan, tensors, i, j, logits, edge)
            # The forward's weights; hidden logits give exp(masked) = 0.
            p = ops.exp(logits - blocks.rows(lse, i)[..., None])
            grad_v = grad_v + ops.matmul(ops.swapaxes(p, 1, 2), do)
            grad_p = ops.matmul(do, ops.swapaxes(v, 1, 2))  # (P, G*C, C)
            grad_logits = p * (grad_p - blocks.rows(delta, i)[..., None])
            if slope is not None:  # through the soft cap
                grad_logits = grad_logits * slope
            if pullback is not None:  # through the score mod
                grad_logits, *grads = pullback(grad_logits)
                grad_captures = [
                    total + ops.cast(g, total.dtype)
                    for total, g in zip(grad_captures, grads, strict=True)
                ]
            grad_k = grad_k + ops.matmul(ops.swapaxes(grad_logits, 1, 2), q)
            grad_q = blocks.read_block(grad_query, i) + ops.matmul(
                grad_logits, k
            )  # (P, G*C, H)
            grad_query = blocks.write_block(grad_query, i, grad_q)
            return grad_query, grad_k, grad_v, grad_captures

        state = (grad_query, ops.zeros_like(k), ops.zeros_like(v))
        state = _query_blocks(
            plan, tensors, j, padded, query_block, (*state, grad_captures)
        )
        grad_query, grad_k, grad_v, grad_captures = state
        grad_key = blocks.write_block(grad_key, j, grad_k)
        grad_value = blocks.write_block(grad_value, j, grad_v)
        return grad_query, grad_key, grad_value, grad_captures

    pairs, dtype = ops.shape(query)[1], plan.compute_dtype
    rows = (pairs, groups * c, query.shape[-1])
    carry = (
        blocks.buffer(plan.query_blocks, rows, dtype),
        blocks.buffer(plan.key_blocks, (pairs, c, key.shape[-1]), dtype),
        blocks.buffer(plan.key_blocks, (pairs, c, value.shape[-1]), dtype),
        # Summed over every block pair: in the compute dtype (float32 for
        # a half-precision table).
        [ops.zeros(ops.shape(x), plan.compute_dtype) for x in captures],
    )
    # Only the last key block holds padded keys.
    last = plan.key_blocks - 1 if plan.padded else plan.key_blocks
    carry = blocks.loop(0, last, key_block, carry, padded=False)
    carry = blocks.loop(last, plan.key_blocks, key_block, carry, padded=True)
    grad_query, grad_key, grad_value, grad_captures = carry
    return (
        blocks.stacked(grad_query),
        blocks.stacked(grad_key),
        blocks.stacked(grad_value),
        grad_captures,
    )


def _scored(plan, tensors, captures, i, j, logits):
    """Block pair `(i, j)`'s logits through the score mod, and its
    pullback (`None` without a score mod)."""
    if plan.score_mod is None:
        return logits, None
    constants = tensors.score_constants
    primitives = backends.current()
    if plan.relative_bias and captures:
        # The logits' gradient passes through the bias unchanged; the
        # tensors' is the bias's pullback of it summed over the batch.
        def bias(*captures):
            held = plan.score_mod.join(captures, constants)
            return blocks.relative_bias(plan, i, j, held)

        value, bias_pullback = primitives.vjp(bias, *captures)

        def pullback(grad_logits):
            c = plan.block
            grad = ops.reshape(grad_logits, (-1, plan.heads, c, c))
            grad = primitives.leading_sum(grad)  # (N, C, C)
            return [grad_logits, *bias_pullback(grad)]

        return blocks.add_bias(plan, logits, value), pullback

    def mod(logits, *captures):
        held = plan.score_mod.join(captures, constants)
        return blocks.score(plan, i, j, logits, held)

    return primitives.vjp(mod, logits, *captures)


def _query_blocks(plan, tensors, j, padded, query_block, state):
    """`query_block` over the query blocks that see key block `j`, each
    with the structure it must apply."""
    if plan.by_map:
        return blocks.visit(plan, tensors.query_lists, j, query_block, state)
    bounds = plan.query_spans(j)
    if plan.is_causal:
        # The diagonal block, first in the range, is the causal edge.
        start, end = bounds[:2]
        diagonal = blocks.Edge(padded=padded, partial=True)
        first_end = blocks.minimum(start + 1, end)
        state = blocks.loop(start, first_end, query_block, state, edge=diagonal)
        interior = blocks.Edge(padded=padded)
        return blocks.loop(start + 1, end, query_block, state, edge=interior)
    return blocks.spans(plan, bounds, query_block, state, padded)
