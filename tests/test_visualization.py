"""plot_attention writes real heatmaps."""

import numpy as np
import pytest

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
