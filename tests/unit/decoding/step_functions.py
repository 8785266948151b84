"""Step functions the decoding tests share, and the helpers that run one
search both ways (Python loop, compiled loop)."""

import itertools

import keras
import numpy as np
from keras import ops

from keras_attention import TransformerDecoderBlock
from keras_attention.decoding import beam_search
from keras_attention.decoding import greedy_search
from tests.helpers import rng
from tests.helpers import to_numpy

V, L, SOURCE = 3, 3, 4

BIGRAM = np.log(
    np.array(
        [[0.1, 0.5, 0.4], [0.34, 0.33, 0.33], [0.9, 0.05, 0.05]], "float32"
    )
)


def table_step(ids, state):
    """A bigram model that reads its table from the state."""
    return ops.take(state["table"], ids, axis=0), state


class PrefixModel:
    """A language model whose next-token logits depend on the whole prefix.

    The state is a code of the prefix, `code' = code · V + token + 1`, so
    beam search must reorder it correctly; logits and attention are looked
    up in fixed random tables (400 codes: prefixes of up to 5 tokens).
    """

    def __init__(self, seed=0, sharp=2.0):
        g = rng(seed)
        self.logits = g.normal(size=(400, V)) * sharp
        attention = np.exp(g.normal(size=(400, SOURCE)) * 2)
        self.attention = attention / attention.sum(-1, keepdims=True)
        self.logits_tensor = ops.convert_to_tensor(self.logits, "float32")
        self.attention_tensor = ops.convert_to_tensor(self.attention, "float32")

    def step(self, token_ids, state):
        code = state["code"] * V + token_ids + 1
        logits = ops.take(self.logits_tensor, code, axis=0)
        attention = ops.take(self.attention_tensor, code, axis=0)
        return logits, {"code": code}, attention

    def initial_state(self, batch):
        return {"code": ops.zeros((batch,), "int32")}

    def log_probs(self, code):
        """The float64 log-softmax of the logits at `code`."""
        logits = self.logits[code]
        return logits - np.log(np.exp(logits).sum())

    def brute_force(self, start, end_id, alpha, beta):
        """The best sequence and its score over all V^L sequences."""
        best, best_score = None, -np.inf
        for seq in itertools.product(range(V), repeat=L):
            if end_id is not None and end_id in seq:
                first = seq.index(end_id)
                if any(t != end_id for t in seq[first:]):
                    continue  # after the end only end_id may follow
                length = first + 1
            else:
                length = L
            code, total, coverage = 0, 0.0, np.zeros(SOURCE)
            token = start
            for t in range(length):
                code = code * V + token + 1
                total += self.log_probs(code)[seq[t]]
                coverage += self.attention[code]
                token = seq[t]
            score = total / (((5 + length) ** alpha) / 6**alpha)
            score += beta * np.log(np.minimum(coverage, 1.0)).sum()
            if score > best_score:
                best, best_score = seq, score
        return np.array(best), best_score


class CachedTransformer:
    """Embedding, one decoder block with a KV cache and cross-attention to a
    fixed source, a vocabulary head."""

    def __init__(
        self,
        vocab=11,
        seed=0,
        sliding_window=None,
        score_mod=None,
        mask_mod=None,
    ):
        keras.utils.set_random_seed(seed)
        self.vocab = vocab
        # A mask mod given to each call, a score mod to the block.
        self.mods = {} if mask_mod is None else {"mask_mod": mask_mod}
        self.embedding = keras.layers.Embedding(vocab, 16)
        self.block = TransformerDecoderBlock(
            4,
            32,
            num_key_value_heads=2,
            use_rotary=True,
            sliding_window=sliding_window,
            score_mod=score_mod,
        )
        self.head = keras.layers.Dense(vocab)
        self.source = rng(seed).normal(size=(3, 5, 16)).astype("float32")
        self.head(self.block(self.embedding(np.zeros((3, 1))), self.source))

    def step(self, ids, state):
        hidden, cache = self.block(
            self.embedding(ids[:, None]),
            cache=state["cache"],
            cache_index=state["index"],
            **self.mods,
        )
        logits = self.head(hidden[:, 0])
        return logits, {"cache": cache, "index": state["index"] + 1}

    def initial_state(self, max_length):
        cache = self.block.init_cache(
            3, max_length, encoder_outputs=self.source
        )
        return {"cache": cache, "index": 0}


def greedy_both_ways(step, initial_state, starts, steps, **kwargs):
    """Greedy ids from the Python loop and from the compiled loop, each
    starting from a fresh `initial_state()`."""
    python, compiled = (
        greedy_search(
            step,
            initial_state(),
            starts,
            steps,
            jit_compile=jit_compile,
            **kwargs,
        )
        for jit_compile in (False, True)
    )
    return to_numpy(python), to_numpy(compiled)


def cached_both_ways(model, starts, steps, **kwargs):
    return greedy_both_ways(
        model.step, lambda: model.initial_state(steps), starts, steps, **kwargs
    )


def beam_both_ways(step, initial_state, starts, steps, **kwargs):
    """Every beam and score from the Python loop and the compiled loop,
    as NumPy arrays of their own dtypes (int32, float32)."""
    results = [
        beam_search(
            step,
            initial_state(),
            starts,
            steps,
            return_all_beams=True,
            jit_compile=jit_compile,
            **kwargs,
        )
        for jit_compile in (False, True)
    ]
    return [tuple(ops.convert_to_numpy(x) for x in r) for r in results]
