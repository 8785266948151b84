"""NumPy references and backend-neutral utilities for the tests."""

import keras
import numpy as np

BACKEND = keras.backend.backend()
RNG_SEED = 20261129


def rng(seed=RNG_SEED):
    return np.random.default_rng(seed)


def to_numpy(x):
    """A float64 NumPy copy of a backend tensor (detached under torch)."""
    return np.asarray(
        keras.ops.convert_to_numpy(keras.ops.cast(x, "float32")), "float64"
    )


def np_masked_softmax(logits, mask):
    """Reference softmax: masked entries and empty rows get weight 0."""
    logits = np.asarray(logits, "float64")
    mask = np.broadcast_to(mask, logits.shape)
    safe = np.where(mask, logits, -np.inf)
    row_max = np.max(np.where(mask, logits, -1e300), axis=-1, keepdims=True)
    exp = np.where(mask, np.exp(safe - row_max), 0.0)
    total = exp.sum(axis=-1, keepdims=True)
    return np.divide(exp, total, out=np.zeros_like(exp), where=total > 0)


def np_sdpa(
    q, k, v, mask=None, causal=False, scale=None, soft_cap=None, bias=None
):
    """Reference scaled dot-product attention in float64.

    3-D `(B, T, H)` or 4-D `(B, T, N, H)` with `K <= N` key/value heads.
    Returns `(output, weights)`.
    """
    q, k, v = (np.asarray(x, "float64") for x in (q, k, v))
    single = q.ndim == 3
    if single:
        q, k, v = q[:, :, None], k[:, :, None], v[:, :, None]
    batch, t, n, h = q.shape
    s = k.shape[1]
    groups = n // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    scale = 1.0 / np.sqrt(h) if scale is None else scale
    logits = np.einsum("btnh,bsnh->bnts", q, k) * scale
    if soft_cap is not None:
        logits = soft_cap * np.tanh(logits / soft_cap)
    if bias is not None:
        logits = logits + bias  # (N, T, S)
    full = np.ones((batch, n, t, s), bool)
    if mask is not None:
        mask = np.asarray(mask, bool)
        if mask.ndim == 3:
            mask = mask[:, None]
        full &= np.broadcast_to(mask, full.shape)
    if causal:
        full &= np.tril(np.ones((t, s), bool))
    weights = np_masked_softmax(logits, full)
    out = np.einsum("bnts,bsnv->btnv", weights, v)
    if single:
        return out[:, :, 0], weights[:, 0]
    return out, weights


def np_structure_mask(
    batch, t, s, is_causal=False, sliding_window=None, segment_ids=None
):
    """Reference `(B, T, S)` visibility of the structural arguments of
    `scaled_dot_product_attention`, written position by position."""
    offset = s - t if is_causal == "bottom_right" else 0
    if sliding_window is None:
        left = right = None
    elif isinstance(sliding_window, int):
        left, right = sliding_window - 1, 0
    else:
        left, right = sliding_window
    if segment_ids is not None and not isinstance(segment_ids, tuple):
        segment_ids = (segment_ids, segment_ids)
    visible = np.ones((batch, t, s), bool)
    for b in range(batch):
        for i in range(t):
            p = i + offset  # the query's position among the keys
            for j in range(s):
                if is_causal and j > p:
                    visible[b, i, j] = False
                if left is not None and j < p - left:
                    visible[b, i, j] = False
                if right is not None and j > p + right:
                    visible[b, i, j] = False
                if segment_ids is not None:
                    query_id = segment_ids[0][b][i]
                    key_id = segment_ids[1][b][j]
                    if key_id == 0 or query_id != key_id:
                        visible[b, i, j] = False
    return visible


def np_mask_mod(spec, batch, heads, t, s):
    """Reference `(B, N, T, S)` visibility of a mask mod of
    `keras_attention.mods`, written position by position. `spec` is
    `(name, argument)`, or `("and" | "or", [specs])`."""
    visible = np.zeros((batch, heads, t, s), bool)
    for b in range(batch):
        for n in range(heads):
            for i in range(t):
                for j in range(s):
                    visible[b, n, i, j] = _np_sees(spec, b, n, i, j)
    return visible


def _np_sees(spec, b, n, i, j):
    name, argument = spec
    if name == "and":
        return all(_np_sees(x, b, n, i, j) for x in argument)
    if name == "or":
        return any(_np_sees(x, b, n, i, j) for x in argument)
    if name == "causal":
        return j <= i
    if name == "sliding_window":
        if isinstance(argument, int):
            return i - argument < j <= i
        left, right = argument
        return i - left <= j <= i + right
    if name == "document":
        query_ids, key_ids = argument
        return key_ids[b][j] != 0 and query_ids[b][i] == key_ids[b][j]
    if name == "prefix_lm":
        return j < argument[b] or j <= i
    if name == "chunked":
        return i // argument == j // argument
    if name == "sink_tokens":
        return j < argument
    raise ValueError(name)


def np_t5_bucket(relative_position, num_buckets, max_distance, bidirectional):
    """T5's relative position bucket of one `kv_idx - q_idx`, as written in
    Raffel et al.'s code (Mesh TensorFlow), for one position."""
    bucket, n = 0, -relative_position
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return bucket + n
    large = exact + int(
        np.float32(
            np.log(np.float32(n) / np.float32(exact))
            / np.float32(np.log(max_distance / exact))
            * (num_buckets - exact)
        )
    )
    return bucket + min(large, num_buckets - 1)


def np_alibi_bias(num_heads, t, s, offset=0):
    """`(N, T, S)`: `-m_n |i + offset - j|`, slopes written out as in
    Press et al. 2022 (powers of two; other counts interleave)."""
    slopes = {
        1: [2**-8],
        2: [2**-4, 2**-8],
        4: [2**-2, 2**-4, 2**-6, 2**-8],
        6: [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3],
    }[num_heads]
    i, j = np.arange(t)[:, None] + offset, np.arange(s)[None, :]
    return -np.asarray(slopes)[:, None, None] * np.abs(i - j)


def gradient(fn, x):
    """d sum(fn(x)) / dx on the active backend, as NumPy."""
    if BACKEND == "jax":
        import jax

        return np.asarray(jax.grad(lambda y: fn(y).sum())(x))
    if BACKEND == "tensorflow":
        import tensorflow as tf

        x = tf.Variable(x)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(fn(x), "float32"))
        return tape.gradient(loss, x).numpy()
    import torch

    x = torch.tensor(x, requires_grad=True)
    fn(x).float().sum().backward()
    return x.grad.numpy()


def np_rotary(x, start=0, max_wavelength=10000.0):
    """Reference rotary embedding (half-split pairs) of `(B, T, [N,] H)`."""
    x = np.asarray(x, "float64")
    length, dim = x.shape[1], x.shape[-1]
    positions = np.arange(length) + start
    inverse = max_wavelength ** (-np.arange(0, dim, 2) / dim)
    angles = positions[:, None] * inverse[None, :]  # (T, H/2)
    if x.ndim == 4:
        angles = angles[:, None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    first, second = x[..., : dim // 2], x[..., dim // 2 :]
    return np.concatenate(
        [first * cos - second * sin, second * cos + first * sin], axis=-1
    )
