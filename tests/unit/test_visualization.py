"""plot_attention writes real heatmaps."""

import numpy as np
import pytest

from keras_attention import visualization
from keras_attention.visualization import plot_attention


def test_plot_attention_writes_a_png(tmp_path):
    weights = np.array([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1]])
    figure = plot_attention(
        weights, ["ein", "zwei", "<eos>"], ["one", "two"], title="alignment"
    )
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_xticklabels()] == [
        "ein",
        "zwei",
        "<eos>",
    ]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["one", "two"]
    np.testing.assert_allclose(axes.images[0].get_array(), weights)
    path = tmp_path / "alignment.png"
    figure.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 2000


@pytest.mark.parametrize(
    "rows, cols, size, label_points, steps",
    [
        # Short: 0.45-inch cells (the figure's floor), 10-point labels.
        (2, 3, (3.0, 2.5), 10.0, (1, 1)),
        # Width-bound: 8.5 / 45 inches a cell, labels still 10 points.
        (58, 45, (10.0, 58 * 8.5 / 45 + 1.2), 10.0, (1, 1)),
        # 8.5 / 60 inches a cell: labels of 0.75 of a cell's 72 x 0.142 pt.
        (70, 60, (10.0, 70 * 8.5 / 60 + 1.2), 0.75 * 72 * 8.5 / 60, (1, 1)),
        # 8.5 / 80 inches: one cell holds 5.7 points, so every 2nd token
        # is labelled, across two cells (11.5 points, capped at 10).
        (90, 80, (10.0, 90 * 8.5 / 80 + 1.2), 10.0, (2, 2)),
        # Height-bound: 12 / 300 inches (2.2 points) a cell; every 3rd.
        (300, 200, (200 * 0.04 + 1.5, 13.2), 3 * 0.75 * 72 * 0.04, (3, 3)),
    ],
)
def test_long_alignments_fit_a_page_with_readable_labels(
    rows, cols, size, label_points, steps
):
    """Cells shrink so that a long pair fits about 10 x 13 inches; labels
    shrink with them down to 6 points, below which every k-th token is
    labelled, at the size of its k cells."""
    import matplotlib.pyplot as plt

    weights = np.full((rows, cols), 1.0 / cols)
    figure = plot_attention(
        weights, [f"s{j}" for j in range(cols)], [f"t{i}" for i in range(rows)]
    )
    np.testing.assert_allclose(figure.get_size_inches(), size)
    axes = figure.axes[0]
    x_step, y_step = steps
    assert [t.get_text() for t in axes.get_xticklabels()] == [
        f"s{j}" for j in range(0, cols, x_step)
    ]
    assert list(axes.get_yticks()) == list(range(0, rows, y_step))
    for label in (*axes.get_xticklabels(), *axes.get_yticklabels()):
        assert label.get_fontsize() == pytest.approx(label_points)
        assert label.get_fontsize() >= 6.0
    plt.close(figure)


def test_plot_into_existing_axes_and_backend_tensors():
    import keras
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots()
    out = plot_attention(keras.ops.eye(3), ax=ax)
    assert out is figure
    np.testing.assert_allclose(ax.images[0].get_array(), np.eye(3))
    plt.close(figure)


def test_plot_attention_bad_input():
    with pytest.raises(ValueError, match=r"weights.shape=\(3,\)"):
        plot_attention(np.ones(3))
    with pytest.raises(ValueError, match="source_tokens"):
        plot_attention(np.ones((2, 3)), source_tokens=["a", "b"])


def test_save_figure_writes_what_the_keys_show(tmp_path):
    import matplotlib.pyplot as plt
    from PIL import Image

    figure, (left, right) = plt.subplots(1, 2)
    left.plot([0, 1], label="may attend")
    left.plot([1, 0], label="masked out")
    left.legend()
    colour = figure.colorbar(right.imshow(np.eye(2)), ax=right)
    colour.set_label("weight")
    plain, _ = plt.subplots()
    written = {}
    for name, fig in (("keyed", figure), ("plain", plain)):
        returned = visualization.save_figure(fig, tmp_path / f"{name}.png")
        with Image.open(tmp_path / f"{name}.png") as image:
            written[name] = (returned, image.text["Legend"])
        plt.close(fig)
    expected = "legend: may attend, masked out; colour bar: weight"
    assert written == {"keyed": (expected, expected), "plain": ("", "")}


def test_plot_attention_keeps_the_users_matplotlib_backend():
    import matplotlib
    import matplotlib.pyplot as plt

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # not the Agg it used to switch to
    try:
        figure = plot_attention(np.eye(2), ["a", "b"], ["A", "B"])
        assert matplotlib.get_backend() == "svg"
        assert plt.fignum_exists(figure.number)  # plt.show() would show it
        plt.close(figure)
    finally:
        matplotlib.use(before)
