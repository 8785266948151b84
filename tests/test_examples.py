"""The example scripts run end to end (tiny `--smoke` sizes)."""

import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name, *args):
    env = {**os.environ, "KERAS_BACKEND": keras.backend.backend()}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_demo_smoke():
    out = run_example("demo.py", "--smoke")
    assert f"on {keras.backend.backend()}" in out
    for name in ("Bahdanau", "Luong dot", "Luong general", "Luong concat"):
        assert name in out
    assert out.count("attends to the queried key") == 5
