"""Packed documents with one mask mod: a character language model that
trains on many short documents per row and never attends across them.

Short documents waste most of a padded batch. Packing them end to end
into long rows fills it, but plain causal attention would then let each
token see the documents before it. One mask mod keeps them apart:

    mask_mod = mods.and_masks(mods.causal(), mods.document(ids))

where `ids` numbers the documents of each row. With ALiBi (a bias on the
distance between positions, so a document does not know where in the
row it starts), the model's predictions for a packed document are then
exactly its predictions for that document alone, which the script
checks. The documents are English number words (`"three hundred and
forty-two"`).

    KERAS_BACKEND=jax python examples/packed_documents.py [--smoke]
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attention as ka  # noqa: E402
from keras_attention import functional  # noqa: E402
from keras_attention import mods  # noqa: E402

DIM, HEADS = 64, 4


class PackedLM(keras.Model):
    """Embedding, Transformer decoder blocks with ALiBi, a softmax over
    characters; attention stays inside each document of a row."""

    def __init__(self, vocabulary_size, num_blocks, **kwargs):
        super().__init__(**kwargs)
        self.embedding = keras.layers.Embedding(vocabulary_size, DIM)
        self.blocks = [
            ka.TransformerDecoderBlock(
                HEADS, 2 * DIM, alibi=True, normalize_first=True
            )
            for _ in range(num_blocks)
        ]
        self.norm = keras.layers.LayerNormalization()
        self.head = keras.layers.Dense(vocabulary_size)

    def call(self, inputs):
        tokens, ids = inputs  # (B, T), (B, T): document ids, 0 = padding
        mask_mod = mods.and_masks(mods.causal(), mods.document(ids))
        x = self.embedding(tokens)  # (B, T, D)
        for block in self.blocks:
            x = block(x, use_causal_mask=False, mask_mod=mask_mod)
        return self.head(self.norm(x))  # (B, T, V)


def documents(count, seed):
    corpus = ka.datasets.load_numbers(count, seed=seed)
    return [target for _, target in corpus.train], [
        target for _, target in corpus.test
    ]


def pack(texts, characters, row_length):
    """Documents end to end in rows: inputs, next-character targets,
    document ids (0 = padding) and each document's `(row, start, end)`."""
    index = {c: i + 1 for i, c in enumerate(characters)}  # 0 = padding
    rows, places = [[]], []
    for text in texts:
        encoded = [index[c] for c in text] + [len(characters) + 1]  # end
        if len(rows[-1]) + len(encoded) > row_length:
            rows.append([])
        places.append(
            (len(rows) - 1, len(rows[-1]), len(rows[-1]) + len(encoded))
        )
        rows[-1].extend(encoded)
    tokens = np.zeros((len(rows), row_length + 1), "int32")
    ids = np.zeros((len(rows), row_length), "int32")
    for document, (row, start, end) in enumerate(places, 1):
        ids[row, start:end] = document
    for r, row in enumerate(rows):
        tokens[r, 1 : len(row) + 1] = row  # a start token (0) first
    starts = tokens[:, :-1].copy()
    for row, start, _ in places:
        starts[row, start] = 0  # each document starts afresh
    targets = tokens[:, 1:]
    return starts, targets, ids, places


def main():
    from examples.backend import publish

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    count, row_length, epochs = (
        (600, 128, 1) if args.smoke else (20000, 512, args.epochs)
    )
    train, test = documents(count, seed=0)
    characters = sorted(set("".join(train + test)))
    x, y, ids, _ = pack(train, characters, row_length)
    tx, ty, tids, places = pack(test, characters, row_length)
    model = PackedLM(len(characters) + 2, num_blocks=1 if args.smoke else 2)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    weights = (ids > 0).astype("float32")  # no loss on padding
    print(
        f"{len(train)} documents packed into {len(x)} rows of {row_length} "
        f"characters ({weights.mean():.0%} real) on {keras.backend.backend()}"
    )
    start = time.perf_counter()
    history = model.fit(
        [x, ids], y, sample_weight=weights, batch_size=16, epochs=epochs,
        verbose=0,
    )  # fmt: skip
    train_seconds = time.perf_counter() - start
    print(
        f"trained {epochs} epochs in {train_seconds:.0f} s, "
        f"final loss {history.history['loss'][-1]:.3f}"
    )
    logits = keras.ops.convert_to_numpy(model([tx, tids]))
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    real = tids > 0
    picked = np.take_along_axis(log_probs, ty[..., None], -1)[..., 0]
    perplexity = float(np.exp(-picked[real].mean()))
    print(f"test perplexity per character: {perplexity:.2f}")
    # A packed document gives what it gives alone, at position 0.
    row, start, end = places[len(places) // 2]
    alone = keras.ops.convert_to_numpy(
        model([tx[row : row + 1, start:end], tids[row : row + 1, start:end]])
    )
    difference = np.abs(alone[0] - logits[row, start:end]).max()
    print(
        f"document {test[len(places) // 2]!r}: packed vs alone, largest "
        f"logit difference {difference:.1e}"
    )
    query = keras.KerasTensor((16, row_length, HEADS, DIM // HEADS))
    mask_mod = mods.and_masks(mods.causal(), mods.document(ids[:16]))
    report = functional.explain(query, query, mask_mod=mask_mod)
    print(f"attention on the {report.path} path: {report.structure}")
    summary = {
        "documents": len(train),
        "rows": len(x),
        "row_length": row_length,
        "real_fraction": float(weights.mean()),
        "epochs": epochs,
        "train_seconds": round(train_seconds, 1),
        "final_loss": float(history.history["loss"][-1]),
        "test_perplexity": perplexity,
        "packed_vs_alone_max_difference": float(difference),
        "path": report.path,
    }
    publish("packed-documents", summary, args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
