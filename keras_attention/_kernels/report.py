"""What `functional.explain` and the layers' `explain` report: the path
attention takes, why each faster path was refused, and how the structure
reaches that path.

It asks the same rule the dispatch uses (`dispatch.choose`), so the
report cannot disagree with what runs.
"""

import keras

from keras_attention._kernels import dispatch

_PATH_NAMES = {
    "fused": "fused kernel",
    "chunked": "blockwise (chunked) path",
    "reference": "reference path",
}


class Explanation:
    """Which path a call of attention takes, and why.

    Attributes:
        path: str. `"fused"`, `"chunked"` or `"reference"`.
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
    path, refused = dispatch.choose(
        query, key, value, weights=weights, structure=structure
    )
    if weights and reason is not None:
        refused = {name: reason for name in refused}
    return Explanation(
        path, refused, _lowering(path, mask, structure), keras.backend.backend()
    )


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
                "applied inside each"
            )
        if structure.has_segments:
            parts.append(
                "key blocks that share no segment id with a query block "
                "skipped; segment ids compared inside the others"
            )
    elif (
        path == "fused"
        and structure.is_top_left_causal
        and mask is None
        and not structure.alibi
    ):
        parts.append("the kernel's causal flag (it skips the masked blocks)")
    else:
        parts.append("a dense (T, S) mask")
    if mask is not None:
        parts.append("with the given mask")
    if structure.soft_cap is not None:
        parts.append(f"logits soft-capped at {structure.soft_cap:g}")
    if structure.alibi:
        parts.append("ALiBi bias added to the logits")
    return "; ".join(parts)
