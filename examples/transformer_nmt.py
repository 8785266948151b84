"""Neural machine translation with an encoder-decoder Transformer.

Builds the Transformer of "Attention Is All You Need" from this library's
blocks (`TransformerEncoderBlock`, `TransformerDecoderBlock` with
cross-attention, `PositionalEncoding` or `PositionEmbedding`), trains it on
a built-in corpus or a TSV file with padding masks from
`Embedding(mask_zero=True)`, then:

* translates the held-out test split with greedy and beam search through
  `keras_attention.decoding`, one token per step with the decoder blocks'
  KV caches, and scores it with exact match, BLEU and chrF (sacrebleu),
* writes cross-attention heatmaps (one panel per decoder block, mean over
  heads) of test sentences,
* saves the model as `.keras`, reloads it and checks that the reloaded
  model translates identically (greedy and beam).

    python examples/transformer_nmt.py --backend jax --data dates
    python examples/transformer_nmt.py --data numbers --positions learned
    python examples/transformer_nmt.py --data fra.txt   # Tatoeba/Anki TSV

Choices: `--data dates|numbers|PATH.tsv`, `--positions sinusoidal|learned`.
The last line printed is a JSON summary of the metrics.
"""

import argparse
import json
import sys
import time
from pathlib import Path


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backend", choices=("jax", "tensorflow", "torch"), default=None
    )
    parser.add_argument("--data", default="dates")
    parser.add_argument(
        "--positions", choices=("sinusoidal", "learned"), default="sinusoidal"
    )
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--decode-batch-size", type=int, default=500)
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--plots", type=int, default=3)
    parser.add_argument("--output", default="examples/output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="seconds-long run")
    args = parser.parse_args(argv)
    if args.smoke:
        args.examples, args.epochs, args.units = 300, 1, 16
        args.heads, args.layers, args.beam_width, args.plots = 2, 1, 2, 2
        args.batch_size = 48  # 240 training pairs: no ragged last batch
    return args


def learning_rate(args, steps_per_epoch):
    """Linear warm-up over the first 10% of steps, then cosine decay."""
    import keras

    total = max(1, args.epochs * steps_per_epoch)
    warmup = max(1, total // 10)
    return keras.optimizers.schedules.CosineDecay(
        0.0,
        decay_steps=max(1, total - warmup),
        alpha=0.05,
        warmup_target=args.learning_rate,
        warmup_steps=warmup,
    )


def decode_test_set(translator, pairs, args):
    """Greedy and beam translations of `pairs`, in batches."""
    greedy, beam = [], []
    for i in range(0, len(pairs), args.decode_batch_size):
        sources = [s for s, _ in pairs[i : i + args.decode_batch_size]]
        greedy += translator.greedy(sources)
        beam += translator.beam(sources, args.beam_width, args.length_penalty)
    return greedy, beam


def main(argv=None):
    args = parse_args(argv)
    from examples.backend import publish
    from examples.backend import select_backend

    select_backend(args.backend)
    import keras

    from examples import seq2seq

    keras.utils.set_random_seed(args.seed)
    corpus, source_vocab, target_vocab = seq2seq.load_corpus(args)
    max_target = seq2seq.max_target_length(corpus, target_vocab)
    # Learned positions need a table long enough for every source (test
    # sentences included) and for the decoding budget.
    max_source = max(
        len(source_vocab.split(s))
        for split in (corpus.train, corpus.validation, corpus.test)
        for s, _ in split
    )
    print(
        f"keras_attention Transformer NMT on {keras.backend.backend()}: "
        f"{corpus.name}, {len(corpus.train)} train / "
        f"{len(corpus.validation)} validation / {len(corpus.test)} test "
        f"pairs, vocabularies {len(source_vocab)} -> {len(target_vocab)}, "
        f"{args.layers}+{args.layers} blocks of {args.units} units, "
        f"{args.heads} heads, {args.positions} positions"
    )
    train = seq2seq.arrays(corpus.train, source_vocab, target_vocab)
    valid = seq2seq.arrays(corpus.validation, source_vocab, target_vocab)
    steps_per_epoch = -(-len(corpus.train) // args.batch_size)
    model = seq2seq.build_transformer(
        len(source_vocab),
        len(target_vocab),
        args.units,
        num_heads=args.heads,
        num_layers=args.layers,
        learning_rate=learning_rate(args, steps_per_epoch),
        positions=args.positions,
        max_length=max(max_source, max_target) + 1,
        dropout=args.dropout,
    )
    print(f"{model.count_params():,} parameters")
    start = time.perf_counter()
    model.fit(
        train[0],
        train[1],
        validation_data=valid,
        epochs=args.epochs,
        batch_size=args.batch_size,
        verbose=2,
    )
    train_seconds = time.perf_counter() - start

    output = Path(args.output) / f"transformer-{corpus.name}-{args.positions}"
    output.mkdir(parents=True, exist_ok=True)
    translator = seq2seq.TransformerTranslator(
        model, source_vocab, target_vocab, max_target
    )
    start = time.perf_counter()
    greedy, beam = decode_test_set(translator, corpus.test, args)
    decode_seconds = time.perf_counter() - start
    references = [t for _, t in corpus.test]
    results = {
        "greedy": seq2seq.scores(greedy, references),
        f"beam-{args.beam_width}": seq2seq.scores(beam, references),
    }
    print(
        f"\ntrained in {train_seconds:.0f} s; test set ({len(corpus.test)} "
        f"pairs, greedy and beam decoded with the KV cache in "
        f"{decode_seconds:.0f} s):"
    )
    for name, scores in results.items():
        print(
            f"  {name:8s} exact match {scores['exact']:6.1%}   "
            f"BLEU {scores['bleu']:5.1f}   chrF {scores['chrf']:5.1f}"
        )
    for (source, target), hypothesis in zip(
        corpus.test[:5], greedy, strict=False
    ):
        print(f"  {source!r:45} -> {hypothesis!r} ({target})")
    for i, ((source, _), hypothesis) in enumerate(
        zip(corpus.test[: args.plots], greedy, strict=False)
    ):
        paths = translator.plot(
            source, output / f"cross_attention_{i}.png", hypothesis
        )
        print(f"  cross-attention plots: {', '.join(map(str, paths))}")

    model_path = output / "model.keras"
    model.save(model_path)
    restored = keras.saving.load_model(model_path)
    reloaded = seq2seq.TransformerTranslator(
        restored, source_vocab, target_vocab, max_target
    )
    probe = corpus.test[: args.batch_size]
    again = decode_test_set(reloaded, probe, args)
    same = again == (greedy[: len(probe)], beam[: len(probe)])
    print(
        f"  saved {model_path}; reloaded model translates "
        f"{probe[0][0]!r} -> {again[0][0]!r} "
        f"({'identical' if same else 'DIFFERENT'} to the trained model, "
        f"greedy and beam, {len(probe)} sentences)"
    )
    summary = {
        "backend": keras.backend.backend(),
        "data": corpus.name,
        "positions": args.positions,
        "train_seconds": round(train_seconds, 1),
        "decode_seconds": round(decode_seconds, 1),
        "test_pairs": len(corpus.test),
        "results": results,
        "reloaded_identical": same,
    }
    (output / "results.json").write_text(json.dumps(summary, indent=2))
    print("RESULT " + json.dumps(summary))
    publish(f"transformer-nmt-{corpus.name}-{args.positions}", summary, args)
    return summary


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(0 if main()["reloaded_identical"] else 1)
