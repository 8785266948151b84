"""Attention as lookup: every RNN attention layer learns associative recall.

Each example is a short list of `key=value` pairs (letters to digits) and a
query letter; the answer is the digit stored under that letter. Lists have
different lengths and are padded, so the layers get an implicit Keras mask
from `Embedding(mask_zero=True)`. A model can only solve this by looking at
the right pair: after a few epochs each layer's attention weights point at
the queried key, which the script prints.

Run it directly (any backend):

    KERAS_BACKEND=jax python examples/associative_recall.py [--smoke]
"""

import argparse
import os
import string
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attention as ka  # noqa: E402

KEYS = string.ascii_lowercase[:16]
DIGITS = string.digits
MAX_PAIRS = 8
DIM = 32

LAYERS = {
    "Bahdanau": lambda: ka.BahdanauAttention(units=DIM),
    "Bahdanau (normalized)": lambda: ka.BahdanauAttention(
        units=DIM, normalize=True
    ),
    "Luong dot": lambda: ka.LuongAttention(score="dot"),
    "Luong general": lambda: ka.LuongAttention(score="general"),
    "Luong concat": lambda: ka.LuongAttention(score="concat", units=DIM),
}


def make_data(num_examples, seed):
    """Token ids (0 = padding) for keys, values and queries, and answers."""
    rng = np.random.default_rng(seed)
    keys = np.zeros((num_examples, MAX_PAIRS), "int32")
    values = np.zeros((num_examples, MAX_PAIRS), "int32")
    queries = np.zeros((num_examples,), "int32")
    answers = np.zeros((num_examples,), "int32")
    for i in range(num_examples):
        length = rng.integers(3, MAX_PAIRS + 1)
        chosen = rng.choice(len(KEYS), size=length, replace=False) + 1
        digits = rng.integers(0, len(DIGITS), size=length)
        keys[i, :length] = chosen
        values[i, :length] = digits + 1
        position = rng.integers(0, length)
        queries[i] = chosen[position]
        answers[i] = digits[position]
    return (queries, keys, values), answers


def build_model(make_attention):
    query_ids = keras.Input((), dtype="int32", name="query")
    key_ids = keras.Input((MAX_PAIRS,), dtype="int32", name="keys")
    value_ids = keras.Input((MAX_PAIRS,), dtype="int32", name="values")
    key_embedding = keras.layers.Embedding(len(KEYS) + 1, DIM, name="letters")
    query = key_embedding(query_ids)  # (B, D)
    keys = keras.layers.Embedding(
        len(KEYS) + 1, DIM, mask_zero=True, name="key_letters"
    )(key_ids)  # (B, S, D)
    values = keras.layers.Embedding(
        len(DIGITS) + 1, DIM, mask_zero=True, name="digits"
    )(value_ids)  # (B, S, D)
    context, weights = make_attention()(
        query, values, key=keys, return_attention_scores=True
    )
    logits = keras.layers.Dense(len(DIGITS), name="answer")(context)
    return keras.Model([query_ids, key_ids, value_ids], [logits, weights])


def evaluate(model, x, y):
    """Test accuracy and the attention weights `(N, S)`."""
    logits, weights = model.predict(x, batch_size=250, verbose=0)
    return np.mean(np.argmax(logits, -1) == y), weights


def describe(example, weights):
    (query, keys, values), answer = example
    pairs = [
        f"{KEYS[k - 1]}={DIGITS[v - 1]}"
        for k, v in zip(keys, values, strict=True)
        if k
    ]
    focus = int(np.argmax(weights))
    return (
        f"    {' '.join(pairs)}   ? {KEYS[query - 1]}  ->  attends to "
        f"{pairs[focus]} (weight {weights[focus]:.2f}), "
        f"answer {DIGITS[answer]}"
    )


def main():
    from examples.backend import publish

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--examples", type=int, default=6000)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny run for the tests"
    )
    args = parser.parse_args()
    if args.smoke:
        args.epochs, args.examples = 1, 256
    keras.utils.set_random_seed(0)
    train_x, train_y = make_data(args.examples, seed=1)
    test_x, test_y = make_data(1000, seed=2)
    print(
        f"keras_attention {ka.__version__} on {keras.backend.backend()}: "
        f"associative recall over up to {MAX_PAIRS} key=value pairs "
        f"(chance = {1 / len(DIGITS):.0%})\n"
    )
    layers = {}
    for name, make_attention in LAYERS.items():
        start = time.perf_counter()
        model = build_model(make_attention)
        model.compile(
            optimizer=keras.optimizers.Adam(3e-3),
            loss=[keras.losses.SparseCategoricalCrossentropy(True), None],
            metrics=[["accuracy"], []],
        )
        untrained, _ = evaluate(model, test_x, test_y)
        model.fit(
            train_x, train_y, epochs=args.epochs, batch_size=64, verbose=0
        )
        accuracy, weights = evaluate(model, test_x, test_y)
        focus = np.argmax(weights, -1)
        on_key = np.mean(test_x[1][np.arange(len(focus)), focus] == test_x[0])
        padded = test_x[1][:, -1] == 0
        print(
            f"{name:22s} accuracy {untrained:4.0%} -> {accuracy:4.0%}   "
            f"attends to the queried key {on_key:4.0%}   "
            f"weight on padding {weights[padded][:, -1].max():.0e}   "
            f"({time.perf_counter() - start:.0f} s)"
        )
        first = ((test_x[0][0], test_x[1][0], test_x[2][0]), test_y[0])
        print(describe(first, weights[0]))
        layers[name] = {
            "untrained_accuracy": float(untrained),
            "accuracy": float(accuracy),
            "attends_to_queried_key": float(on_key),
            "max_weight_on_padding": float(weights[padded][:, -1].max()),
            "seconds": round(time.perf_counter() - start, 1),
        }
    publish("associative-recall", {"test_lists": 1000, "layers": layers}, args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
