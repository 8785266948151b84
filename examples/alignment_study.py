"""Attention alignment and length generalisation, on spelled-out digits.

The target spells the source digits out, character by character
("604" -> "six zero four"), so every target character comes from one
known source digit (`keras_attention.datasets.load_spelled_digits`). The
alignment is monotonic, each digit yields three to five characters and
digits repeat: content alone cannot tell the decoder where it is in the
source. This script trains the same encoder-decoder (bidirectional-GRU
encoder, `AttentionDecoder` with a GRU cell) with content-based attention
(Bahdanau et al. 2015; Luong et al. 2015), location-sensitive attention
(Chorowski et al. 2015) and monotonic attention (Raffel et al. 2017) on
sources of 1 to L digits, and measures, on sources of exactly L, 2L and 4L
digits:

* exact match of the greedy decode, and
* the alignment error rate: how often the largest attention weight of a
  target character falls on another digit than the one it spells, with
  the decoder fed the reference target (teacher forcing), so that every
  row of the attention map has a reference; over all characters, and
  over the first letter of each name, which nothing written before it
  predicts.

It writes `results.json`, a plot of the three against the source length,
and one attention map per mechanism on a 4L-digit source.

    python examples/alignment_study.py --backend jax
    python examples/alignment_study.py --smoke      # seconds, for the tests
"""

import argparse
import json
import sys
import time
from pathlib import Path

MECHANISMS = ("bahdanau", "luong-general", "location-sensitive", "monotonic")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backend", choices=("jax", "tensorflow", "torch"), default=None
    )
    parser.add_argument(
        "--mechanisms", nargs="+", choices=MECHANISMS, default=MECHANISMS
    )
    parser.add_argument("--max-length", type=int, default=8, help="L")
    parser.add_argument("--examples", type=int, default=8000)
    parser.add_argument("--test-examples", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument(
        "--kernel-size",
        type=int,
        default=5,
        help="location-sensitive attention's filter width (Tacotron 2: 31)",
    )
    parser.add_argument(
        "--monotonic-mode",
        choices=("recursive", "parallel"),
        default="recursive",
        help="how monotonic attention computes its expected alignment",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output", default="examples/output/alignment")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="seconds-long run")
    args = parser.parse_args(argv)
    if args.smoke:
        args.examples, args.test_examples, args.epochs = 100, 4, 1
        args.units, args.max_length = 8, 1
        args.batch_size = 512  # one batch an epoch: one compiled step
    return args


def make_attention(mechanism, units, kernel_size=5, monotonic_mode="recursive"):
    import keras_attention as ka

    if mechanism == "bahdanau":
        return ka.BahdanauAttention(units)
    if mechanism == "luong-general":
        return ka.LuongAttention("general")
    if mechanism == "location-sensitive":
        # Tacotron 2's 32 filters, but narrower than its 31 taps: a tap
        # further from the centre than the training sources are long is
        # never trained, and on longer sources its initial weights move
        # the attention.
        return ka.LocationSensitiveAttention(
            units, filters=32, kernel_size=kernel_size
        )
    # Raffel et al. (2017): Gaussian noise before the sigmoid pushes the
    # stopping probabilities to 0 or 1, so that decoding can stop hard,
    # one source token per step, where training used the expected
    # alignment; a negative offset starts them low. They add noise of
    # standard deviation 1; here 2 made the hard decoding match training.
    # The recursion, not the closed form: with probabilities pushed to 0
    # and 1 the closed form loses the mass that should carry past them.
    return ka.MonotonicAttention(
        units,
        score="bahdanau",
        mode=monotonic_mode,
        sigmoid_noise=2.0,
        score_bias_init=-1.0,
        inference_mode="hard",
    )


def build_model(mechanism, source_size, target_size, units, **options):
    """The bidirectional-GRU encoder and the attention decoder, with the
    layer names `examples/seq2seq.py`'s `Translator` decodes with."""
    import keras

    import keras_attention as ka

    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target")
    embedded = keras.layers.Embedding(
        source_size, units, mask_zero=True, name="source_embedding"
    )(source)  # (B, S, units)
    encoded, forward, backward = keras.layers.Bidirectional(
        keras.layers.GRU(units // 2, return_sequences=True, return_state=True),
        name="encoder",
    )(embedded)  # (B, S, units)
    state = keras.layers.Concatenate(name="encoder_state")([forward, backward])
    target_embedded = keras.layers.Embedding(
        target_size, units, mask_zero=True, name="target_embedding"
    )(target)  # (B, T, units)
    decoded = ka.AttentionDecoder(
        keras.layers.GRUCell(units),
        make_attention(mechanism, units, **options),
        name="decoder",
    )(target_embedded, encoded, initial_state=[state])  # (B, T, units)
    logits = keras.layers.Dense(target_size, name="logits")(decoded)
    model = keras.Model([source, target], logits, name=mechanism)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3, clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=0
        ),
    )
    return model


def texts(pairs):
    """`(source, target)` strings of aligned pairs."""
    return [("".join(p.source), "".join(p.target)) for p in pairs]


def reference_alignments(pairs, length):
    """`(N, length)` source indices of the targets, -1 for `<end>` and
    padding, and an `(N, length)` mask of the first character of each
    digit name."""
    import numpy as np

    out = np.full((len(pairs), length), -1, "int32")
    initial = np.zeros((len(pairs), length), bool)
    for i, pair in enumerate(pairs):
        out[i, : len(pair.alignment)] = pair.alignment
        starts = [0] + [t + 1 for t, c in enumerate(pair.target) if c == " "]
        initial[i, starts] = True
    return out, initial


def teacher_forced_attention(translator, pairs):
    """The decoder's `(N, T + 1, S)` attention with the reference targets
    (and `<end>`) as its inputs."""
    import keras
    import numpy as np

    sources, targets = zip(*texts(pairs), strict=True)
    ids = translator.source_vocab.encode(sources)
    inputs = translator.target_vocab.encode(targets, add_start=True)
    encoded, state = translator.encoder(ids)
    _, weights = translator.decoder(
        translator.embedding(inputs),
        encoded,
        encoder_padding_mask=ids != 0,
        initial_state=[state],
        return_attention_scores=True,
    )  # (N, T + 1, S)
    return np.asarray(keras.ops.convert_to_numpy(weights))


def evaluate(translator, tests):
    """Greedy exact match and teacher-forced alignment error rate per
    source length, the greedy decodes and the attention weights of all
    test pairs (decoded together, padded to the longest)."""
    import numpy as np

    from keras_attention.datasets import alignment_error_rate

    pairs = [pair for band in tests.values() for pair in band]
    sources, targets = zip(*texts(pairs), strict=True)
    translator.max_length = max(len(t) for t in targets) + 2
    hypotheses = translator.greedy(list(sources))
    weights = teacher_forced_attention(translator, pairs)  # (N, T + 1, S)
    references, initial = reference_alignments(pairs, weights.shape[1])
    exact = np.array([h == t for h, t in zip(hypotheses, targets, strict=True)])
    rows, start = [], 0
    for length, band in tests.items():
        chosen = slice(start, start + len(band))
        start += len(band)
        rows.append(
            {
                "length": length,
                "count": len(band),
                "exact": float(exact[chosen].mean()),
                "alignment_error": alignment_error_rate(
                    weights[chosen], references[chosen]
                ),
                "alignment_error_initial": alignment_error_rate(
                    weights[chosen], references[chosen], initial[chosen]
                ),
            }
        )
    return rows, hypotheses, weights


def main(argv=None):
    args = parse_args(argv)
    from examples.backend import publish
    from examples.backend import select_backend

    select_backend(args.backend)
    import keras

    from examples import seq2seq
    from keras_attention import datasets

    keras.utils.set_random_seed(args.seed)
    length = args.max_length
    train = datasets.load_spelled_digits(
        args.examples, max_length=length, seed=args.seed
    )
    test_lengths = (length, 2 * length, 4 * length)
    tests = {
        n: datasets.load_spelled_digits(
            args.test_examples, min_length=n, max_length=n, seed=1000 + n
        )
        for n in test_lengths
    }
    source_vocab = datasets.Vocabulary.from_texts(
        [s for s, _ in texts(train)], "char"
    )
    target_vocab = datasets.Vocabulary.from_texts(
        [t for _, t in texts(train)], "char"
    )
    inputs, outputs = seq2seq.arrays(texts(train), source_vocab, target_vocab)
    print(
        f"alignment study on {keras.backend.backend()}: spelled digits, "
        f"{len(train)} training sources of 1-{length} digits, "
        f"{args.test_examples} test sources of exactly "
        f"{', '.join(map(str, test_lengths))} digits"
    )
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    table = {}
    for mechanism in args.mechanisms:
        start = time.perf_counter()
        model = build_model(
            mechanism,
            len(source_vocab),
            len(target_vocab),
            args.units,
            kernel_size=args.kernel_size,
            monotonic_mode=args.monotonic_mode,
        )
        model.fit(
            inputs,
            outputs,
            validation_split=0.0 if args.smoke else 0.1,
            epochs=args.epochs,
            batch_size=args.batch_size,
            verbose=2,
        )
        train_seconds = time.perf_counter() - start
        translator = seq2seq.Translator(model, source_vocab, target_vocab, 1)
        rows, hypotheses, weights = evaluate(translator, tests)
        table[mechanism] = rows
        print(f"\n{mechanism} (trained in {train_seconds:.0f} s):")
        for row in rows:
            print(
                f"  {row['length']:3d} digits ({row['count']}): exact "
                f"{row['exact']:6.1%}  alignment error "
                f"{row['alignment_error']:6.1%} (first letters "
                f"{row['alignment_error_initial']:6.1%})"
            )
        # The first of the longest sources, as decoded above.
        first = len(hypotheses) - len(tests[test_lengths[-1]])
        path = output / f"alignment_study_{mechanism}.png"
        plot_heatmap(
            tests[test_lengths[-1]][0],
            hypotheses[first],
            weights[first],
            f"{mechanism}, trained on 1-{length} digits",
            path,
        )
        print(f"  attention map: {path}")
    (output / "results.json").write_text(json.dumps(table, indent=2))
    plot(table, length, output / "alignment_study.png")
    print(
        f"\nwrote {output / 'results.json'} and "
        f"{output / 'alignment_study.png'}"
    )
    name = "alignment-study"
    if list(args.mechanisms) != list(MECHANISMS):
        name += "-" + "-".join(args.mechanisms)
    if args.kernel_size != 5:
        name += f"-kernel{args.kernel_size}"
    if args.monotonic_mode != "recursive":
        name += f"-{args.monotonic_mode}"
    publish(name, table, args)
    return table


def plot(table, length, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from keras_attention.visualization import save_figure

    figure, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    columns = {
        "exact": "exact match, greedy (%)",
        "alignment_error": "alignment error, all characters (%)",
        "alignment_error_initial": "alignment error, first letters (%)",
    }
    for mechanism, rows in table.items():
        lengths = [row["length"] for row in rows]
        for ax, column in zip(axes, columns, strict=True):
            ax.plot(
                lengths,
                [100 * row[column] for row in rows],
                "o-",
                label=mechanism,
            )
    for ax, label in zip(axes, columns.values(), strict=True):
        ax.set_ylabel(label)
        ax.set_xlabel("source length (digits)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle(
        f"Spelled digits, trained on 1-{length} digits: "
        "exact match and alignment by length"
    )
    figure.tight_layout()
    save_figure(figure, path, dpi=110)
    plt.close(figure)


def plot_heatmap(pair, greedy, weights, title, path):
    """The `(T + 1, S)` teacher-forced attention map of one pair, with the
    reference alignment drawn over it; the target axis is labelled with
    the digit names (one tick at each name's first letter), so that a
    map of 150 letters stays legible at about 700 x 800 pixels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from keras_attention.visualization import plot_attention
    from keras_attention.visualization import save_figure

    rows = len(pair.target) + 1  # with <end>
    exact = greedy == "".join(pair.target)
    figure, ax = plt.subplots(figsize=(6.5, 7.5))
    plot_attention(
        weights[:rows, : len(pair.source)],
        list(pair.source),
        [*pair.target, "<end>"],
        ax=ax,
        title=f"{title}\n{len(pair.source)} digits, teacher-forced; "
        f"greedy decode {'exact' if exact else 'wrong'}",
    )
    words = "".join(pair.target).split(" ")
    starts = [0]
    for word in words[:-1]:
        starts.append(starts[-1] + len(word) + 1)
    ax.set_yticks([*starts, rows - 1], [*words, "<end>"], fontsize=7)
    ax.set_ylabel("target (a tick at each name's first letter)")
    ax.plot(
        pair.alignment,
        range(len(pair.alignment)),
        "o",
        mfc="none",
        mec="red",
        ms=3,
        mew=0.6,
        label="reference",
    )
    ax.legend(loc="upper right", fontsize=7)
    save_figure(figure, path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
