"""The RNN encoder-decoder shared by the NMT example, the bottleneck study
and the demo: data, model, decoding and evaluation.

Shape legend: B batch, S source length, T target length, V vocabulary.
"""

import keras
import numpy as np

import keras_attention as ka
from keras_attention import datasets
from keras_attention.decoding import beam_search
from keras_attention.decoding import greedy_search


def max_target_length(corpus, target_vocab):
    """Decoding budget: the longest training target plus room for <end>."""
    return max(len(target_vocab.split(t)) for _, t in corpus.train) + 2


def load_corpus(args):
    """The corpus of `args.data` and its source and target vocabularies."""
    if args.data == "dates":
        corpus = datasets.load_dates(args.examples, seed=args.seed)
        tokenizers = ("word", "char")
    elif args.data == "numbers":
        corpus = datasets.load_numbers(args.examples, seed=args.seed)
        tokenizers = ("char", "char")
    else:
        corpus = datasets.load_tsv(args.data, seed=args.seed)
        tokenizers = ("word", "word")
    sources = [s for s, _ in corpus.train]
    targets = [t for _, t in corpus.train]
    return (
        corpus,
        datasets.Vocabulary.from_texts(sources, tokenizers[0]),
        datasets.Vocabulary.from_texts(targets, tokenizers[1]),
    )


def arrays(pairs, source_vocab, target_vocab):
    """`([source_ids, target_inputs], target_outputs)` for teacher forcing."""
    sources = source_vocab.encode([s for s, _ in pairs])
    targets = [t for _, t in pairs]
    length = target_vocab.encode(targets).shape[1] + 1
    inputs = target_vocab.encode(targets, length, add_start=True)
    outputs = target_vocab.encode(targets, length, add_end=True)
    return [sources, inputs], outputs


def make_attention(kind, units):
    return {
        "bahdanau": lambda: ka.BahdanauAttention(units),
        "luong-dot": lambda: ka.LuongAttention("dot"),
        "luong-general": lambda: ka.LuongAttention("general"),
        "luong-concat": lambda: ka.LuongAttention("concat", units=units),
    }[kind]()


def build_model(attention, source_size, target_size, units, learning_rate=3e-3):
    """Bidirectional-GRU encoder; attention decoder or a plain GRU one."""
    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target")
    embedded = keras.layers.Embedding(
        source_size, units, mask_zero=True, name="source_embedding"
    )(source)
    encoded, forward, backward = keras.layers.Bidirectional(
        keras.layers.GRU(units // 2, return_sequences=True, return_state=True),
        name="encoder",
    )(embedded)  # (B, S, units)
    state = keras.layers.Concatenate(name="encoder_state")([forward, backward])
    target_embedded = keras.layers.Embedding(
        target_size, units, mask_zero=True, name="target_embedding"
    )(target)
    if attention == "none":
        decoded = keras.layers.GRU(
            units, return_sequences=True, name="decoder"
        )(target_embedded, initial_state=[state])
    else:
        decoded = ka.AttentionDecoder(
            keras.layers.GRUCell(units),
            make_attention(attention, units),
            name="decoder",
        )(target_embedded, encoded, initial_state=[state])
    logits = keras.layers.Dense(target_size, name="logits")(decoded)
    model = keras.Model([source, target], logits, name=f"seq2seq_{attention}")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate, clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=0
        ),
    )
    return model


class TranslatorBase:
    """Decoding, evaluation and plots shared by the RNN and Transformer
    translators.

    Subclasses provide `initial_state(sources)`, `step(token_ids, state)`
    (the step function of `keras_attention.decoding`) and
    `alignment(source)`, and set `target_vocab` and `max_length`.
    """

    def greedy(self, sources):
        starts = np.full(len(sources), self.target_vocab.start_id, "int32")
        ids = greedy_search(
            self.step,
            self.initial_state(sources),
            starts,
            self.max_length,
            end_id=self.target_vocab.end_id,
        )
        return [self.target_vocab.decode(row) for row in _numpy(ids)]

    def beam(self, sources, beam_width, length_penalty=0.0):
        starts = np.full(len(sources), self.target_vocab.start_id, "int32")
        ids, _ = beam_search(
            self.step,
            self.initial_state(sources),
            starts,
            self.max_length,
            beam_width=beam_width,
            end_id=self.target_vocab.end_id,
            length_penalty=length_penalty,
        )
        return [self.target_vocab.decode(row) for row in _numpy(ids)]

    def evaluate(self, pairs, beam_width, length_penalty, batch_size=500):
        """Exact match, BLEU and chrF of greedy and beam search, against
        the references as the target vocabulary writes text (word tokens
        joined by spaces), the form the decoded translations take."""
        references = [self.target_vocab.tokenized(t) for _, t in pairs]
        results = {}
        for name, decode in (
            ("greedy", self.greedy),
            (
                f"beam-{beam_width}",
                lambda s: self.beam(s, beam_width, length_penalty),
            ),
        ):
            hypotheses = []
            for i in range(0, len(pairs), batch_size):
                hypotheses += decode([s for s, _ in pairs[i : i + batch_size]])
            results[name] = scores(hypotheses, references)
        return results

    def plot(self, source, path):
        from keras_attention.visualization import plot_attention
        from keras_attention.visualization import save_figure

        target_tokens, weights = self.alignment(source)
        source_tokens = self.source_vocab.split(source)
        figure = plot_attention(
            weights[: len(target_tokens), : len(source_tokens)],
            source_tokens,
            target_tokens,
            title=f"{source} -> {''.join(target_tokens[:-1])}",
        )
        save_figure(figure, path, dpi=110)
        import matplotlib.pyplot as plt

        plt.close(figure)


def scores(hypotheses, references):
    """Exact match, corpus BLEU and chrF (sacrebleu) of translations."""
    import sacrebleu

    return {
        "exact": float(
            np.mean(
                [h == r for h, r in zip(hypotheses, references, strict=True)]
            )
        ),
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
    }


class Translator(TranslatorBase):
    """Greedy and beam-search decoding with a trained (or reloaded) model."""

    def __init__(self, model, source_vocab, target_vocab, max_length):
        self.source_vocab, self.target_vocab = source_vocab, target_vocab
        self.encoder = keras.Model(
            model.get_layer("source").output,
            [
                model.get_layer("encoder").output[0],
                model.get_layer("encoder_state").output,
            ],
        )
        self.embedding = model.get_layer("target_embedding")
        self.decoder = model.get_layer("decoder")
        self.head = model.get_layer("logits")
        self.attention = isinstance(self.decoder, ka.AttentionDecoder)
        self.max_length = max_length

    def initial_state(self, sources):
        ids = self.source_vocab.encode(sources)
        encoded, state = self.encoder(ids)
        if not self.attention:
            return {"h": [state]}
        mask = keras.ops.convert_to_tensor(ids != 0)
        return {
            "decoder": self.decoder.get_initial_state(encoded, mask, [state]),
            "encoded": encoded,
            "mask": mask,
        }

    def step(self, token_ids, state):
        # A table lookup: the Embedding layer would attach a padding mask.
        embedded = keras.ops.take(
            self.embedding.embeddings, token_ids, axis=0
        )  # (B, E)
        if not self.attention:
            hidden, new = self.decoder.cell(embedded, state["h"])
            new = list(new) if isinstance(new, (list, tuple)) else [new]
            return self.head(hidden), {"h": new}
        output, decoder_state, alignment = self.decoder.step(
            embedded, state["decoder"], state["encoded"], state["mask"]
        )
        return self.head(output), {**state, "decoder": decoder_state}, alignment

    def alignment(self, source):
        """The greedy translation's target tokens and its `(T, S)` weights."""
        translation = self.greedy([source])[0]
        pieces = self.target_vocab.split(translation)
        inputs = self.target_vocab.encode([translation], add_start=True)
        ids = self.source_vocab.encode([source])
        encoded, state = self.encoder(ids)
        _, weights = self.decoder(
            self.embedding(inputs),
            encoded,
            encoder_padding_mask=ids != 0,
            initial_state=[state],
            return_attention_scores=True,
        )
        return [*pieces, "<end>"], _numpy(weights)[0]


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def build_transformer(
    source_size,
    target_size,
    units,
    num_heads=4,
    num_layers=2,
    learning_rate=1e-3,
    positions="sinusoidal",
    max_length=None,
    dropout=0.1,
):
    """An encoder-decoder Transformer from keras_attention's blocks.

    `positions` is `"sinusoidal"` (`PositionalEncoding`) or `"learned"`
    (`PositionEmbedding(max_length)`, which then needs `max_length`, the
    longest source or target sequence the model will see). Padding masks
    come from `Embedding(mask_zero=True)`: the encoder blocks hide padded
    source tokens, the decoder blocks padded targets and, in
    cross-attention, padded source tokens. `learning_rate` may be a
    schedule.
    """
    if positions not in ("sinusoidal", "learned"):
        raise ValueError(
            "build_transformer: `positions` must be 'sinusoidal' or "
            f"'learned'. Received: positions={positions!r}"
        )
    if positions == "learned" and not max_length:
        raise ValueError(
            "build_transformer: learned positions need `max_length`. "
            f"Received: max_length={max_length!r}"
        )

    def position_layer(name):
        if positions == "learned":
            return ka.PositionEmbedding(max_length, name=name)
        return ka.PositionalEncoding(name=name)

    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target")
    x = keras.layers.Embedding(
        source_size, units, mask_zero=True, name="source_embedding"
    )(source)  # (B, S, D)
    x = position_layer("source_positions")(x)
    for i in range(num_layers):
        x = ka.TransformerEncoderBlock(
            num_heads, 2 * units, dropout=dropout, name=f"encoder_{i}"
        )(x)
    y = keras.layers.Embedding(
        target_size, units, mask_zero=True, name="target_embedding"
    )(target)  # (B, T, D)
    y = position_layer("target_positions")(y)
    for i in range(num_layers):
        y = ka.TransformerDecoderBlock(
            num_heads, 2 * units, dropout=dropout, name=f"decoder_{i}"
        )(y, x)
    logits = keras.layers.Dense(target_size, name="logits")(y)  # (B, T, V)
    model = keras.Model([source, target], logits, name="seq2seq_transformer")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate, clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=0
        ),
    )
    return model


class TransformerTranslator(TranslatorBase):
    """Greedy and beam-search decoding of `build_transformer` models.

    Decoding is incremental: each decoder block keeps a KV cache of its
    self-attention and the cross-attention keys and values of the source,
    projected once by `init_cache`; a step feeds one token per row.
    """

    def __init__(self, model, source_vocab, target_vocab, max_length):
        self.source_vocab, self.target_vocab = source_vocab, target_vocab
        self.max_length = max_length
        layers = [layer.name for layer in model.layers]
        num_layers = sum(name.startswith("decoder_") for name in layers)
        self.encoder = keras.Model(
            model.get_layer("source").output,
            model.get_layer(f"encoder_{num_layers - 1}").output,
        )
        self.blocks = [
            model.get_layer(f"decoder_{i}") for i in range(num_layers)
        ]
        self.embedding = model.get_layer("target_embedding")
        self.positions = model.get_layer("target_positions")
        self.head = model.get_layer("logits")

    def initial_state(self, sources):
        ids = self.source_vocab.encode(sources)
        encoded = self.encoder(ids)  # (B, S, D)
        batch = len(sources)
        return {
            "caches": [
                block.init_cache(batch, self.max_length, encoded)
                for block in self.blocks
            ],
            "mask": keras.ops.convert_to_tensor(ids != 0),  # (B, S)
            # The next position, per row so that beam search can tile and
            # reorder it with the rest of the state (a Python int cannot).
            "index": keras.ops.zeros((batch,), "int32"),
        }

    def step(self, token_ids, state):
        index = state["index"][0]  # all rows decode in lockstep
        # A table lookup: the Embedding layer would attach a padding mask.
        x = keras.ops.take(
            self.embedding.embeddings, token_ids[:, None], axis=0
        )  # (B, 1, D)
        x = self.positions(x, start_index=index)
        caches = []
        for block, cache in zip(self.blocks, state["caches"], strict=True):
            x, cache = block(
                x,
                encoder_padding_mask=state["mask"],
                cache=cache,
                cache_index=index,
            )  # (B, 1, D)
            caches.append(cache)
        return self.head(x[:, 0]), {
            **state,
            "caches": caches,
            "index": state["index"] + 1,
        }

    def cross_attention(self, source, translation=None):
        """The target tokens of `translation` (by default the greedy one)
        and, per decoder block, its cross-attention weights averaged over
        heads, `(T, S)`."""
        if translation is None:
            translation = self.greedy([source])[0]
        pieces = self.target_vocab.split(translation)
        inputs = self.target_vocab.encode([translation], add_start=True)
        ids = self.source_vocab.encode([source])
        encoded = self.encoder(ids)  # (1, S, D)
        x = self.positions(
            keras.ops.take(self.embedding.embeddings, inputs, axis=0)
        )  # (1, T, D)
        weights = []
        for block in self.blocks:
            x, block_scores = block(
                x,
                encoded,
                encoder_padding_mask=ids != 0,
                return_attention_scores=True,
            )
            cross = block_scores["cross"][0]  # (N, T, S)
            weights.append(_numpy(keras.ops.mean(cross, axis=0)))  # (T, S)
        return [*pieces, "<end>"], weights

    def alignment(self, source):
        """Target tokens and the last block's head-averaged `(T, S)`."""
        target_tokens, weights = self.cross_attention(source)
        return target_tokens, weights[-1]

    def plot(self, source, path, translation=None):
        """One heatmap file per decoder block of the cross-attention,
        `{path stem}_block{i}.png`, each sized to stay legible at page
        width; returns their paths."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from keras_attention.visualization import plot_attention
        from keras_attention.visualization import save_figure

        target_tokens, weights = self.cross_attention(source, translation)
        source_tokens = self.source_vocab.split(source)
        joiner = "" if self.target_vocab.tokenizer == "char" else " "
        translated = joiner.join(target_tokens[:-1])
        paths = []
        for i, layer_weights in enumerate(weights):
            figure = plot_attention(
                layer_weights[: len(target_tokens), : len(source_tokens)],
                source_tokens,
                target_tokens,
                title=f"{source} -> {translated}\n"
                f"decoder block {i} (cross-attention, mean over heads)",
            )
            paths.append(path.with_name(f"{path.stem}_block{i}{path.suffix}"))
            save_figure(figure, paths[-1], dpi=110)
            plt.close(figure)
        return paths
