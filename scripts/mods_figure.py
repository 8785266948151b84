"""Draws the mask mods of the programmable-attention concept page.

    python scripts/mods_figure.py  # writes docs/assets/concepts/

Each panel is one mask mod of `keras_attention.mods` evaluated on a
12 x 12 grid (dark = may attend); the last panel is the map of blocks
that the blockwise path reads for one of them.
"""

import pathlib

import keras
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from keras_attention import mods  # noqa: E402
from keras_attention.visualization import save_figure  # noqa: E402

N = 12
IDS = np.array([[1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 0, 0]])
PANELS = [
    ("causal()", mods.causal()),
    ("sliding_window(4)", mods.sliding_window(4)),
    ("sliding_window((2, 2))", mods.sliding_window((2, 2))),
    ("document(ids): 3 documents, padding", mods.document(IDS)),
    ("prefix_lm([5])", mods.prefix_lm(np.array([5]))),
    ("chunked(4)", mods.chunked(4)),
    (
        "and_masks(causal(), chunked(4))",
        mods.and_masks(mods.causal(), mods.chunked(4)),
    ),
    (
        "or_masks(sink_tokens(2), sliding_window(3))",
        mods.or_masks(mods.sink_tokens(2), mods.sliding_window(3)),
    ),
]
BLOCKS_OF = PANELS[-1][1]


def grid():
    return (
        np.zeros((1, 1, 1, 1), "int32"),
        np.zeros((1, 1, 1, 1), "int32"),
        np.arange(N, dtype="int32").reshape(1, 1, N, 1),
        np.arange(N, dtype="int32").reshape(1, 1, 1, N),
    )


def draw(ax, image, title, ticks, vmax=1.0):
    ax.imshow(image, cmap="Blues", vmin=-0.15, vmax=vmax)
    size = image.shape[0]
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.set_xticks([x - 0.5 for x in range(size + 1)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(size + 1)], minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="both", length=0, labelsize=7)
    ax.set_title(title, fontsize=8)


def main():
    figure, axes = plt.subplots(3, 3, figsize=(9.6, 10.4))
    for ax, (title, mod) in zip(axes.flat, PANELS, strict=False):
        mask = keras.ops.convert_to_numpy(mod(*grid()))[0, 0]
        mask = np.broadcast_to(mask, (N, N)).astype("float32")
        draw(ax, mask, title, range(0, N, 2))
        ax.set_xlabel("kv_idx", fontsize=8)
        ax.set_ylabel("q_idx", fontsize=8)
    blocks = mods.block_mask(BLOCKS_OF, 1, 1, N, N, block_size=3).blocks
    blocks = keras.ops.convert_to_numpy(blocks).astype("float32")
    ax = axes.flat[-1]
    title = "its block map: 4 x 4 blocks of 3 x 3 positions"
    draw(ax, blocks, title, [], vmax=2.0)
    ax.set_xlabel("key block", fontsize=8)
    ax.set_ylabel("query block", fontsize=8)
    colours = plt.get_cmap("Blues")
    figure.legend(
        handles=[
            Patch(color=colours(0.08), label="hidden / empty block (skipped)"),
            Patch(color=colours(0.54), label="partial block (mod applied)"),
            Patch(color=colours(1.0), label="may attend / full block"),
        ],
        loc="lower center",
        ncol=3,
        fontsize=9,
        frameon=False,
    )
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    out = pathlib.Path(__file__).parents[1] / "docs/assets/concepts"
    out.mkdir(parents=True, exist_ok=True)
    save_figure(figure, out / "mods_masks.png", dpi=80)
    print("wrote", out / "mods_masks.png")


if __name__ == "__main__":
    main()
