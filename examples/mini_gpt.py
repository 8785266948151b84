"""A decoder-only (GPT-style) byte-level language model of Python docstrings.

The text is real and needs no download: the docstrings of the Python
standard library installed on this machine (`ast.get_docstring` of every
module, class and function), read from a deterministic, sorted list of
files. Whole files are held out (every tenth file), so the perplexity is
measured on documentation the model never saw. Tokens are UTF-8 bytes
(vocabulary 256).

The model is a stack of `TransformerDecoderBlock`s called without encoder
outputs (causal self-attention and a feed-forward net, pre-LN), with
rotary (`--positions rotary`, `use_rotary=True`) or learned
(`PositionEmbedding`) positions, and grouped-query attention with
`--kv-heads` key/value heads. `--sliding-window W` gives every block a
causal sliding window (Beltagy et al. 2020, Jiang et al. 2023): each
position sees itself and the `W - 1` before it, and the KV caches of
generation keep only the last `W` positions.

Three ways to fill the training rows of `--sequence-length` bytes:

* stream (the default): random windows of all training docstrings joined
  by blank lines; no padding, but windows run across documents;
* `--padded`: one docstring per row, padding after it (a docstring longer
  than a row is cut into pieces of one row, each starting with the last
  byte of the one before);
* `--packed`: several whole docstrings (or pieces) per row, by greedy
  best-fit decreasing packing, with segment ids 1, 2, 3, ... per
  document and 0 for the padding at the end (Krell et al. 2021). The
  model then takes the segment ids as a second input: the blocks attend
  only within a document and restart rotary positions there, as
  `PositionEmbedding` does learned ones.

With `--padded` and `--packed` the loss ignores (sample weight 0) the
padding and the target that would cross into the next document. All
three train `--windows` rows per epoch; the summary reports real
(non-padding) training tokens per second and the fraction of padding.
After training it

* prints the held-out perplexity per byte (and bits per byte), the same
  measurement whatever the batching: every held-out docstring in a row
  of its own, each byte predicted from the bytes of its own docstring,
* continues held-out docstrings with top-p sampling through
  `keras_attention.decoding.sample`, one token per step with the blocks'
  KV caches, the whole loop compiled (`jit_compile=True`),
* generates again without the cache (the whole prefix re-run every step)
  from the same model and seed, checks that both give the same tokens
  (greedy and sampled), and prints tokens/s of both,
* saves the model as `.keras`, reloads it and checks its logits.

    python examples/mini_gpt.py --backend jax
    python examples/mini_gpt.py --positions learned --kv-heads 4
    python examples/mini_gpt.py --packed --sliding-window 64

The last line printed is a JSON summary of the measurements.
"""

import argparse
import ast
import functools
import json
import sys
import sysconfig
import time
from pathlib import Path

BUCKET = 32  # uncached generation pads prefixes to a multiple of this

SKIPPED_DIRECTORIES = {
    "__pycache__",
    "ensurepip",
    "idlelib",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "turtledemo",
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backend", choices=("jax", "tensorflow", "torch"), default=None
    )
    parser.add_argument(
        "--positions", choices=("rotary", "learned"), default="rotary"
    )
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument(
        "--kv-heads", type=int, default=2, help="< --heads: grouped-query"
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument(
        "--windows", type=int, default=20000, help="training rows per epoch"
    )
    layout = parser.add_mutually_exclusive_group()
    layout.add_argument(
        "--packed",
        action="store_true",
        help="pack whole docstrings into each row, with segment ids",
    )
    layout.add_argument(
        "--padded",
        action="store_true",
        help="one docstring per row, padded (the baseline of --packed)",
    )
    parser.add_argument(
        "--sliding-window",
        type=int,
        default=None,
        help="each position sees itself and the W - 1 before it",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--max-files", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=24)
    parser.add_argument("--generate", type=int, default=200)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--output", default="examples/output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="seconds-long run")
    args = parser.parse_args(argv)
    if args.sliding_window is not None and args.sliding_window < 1:
        parser.error("--sliding-window must be a positive integer")
    if args.smoke:
        args.units, args.heads, args.kv_heads, args.layers = 32, 2, 1, 1
        args.sequence_length, args.windows, args.epochs = 32, 64, 1
        args.max_files, args.prompts, args.prompt_length = 24, 2, 8
        args.generate = 12
    return args


def docstring_files(max_files=None):
    """The standard library's `.py` files, sorted, without tests and tools."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        path
        for path in root.rglob("*.py")
        if not set(path.relative_to(root).parts[:-1]) & SKIPPED_DIRECTORIES
    )
    return root, files[:max_files]


def docstrings(path):
    """The docstrings of a module, its classes and functions, in order."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    return [
        text
        for node in ast.walk(tree)
        if isinstance(
            node,
            (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef),
        )
        and (text := ast.get_docstring(node))
    ]


def load_documents(max_files=None):
    """Train and held-out docstrings; every tenth file is held out."""
    root, files = docstring_files(max_files)
    splits = {"train": [], "held_out": []}
    for i, path in enumerate(files):
        split = "held_out" if i % 10 == 9 else "train"
        splits[split] += docstrings(path)
    return root, len(files), splits


def load_corpus(max_files=None):
    """Train and held-out byte streams, and the held-out docstrings."""
    root, num_files, splits = load_documents(max_files)
    return root, num_files, byte_streams(splits), splits["held_out"]


def byte_streams(splits):
    """Each split's docstrings as one int32 byte array, blank lines between."""
    import numpy as np

    return {
        name: np.frombuffer(
            "\n\n".join(texts).encode("utf-8"), dtype="uint8"
        ).astype("int32")
        for name, texts in splits.items()
    }


def windows(data, count, length, rng=None):
    """`count` windows of `length + 1` bytes: random, or consecutive."""
    import numpy as np

    if rng is None:
        count = min(count, (len(data) - 1) // length)
        starts = np.arange(count) * length
    else:
        starts = rng.integers(0, len(data) - length - 1, size=count)
    rows = np.stack([data[s : s + length + 1] for s in starts])  # (N, T+1)
    return rows[:, :-1], rows[:, 1:]


def split_document(ids, length):
    """Pieces of at most `length + 1` tokens (one training row). Each piece
    starts with the last token of the one before, so that every
    next-token target of the document lies in exactly one piece."""
    return [ids[s : s + length + 1] for s in range(0, len(ids) - 1, length)]


def pack_documents(documents, length, packed=True):
    """Rows of `length + 1` tokens and their segment ids, both `(R, T+1)`.

    Documents longer than a row are first cut by `split_document`. With
    `packed`, greedy best-fit decreasing packing (longest piece first,
    into the fullest row that still has room) puts several whole pieces
    in a row, with segment ids 1, 2, 3, ... in order; otherwise each
    piece gets a row of its own, in document order. Id 0 is the padding
    at the end of a row. Deterministic: ties go to the earlier piece.
    """
    import numpy as np

    capacity = length + 1
    pieces = [
        piece
        for document in documents
        for piece in split_document(np.asarray(document, "int32"), length)
    ]
    if not packed:
        rows = [[i] for i in range(len(pieces))]
    else:
        rows = []
        by_room = [[] for _ in range(capacity + 1)]  # row numbers by room
        for i in sorted(range(len(pieces)), key=lambda i: -len(pieces[i])):
            size = len(pieces[i])
            room = next(
                (r for r in range(size, capacity + 1) if by_room[r]), None
            )
            if room is None:
                row, room = len(rows), capacity
                rows.append([])
            else:
                row = by_room[room].pop(0)
            rows[row].append(i)
            by_room[room - size].append(row)
    tokens = np.zeros((len(rows), capacity), "int32")
    segment_ids = np.zeros((len(rows), capacity), "int32")
    for row, members in enumerate(rows):
        start = 0
        for segment, i in enumerate(members, 1):
            end = start + len(pieces[i])
            tokens[row, start:end] = pieces[i]
            segment_ids[row, start:end] = segment
            start = end
    return tokens, segment_ids


def next_token_pairs(tokens, segment_ids):
    """Inputs, targets, input segment ids and sample weights, `(R, T)`.

    A target counts (weight 1) only where it continues the input's own
    document: not on padding, and not across a document boundary.
    """
    ids = segment_ids[:, :-1]  # (R, T)
    weights = (ids != 0) & (ids == segment_ids[:, 1:])  # (R, T)
    return tokens[:, :-1], tokens[:, 1:], ids, weights.astype("float32")


def training_rows(args, documents, stream, rng):
    """`--windows` training rows of `--sequence-length` and their layout.

    Stream batching (the default) cuts random windows from the byte stream
    of all training docstrings, blank lines between them: no padding, but
    windows run across documents. `--padded` gives each docstring (or
    piece of a long one) a row of its own; `--packed` packs several into
    a row. Those rows are drawn in a seeded random order, again and again
    if `--windows` is more than there are, so that all three layouts
    train the same number of steps of the same shape.
    """
    import numpy as np

    length = args.sequence_length
    baseline = pack_documents(documents, length, packed=False)[1][:, :-1]
    if not (args.packed or args.padded):
        inputs, targets = windows(stream, args.windows, length, rng)
        ids, weights = np.ones_like(inputs), None
    else:
        tokens, segment_ids = pack_documents(documents, length, args.packed)
        repeats = -(-args.windows // len(tokens))
        order = np.concatenate(
            [rng.permutation(len(tokens)) for _ in range(repeats)]
        )[: args.windows]
        inputs, targets, ids, weights = next_token_pairs(
            tokens[order], segment_ids[order]
        )
    return {
        "inputs": inputs,  # (R, T)
        "targets": targets,  # (R, T)
        "segment_ids": ids,  # (R, T)
        "weights": weights,  # (R, T) or None: every target counts
        "real_targets": int(ids.size if weights is None else np.sum(weights)),
        "padding_fraction": float(np.mean(ids == 0)),
        "padding_fraction_one_per_row": float(np.mean(baseline == 0)),
    }


def held_out_rows(documents, length, count):
    """The first `count` rows of the held-out docstrings, one per row: the
    same measurement whatever the training batching."""
    tokens, segment_ids = pack_documents(documents, length, packed=False)
    pairs = next_token_pairs(tokens[:count], segment_ids[:count])
    names = ("inputs", "targets", "segment_ids", "weights")
    return dict(zip(names, pairs, strict=True))


def held_out_loss(model, held_out, batch_size):
    """Mean cross-entropy (nats) over the targets of weight 1."""
    import numpy as np

    total, chunk = 0.0, 8 * batch_size
    for start in range(0, len(held_out["targets"]), chunk):
        part = {k: v[start : start + chunk] for k, v in held_out.items()}
        logits = model.predict(
            model_inputs(model, part["inputs"], part["segment_ids"]),
            batch_size=batch_size,
            verbose=0,
        ).astype("float64")  # (n, T, 256)
        top = logits.max(axis=-1, keepdims=True)
        log_z = np.log(np.exp(logits - top).sum(axis=-1)) + top[..., 0]
        picked = np.take_along_axis(
            logits, part["targets"][..., None], axis=-1
        )[..., 0]  # (n, T)
        total += float(np.sum((log_z - picked) * part["weights"]))
    return total / float(np.sum(held_out["weights"]))


def encode(texts):
    """UTF-8 bytes of each text, as int32 token ids."""
    import numpy as np

    return [
        np.frombuffer(t.encode("utf-8"), dtype="uint8").astype("int32")
        for t in texts
    ]


def build_model(args):
    """Byte embedding, decoder-only blocks, final LayerNorm, logits.

    With `args.packed` the model takes `{"tokens", "segment_ids"}`: each
    block attends within equal ids and restarts its rotary positions
    there, as does `PositionEmbedding` its learned ones.
    """
    import keras

    import keras_attention as ka

    tokens = keras.Input((None,), dtype="int32", name="tokens")
    inputs, segment_ids = tokens, None
    if getattr(args, "packed", False):
        segment_ids = keras.Input((None,), dtype="int32", name="segment_ids")
        inputs = {"tokens": tokens, "segment_ids": segment_ids}
    x = keras.layers.Embedding(256, args.units, name="token_embedding")(
        tokens
    )  # (B, T, D)
    if args.positions == "learned":
        longest = max(args.sequence_length, args.prompt_length + args.generate)
        x = ka.PositionEmbedding(longest + -longest % BUCKET, name="positions")(
            x, segment_ids=segment_ids
        )
    for i in range(args.layers):
        x = ka.TransformerDecoderBlock(
            args.heads,
            4 * args.units,
            dropout=args.dropout,
            activation="gelu",
            normalize_first=True,
            num_key_value_heads=args.kv_heads,
            use_rotary=args.positions == "rotary",
            sliding_window=getattr(args, "sliding_window", None),
            name=f"block_{i}",
        )(x, segment_ids=segment_ids)  # (B, T, D)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    logits = keras.layers.Dense(256, name="logits")(x)  # (B, T, 256)
    return keras.Model(inputs, logits, name="mini_gpt")


def model_inputs(model, tokens, segment_ids):
    """What `model` takes: the tokens, or with segment ids for packing."""
    if len(model.inputs) == 1:
        return tokens
    return {"tokens": tokens, "segment_ids": segment_ids}


class Generator:
    """Incremental (KV-cached) and full-prefix generation of a mini GPT."""

    def __init__(self, model):
        import keras

        self.model = model
        names = [layer.name for layer in model.layers]
        self.blocks = [
            model.get_layer(name) for name in names if name.startswith("block_")
        ]
        self.embedding = model.get_layer("token_embedding")
        self.positions = (
            model.get_layer("positions") if "positions" in names else None
        )
        self.norm = model.get_layer("final_norm")
        self.head = model.get_layer("logits")
        self.ops = keras.ops

    def cached_state(self, prompts, max_length):
        """Runs all prompt tokens but the last through the blocks at once,
        filling each block's cache; the last one starts the decoding."""
        ops = self.ops
        batch, length = prompts.shape
        x = self._embed(prompts[:, :-1], 0)  # (B, P-1, D)
        caches = []
        for block in self.blocks:
            cache = block.init_cache(batch, max_length)
            x, cache = block(x, cache=cache, cache_index=0)
            caches.append(cache)
        return {
            "caches": caches,
            # Per row, so that the decoding functions may tile it.
            "index": ops.full((batch,), length - 1, "int32"),
        }

    def cached_step(self, token_ids, state):
        index = state["index"][0]  # all rows advance in lockstep
        x = self._embed(token_ids[:, None], index)  # (B, 1, D)
        caches = []
        for block, cache in zip(self.blocks, state["caches"], strict=True):
            x, cache = block(x, cache=cache, cache_index=index)  # (B, 1, D)
            caches.append(cache)
        logits = self.head(self.norm(x[:, 0]))  # (B, 256)
        return logits, {"caches": caches, "index": state["index"] + 1}

    def full_state(self, prompts):
        return {"tokens": self.ops.convert_to_tensor(prompts[:, :-1])}

    def full_step(self, token_ids, state):
        """No cache: the whole prefix through the model at every step.

        The prefix is padded at the end to a multiple of `BUCKET` tokens:
        causal attention keeps the padding from changing the logits of the
        prefix, and JAX then compiles one graph per bucket instead of one
        per length (seconds each, which would dwarf the compute).
        """
        ops = self.ops
        tokens = ops.concatenate(
            [state["tokens"], token_ids[:, None]], axis=1
        )  # (B, t)
        length = tokens.shape[1]
        padding = [[0, 0], [0, -length % BUCKET]]
        padded = ops.pad(tokens, padding)  # (B, ⌈t⌉)
        # A packed model: one sequence (id 1), then padding (id 0).
        ids = ops.pad(ops.ones_like(tokens), padding)  # (B, ⌈t⌉)
        logits = self.model(model_inputs(self.model, padded, ids))
        return logits[:, length - 1], {"tokens": tokens}

    def _embed(self, ids, start_index):
        x = self.ops.take(self.embedding.embeddings, ids, axis=0)
        if self.positions is not None:
            x = self.positions(x, start_index=start_index)
        return x


def generate(
    generator, prompts, length, cached, top_p=None, seed=None, compiled=False
):
    """`(ids (B, length), seconds)`: greedy without `top_p`, else top-p;
    `compiled` runs the whole loop as one program (`jit_compile=True`),
    which needs the cache: without it the prefix grows every step."""
    import keras
    import numpy as np

    from keras_attention import decoding

    if cached:
        step = generator.cached_step
        state = generator.cached_state(prompts, prompts.shape[1] + length)
    else:
        step, state = generator.full_step, generator.full_state(prompts)
    starts = prompts[:, -1]
    start = time.perf_counter()
    if top_p is None:
        ids = decoding.greedy_search(
            step, state, starts, length, jit_compile=compiled
        )
    else:
        ids = decoding.sample(
            step,
            state,
            starts,
            length,
            top_p=top_p,
            seed=seed,
            jit_compile=compiled,
        )
    ids = np.asarray(keras.ops.convert_to_numpy(ids))
    return ids, time.perf_counter() - start


def text(ids):
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def main(argv=None):
    args = parse_args(argv)
    from examples.backend import publish
    from examples.backend import select_backend

    select_backend(args.backend)
    import keras
    import numpy as np

    keras.utils.set_random_seed(args.seed)
    root, num_files, splits = load_documents(args.max_files)
    data, held_out_docs = byte_streams(splits), splits["held_out"]
    print(
        f"keras_attention mini GPT on {keras.backend.backend()}: docstrings "
        f"of {num_files} standard-library files in {root} (Python "
        f"{sys.version.split()[0]}), {len(data['train']):,} train / "
        f"{len(data['held_out']):,} held-out bytes (every tenth file)"
    )
    rng = np.random.default_rng(args.seed)
    train = training_rows(args, encode(splits["train"]), data["train"], rng)
    held_out = held_out_rows(
        encode(held_out_docs), args.sequence_length, max(1, args.windows // 8)
    )
    model = build_model(args)
    steps = args.epochs * -(-args.windows // args.batch_size)
    model.compile(
        optimizer=keras.optimizers.AdamW(
            keras.optimizers.schedules.CosineDecay(
                0.0,
                decay_steps=max(1, steps - steps // 10),
                alpha=0.05,
                warmup_target=args.learning_rate,
                warmup_steps=max(1, steps // 10),
            ),
            weight_decay=0.01,
            clipnorm=1.0,
        ),
        # Each batch's loss is the mean over the targets that count.
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight"
        ),
    )
    batching = (
        "packed" if args.packed else "padded" if args.padded else "stream"
    )
    print(
        f"{model.count_params():,} parameters: {args.layers} blocks of "
        f"{args.units} units, {args.heads} query / {args.kv_heads} key-value "
        f"heads, {args.positions} positions, sliding window "
        f"{args.sliding_window or 'none'}; {batching} batching: "
        f"{len(train['inputs']):,} rows of {args.sequence_length} bytes, "
        f"{train['padding_fraction']:.1%} padding (one docstring per row: "
        f"{train['padding_fraction_one_per_row']:.1%})"
    )
    start = time.perf_counter()
    model.fit(
        model_inputs(model, train["inputs"], train["segment_ids"]),
        train["targets"],
        sample_weight=train["weights"],
        epochs=args.epochs,
        batch_size=args.batch_size,
        verbose=2,
    )
    train_seconds = time.perf_counter() - start
    real_tokens_per_second = args.epochs * train["real_targets"] / train_seconds
    loss = held_out_loss(model, held_out, args.batch_size)
    perplexity = float(np.exp(loss))
    held_out_targets = int(held_out["weights"].sum())
    print(
        f"\ntrained in {train_seconds:.0f} s, "
        f"{real_tokens_per_second:,.0f} real (non-padding) training "
        f"tokens/s; held-out perplexity {perplexity:.2f} per byte "
        f"({loss / np.log(2):.3f} bits per byte, {held_out_targets:,} "
        "bytes, each docstring on its own); a uniform guess is 256"
    )

    # Prompts: the first bytes of held-out docstrings.
    encoded = [d.encode("utf-8") for d in held_out_docs]
    prompts = np.array(
        [
            list(d[: args.prompt_length])
            for d in encoded
            if len(d) >= args.prompt_length
        ][: args.prompts],
        "int32",
    )  # (B, P)
    generator = Generator(model)
    runs = {}
    for cached in (True, False):
        name = "cached" if cached else "uncached"
        greedy, _ = generate(
            generator, prompts, args.generate, cached, compiled=cached
        )
        sample = functools.partial(
            generate,
            generator,
            prompts,
            args.generate,
            cached,
            top_p=args.top_p,
            seed=args.seed,
        )
        # The Python loop's samples are compared across the two runs: on
        # TensorFlow a compiled loop draws other random numbers.
        sampled, seconds = sample()
        if cached:
            # Timed on the second run: the first compiles the whole loop
            # (eager on PyTorch).
            sample(compiled=True)
            _, seconds = sample(compiled=True)
        else:
            # Timed on the second run: the first compiles each op per shape.
            _, seconds = sample()
        runs[name] = {
            "greedy": greedy,
            "sampled": sampled,
            "tokens_per_second": sampled.size / seconds,
        }
    same_greedy = np.array_equal(
        runs["cached"]["greedy"], runs["uncached"]["greedy"]
    )
    same_sampled = np.array_equal(
        runs["cached"]["sampled"], runs["uncached"]["sampled"]
    )
    speedup = (
        runs["cached"]["tokens_per_second"]
        / runs["uncached"]["tokens_per_second"]
    )
    print(
        f"top-p {args.top_p} samples (seed {args.seed}) continuing held-out "
        "docstrings:"
    )
    for prompt, ids in zip(prompts, runs["cached"]["sampled"], strict=True):
        print(f"  {text(prompt)!r} + {text(ids)!r}")
    print(
        f"generation of {len(prompts)} x {args.generate} tokens: "
        f"{runs['cached']['tokens_per_second']:.1f} tokens/s with the KV "
        f"cache, {runs['uncached']['tokens_per_second']:.1f} tokens/s "
        f"re-running the prefix ({speedup:.1f}x); same tokens: greedy "
        f"{'yes' if same_greedy else 'NO'}, sampled "
        f"{'yes' if same_sampled else 'NO'}"
    )

    name = f"mini-gpt-{args.positions}"
    if batching != "stream":
        name += f"-{batching}"
    if args.sliding_window:
        name += f"-window{args.sliding_window}"
    output = Path(args.output) / name
    output.mkdir(parents=True, exist_ok=True)
    model_path = output / "model.keras"
    model.save(model_path)
    restored = keras.saving.load_model(model_path)
    probe = model_inputs(
        model, held_out["inputs"][:4], held_out["segment_ids"][:4]
    )
    reload_difference = float(
        np.max(
            np.abs(
                keras.ops.convert_to_numpy(model(probe))
                - keras.ops.convert_to_numpy(restored(probe))
            )
        )
    )
    reloaded, _ = generate(Generator(restored), prompts, args.generate, True)
    same_reloaded = np.array_equal(reloaded, runs["cached"]["greedy"])
    print(
        f"saved {model_path}; reloaded logits differ by at most "
        f"{reload_difference:.1e}, greedy generation "
        f"{'identical' if same_reloaded else 'DIFFERENT'}"
    )
    summary = {
        "backend": keras.backend.backend(),
        "positions": args.positions,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "sliding_window": args.sliding_window,
        "batching": batching,
        "parameters": model.count_params(),
        "files": num_files,
        "train_docstrings": len(splits["train"]),
        "train_bytes": len(data["train"]),
        "held_out_bytes": len(data["held_out"]),
        "train_rows": len(train["inputs"]),
        "steps": steps,
        "train_seconds": round(train_seconds, 1),
        "ms_per_step": 1000 * train_seconds / steps,
        "real_train_tokens": args.epochs * train["real_targets"],
        "real_tokens_per_second": real_tokens_per_second,
        "padding_fraction": train["padding_fraction"],
        "padding_fraction_one_per_row": train["padding_fraction_one_per_row"],
        "held_out_targets": held_out_targets,
        "held_out_loss": float(loss),
        "perplexity": perplexity,
        "bits_per_byte": float(loss / np.log(2)),
        "cached_tokens_per_second": runs["cached"]["tokens_per_second"],
        "uncached_tokens_per_second": runs["uncached"]["tokens_per_second"],
        "same_greedy": bool(same_greedy),
        "same_sampled": bool(same_sampled),
        "reload_max_difference": reload_difference,
        "reloaded_identical": bool(same_reloaded),
    }
    (output / "results.json").write_text(json.dumps(summary, indent=2))
    print("RESULT " + json.dumps(summary))
    publish(name, summary, args)
    return summary


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    result = main()
    sys.exit(0 if result["same_greedy"] and result["reloaded_identical"] else 1)
