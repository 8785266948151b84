"""The Transformer example scripts run end to end (tiny `--smoke` sizes).

Each script prints a last line `RESULT {json}` with its measurements; the
tests check those as well as the files written.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name, *args, env=None):
    env = {
        **os.environ,
        "KERAS_BACKEND": keras.backend.backend(),
        **(env or {}),
    }
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("RESULT "), lines[-5:]
    return result.stdout, json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.slow
def test_transformer_nmt_smoke(tmp_path):
    out, result = run_example(
        "transformer_nmt.py",
        "--smoke",
        "--positions",
        "learned",
        "--output",
        str(tmp_path),
    )
    assert f"Transformer NMT on {keras.backend.backend()}" in out
    assert result["backend"] == keras.backend.backend()
    assert result["positions"] == "learned"
    assert set(result["results"]) == {"greedy", "beam-2"}
    for scores in result["results"].values():
        assert 0.0 <= scores["exact"] <= 1.0
        assert 0.0 <= scores["bleu"] <= 100.0
        assert 0.0 <= scores["chrf"] <= 100.0
    assert "exact match" in out and "BLEU" in out and "chrF" in out
    assert result["reloaded_identical"] is True
    assert "(identical to the trained model, greedy and beam" in out
    folder = tmp_path / "transformer-dates-learned"
    plots = sorted(folder.glob("cross_attention_*.png"))
    assert len(plots) == 2
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in plots)
    assert (folder / "model.keras").stat().st_size > 0
    assert json.loads((folder / "results.json").read_text()) == result


@pytest.mark.slow
def test_mini_gpt_smoke(tmp_path):
    out, result = run_example(
        "mini_gpt.py", "--smoke", "--output", str(tmp_path)
    )
    assert f"mini GPT on {keras.backend.backend()}" in out
    assert (result["heads"], result["kv_heads"]) == (2, 1)  # GQA
    assert result["positions"] == "rotary"
    # An untrained byte model is close to uniform over 256 bytes.
    assert 1.0 < result["perplexity"] < 400.0
    assert "held-out perplexity" in out
    assert result["cached_tokens_per_second"] > 0
    assert result["uncached_tokens_per_second"] > 0
    assert "tokens/s with the KV cache" in out
    # Same model and seed: the KV cache changes the speed, not the tokens.
    assert result["same_greedy"] is True
    assert result["same_sampled"] is True
    assert result["reload_max_difference"] < 1e-5
    assert result["reloaded_identical"] is True
    assert (tmp_path / "mini-gpt-rotary" / "model.keras").stat().st_size > 0


@pytest.mark.slow
def test_distributed_training_smoke(tmp_path):
    out, result = run_example(
        "distributed_training.py",
        "--smoke",
        "--simulate-devices",
        "8",
        "--output",
        str(tmp_path),
    )
    assert set(result["models"]) == {"gpt", "nmt"}
    for model in result["models"].values():
        assert len(model["baseline_losses"]) == model["steps"] == 3
    saved = json.loads((tmp_path / "distributed" / "results.json").read_text())
    assert saved == result
    if keras.backend.backend() != "jax":
        assert result["distribution_supported"] is False
        assert "is not implemented for the" in out
        assert "Training the single-device baseline only" in out
        return
    assert result["distribution_supported"] is True
    assert result["devices"] == 8
    assert result["losses_match"] is True
    sharded = {"gpt": 10, "nmt": 27}  # per block: q/k/v, output, FFN
    for name, model in result["models"].items():
        runs = model["runs"]
        assert set(runs) == {"single device", "data parallel", "model parallel"}
        for label in ("data parallel", "model parallel"):
            assert runs[label]["max_loss_difference"] < 1e-4
            assert runs[label]["max_weight_difference"] < 1e-3
        assert runs["data parallel"]["sharded_variables"] == 0
        assert runs["model parallel"]["sharded_variables"] == sharded[name]
    assert "self_attention/query_dense/kernel: (None, 'model', None)" in out
