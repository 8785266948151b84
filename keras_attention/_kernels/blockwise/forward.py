"""The forward pass: for each query block, an online softmax over the
key blocks it can see; keeps each row's log-sum-exp for the backward
pass.

Shape legend: B batch, T query length, S key length, C block rows,
N query heads, K key/value heads, G = N // K queries per key/value head,
H head dim, V value head dim, P = B x K.
"""

from keras import ops

from keras_attention._kernels.blockwise import blocks


def forward(plan, query, key, value, tensors, captures):
    """Outputs `(T'/C, P, G*C, V)` and row log-sum-exps `(T'/C, P, G*C)`,
    both in the compute dtype, from blocked inputs (see `layout`);
    `captures` are the score mod's floating tensors."""
    c, groups, dtype = plan.block, plan.groups, plan.compute_dtype
    pairs = ops.shape(query)[1]

    def query_block(i, carry):
        outputs, lse = carry
        q = blocks.rows(query, i)  # (P, G*C, H)

        def key_block(j, state, edge):
            running_max, total, acc = state
            k, v = blocks.rows(key, j), blocks.rows(value, j)  # (P, C, H|V)
            logits = ops.matmul(q, ops.swapaxes(k, 1, 2))  # (P, G*C, C)
            if plan.score_mod is not None:
                held = plan.score_mod.join(captures, tensors.score_constants)
                logits = blocks.score(plan, i, j, logits, held)
            logits, _ = blocks.transform(plan, i, j, logits)
            logits = blocks.hide(plan, tensors, i, j, logits, edge)
            new_max = ops.maximum(running_max, ops.max(logits, axis=-1))
            # Rows with no visible key yet subtract 0, so that their hidden
            # logits still give exp(masked) = 0.
            shift = ops.where(new_max > plan.negative / 2, new_max, 0.0)
            p = ops.exp(logits - shift[..., None])  # (P, G*C, C)
            rescale = ops.exp(running_max - shift)
            total = total * rescale + ops.sum(p, axis=-1)
            acc = acc * rescale[..., None] + ops.matmul(p, v)  # (P, G*C, V)
            return new_max, total, acc

        shape = (pairs, groups * c)
        state = (
            ops.full(shape, plan.negative, dtype),
            ops.zeros(shape, dtype),
            ops.zeros((*shape, plan.value_dim), dtype),
        )
        if plan.by_map:
            state = blocks.visit(plan, tensors.key_lists, i, key_block, state)
        elif plan.is_causal or plan.structure.is_empty:
            # Every block whole but the last: the diagonal, or the one
            # with the padded keys.
            last = plan.key_spans(i)[1] - 1
            state = blocks.loop(0, last, key_block, state, edge=blocks.Edge())
            edge = blocks.Edge(padded=plan.padded, partial=plan.is_causal)
            state = key_block(last, state, edge=edge)
        else:
            bounds = plan.key_spans(i)
            state = blocks.spans(plan, bounds, key_block, state, plan.padded)
        running_max, total, acc = state
        seen = total > 0  # a row with no visible key gives zeros
        safe_total = ops.where(seen, total, ops.ones_like(total))
        out = ops.where(seen[..., None], acc / safe_total[..., None], 0.0)
        row_lse = ops.where(seen, running_max + ops.log(safe_total), 0.0)
        outputs = blocks.write_block(outputs, i, out)
        lse = blocks.write_block(lse, i, row_lse)
        return outputs, lse

    rows = (pairs, groups * c)
    init = (
        blocks.buffer(plan.query_blocks, (*rows, plan.value_dim), dtype),
        blocks.buffer(plan.query_blocks, rows, dtype),
    )
    outputs, lse = blocks.fori_loop(0, plan.query_blocks, query_block, init)
    return blocks.stacked(outputs), blocks.stacked(lse)
