"""Checkpoints across backends, each save and load in a fresh process.

The model of tests/integration/checkpoint_worker.py uses every public
layer. It is saved (`.keras` and `.weights.h5`) on each backend, and each
backend loads the three saves: all 9 (saved on, loaded on) pairs, in six
processes. Loading uses the default `safe_mode=True` and no
`custom_objects`: every layer is registered when `keras_attention` is
imported.

The test starts every backend itself, so it runs in one pass of the suite
(PyTorch's) rather than in each.
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

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        keras.backend.backend() != "torch",
        reason="starts every backend itself; runs in the PyTorch pass only",
    ),
]


def workers(command, folders_of):
    """Runs the worker once per backend, side by side: `command` on
    `folders_of[backend]`. Returns `{backend: stdout}`."""
    running = {}
    for backend, folders in folders_of.items():
        running[backend] = subprocess.Popen(
            [sys.executable, str(WORKER), command, *map(str, folders)],
            env={**os.environ, "KERAS_BACKEND": backend},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    outputs = {}
    for backend, process in running.items():
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, f"{backend}: {stderr[-4000:]}"
        outputs[backend] = stdout
    return outputs


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """`{saved on: folder}`, one save per backend."""
    folders = {b: tmp_path_factory.mktemp(f"saved_on_{b}") for b in BACKENDS}
    workers("save", {b: [folder] for b, folder in folders.items()})
    for folder in folders.values():
        assert (folder / "model.keras").stat().st_size > 0
        assert (folder / "model.weights.h5").stat().st_size > 0
    return folders


@pytest.fixture(scope="module")
def loaded(saved):
    """`{(saved on, loaded on): differences}` for all 9 pairs."""
    outputs = workers("load", {b: list(saved.values()) for b in BACKENDS})
    results = {}
    for load_backend, stdout in outputs.items():
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        assert len(lines) == len(saved), stdout
        for save_backend, line in zip(saved, lines, strict=True):
            results[save_backend, load_backend] = json.loads(line)
    return results


@pytest.mark.parametrize("load_backend", BACKENDS)
@pytest.mark.parametrize("save_backend", BACKENDS)
def test_checkpoint_saved_on_one_backend_loads_on_another(
    loaded, save_backend, load_backend
):
    result = loaded[save_backend, load_backend]
    assert result["keras"] <= 1e-5, result
    assert result["weights_h5"] <= 1e-5, result
    # The comparison can fail: other weights give other outputs.
    assert result["before_loading"] > 1e-2, result
