"""The memory-efficient path: blockwise attention with an online softmax.

The `(T, S)` logits are never materialised. Queries and keys are cut into
blocks of `C` rows; for each query block a loop runs over the key blocks,
keeping a running maximum `m`, a running sum `l` of the exponentials and
an unnormalised output, rescaled whenever the maximum grows (Milakov and
Gimelshein 2018; Rabe and Staats 2021; Dao et al. 2022, FlashAttention).
The backward pass is written by hand, as in FlashAttention-2 (Dao 2023):
it keeps only the output and the log-sum-exp of each row from the
forward pass and recomputes each block's logits once, so a training step
holds `O(B x N x C^2)` attention buffers beyond its inputs and outputs.

Block pairs that the structure leaves empty are never computed: with a
top-left causal structure, query block `i` visits key blocks `0..i`
only, and the backward pass visits, for key block `j`, query blocks
`j..` only, which skips about half of the work for `T = S`; only the
diagonal block applies the causal condition. Any other band (bottom-right
alignment, a sliding window) visits the key blocks the band reaches and
applies the band only in the ones it cuts. Segment ids and mask mods
depend on the data, so a map of the block pairs is computed on the
device once per call (for segment ids, from each block's smallest and
largest id): a pair is empty (never visited: packed sequences reach
only the blocks of their own documents), full (visited without an
elementwise mask) or partial (visited with it).

Shape legend: B batch, T query length, S key length, C block rows,
N query heads, K key/value heads, G = N // K queries per key/value head,
H head dim, V value head dim, P = B x K.
"""

from keras import ops

from keras_attention._core import Structure
from keras_attention._kernels import backends
from keras_attention._kernels.blockwise import layout
from keras_attention._kernels.blockwise import plan as plan_
from keras_attention._kernels.blockwise.backward import backward
from keras_attention._kernels.blockwise.forward import forward
from keras_attention._kernels.blockwise.plan import Plan


def chunked_attention(query, key, value, mask, structure, scale, chunk_size):
    """Attention over blocks of `chunk_size` queries and keys.

    `mask` has the weights' rank (`(B|1, T|1, S)` for 3-D inputs,
    `(B|1, N|1, T|1, S)` for 4-D) or is `None`; `structure` (a
    `Structure`) may come with it, and is what lets blocks be skipped.
    """
    single_head = len(query.shape) == 3
    if single_head:
        query, key, value = (ops.expand_dims(x, 2) for x in (query, key, value))
        if mask is not None:
            mask = ops.expand_dims(mask, 1)  # (B|1, 1, T|1, S)
    plan = Plan(query, key, value, mask, structure, scale, chunk_size)
    output = with_gradient(plan)(query, key, value, plan.captures, plan.tensors)
    if single_head:
        output = ops.squeeze(output, 2)  # (B, T, V)
    return output


def mod_blocks(mask_mod, batch, heads, length, key_length, block):
    """The block map of `mask_mod` (see `plan.block_map`) on a grid of
    `batch` rows, `heads` heads, `length` queries and `key_length` keys,
    in blocks of `block`: a built-in mod's from its ranges, any other
    evaluated."""
    structure = Structure.from_args(
        where="block_mask",
        batch=batch,
        query_length=length,
        key_length=key_length,
        heads=heads,
        mask_mod=mask_mod,
    )
    return plan_.block_map(structure, batch, heads, length, key_length, block)


def with_gradient(plan):
    """`fn(query, key, value, captures, tensors)`: the attention output
    `(B, T, N, V)`, differentiated by `backward` on every backend.
    `captures` are the score mod's floating tensors, differentiated too;
    `tensors` are the plan's blocked mask, segment ids, block lists and
    the mask mod's tensors; they get no gradient."""

    def forward_pass(query, key, value, captures, tensors):
        query, key, value = layout.to_blocks(plan, query, key, value)
        outputs, lse = forward(plan, query, key, value, tensors, captures)
        output = layout.from_query_blocks(plan, outputs, plan.dtypes[2])
        return output, (query, key, value, outputs, lse, *captures)

    def backward_pass(tensors, residuals, grad):
        query, key, value, outputs, lse, *captures = residuals
        grad = layout.query_blocks(plan, ops.cast(grad, plan.compute_dtype))
        grads = backward(
            plan, query, key, value, tensors, captures, outputs, lse, grad
        )
        grad_query, grad_key, grad_value, grad_captures = grads
        grad_captures = [
            ops.cast(g, x.dtype)
            for g, x in zip(grad_captures, captures, strict=True)
        ]
        return (
            layout.from_query_blocks(
                plan, grad_query * plan.scale, plan.dtypes[0]
            ),
            layout.from_key_blocks(plan, grad_key, plan.dtypes[1]),
            layout.from_key_blocks(plan, grad_value, plan.dtypes[2]),
            grad_captures,
        )

    return backends.current().custom_gradient(forward_pass, backward_pass)
