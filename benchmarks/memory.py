"""Peak memory of one self-attention training step, per layer and length.

Each measurement runs in its own process: the model (the attention layer
alone, B=8, D=512, 8 heads, with and without a causal mask) is built, the
kernel's peak-RSS counter is reset (`/proc/self/clear_refs`) and two
training steps run: the figure is their peak resident memory above the
memory held before them. It includes
the compilation of the step (XLA on TensorFlow and JAX), a cost of a few
hundred MiB that does not grow with T. (Measuring a later step alone
does not work: TensorFlow keeps the memory of earlier steps.)

Keras's layer is not run at lengths whose predicted peak (4x the
measured one at half the length) exceeds the budget, and is reported as
predicted. Ours always runs: it keeps the reference path only while the
`(B, N, T, S)` weights take at most 1 GiB, so its peak does not follow
the quadratic prediction.

    KERAS_BACKEND=jax python benchmarks/memory.py [--quick]
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

B, D, N = 8, 512, 8
BUDGET_GIB = 12.0  # half of the 24 GiB machine: others share it
CANDIDATES = ("ours", "ours_causal", "keras_mha", "keras_mha_causal")


def child(name, length):
    import keras
    import numpy as np
    from common import BACKEND  # noqa: F401  (imports torch first)

    import keras_attention as ka

    causal = name.endswith("_causal")
    inputs = keras.Input((length, D), batch_size=B)
    if name.startswith("ours"):
        layer = ka.MultiHeadSelfAttention(N, D // N)
        outputs = layer(inputs, use_causal_mask=causal)
    else:
        layer = keras.layers.MultiHeadAttention(N, D // N)
        outputs = layer(inputs, inputs, use_causal_mask=causal)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(size=(B, length, D)).astype("float32")
    print_training_peak(model, x, np.zeros_like(x))


def print_training_peak(model, x, y):
    """Prints, as JSON, the peak resident memory of two training steps
    (the first compiles) above the memory held before them."""
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM
    model.train_on_batch(x, y)  # compiles, then runs
    model.train_on_batch(x, y)
    peak = _status("VmHWM")
    print(json.dumps({"peak_mib": (peak - before) / 1024}))


def _status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])  # kB
    raise RuntimeError(field)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("NAME", "T"))
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]))
    from common import BACKEND
    from common import write

    lengths = (512, 1024) if args.quick else (1024, 2048, 4096, 8192)
    rows = []
    for name in CANDIDATES:
        previous = None
        for length in lengths:
            predicted = None if previous is None else previous * 4 / 1024
            quadratic = name.startswith("keras")
            if quadratic and predicted is not None and predicted > BUDGET_GIB:
                rows.append(
                    {"name": name, "T": length, "peak_mib": None,
                     "predicted_gib": predicted}
                )  # fmt: skip
                print(f"{name:10s} T={length}: not run, ~{predicted:.1f} GiB")
                previous = predicted * 1024  # the next length grows from it
                continue
            result = subprocess.run(
                [sys.executable, __file__, "--child", name, str(length)],
                env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode:
                print(result.stderr[-2000:])
                rows.append({"name": name, "T": length, "peak_mib": None,
                             "error": result.returncode})  # fmt: skip
                continue
            peak = json.loads(result.stdout.splitlines()[-1])["peak_mib"]
            previous = peak
            rows.append({"name": name, "T": length, "peak_mib": peak})
            print(f"{name:10s} T={length}: {peak:8.0f} MiB  ({BACKEND})")
    write("memory", {"B": B, "D": D, "N": N, "budget_gib": BUDGET_GIB,
                     "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
