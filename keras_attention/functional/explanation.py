"""Which path attention takes for a call, and why.

The report comes from the rule the dispatch itself uses, so it cannot
disagree with what runs.
"""

from keras_attention import _core
from keras_attention import _kernels
from keras_attention._core import Structure


def explain(
    query,
    key,
    value=None,
    mask=None,
    is_causal: bool | str = False,
    sliding_window: int | tuple[int, int] | None = None,
    segment_ids=None,
    return_attention_scores: bool = False,
    alibi: bool = False,
    logit_soft_cap: float | None = None,
    mask_mod=None,
    score_mod=None,
):
    """Which path `scaled_dot_product_attention` takes for these arguments,
    and why.

    The report comes from the rule the dispatch itself uses, for these
    shapes and dtypes on this backend and device: the path that will run,
    the reason each faster path was refused, and how the causal, window
    and segment structure is applied on that path. Nothing is computed.

    Args:
        query (Tensor | keras.KerasTensor): A tensor, or a `keras.KerasTensor`
            of its shape, as in `scaled_dot_product_attention`.
        key (Tensor | keras.KerasTensor): As there.
        value (Tensor | keras.KerasTensor | None): Defaults to `key`.
        mask (Tensor | None): As in `scaled_dot_product_attention`.
        is_causal: As there.
        sliding_window: As there.
        segment_ids (Tensor | tuple[Tensor, Tensor] | None): As there.
        return_attention_scores: As there.
        alibi: As there.
        logit_soft_cap: As there.
        mask_mod: As there. On the blockwise path the report counts the
            block pairs it leaves to visit (this evaluates the mod once,
            when the batch size is known).
        score_mod: As there.

    Returns:
        Explanation: Its `.path` (`"fused"`, `"chunked"` or
            `"reference"`), `.refused` (path name to reason), `.structure`;
            `print` it for a summary.

    Examples:
        >>> import keras
        >>> q = keras.KerasTensor((1, 64, 4, 16))
        >>> report = explain(q, q, return_attention_scores=True)
        >>> report.path
        'reference'
        >>> print(report.refused["fused"])
        the weights are requested; only the reference computes them
    """
    value = key if value is None else value
    mask = _core.check_inputs("explain", query, key, value, mask)
    structure = Structure.of_call(
        "explain",
        query,
        key,
        is_causal=is_causal,
        sliding_window=sliding_window,
        segment_ids=segment_ids,
        alibi=alibi,
        logit_soft_cap=logit_soft_cap,
        mask_mod=mask_mod,
        score_mod=score_mod,
    )
    return _kernels.explain_call(
        query, key, value, mask, structure, return_attention_scores
    )
