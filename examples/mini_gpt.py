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
`--kv-heads` key/value heads. After training it

* prints the held-out perplexity per byte (and bits per byte),
* continues held-out docstrings with top-p sampling through
  `keras_attention.decoding.sample`, one token per step with the blocks'
  KV caches,
* generates again without the cache (the whole prefix re-run every step)
  from the same model and seed, checks that both give the same tokens
  (greedy and sampled), and prints tokens/s of both,
* saves the model as `.keras`, reloads it and checks its logits.

    python examples/mini_gpt.py --backend jax
    python examples/mini_gpt.py --positions learned --kv-heads 4

The last line printed is a JSON summary of the measurements.
"""

import argparse
import ast
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
    parser.add_argument("--windows", type=int, default=20000)
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


def load_corpus(max_files=None):
    """Train and held-out byte arrays; every tenth file is held out."""
    import numpy as np

    root, files = docstring_files(max_files)
    splits = {"train": [], "held_out": []}
    for i, path in enumerate(files):
        split = "held_out" if i % 10 == 9 else "train"
        splits[split] += docstrings(path)
    arrays = {
        name: np.frombuffer(
            "\n\n".join(texts).encode("utf-8"), dtype="uint8"
        ).astype("int32")
        for name, texts in splits.items()
    }
    return root, len(files), arrays, splits["held_out"]


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


def build_model(args):
    """Byte embedding, decoder-only blocks, final LayerNorm, logits."""
    import keras

    import keras_attention as ka

    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(256, args.units, name="token_embedding")(
        tokens
    )  # (B, T, D)
    if args.positions == "learned":
        longest = max(args.sequence_length, args.prompt_length + args.generate)
        x = ka.PositionEmbedding(longest + -longest % BUCKET, name="positions")(
            x
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
            name=f"block_{i}",
        )(x)  # (B, T, D)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    logits = keras.layers.Dense(256, name="logits")(x)  # (B, T, 256)
    return keras.Model(tokens, logits, name="mini_gpt")


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
        tokens = self.ops.concatenate(
            [state["tokens"], token_ids[:, None]], axis=1
        )  # (B, t)
        length = tokens.shape[1]
        padded = self.ops.pad(
            tokens, [[0, 0], [0, -length % BUCKET]]
        )  # (B, ⌈t⌉)
        return self.model(padded)[:, length - 1], {"tokens": tokens}

    def _embed(self, ids, start_index):
        x = self.ops.take(self.embedding.embeddings, ids, axis=0)
        if self.positions is not None:
            x = self.positions(x, start_index=start_index)
        return x


def generate(generator, prompts, length, cached, top_p=None, seed=None):
    """`(ids (B, length), seconds)`: greedy without `top_p`, else top-p."""
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
        ids = decoding.greedy_search(step, state, starts, length)
    else:
        ids = decoding.sample(
            step, state, starts, length, top_p=top_p, seed=seed
        )
    ids = np.asarray(keras.ops.convert_to_numpy(ids))
    return ids, time.perf_counter() - start


def text(ids):
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def main(argv=None):
    args = parse_args(argv)
    from examples.backend import select_backend

    select_backend(args.backend)
    import keras
    import numpy as np

    keras.utils.set_random_seed(args.seed)
    root, num_files, data, held_out_docs = load_corpus(args.max_files)
    print(
        f"keras_attention mini GPT on {keras.backend.backend()}: docstrings "
        f"of {num_files} standard-library files in {root} (Python "
        f"{sys.version.split()[0]}), {len(data['train']):,} train / "
        f"{len(data['held_out']):,} held-out bytes (every tenth file)"
    )
    rng = np.random.default_rng(args.seed)
    train = windows(data["train"], args.windows, args.sequence_length, rng)
    held_out = windows(
        data["held_out"], args.windows // 8, args.sequence_length
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
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    print(
        f"{model.count_params():,} parameters: {args.layers} blocks of "
        f"{args.units} units, {args.heads} query / {args.kv_heads} key-value "
        f"heads, {args.positions} positions, {len(train[0]):,} windows of "
        f"{args.sequence_length} bytes"
    )
    start = time.perf_counter()
    model.fit(*train, epochs=args.epochs, batch_size=args.batch_size, verbose=2)
    train_seconds = time.perf_counter() - start
    loss = model.evaluate(*held_out, batch_size=args.batch_size, verbose=0)
    perplexity = float(np.exp(loss))
    print(
        f"\ntrained in {train_seconds:.0f} s; held-out perplexity "
        f"{perplexity:.2f} per byte ({loss / np.log(2):.3f} bits per byte, "
        f"{len(held_out[0]) * args.sequence_length:,} bytes); a uniform "
        "guess is 256"
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
        greedy, _ = generate(generator, prompts, args.generate, cached)
        # Timed on the second run: the first compiles each op per shape.
        for _ in range(2):
            sampled, seconds = generate(
                generator,
                prompts,
                args.generate,
                cached,
                top_p=args.top_p,
                seed=args.seed,
            )
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

    output = Path(args.output) / f"mini-gpt-{args.positions}"
    output.mkdir(parents=True, exist_ok=True)
    model_path = output / "model.keras"
    model.save(model_path)
    restored = keras.saving.load_model(model_path)
    probe = held_out[0][:4]
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
        "parameters": model.count_params(),
        "train_seconds": round(train_seconds, 1),
        "held_out_loss": float(loss),
        "perplexity": perplexity,
        "cached_tokens_per_second": runs["cached"]["tokens_per_second"],
        "uncached_tokens_per_second": runs["uncached"]["tokens_per_second"],
        "same_greedy": bool(same_greedy),
        "same_sampled": bool(same_sampled),
        "reload_max_difference": reload_difference,
        "reloaded_identical": bool(same_reloaded),
    }
    (output / "results.json").write_text(json.dumps(summary, indent=2))
    print("RESULT " + json.dumps(summary))
    return summary


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    result = main()
    sys.exit(0 if result["same_greedy"] and result["reloaded_identical"] else 1)
