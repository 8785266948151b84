"""The Seq2Seq bottleneck, measured: accuracy by source length.

A decoder which sees only the encoder's final state (one fixed vector)
degrades as sources get longer, while attention, which looks back at every
encoder state, holds up (Cho et al. 2014; Bahdanau et al. 2015). This
script trains the same encoder-decoder with no attention, Bahdanau
attention and Luong attention, and a small Transformer built from this
library's blocks, on German number words -> English number words
(character level: "vierundzwanzig" -> "twenty-four", up to about 90
characters), then reports exact match and chrF on the test split by
source-length bucket and plots them.

    python examples/bottleneck_study.py --backend jax
    python examples/bottleneck_study.py --smoke      # seconds, for the tests
"""

import argparse
import json
import sys
from pathlib import Path

VARIANTS = ("none", "bahdanau", "luong-general", "transformer")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend", choices=("jax", "tensorflow", "torch"), default=None
    )
    parser.add_argument("--examples", type=int, default=30000)
    parser.add_argument("--max-value", type=int, default=999999)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--output", default="examples/output/bottleneck")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.examples, args.epochs, args.units = 300, 1, 16
        args.max_value, args.buckets = 9999, 2
        args.batch_size = 512  # one batch an epoch: one compiled step
    return args


def bucket_edges(lengths, buckets):
    """Source-length bucket edges at quantiles of the test lengths."""
    import numpy as np

    edges = np.quantile(lengths, np.linspace(0, 1, buckets + 1)).astype(int)
    edges[-1] += 1
    return sorted(set(edges.tolist()))


def main(argv=None):
    args = parse_args(argv)
    from examples.backend import publish
    from examples.backend import select_backend

    select_backend(args.backend)
    import keras
    import numpy as np
    import sacrebleu

    from examples import seq2seq
    from keras_attention import datasets

    keras.utils.set_random_seed(args.seed)
    corpus = datasets.load_numbers(
        args.examples, max_value=args.max_value, seed=args.seed
    )
    source_vocab = datasets.Vocabulary.from_texts(
        [s for s, _ in corpus.train], "char"
    )
    target_vocab = datasets.Vocabulary.from_texts(
        [t for _, t in corpus.train], "char"
    )
    train = seq2seq.arrays(corpus.train, source_vocab, target_vocab)
    valid = seq2seq.arrays(corpus.validation, source_vocab, target_vocab)
    lengths = np.array([len(s) for s, _ in corpus.test])
    edges = bucket_edges(lengths, args.buckets)
    max_target = seq2seq.max_target_length(corpus, target_vocab)
    print(
        f"bottleneck study on {keras.backend.backend()}: {corpus.name}, "
        f"{len(corpus.train)} train / {len(corpus.test)} test pairs, source "
        f"lengths {lengths.min()}-{lengths.max()} characters"
    )
    table = {}
    for variant in VARIANTS:
        if variant == "transformer":
            model = seq2seq.build_transformer(
                len(source_vocab), len(target_vocab), args.units
            )
        else:
            model = seq2seq.build_model(
                variant, len(source_vocab), len(target_vocab), args.units
            )
        model.fit(
            train[0],
            train[1],
            validation_data=valid,
            epochs=args.epochs,
            batch_size=args.batch_size,
            verbose=2,
        )
        make_translator = (
            seq2seq.TransformerTranslator
            if variant == "transformer"
            else seq2seq.Translator
        )
        translator = make_translator(
            model, source_vocab, target_vocab, max_length=max_target
        )
        hypotheses = []
        for i in range(0, len(corpus.test), 500):
            hypotheses += translator.greedy(
                [s for s, _ in corpus.test[i : i + 500]]
            )
        rows = []
        for low, high in zip(edges[:-1], edges[1:], strict=True):
            chosen = [i for i, n in enumerate(lengths) if low <= n < high]
            hyp = [hypotheses[i] for i in chosen]
            ref = [corpus.test[i][1] for i in chosen]
            rows.append(
                {
                    "lengths": f"{low}-{high - 1}",
                    "count": len(chosen),
                    "exact": float(
                        np.mean([h == r for h, r in zip(hyp, ref, strict=True)])
                    ),
                    "chrf": sacrebleu.corpus_chrf(hyp, [ref]).score,
                }
            )
        table[variant] = rows
        print(f"\n{variant}:")
        for row in rows:
            print(
                f"  source {row['lengths']:>7} chars ({row['count']:4d}): "
                f"exact {row['exact']:6.1%}  chrF {row['chrf']:5.1f}"
            )
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps(table, indent=2))
    plot(table, output / "bottleneck.png")
    print(f"\nwrote {output / 'results.json'} and {output / 'bottleneck.png'}")
    publish("bottleneck-study", table, args)
    return table


def plot(table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from keras_attention.visualization import save_figure

    figure, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for variant, rows in table.items():
        labels = [row["lengths"] for row in rows]
        axes[0].plot(
            labels, [100 * r["exact"] for r in rows], "o-", label=variant
        )
        axes[1].plot(labels, [r["chrf"] for r in rows], "o-", label=variant)
    axes[0].set_ylabel("exact match (%)")
    axes[1].set_ylabel("chrF")
    for ax in axes:
        ax.set_xlabel("source length (characters)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle("German -> English number words: the bottleneck by length")
    figure.tight_layout()
    save_figure(figure, path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
