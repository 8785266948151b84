"""PyTorch's FlexAttention (Dong et al. 2024) as the fused kernel of a
structure: the mask tensor, the band, the segment ids and the mask mod
become one `mask_mod` (a block mask: the kernel skips the blocks it leaves
empty), the score mod, soft cap and ALiBi one `score_mod`, in the order
the reference applies them.

The fused path takes it only where forced (`dispatch.force("fused",
flex="compiled")`, or `"eager"`: PyTorch's uncompiled reference
implementation, which holds the whole `(B, N, T, S)` logits and checks
the lowering quickly): the dispatch picks a path where it is measured
faster, and FlexAttention has not been measured on a GPU yet
(`benchmarks/gpu.py` measures it against the fused kernel on a dense
mask and the blockwise path). On a CPU, PyTorch has no backward pass for
it.

Shape legend: B batch, T query length, S key length, N query heads,
K key/value heads, H head dim, V value head dim.
"""

import contextlib
import functools
import warnings

import keras
from keras import ops

from keras_attention._core.binding import with_tensors
from keras_attention._core.builtins import Alibi
from keras_attention._core.builtins import SoftCap

MODES = ("compiled", "eager")
_forced = {"flex": None}  # a mode, or None: not forced


def refusal(query, key, value):
    """Why FlexAttention does not take these inputs, or `None`."""
    if keras.backend.backend() != "torch":
        return "FlexAttention is PyTorch's"
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        import torch

        return f"PyTorch {torch.__version__} has no FlexAttention"
    dtypes = {
        keras.backend.standardize_dtype(x.dtype) for x in (query, key, value)
    }
    if len(dtypes) > 1:
        return f"the inputs' dtypes differ ({', '.join(sorted(dtypes))})"
    return None


def not_chosen(query, key, value):
    """Why the dispatch does not run FlexAttention for these inputs."""
    reason = refusal(query, key, value)
    if reason is not None:
        return reason
    from keras_attention._kernels.backends import torch as primitives

    if primitives.on_cpu():
        return "PyTorch has no backward pass for it on a CPU"
    return (
        "not yet measured against the fused kernel on a dense mask on "
        "this device"
    )


@contextlib.contextmanager
def forced(mode="compiled"):
    """Inside the context, the fused path runs FlexAttention on the
    inputs it takes, compiled or eager (`mode` in `MODES`), or never
    (`None`)."""
    previous = _forced["flex"]
    _forced["flex"] = mode
    try:
        yield
    finally:
        _forced["flex"] = previous


def chosen(query, key, value) -> bool:
    """Whether the fused path runs FlexAttention for these inputs."""
    return _forced["flex"] is not None and refusal(query, key, value) is None


def attention(query, key, value, mask, structure, scale):
    """Attention through `torch.nn.attention.flex_attention`.

    Args:
        query, key, value: `(B, T, H)`, `(B, S, H)`, `(B, S, V)` or
            `(B, T, N, H)`, `(B, S, K, H)`, `(B, S, K, V)`.
        mask: boolean tensor of the weights' rank, or `None`.
        structure: `Structure`.
        scale: float. Multiplies the logits.

    Returns:
        The output, `(B, T, V)` or `(B, T, N, V)`; a query that sees no
        key gets zeros.
    """
    from torch.nn.attention import flex_attention as flex

    single_head = len(query.shape) == 3
    if single_head:
        query, key, value = (ops.expand_dims(x, 2) for x in (query, key, value))
        if mask is not None:
            mask = ops.expand_dims(mask, 1)  # (B|1, 1, T|1, S)
    query, key, value = (
        ops.convert_to_tensor(x).transpose(1, 2) for x in (query, key, value)
    )  # (B, N, T, H), (B, K, S, H), (B, K, S, V)
    batch, heads, length = query.shape[:3]
    key_length = key.shape[2]
    _check_mods(structure, heads, min(length, 2), min(key_length, 2))
    visible = _mask_mod(structure, mask)
    block_mask = None
    if visible is not None:
        block_mask = flex.create_block_mask(
            visible, batch, heads, length, key_length, device=query.device
        )
    with warnings.catch_warnings():
        # Uncompiled, PyTorch warns that it is slow.
        warnings.simplefilter("ignore", UserWarning)
        output = _kernel(_forced["flex"] == "compiled")(
            query,
            key,
            value,
            score_mod=_score_mod(structure, heads),
            block_mask=block_mask,
            scale=scale,
            enable_gqa=heads != key.shape[1],
        )  # (B, N, T, V)
    output = output.transpose(1, 2)  # (B, T, N, V)
    return ops.squeeze(output, 2) if single_head else output


def _check_mods(structure, heads, rows, cols):
    """The `ValueError`s of the other paths for a bad mod, which the
    kernel would raise from inside its trace: each mod is called once on
    the first `rows` queries and `cols` keys of every head."""
    queries, keys = ops.arange(rows), ops.arange(cols)
    structure.mod_mask(1, heads, queries, keys)
    structure.modify_scores(ops.zeros((1, heads, rows, cols)), queries, keys)


@functools.cache
def _kernel(compiled):
    """`flex_attention`, compiled or not."""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    import torch

    return torch.compile(flex_attention)


def _mask_mod(structure, mask):
    """Everything that hides keys as one `mask_mod(b, h, q_idx, kv_idx)`,
    or `None` where nothing does."""
    segments = structure.segments
    parts = [
        part
        for part in (
            structure.band,
            None if segments is None else _same_segment(segments),
            with_tensors(structure.mask_mod),
        )
        if part is not None
    ]
    if mask is not None:
        parts.append(_from_mask(ops.convert_to_tensor(mask)))
    if not parts:
        return None

    def visible(b, h, q_idx, kv_idx):
        result = parts[0](b, h, q_idx, kv_idx)
        for part in parts[1:]:
            result = ops.logical_and(result, part(b, h, q_idx, kv_idx))
        return result

    return visible


def _same_segment(segments):
    """The segment ids' mask mod, read by indexing: compiled on a CPU,
    PyTorch 2.13 gives wrong values for `keras.ops.take` inside a
    FlexAttention mod."""
    query_ids, key_ids = (
        ops.convert_to_tensor(ids)
        for ids in (segments.query_ids, segments.key_ids)
    )  # (B, T), (B, S)

    def same(b, h, q_idx, kv_idx):
        key = key_ids[b, kv_idx]
        return (query_ids[b, q_idx] == key) & (key != 0)

    return same


def _from_mask(mask):
    """A mask `(B|1, N|1, T|1, S|1)` as a mask mod."""

    def read(b, h, q_idx, kv_idx):
        indices = (b, h, q_idx, kv_idx)
        return mask[
            tuple(
                index if size > 1 else 0
                for index, size in zip(indices, mask.shape, strict=True)
            )
        ]

    return read


def _score_mod(structure, heads):
    """The score mod, soft cap and ALiBi, in that order, as one
    `score_mod(score, b, h, q_idx, kv_idx)` on float32 logits, or `None`
    where there are none."""
    score_mod = with_tensors(structure.score_mod)
    chain = [] if score_mod is None else [score_mod]
    if structure.soft_cap is not None:
        chain.append(SoftCap(structure.soft_cap))
    if structure.alibi:
        chain.append(with_tensors(Alibi(heads, structure.offset)))
    if not chain:
        return None

    def modified(score, b, h, q_idx, kv_idx):
        logits = ops.cast(score, "float32")
        for mod in chain:
            logits = mod(logits, b, h, q_idx, kv_idx)
        return ops.cast(logits, score.dtype)

    return modified
