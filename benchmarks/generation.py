"""Greedy generation tokens/s: our KV cache, keras-hub's, and no cache.

A decoder-only model (vocabulary 1000, d=256, 4 heads, feed-forward 1024,
2 blocks, random weights) generates 128 new tokens after one start token
at batch 1 and 8. Models:

* `ours_cached`: `TransformerDecoderBlock` with `init_cache`;
* `keras_hub_cached`: keras-hub's `TransformerDecoder` with its
  `self_attention_cache` (same sizes);
* `ours_uncached`: our blocks re-run on the whole (fixed-size, causally
  masked) sequence at every step.

Loops (the `loop` field of each row):

* `compiled`: the whole loop as one program. Ours is
  `greedy_search(..., jit_compile=True)`; keras-hub's is its own
  `GreedySampler` inside a function compiled the way
  `CausalLM.generate` compiles it.
* `python`: `greedy_search`'s Python loop driving a compiled step.

Beam search (`name` `beam`: beam width 4, batch 8, 64 new tokens, our
cached model) runs both ways too: `beam_search(..., jit_compile=True)`
and its Python loop driving a compiled step. Next to it, `beam_floor`
is compiled greedy search over as many rows as the beams (batch
8 x 4 = 32) for as many tokens: the model's own arithmetic, which no
beam search over this model can go below.

Compilation is `jax.jit` or `tf.function(jit_compile=True)`; PyTorch runs
eagerly. The first generation (compilation) is not timed; then every
variant is timed once per round, round after round, and the median is
reported.

    KERAS_BACKEND=jax python benchmarks/generation.py [--quick]
"""

import argparse
import time

import keras
import numpy as np
from common import BACKEND
from common import block as wait_for
from common import compiled
from common import write
from keras import ops

import keras_attention as ka
from keras_attention.decoding import beam_search
from keras_attention.decoding import greedy_search

VOCAB, D, HEADS, FFN, LAYERS = 1000, 256, 4, 1024, 2
BEAM_WIDTH, BEAM_BATCH, BEAM_TOKENS = 4, 8, 64


class Model:
    def __init__(self, kind, max_length):
        keras.utils.set_random_seed(0)
        self.kind, self.max_length = kind, max_length
        self.embedding = keras.layers.Embedding(VOCAB, D)
        self.positions = ka.PositionalEncoding()
        if kind == "keras_hub_cached":
            import keras_hub

            self.blocks = [
                keras_hub.layers.TransformerDecoder(FFN, HEADS)
                for _ in range(LAYERS)
            ]
        else:
            self.blocks = [
                ka.TransformerDecoderBlock(HEADS, FFN) for _ in range(LAYERS)
            ]
        self.head = keras.layers.Dense(VOCAB)
        ids = np.zeros((1, 4), "int32")
        x = self.positions(self.embedding(ids))
        for block in self.blocks:
            x = block(x)
        self.head(x)

    def initial_state(self, batch):
        index = ops.convert_to_tensor(0, "int32")
        if self.kind == "ours_uncached":
            buffer = ops.zeros((batch, self.max_length), "int32")
            return {"tokens": buffer, "index": index}
        if self.kind == "ours_cached":
            caches = [
                block.init_cache(batch, self.max_length)
                for block in self.blocks
            ]
        else:
            shape = (batch, 2, self.max_length, HEADS, D // HEADS)
            caches = [ops.zeros(shape) for _ in self.blocks]
        return {"caches": caches, "index": index}

    def keras_hub_next(self, prompt, caches, index):
        """keras-hub's sampler callback: the token before `index`."""
        ids = ops.take(prompt, index - 1, axis=1)  # (B,)
        logits, state = self.step(ids, {"caches": caches, "index": index - 1})
        return logits, None, tuple(state["caches"])

    def step(self, ids, state):
        index = state["index"]
        if self.kind == "ours_uncached":
            positions = ops.arange(self.max_length)[None, :]  # (1, L)
            tokens = ops.where(
                positions == index, ids[:, None], state["tokens"]
            )
            x = self.positions(self.embedding(tokens))  # (B, L, D)
            for block in self.blocks:
                x = block(x)
            logits = self.head(ops.take(x, index, axis=1))  # (B, V)
            return logits, {"tokens": tokens, "index": index + 1}
        x = self.positions(self.embedding(ids[:, None]), start_index=index)
        caches = []
        for block, cache in zip(self.blocks, state["caches"], strict=True):
            if self.kind == "ours_cached":
                x, cache = block(x, cache=cache, cache_index=index)
            else:
                x, cache = block(
                    x,
                    self_attention_cache=cache,
                    self_attention_cache_update_index=index,
                )
            caches.append(cache)
        return self.head(x[:, 0]), {"caches": caches, "index": index + 1}


def generator(model, loop, new_tokens, beam=False):
    """`generate(batch)` for one model and loop: greedy search, or beam
    search (`BEAM_WIDTH` beams, length penalty 0.6) with `beam=True`."""
    if model.kind == "keras_hub_cached" and loop == "compiled":
        return keras_hub_generator(model, new_tokens)
    step = model.step if loop == "compiled" else compiled(model.step)
    options = {"beam_width": BEAM_WIDTH, "length_penalty": 0.6} if beam else {}
    search = beam_search if beam else greedy_search

    def generate(batch):
        return search(
            step,
            model.initial_state(batch),
            np.ones(batch, "int32"),
            new_tokens,
            jit_compile=loop == "compiled",
            **options,
        )

    return generate


def keras_hub_generator(model, new_tokens):
    """keras-hub's `GreedySampler` compiled as `CausalLM.generate` compiles
    its loop: `jax.jit` with the weights passed in through a
    `StatelessScope`, `tf.function(jit_compile=True)`, eager PyTorch under
    `torch.no_grad()`."""
    import keras_hub

    sampler = keras_hub.samplers.GreedySampler()
    weights = [
        *model.embedding.weights,
        *(w for block in model.blocks for w in block.weights),
        *model.head.weights,
    ]

    def hub_generate(values, prompt, caches):
        mapping = list(zip(weights[: len(values)], values, strict=True))
        with keras.StatelessScope(state_mapping=mapping):
            return sampler(model.keras_hub_next, prompt, caches, index=1)

    if BACKEND == "jax":
        import jax

        run = jax.jit(hub_generate)
    elif BACKEND == "tensorflow":
        run = compiled(lambda prompt, caches: hub_generate([], prompt, caches))
    else:
        import torch

        run = torch.no_grad()(hub_generate)

    def generate(batch):
        prompt = np.zeros((batch, new_tokens + 1), "int32")
        prompt[:, 0] = 1
        caches = tuple(model.initial_state(batch)["caches"])
        if BACKEND == "tensorflow":
            return run(ops.convert_to_tensor(prompt), caches)
        values = [w.value for w in weights] if BACKEND == "jax" else []
        return run(values, ops.convert_to_tensor(prompt), caches)

    return generate


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    new_tokens = 32 if args.quick else 128
    rounds = 3 if args.quick else 7
    runs = {}
    for kind in ("ours_cached", "keras_hub_cached", "ours_uncached"):
        model = Model(kind, new_tokens + 1)
        for loop in ("compiled", "python"):
            generate = generator(model, loop, new_tokens)
            for batch in (1, 8):
                wait_for(generate(batch))  # compiles; not timed
                runs[(kind, loop, batch)] = generate
    beam_model = Model("ours_cached", BEAM_TOKENS + 1)
    for loop in ("compiled", "python"):
        generate = generator(beam_model, loop, BEAM_TOKENS, beam=True)
        wait_for(generate(BEAM_BATCH))
        runs[("beam", loop, BEAM_BATCH)] = generate
    floor = generator(beam_model, "compiled", BEAM_TOKENS)
    wait_for(floor(BEAM_BATCH * BEAM_WIDTH))
    runs[("beam_floor", "compiled", BEAM_BATCH * BEAM_WIDTH)] = floor
    # Round-robin: each round times every variant once, so that a change
    # in the machine's load falls on all of them alike.
    seconds = {key: [] for key in runs}
    for _ in range(rounds):
        for (kind, loop, batch), generate in runs.items():
            start = time.perf_counter()
            wait_for(generate(batch))
            seconds[(kind, loop, batch)].append(time.perf_counter() - start)
    rows = []
    for (kind, loop, batch), times in seconds.items():
        tokens = BEAM_TOKENS if kind.startswith("beam") else new_tokens
        # Beam rows count the tokens of the batch's sentences, not of
        # every beam, so that the floor compares as the same output.
        sentences = BEAM_BATCH if kind.startswith("beam") else batch
        rate = sentences * tokens / float(np.median(times))
        rows.append(
            {"name": kind, "loop": loop, "batch": batch, "tokens_per_s": rate}
        )
        print(f"{kind:17s} {loop:8s} batch {batch}: {rate:8.0f} tok/s")
    write(
        "generation",
        {"new_tokens": new_tokens, "beam_tokens": BEAM_TOKENS,
         "rounds": rounds, "rows": rows},
    )  # fmt: skip


if __name__ == "__main__":
    main()
