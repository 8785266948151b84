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

ROOT = Path(__file__).resolve().parents[2]


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
    plots = sorted(folder.glob("cross_attention_*_block*.png"))
    assert len(plots) == 2  # 2 sentences, 1 decoder block each
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


# Each backend's own engine, on simulated CPU devices, and the runs it makes.
DISTRIBUTED = {
    "jax": (
        "keras.distribution",
        8,
        {"DataParallel (8)", "ModelParallel (4 x 2)"},
    ),
    "tensorflow": (
        "tf.distribute.MirroredStrategy",
        2,
        {"MirroredStrategy (2)"},
    ),
    "torch": (
        "torch.nn.parallel.DistributedDataParallel",
        2,
        {"DistributedDataParallel (2)"},
    ),
}


@pytest.mark.slow
def test_distributed_training_smoke(tmp_path):
    """Training on several devices follows the single-device run: JAX's
    DataParallel and ModelParallel, TensorFlow's MirroredStrategy over two
    logical CPUs, torch DDP over two gloo processes."""
    engine, devices, labels = DISTRIBUTED[keras.backend.backend()]
    # A zero exit status also means agreement within --tolerance.
    out, result = run_example(
        "distributed_training.py",
        "--smoke",
        "--simulate-devices",
        str(devices),
        "--output",
        str(tmp_path),
    )
    saved = json.loads((tmp_path / "distributed" / "results.json").read_text())
    assert saved == result
    assert result["backend"] == keras.backend.backend()
    assert (result["engine"], result["devices"]) == (engine, devices)
    assert f"with {engine}" in out
    assert result["matches_single_device"] is True
    assert set(result["models"]) == {"gpt", "nmt"}
    sharded = {"gpt": 10, "nmt": 27}  # per block: q/k/v, output, FFN
    for name, model in result["models"].items():
        assert len(model["baseline_losses"]) == model["steps"] == 3
        runs = model["runs"]
        assert set(runs) == {"single device"} | labels
        for label in labels:
            assert runs[label]["max_loss_difference"] < 1e-5
            assert runs[label]["max_weight_difference"] < 1e-4
            parallel = label.startswith("ModelParallel")
            expected = sharded[name] if parallel else 0
            assert runs[label]["sharded_variables"] == expected
    if keras.backend.backend() == "jax":
        assert "self_attention/query_dense/kernel: (None, 'model', None)" in out


@pytest.mark.slow
def test_mini_gpt_packed_sliding_window_smoke(tmp_path):
    out, result = run_example(
        "mini_gpt.py",
        "--smoke",
        "--packed",
        "--sliding-window",
        "8",
        "--output",
        str(tmp_path),
    )
    assert (result["batching"], result["sliding_window"]) == ("packed", 8)
    assert "packed batching" in out and "sliding window 8" in out
    # Fewer padded positions than one docstring per row.
    assert result["padding_fraction"] < result["padding_fraction_one_per_row"]
    assert 0 < result["real_train_tokens"] <= result["train_rows"] * 32
    assert result["real_tokens_per_second"] > 0
    assert 1.0 < result["perplexity"] < 400.0
    assert result["held_out_targets"] > 0
    # 8 prompt + 12 generated tokens run past the window of 8: the cache
    # rolls, and still gives the tokens of the full computation.
    assert result["same_greedy"] is True
    assert result["same_sampled"] is True
    assert result["reload_max_difference"] < 1e-5
    assert result["reloaded_identical"] is True
    folder = tmp_path / "mini-gpt-rotary-packed-window8"
    assert (folder / "model.keras").stat().st_size > 0


def test_mini_gpt_packing():
    import numpy as np

    from examples import mini_gpt

    rng = np.random.default_rng(0)
    length = 16  # rows of 17 tokens
    documents = [
        rng.integers(1, 256, size=size).astype("int32")
        for size in (17, 3, 40, 5, 2, 9, 1, 12, 16, 4, 17, 8)
    ]
    packed = mini_gpt.pack_documents(documents, length)
    padded = mini_gpt.pack_documents(documents, length, packed=False)
    again = mini_gpt.pack_documents(documents, length)
    assert all(np.array_equal(a, b) for a, b in zip(packed, again, strict=True))

    # Pieces of one row each; the 1-byte document has no target, no piece.
    expected = [
        tuple(piece)
        for document in documents
        for piece in mini_gpt.split_document(document, length)
    ]
    for tokens, segment_ids in (packed, padded):
        assert tokens.shape == segment_ids.shape
        assert tokens.shape[1] == length + 1
        found = []
        for row, ids in zip(tokens, segment_ids, strict=True):
            used = int(np.sum(ids != 0))
            # Ids 1, 2, 3, ... in order, then only padding (0) at the end.
            assert np.all(ids[used:] == 0) and np.all(ids[:used] > 0)
            starts = np.flatnonzero(np.diff(ids[:used], prepend=0))
            assert ids[:used][starts].tolist() == list(
                range(1, len(starts) + 1)
            )
            ends = [*starts[1:], used]
            found += [
                tuple(row[s:e]) for s, e in zip(starts, ends, strict=True)
            ]
        # Every piece exactly once, whole, in one segment.
        assert sorted(found) == sorted(expected)
        inputs, targets, ids, weights = mini_gpt.next_token_pairs(
            tokens, segment_ids
        )
        assert np.array_equal(inputs, tokens[:, :-1])
        assert np.array_equal(targets, tokens[:, 1:])
        # Weight 0 exactly on padding and on a document's last token.
        last = segment_ids[:, 1:] != segment_ids[:, :-1]
        assert np.array_equal(weights == 0, (ids == 0) | last)
        # Every next-token target of every document, exactly once.
        assert weights.sum() == sum(len(d) - 1 for d in documents)
    assert len(padded[0]) == len(expected)
    assert len(packed[0]) < len(padded[0])
    assert np.mean(packed[1] == 0) < np.mean(padded[1] == 0)

    # A long document: pieces of one row, each starting with the last
    # token of the one before, that join into the document again.
    document = np.arange(40, dtype="int32")
    pieces = mini_gpt.split_document(document, length)
    assert [len(p) for p in pieces] == [17, 17, 8]
    joined = np.concatenate([pieces[0], *(p[1:] for p in pieces[1:])])
    assert np.array_equal(joined, document)
