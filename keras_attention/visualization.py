"""Attention maps as heatmaps: alignment between target and source tokens.

Needs the `[viz]` extra (matplotlib).
"""

import math

import numpy as np

_MIN_POINTS = 6.0


def plot_attention(
    weights, source_tokens=None, target_tokens=None, ax=None, title=None
):
    """Draws a `(T, S)` alignment as a heatmap with tokens on the axes.

    Row `t` is the attention of target step `t` over the source; a sharp
    diagonal means monotonic alignment, off-diagonal blocks show the
    reordering a translation needed. Attention weights show where a model
    looked, which is not always why it decided (Jain and Wallace, 2019).
    Labels take the size their cells allow (6 to 10 points); where cells
    are smaller, as on long character-level pairs, every k-th token is
    labelled.

    Args:
        weights (ArrayLike): Shape `(T, S)` (a backend tensor or NumPy
            array).
        source_tokens (list[str] | None): `S` labels for the x axis.
        target_tokens (list[str] | None): `T` labels for the y axis.
        ax (matplotlib.axes.Axes | None): Draw into it instead of a new
            figure.
        title (str | None): The figure title.

    Returns:
        matplotlib.figure.Figure: The figure.

    Examples:
        >>> import numpy as np
        >>> figure = plot_attention(
        ...     np.eye(3), ["a", "b", "c"], ["A", "B", "C"], title="identity"
        ... )
        >>> figure.axes[0].get_title()
        'identity'
    """
    try:  # pyplot keeps the user's backend (headless, it picks Agg)
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the extra
        raise ImportError(
            "plot_attention needs matplotlib: "
            "pip install 'keras-attention-layers[viz]'"
        ) from error
    weights = _to_numpy(weights)
    if weights.ndim != 2 or 0 in weights.shape:
        raise ValueError(
            "plot_attention: `weights` must be (T, S), with T and S > 0. "
            f"Received: weights.shape={weights.shape}"
        )
    rows, cols = weights.shape
    for name, tokens, size in (
        ("source_tokens", source_tokens, cols),
        ("target_tokens", target_tokens, rows),
    ):
        if tokens is not None and len(tokens) != size:
            raise ValueError(
                f"plot_attention: `{name}` must have {size} entries to match "
                f"weights.shape={weights.shape}. "
                f"Received: len({name})={len(tokens)}"
            )
    if ax is None:
        # Inches per token: roomy for short sequences, and long ones still
        # fit a page (about 10 x 13 inches) rather than growing with T, S.
        cell = min(0.45, 8.5 / cols, 12.0 / rows)
        figure, ax = plt.subplots(
            figsize=(max(3.0, cell * cols + 1.5), max(2.5, cell * rows + 1.2))
        )
        cell_x = cell_y = cell
    else:
        figure = ax.figure
        box = ax.get_position()  # in figure fractions
        width, height = figure.get_size_inches()
        cell_x, cell_y = box.width * width / cols, box.height * height / rows
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, aspect="auto")
    colorbar = figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    colorbar.set_label("attention weight")
    if source_tokens is not None:
        _label_ticks(ax.set_xticks, source_tokens, cell_x, rotation=60,
                     ha="right")  # fmt: skip
    if target_tokens is not None:
        _label_ticks(ax.set_yticks, target_tokens, cell_y)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    if title:
        ax.set_title(title)
    figure.tight_layout()
    return figure


def save_figure(figure, path, **kwargs):
    """Saves a Matplotlib `figure` as a PNG that says what its keys show.

    The PNG's `Legend` text entry lists the entries of every legend and
    the label of every colour bar in the figure (empty when it has none),
    so that a reader of the file, or a test over a documentation site's
    images, can tell which colour means what without opening the figure.

    Args:
        figure (matplotlib.figure.Figure): The figure to save.
        path (str | os.PathLike): Where to write the PNG.
        **kwargs: Passed on to `figure.savefig` (`dpi`, `bbox_inches`).

    Returns:
        str: The `Legend` entry written, such as `"legend: may attend,
            masked out"` or `"colour bar: attention weight"`, one part per
            key, joined by `"; "`.

    Examples:
        >>> import os, tempfile
        >>> import numpy as np
        >>> figure = plot_attention(np.eye(2), ["a", "b"], ["A", "B"])
        >>> path = os.path.join(tempfile.mkdtemp(), "alignment.png")
        >>> save_figure(figure, path)
        'colour bar: attention weight'
    """
    keys = []
    for legend in [*figure.legends, *(ax.get_legend() for ax in figure.axes)]:
        if legend is not None:
            entries = ", ".join(text.get_text() for text in legend.get_texts())
            keys.append(f"legend: {entries}")
    for ax in figure.axes:
        # Matplotlib marks a colour bar's axes with `_colorbar` (no public
        # accessor exists); other axes have none.
        colorbar = getattr(ax, "_colorbar", None)
        if colorbar is not None:
            label = colorbar.ax.get_ylabel() or colorbar.ax.get_xlabel()
            keys.append(f"colour bar: {label}" if label else "colour bar")
    legend = "; ".join(keys)
    figure.savefig(path, format="png", metadata={"Legend": legend}, **kwargs)
    return legend


def _label_ticks(set_ticks, tokens, cell, **kwargs):
    """Labels as large as their cells allow, 10 points at most. Where a
    cell is too small for a 6-point label (long character-level pairs),
    every k-th token is labelled, so that labels never overlap."""
    points = 0.75 * 72 * cell  # the label size that fills one cell
    step = max(1, math.ceil(_MIN_POINTS / points))
    shown = range(0, len(tokens), step)
    set_ticks(
        shown,
        [tokens[i] for i in shown],
        fontsize=min(10.0, points * step),
        **kwargs,
    )


def _to_numpy(weights):
    if hasattr(weights, "numpy") or not isinstance(weights, np.ndarray):
        import keras

        weights = keras.ops.convert_to_numpy(weights)
    try:
        return np.asarray(weights, dtype="float32")
    except (TypeError, ValueError) as error:
        raise ValueError(
            "plot_attention: `weights` must be numbers (T, S). "
            f"Received: {error}"
        ) from None
