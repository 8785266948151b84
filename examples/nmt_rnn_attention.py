"""Neural machine translation with an RNN encoder and an attention decoder.

Trains a bidirectional-GRU encoder and an `AttentionDecoder` (or, with
`--attention none`, a plain GRU decoder that sees only the encoder's final
state: the Seq2Seq bottleneck) on a built-in corpus or a TSV file, then:

* evaluates greedy and beam search on the held-out test split (exact match,
  BLEU and chrF from sacrebleu),
* writes alignment heatmaps of test sentences,
* saves the trained model as `.keras`, reloads it and translates with it.

    python examples/nmt_rnn_attention.py --backend jax --attention bahdanau
    python examples/nmt_rnn_attention.py --data numbers --attention luong-dot
    python examples/nmt_rnn_attention.py --data fra.txt   # Tatoeba/Anki TSV

Choices: `--attention none|bahdanau|luong-dot|luong-general|luong-concat`,
`--data dates|numbers|PATH.tsv`.
"""

import argparse
import sys
import time
from pathlib import Path

ATTENTIONS = ("none", "bahdanau", "luong-dot", "luong-general", "luong-concat")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--attention", choices=ATTENTIONS, default="bahdanau")
    parser.add_argument(
        "--backend", choices=("jax", "tensorflow", "torch"), default=None
    )
    parser.add_argument("--data", default="dates")
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--output", default="examples/output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="seconds-long run")
    args = parser.parse_args(argv)
    if args.smoke:
        args.examples, args.epochs, args.units = 300, 1, 16
        args.beam_width = 2
        args.batch_size = 512  # one batch an epoch: one compiled step
    return args


def main(argv=None):
    args = parse_args(argv)
    from examples.backend import publish
    from examples.backend import select_backend

    select_backend(args.backend)
    import keras

    from examples import seq2seq

    keras.utils.set_random_seed(args.seed)
    corpus, source_vocab, target_vocab = seq2seq.load_corpus(args)
    print(
        f"keras_attention NMT on {keras.backend.backend()}: {corpus.name}, "
        f"{len(corpus.train)} train / {len(corpus.validation)} validation / "
        f"{len(corpus.test)} test pairs, vocabularies {len(source_vocab)} -> "
        f"{len(target_vocab)}, attention: {args.attention}"
    )
    model = seq2seq.build_model(
        args.attention, len(source_vocab), len(target_vocab), args.units
    )
    train = seq2seq.arrays(corpus.train, source_vocab, target_vocab)
    valid = seq2seq.arrays(corpus.validation, source_vocab, target_vocab)
    start = time.perf_counter()
    model.fit(
        train[0],
        train[1],
        validation_data=valid,
        epochs=args.epochs,
        batch_size=args.batch_size,
        verbose=2 if args.smoke else 1,
    )
    train_seconds = time.perf_counter() - start

    output = Path(args.output) / f"{corpus.name}-{args.attention}"
    output.mkdir(parents=True, exist_ok=True)
    max_length = seq2seq.max_target_length(corpus, target_vocab)
    translator = seq2seq.Translator(
        model, source_vocab, target_vocab, max_length
    )
    results = translator.evaluate(
        corpus.test, args.beam_width, args.length_penalty
    )
    print(f"\ntrained in {train_seconds:.0f} s; test set ({len(corpus.test)}):")
    for name, scores in results.items():
        print(
            f"  {name:8s} exact match {scores['exact']:6.1%}   "
            f"BLEU {scores['bleu']:5.1f}   chrF {scores['chrf']:5.1f}"
        )
    for source, target in corpus.test[:5]:
        print(
            f"  {source!r:45} -> {translator.greedy([source])[0]!r} ({target})"
        )
    if args.attention != "none":
        for i, (source, _) in enumerate(corpus.test[:3]):
            path = output / f"alignment_{i}.png"
            translator.plot(source, path)
            print(f"  alignment plot: {path}")

    model_path = output / "model.keras"
    model.save(model_path)
    restored = keras.saving.load_model(model_path)
    reloaded = seq2seq.Translator(
        restored, source_vocab, target_vocab, max_length
    )
    sample_sources = [source for source, _ in corpus.test[:3]]
    same = reloaded.greedy(sample_sources) == translator.greedy(sample_sources)
    print(
        f"  saved {model_path}; reloaded model translates "
        f"{sample_sources[0]!r} -> {reloaded.greedy(sample_sources[:1])[0]!r}"
        f" ({'identical' if same else 'DIFFERENT'} to the trained model)"
    )
    summary = {
        "data": corpus.name,
        "attention": args.attention,
        "train_pairs": len(corpus.train),
        "test_pairs": len(corpus.test),
        "train_seconds": round(train_seconds, 1),
        "results": results,
        "reloaded_identical": same,
    }
    publish(f"nmt-rnn-{corpus.name}-{args.attention}", summary, args)
    return results, same


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    _, identical = main()
    sys.exit(0 if identical else 1)
