"""Checkpoints across backends, each save and load in a fresh process.

The model of tests/integration/checkpoint_worker.py uses every public
layer. Each
backend's pass of the suite saves it (`.keras` and `.weights.h5`) on its
own backend and loads both files on all three backends: the three passes
together cover the 9 (saved on, loaded on) pairs. Loading uses the default
`safe_mode=True` and no `custom_objects`: every layer is registered when
`keras_attention` is imported.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "checkpoint_worker.py"
BACKENDS = ("tensorflow", "jax", "torch")


def worker(backend, *args):
    env = {**os.environ, "KERAS_BACKEND": backend}
    result = subprocess.run(
        [sys.executable, str(WORKER), *map(str, args)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoint")
    worker(keras.backend.backend(), "save", folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("load_backend", BACKENDS)
def test_checkpoint_loads_on_every_backend(checkpoint, load_backend):
    assert (checkpoint / "model.keras").stat().st_size > 0
    assert (checkpoint / "model.weights.h5").stat().st_size > 0
    result = json.loads(
        worker(load_backend, "load", checkpoint).splitlines()[-1]
    )
    assert result["keras"] <= 1e-5, result
    assert result["weights_h5"] <= 1e-5, result
    # The comparison can fail: other weights give other outputs.
    assert result["before_loading"] > 1e-2, result
