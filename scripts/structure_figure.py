"""Draws the masks of the attention-structure concept page.

    python scripts/structure_figure.py  # writes docs/assets/concepts/

Each panel is `functional.structure_mask` for one set of arguments
(dark = may attend, as the legend says).
"""

import pathlib

import keras
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from keras_attention import functional  # noqa: E402
from keras_attention.visualization import save_figure  # noqa: E402

IDS = [[1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 0, 0]]
PANELS = [
    ("is_causal=True", dict(is_causal=True), 12, 12),
    ("is_causal='bottom_right'\n(4 new queries, 12 keys)",
     dict(is_causal="bottom_right"), 4, 12),
    ("is_causal=True, sliding_window=4", dict(is_causal=True,
                                              sliding_window=4), 12, 12),
    ("sliding_window=(2, 2)", dict(sliding_window=(2, 2)), 12, 12),
    ("segment_ids (3 packed sequences,\n2 padding)",
     dict(segment_ids=IDS), 12, 12),
    ("segment_ids + is_causal=True",
     dict(segment_ids=IDS, is_causal=True), 12, 12),
]  # fmt: skip


ATTEND, BLOCKED = plt.get_cmap("Blues")(1.0), plt.get_cmap("Blues")(0.0)


def main():
    # Constrained layout keeps each row's "key j" clear of the titles below.
    figure, axes = plt.subplots(2, 3, figsize=(10.5, 8.0), layout="constrained")
    for ax, (title, arguments, t, s) in zip(axes.flat, PANELS, strict=True):
        mask = functional.structure_mask(t, s, **arguments)[0]
        mask = keras.ops.convert_to_numpy(mask).astype("float32")
        ax.imshow(mask, cmap="Blues", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(s))
        ax.set_yticks(range(t))
        ax.set_xticks([x - 0.5 for x in range(s + 1)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(t + 1)], minor=True)
        ax.grid(which="minor", color="white", linewidth=0.8)
        ax.tick_params(which="both", length=0, labelsize=7)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
    figure.get_layout_engine().set(h_pad=0.15)
    figure.legend(
        handles=[
            Patch(facecolor=ATTEND, edgecolor="grey", label="may attend"),
            Patch(facecolor=BLOCKED, edgecolor="grey", label="masked out"),
        ],
        loc="outside upper center",
        ncols=2,
        fontsize=10,
        frameon=False,
    )
    out = pathlib.Path(__file__).parents[1] / "docs/assets/concepts"
    out.mkdir(parents=True, exist_ok=True)
    save_figure(figure, out / "structure_masks.png", dpi=90)
    print("wrote", out / "structure_masks.png")


if __name__ == "__main__":
    main()
