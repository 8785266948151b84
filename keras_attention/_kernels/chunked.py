"""The memory-efficient path: query chunks, rematerialised for gradients.

The queries are processed in chunks of rows by a sequential loop
(`ops.map`), so one chunk's buffers are live at a time, and each chunk is
recomputed in the backward pass (`jax.checkpoint`, `tf.recompute_grad`,
`torch.utils.checkpoint`), so a training step never holds the whole
`(B, N, T, S)` weight matrix. Each chunk runs the reference computation on
its rows, so the numbers are the reference path's.

Shape legend: B batch, T query length, S key length, C chunk rows,
N query heads, H head dim, V value head dim.
"""

import keras
from keras import ops


def chunked_attention(
    query, key, value, mask, is_causal, scale, reference, chunk_size
):
    """Attention over `chunk_size` query rows at a time.

    `mask` has the weights' rank (`(..., T|1, S)`); `reference` computes
    one chunk: `reference(query, key, value, mask, scale, causal_offset)`.
    """
    length = query.shape[1]
    chunks = -(-length // chunk_size)
    pad = chunks * chunk_size - length
    # The last chunk is padded with queries whose outputs are dropped.
    rows = _to_chunks(query, 1, pad, chunks, chunk_size)  # (chunks,B,C,...)
    chunked_mask = mask is not None and mask.shape[-2] != 1
    if chunked_mask:
        mask_axis = len(mask.shape) - 2
        mask_rows = _to_chunks(mask, mask_axis, pad, chunks, chunk_size)
    starts = ops.arange(chunks) * chunk_size  # first query of each chunk

    def chunk(inputs):
        query_rows, start = inputs[0], inputs[1]
        rows_mask = inputs[2] if chunked_mask else mask  # (..., C|1, S)

        def attend_rows(query_rows, key, value):
            offset = start if is_causal else None
            return reference(query_rows, key, value, rows_mask, scale, offset)

        # Keys and values are explicit arguments: TensorFlow's
        # `recompute_grad` differentiates only those, never a closure.
        return _rematerialized(attend_rows)(query_rows, key, value)

    inputs = (rows, starts, mask_rows) if chunked_mask else (rows, starts)
    outputs = ops.map(chunk, inputs)  # (chunks, B, C, [N,] V)
    outputs = ops.moveaxis(outputs, 0, 1)  # (B, chunks, C, [N,] V)
    outputs = ops.reshape(
        outputs, (-1, chunks * chunk_size, *outputs.shape[3:])
    )  # (B, T + pad, [N,] V)
    return outputs[:, :length]


def _to_chunks(tensor, axis, pad, chunks, chunk_size):
    """`tensor` with `axis` padded by `pad` and split into `chunks` equal
    pieces stacked on a new leading axis."""
    if pad:
        widths = [(0, 0)] * len(tensor.shape)
        widths[axis] = (0, pad)
        tensor = ops.pad(tensor, widths)
    shape = ops.shape(tensor)
    tensor = ops.reshape(
        tensor, (*shape[:axis], chunks, chunk_size, *shape[axis + 1 :])
    )
    return ops.moveaxis(tensor, axis, 0)


def _rematerialized(fn):
    """`fn` whose intermediates are recomputed, not stored, for gradients.

    Only the explicit arguments of `fn` get gradients on TensorFlow."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.checkpoint(fn)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.recompute_grad(fn)
    import torch.utils.checkpoint

    def checkpointed(*args):
        if not torch.is_grad_enabled():
            return fn(*args)
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)

    return checkpointed
