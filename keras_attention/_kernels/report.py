"""What `functional.explain` and the layers' `explain` report: the path
attention takes, why each faster path was refused, and how the structure
reaches that path.

It asks the same rule the dispatch uses (`dispatch.choose`), so the
report cannot disagree with what runs.
"""

import types

import keras
import numpy as np
from keras import ops

from keras_attention._core.mods import BlockTable
from keras_attention._core.mods import Chained
from keras_attention._core.mods import Positioned
from keras_attention._kernels import dispatch
from keras_attention._kernels import flex as flex_kernel
from keras_attention._kernels import runtime
from keras_attention._kernels.blockwise import plan

_PATH_NAMES = {
    "fused": "fused kernel",
    "chunked": "blockwise (chunked) path",
    "reference": "reference path",
    "context_parallel": "context-parallel attention",
    "flex": "PyTorch's flex_attention",
}


class Explanation:
    """Which path a call of attention takes, and why.

    Attributes:
        path: str. `"fused"`, `"chunked"`, `"reference"`, or
            `"context_parallel"` under `distribution.ContextParallel`.
        refused: dict. For each faster path not taken, the reason.
        structure: str. How the causal, window and segment structure is
            applied on that path.
        backend: str. The Keras backend.
    """

    def __init__(self, path, refused, structure, backend):
        self.path = path
        self.refused = dict(refused)
        self.structure = structure
        self.backend = backend

    def __str__(self):
        lines = [
            f"path: {self.path} ({_PATH_NAMES[self.path]}, {self.backend})"
        ]
        for name, reason in self.refused.items():
            lines.append(f"{_PATH_NAMES.get(name, name)} refused: {reason}")
        lines.append(f"structure: {self.structure}")
        return "\n".join(lines)

    def __repr__(self):
        return f"Explanation(path={self.path!r}, refused={self.refused!r})"


def explain_call(query, key, value, mask, structure, weights, reason=None):
    """The `Explanation` of one call; `reason`, if given, is why the
    weights are needed (it replaces the generic one)."""
    distribution = runtime.context_parallel()
    if distribution is not None:
        # Imported here: it is written in JAX, the only backend with one.
        from keras_attention._kernels import context

        why = context.refusal(structure, weights)
        if why is None:
            return _context_parallel(query, key, value, structure, distribution)
    path, refused = dispatch.choose(
        query, key, value, weights=weights, structure=structure
    )
    if weights and reason is not None:
        refused = {name: reason for name in refused}
    if path == "fused" and flex_kernel.chosen(query, key, value):
        lowering = _flex(mask, structure)
    else:
        if keras.backend.backend() == "torch" and (
            structure.mask_mod is not None or structure.score_mod is not None
        ):
            refused["flex"] = flex_kernel.not_chosen(query, key, value)
        lowering = _lowering(path, mask, structure)
        if path == "chunked":
            block = dispatch.call_chunk_size(query, key, mask, structure)
            blocks = f"blocks of {block} queries and keys"
            lowering = f"{lowering}; {blocks}" if lowering else blocks
        if structure.mask_mod is not None or structure.score_mod is not None:
            mods = _mods(path, query, key, structure)
            lowering = f"{lowering}; {mods}" if lowering else mods
    if distribution is not None:
        refused = {"context_parallel": why, **refused}
    return Explanation(path, refused, lowering, keras.backend.backend())


def _context_parallel(query, key, value, structure, distribution):
    """The `Explanation` of a call under `ContextParallel`."""
    from keras_attention._kernels import context  # JAX only, as above

    sharding, reasons = context.plan(query, key, value, structure, distribution)
    visited = context.visited_chunks(
        sharding, structure, query.shape[1], key.shape[1]
    )
    lowering = (
        f"{sharding.devices} devices along '{sharding.sequence_axis}'; "
        f"{reasons['exchange']}; {reasons['order']}; chunk pairs visited "
        f"per device: {', '.join(map(str, visited))} of "
        f"{4 * sharding.devices} (band, segment ids, masks and mask mods "
        "at global positions)"
    )
    return Explanation("context_parallel", {}, lowering, "jax")


def _mods(path, query, key, structure):
    """How the mods reach `path`, with the block pairs a mask mod leaves
    to the blockwise path."""
    parts = []
    if structure.mask_mod is not None:
        mod = _name(structure.mask_mod)
        if path != "chunked":
            parts.append(f"mask mod {mod} evaluated on the whole grid")
        else:
            parts.append(f"mask mod {mod} {_visited(query, key, structure)}")
    if structure.score_mod is not None:
        mod = _name(structure.score_mod)
        if path == "chunked":
            parts.append(
                f"score mod {mod} applied inside each block visited (its "
                "backward pass block by block)"
            )
        else:
            parts.append(f"score mod {mod} applied to the whole (T, S) logits")
    return "; ".join(parts)


def _name(mod):
    """A mod as a reader knows it: the mods of `keras_attention.mods` by
    their call, a layer by its class and name, a function by its name."""
    if isinstance(mod, types.MethodType) and isinstance(
        mod.__self__, keras.Layer
    ):
        return f"{type(mod.__self__).__name__} (layer '{mod.__self__.name}')"
    if isinstance(mod, Chained):
        return " then ".join(_name(m) for m in mod.mods)
    if isinstance(mod, Positioned):
        return _name(mod.mod)
    if isinstance(mod, types.FunctionType):
        return f"function {mod.__name__}"
    return repr(mod)


def _visited(query, key, structure):
    """`"...: 12 of 16 block pairs visited (6 full)"`, or what is known
    without the batch size."""
    batch = runtime.static_dim(query.shape[0])
    lengths = [runtime.static_dim(x.shape[1]) for x in (query, key)]
    block = dispatch.chunk_size(structure)
    if batch is None or None in lengths:
        return "evaluated once per call into a map of blocks"
    heads = 1 if len(query.shape) == 3 else query.shape[2]
    sizes = (batch, heads, *lengths, block)
    known = plan.known_mod_blocks(structure, *sizes)
    reused = isinstance(structure.mask_mod, BlockTable) and known is not None
    table = ops.convert_to_numpy(plan.block_map(structure, *sizes, known))
    visited, full = int(np.sum(table > 0)), int(np.sum(table == plan.FULL))
    how = "read from its block mask" if reused else "evaluated into a map"
    return (
        f"{how} of {block}-row blocks: {visited} of "
        f"{table.size} block pairs visited ({100 * visited / table.size:.0f}"
        f"%; {full} without an elementwise mask), the others skipped"
    )


def _flex(mask, structure):
    """How the structure reaches PyTorch's FlexAttention."""
    hiding = [
        name
        for name, part in (
            ("the given mask", mask),
            ("the band", structure.band),
            ("the segment ids", structure.segments),
            (
                f"mask mod {_name(structure.mask_mod)}",
                structure.mask_mod,
            ),
        )
        if part is not None
    ]
    scoring = [
        name
        for name, present in (
            (f"score mod {_name(structure.score_mod)}", structure.score_mod),
            (f"soft cap at {structure.soft_cap}", structure.soft_cap),
            ("ALiBi", structure.alibi or None),
        )
        if present is not None
    ]
    parts = ["PyTorch's flex_attention"]
    if hiding:
        parts.append(
            f"{', '.join(hiding)} as one block mask (the empty blocks skipped)"
        )
    if scoring:
        parts.append(f"{', then '.join(scoring)} inside the kernel")
    return "; ".join(parts)


def _holding(structure):
    """`" of the causal band and the segment ids"`: what a dense mask
    holds of the structure, or `""`."""
    held = []
    if structure.has_band:
        held.append("the causal band" if structure.causal else "the band")
    if structure.has_segments:
        held.append("the segment ids")
    return f" of {' and '.join(held)}" if held else ""


def _lowering(path, mask, structure):
    parts = []
    if structure.is_empty and not structure.causal:
        parts.append("no mask structure")
    elif path == "chunked":
        if structure.is_top_left_causal:
            parts.append(
                "key blocks above the diagonal skipped; the causal mask "
                "applied in the diagonal block only"
            )
        elif structure.has_band:
            parts.append(
                "only the key blocks the band reaches are visited; the band "
                "applied inside the ones it cuts"
            )
        if structure.has_segments:
            parts.append(
                "key blocks that share no segment id with a query block "
                "skipped; segment ids compared only inside the blocks that "
                "hold more than one"
            )
    elif (
        path == "fused"
        and structure.is_top_left_causal
        and mask is None
        and not structure.alibi
    ):
        parts.append("the kernel's causal flag (it skips the masked blocks)")
    else:
        parts.append(f"a dense (T, S) mask{_holding(structure)}")
    if mask is not None:
        parts.append("with the given mask")
    if structure.soft_cap is not None:
        parts.append(f"logits soft-capped at {structure.soft_cap:g}")
    if structure.alibi:
        parts.append("ALiBi bias added to the logits")
    return "; ".join(parts)
