"""The fused path: the backend's own attention kernel.

`keras.ops.dot_product_attention` reaches cuDNN flash attention for JAX on
a GPU; on PyTorch, `torch.nn.functional.scaled_dot_product_attention` is
called directly (see `backends.torch`). Such a kernel gives a query row
with no visible key the mean of the values (where the reference gives
zeros), so its output is zeroed on those rows, which makes both paths
agree on every input.

Shape legend: B batch, T query length, S key length, N query heads,
K key/value heads, H head dim, V value head dim.
"""

from keras import ops

from keras_attention._kernels import backends
from keras_attention._kernels import flex


def fused_attention(query, key, value, mask, structure, scale):
    """Attention through the backend's fused kernel.

    `mask` has the weights' rank (`(B|1, T|1, S)` for 3-D inputs,
    `(B|1, N|1, T|1, S)` for 4-D). A kernel takes a causal flag or a mask
    tensor, not both: a top-left causal structure alone reaches it as the
    flag, which lets it skip the masked blocks; any other structure is
    merged into the mask. The dispatch sends the inputs the kernel
    cannot take (`refusal`, `structure_refusal`) to the reference. Where
    forced, PyTorch's FlexAttention takes the whole structure instead
    (see `flex`).
    """
    if flex.chosen(query, key, value):
        return flex.attention(query, key, value, mask, structure, scale)
    primitives = backends.current()
    # A kernel takes a bias or a causal flag, not both.
    is_causal = (
        structure.is_top_left_causal and mask is None and not structure.alibi
    )
    if not is_causal:
        dense = structure.dense_mask(ops.shape(query)[1], ops.shape(key)[1])
        if dense is not None:
            if len(query.shape) == 4:
                dense = ops.expand_dims(dense, 1)  # (B|1, 1, T, S)
            mask = dense if mask is None else ops.logical_and(mask, dense)
    heads = 1 if len(query.shape) == 3 else query.shape[2]
    modded = structure.mod_mask(
        ops.shape(query)[0],
        heads,
        ops.arange(0, ops.shape(query)[1]),
        ops.arange(0, ops.shape(key)[1]),
    )  # (B|1, N|1, T|1, S|1)
    if modded is not None:
        if len(query.shape) == 3:
            modded = modded[:, 0]
        modded = ops.broadcast_to(
            modded,
            (*ops.shape(modded)[:-2], ops.shape(query)[1], ops.shape(key)[1]),
        )
        mask = modded if mask is None else ops.logical_and(mask, modded)
    single_head = len(query.shape) == 3
    if single_head:
        query, key, value = (ops.expand_dims(x, 2) for x in (query, key, value))
        if mask is not None:
            mask = ops.expand_dims(mask, 1)  # (B|1, 1, T|1, S)
    bias = structure.dense_bias(
        query.shape[2], ops.shape(query)[1], ops.shape(key)[1]
    )  # (1, N, T, S) or None
    output = primitives.fused_kernel(
        query, key, value, mask, is_causal, scale, bias
    )  # (B, T, N, V)
    if mask is not None:
        visible = ops.any(mask, axis=-1)  # (B|1, N|1, T|1)
        visible = ops.expand_dims(ops.transpose(visible, (0, 2, 1)), -1)
        output = ops.where(visible, output, ops.zeros_like(output))
    if single_head:
        output = ops.squeeze(output, 2)  # (B, T, V)
    return output


def structure_refusal(structure):
    """Why the kernel cannot apply this structure, or `None`."""
    if structure.soft_cap is not None:
        return "logit soft-capping: the kernel has no such option"
    if structure.score_mod is not None:
        return "a score mod: the kernel takes no function of the logits"
    return None


def refusal(query, value):
    """Why the backend's kernel cannot take these inputs, or `None`."""
    return backends.current().fused_refusal(query, value)
