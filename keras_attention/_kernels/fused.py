"""The fused path: the backend's own attention kernel.

`keras.ops.dot_product_attention` reaches PyTorch's fused SDPA kernels and,
on GPU, cuDNN flash attention for JAX. Such a kernel gives a query row with
no visible key the mean of the values (where the reference gives zeros), so
its output is zeroed on those rows, which makes both paths agree on every
input.

Shape legend: B batch, T query length, S key length, N query heads,
K key/value heads, H head dim, V value head dim.
"""

import keras
import numpy as np
from keras import ops


def fused_attention(query, key, value, mask, structure, scale, reference):
    """Attention through the backend's fused kernel.

    `mask` has the weights' rank (`(B|1, T|1, S)` for 3-D inputs,
    `(B|1, N|1, T|1, S)` for 4-D). A kernel takes a causal flag or a mask
    tensor, not both: a top-left causal structure alone reaches it as the
    flag, which lets it skip the masked blocks; any other structure is
    merged into the mask.
    """
    if not _kernel_takes(query, value) or structure.soft_cap is not None:
        return reference(query, key, value, mask, scale, structure)
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
    single_head = len(query.shape) == 3
    if single_head:
        query, key, value = (ops.expand_dims(x, 2) for x in (query, key, value))
        if mask is not None:
            mask = ops.expand_dims(mask, 1)  # (B|1, 1, T|1, S)
    bias = structure.dense_bias(
        query.shape[2], ops.shape(query)[1], ops.shape(key)[1]
    )  # (1, N, T, S) or None
    output = _kernel(query, key, value, mask, is_causal, scale, bias)
    if mask is not None:
        visible = ops.any(mask, axis=-1)  # (B|1, N|1, T|1)
        visible = ops.expand_dims(ops.transpose(visible, (0, 2, 1)), -1)
        output = ops.where(visible, output, ops.zeros_like(output))
    if single_head:
        output = ops.squeeze(output, 2)  # (B, T, V)
    return output


def _kernel_takes(query, value) -> bool:
    return refusal(query, value) is None


def refusal(query, value):
    """Why the backend's kernel cannot take these inputs, or `None`.
    JAX's needs the value head dim to equal the key head dim, and on CPU
    (its XLA implementation) it cannot multiply float16 into float32."""
    if keras.backend.backend() != "jax":
        return None
    import jax

    if query.shape[-1] != value.shape[-1]:
        return (
            "JAX's kernel needs equal query and value head dims "
            f"(received {query.shape[-1]} and {value.shape[-1]})"
        )
    dtype = keras.backend.standardize_dtype(query.dtype)
    if jax.default_backend() == "cpu" and dtype == "float16":
        return "JAX's kernel on CPU cannot compute in float16"
    return None


def _negative(dtype):
    """Half the most negative finite value of `dtype`: masked logits stay
    finite, so a row with nothing visible gives no NaN."""
    dtype = keras.backend.standardize_dtype(dtype)
    return -1.6e38 if dtype == "bfloat16" else float(np.finfo(dtype).min) / 2


def _kernel(query, key, value, mask, is_causal, scale, bias=None):
    """The backend's fused kernel on `(B, T, N, H)` heads, with an
    additive `bias` `(1, N, T, S)` if given.

    On PyTorch, `torch.nn.functional.scaled_dot_product_attention` is
    called on transposed views, with grouped-query heads left to the
    kernel: `keras.ops.dot_product_attention` copies the keys and values
    into contiguous, repeated heads first, which for a decoding step means
    copying the whole KV cache. The mask becomes additive (0 or a large
    negative), as Keras makes it, so that a row with no visible key stays
    finite (it is zeroed by the caller).
    """
    dtypes = {
        keras.backend.standardize_dtype(x.dtype) for x in (query, key, value)
    }
    if keras.backend.backend() != "torch" or len(dtypes) > 1:
        if bias is not None:
            bias = ops.cast(bias, query.dtype)
            if mask is not None:  # Keras takes a bias or a mask, not both
                negative = ops.cast(_negative(query.dtype), query.dtype)
                bias = ops.where(mask, bias, negative)
                mask = None
        return ops.dot_product_attention(
            query,
            key,
            value,
            bias=bias,
            mask=mask,
            scale=scale,
            is_causal=is_causal,
        )  # (B, T, N, V)
    import torch

    query, key, value = (
        ops.convert_to_tensor(x).transpose(1, 2) for x in (query, key, value)
    )  # (B, N, T, H), (B, K, S, H), (B, K, S, V)
    if mask is not None:
        negative = torch.finfo(query.dtype).min / 2
        mask = torch.where(
            ops.convert_to_tensor(mask),
            torch.zeros((), dtype=query.dtype, device=query.device),
            torch.full((), negative, dtype=query.dtype, device=query.device),
        )
    if bias is not None:
        bias = ops.convert_to_tensor(bias).to(query.dtype)
        mask = bias if mask is None else mask + bias
    grouped = {"enable_gqa": True} if query.shape[1] != key.shape[1] else {}
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        is_causal=is_causal,
        scale=scale,
        **grouped,
    )  # (B, N, T, V)
    return output.transpose(1, 2)  # (B, T, N, V)
