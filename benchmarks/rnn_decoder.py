"""`AttentionDecoder` inference: keys projected once vs at every step.

A GRU decoder (256 units) with Bahdanau attention (256 units) over a
source of 256 encoder states (dim 512), batch 8. `precomputed` is the
library's way: `get_initial_state` projects the keys once and `step`
reuses them. `recomputed` projects the keys again inside every step, as a
decoder that calls the attention layer on the encoder outputs would. Both
steps are compiled; the time is per decoding step.

    KERAS_BACKEND=jax python benchmarks/rnn_decoder.py [--quick]
"""

import argparse

import keras
import numpy as np
from common import compiled
from common import median_seconds
from common import write

import keras_attention as ka

B, S, DE, UNITS, E = 8, 256, 512, 256, 64


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    steps = 10 if args.quick else 50
    rng = np.random.default_rng(0)
    encoder_outputs = keras.ops.convert_to_tensor(
        rng.normal(size=(B, S, DE)), "float32"
    )
    inputs = keras.ops.convert_to_tensor(rng.normal(size=(B, E)), "float32")
    attention = ka.BahdanauAttention(UNITS)
    decoder = ka.AttentionDecoder(keras.layers.GRUCell(UNITS), attention)
    decoder(inputs[:, None], encoder_outputs)  # builds

    # Encoder outputs are arguments, not constants a compiler could fold.
    def precomputed(state, encoder_outputs):
        output, state, _ = decoder.step(inputs, state, encoder_outputs)
        return output, state

    def recomputed(state, encoder_outputs):
        state = {**state, "keys": attention.project_keys(encoder_outputs)}
        output, state, _ = decoder.step(inputs, state, encoder_outputs)
        return output, state

    rows = []
    for name, step in (
        ("precomputed", precomputed),
        ("recomputed", recomputed),
    ):
        step = compiled(step)

        def decode(step=step):
            state = decoder.get_initial_state(encoder_outputs)
            for _ in range(steps):
                output, state = step(state, encoder_outputs)
            return output

        seconds = median_seconds(decode, repeats=5) / steps
        rows.append({"name": name, "step_ms": seconds * 1e3})
        print(f"{name:12s} {seconds * 1e3:8.3f} ms per step")
    write("rnn_decoder", {"B": B, "S": S, "steps": steps, "rows": rows})


if __name__ == "__main__":
    main()
