"""Export of models built from our layers, run without Keras.

Three tiny models (an encoder-decoder Transformer, a decoder-only LM with
rotary positions and grouped-query attention, an RNN attention NMT model)
and one greedy decoding step with its KV cache are exported with
`model.export` to every format Keras supports from this backend. One fresh
worker process (tests/integration/export_worker.py) loads every artefact
(`tf.saved_model.load`, `onnxruntime.InferenceSession`) and runs them on
inputs of two batch sizes and two lengths, with padding; its outputs must
equal the Keras model's, and a generation loop on the decode-step artefact
must produce Keras's tokens.

Where an exporter or converter fails on its own, the case is an expected
failure with the upstream cause (`_EXPECTED`); it fails the suite if it
starts passing.
"""

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention import decoding

pytestmark = pytest.mark.slow  # runs early: see tests/conftest.py

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "export_worker.py"
BACKEND = keras.backend.backend()
VOCAB, D, MAX_LENGTH = 11, 8, 16
CASES = ((2, 5), (3, 7))  # (batch, length): both dynamic
GENERATE = 6  # tokens generated with the decode-step artefact
TOLERANCE = 1e-5

# Where the exporter cannot keep the shapes dynamic (`_EXPECTED`), the
# models are also exported to ONNX the way the docs advise: with fixed
# shapes on PyTorch.
FIXED = {
    "torch": ("onnx-fixed-shape", ((2, 5),), 2),
}.get(BACKEND)  # (variant, (batch, length) cases, batch in the signature)

FORMATS = {
    "tensorflow": ("tf_saved_model", "onnx"),
    "jax": ("tf_saved_model", "onnx"),
    "torch": ("tf_saved_model", "onnx"),
}[BACKEND]


def _distance_penalty(score, batch, head, q_idx, kv_idx):
    """A score mod of every index: a per-head, per-row penalty on the
    distance between query and key."""
    distance = ops.cast(ops.abs(q_idx - kv_idx) * (head + 1), score.dtype)
    return score - 0.1 * distance - 0.01 * ops.cast(batch, score.dtype)


def encoder_decoder():
    """Transformer NMT: encoder and decoder blocks, sinusoidal and learned
    positions, T5's relative position bias (a score mod layer), a score
    mod function, self- and cross-attention, padding from `mask_zero`."""
    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target")
    x = keras.layers.Embedding(VOCAB, D, mask_zero=True)(source)
    x = ka.PositionalEncoding()(x)
    x = ka.TransformerEncoderBlock(2, 16, score_mod=ka.RelativePositionBias())(
        x
    )  # (B, S, D)
    y = keras.layers.Embedding(VOCAB, D, mask_zero=True)(target)
    y = ka.PositionEmbedding(MAX_LENGTH)(y)
    y = ka.TransformerDecoderBlock(2, 16)(y, x)  # (B, T, D)
    y = ka.MultiHeadSelfAttention(2)(
        y, use_causal_mask=True, score_mod=_distance_penalty
    )
    y = ka.CrossAttention(2)(y, x)
    logits = keras.layers.Dense(VOCAB)(y)  # (B, T, V)
    return keras.Model([source, target], logits, name="encoder_decoder")


def decoder_lm():
    """Decoder-only LM: learned positions, then a causal block with rotary
    positions and grouped-query attention (4 query heads, 2 KV heads)."""
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, D, mask_zero=True, name="embed")(tokens)
    x = ka.PositionEmbedding(MAX_LENGTH, name="positions")(x)
    x = ka.TransformerDecoderBlock(
        4, 16, num_key_value_heads=2, use_rotary=True, name="block"
    )(x)
    logits = keras.layers.Dense(VOCAB, name="head")(x)  # (B, T, V)
    return keras.Model(tokens, logits, name="decoder_lm")


def rnn_nmt():
    """RNN NMT: Bahdanau (GRU), Luong (LSTM), location-sensitive and
    monotonic attention decoders over the padded source."""
    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target")
    x = keras.layers.Embedding(VOCAB, D, mask_zero=True)(source)  # (B, S, D)
    y = keras.layers.Embedding(VOCAB, D)(target)  # (B, T, D)
    bahdanau = ka.AttentionDecoder(
        keras.layers.GRUCell(D), ka.BahdanauAttention(6)
    )(y, x)
    luong = ka.AttentionDecoder(
        keras.layers.LSTMCell(D), ka.LuongAttention("general"), attention_dim=D
    )(y, x)
    location = ka.AttentionDecoder(
        keras.layers.GRUCell(D), ka.LocationSensitiveAttention(6, 4, 3)
    )(y, x)
    monotonic = ka.AttentionDecoder(
        keras.layers.GRUCell(D), ka.MonotonicAttention(6)
    )(y, x)
    outputs = bahdanau + luong + location + monotonic  # (B, T, D)
    logits = keras.layers.Dense(VOCAB)(outputs)  # (B, T, V)
    return keras.Model([source, target], logits, name="rnn_nmt")


class DecodeStep(keras.Model):
    """One greedy decoding step of `decoder_lm` with its KV cache:
    `(token_ids (B, 1), cache (B, 2, S_max, K, H), index ()) -> (logits
    (B, V), new cache)`. It shares the LM's layers and weights."""

    def __init__(self, lm, **kwargs):
        super().__init__(**kwargs)
        self.embed = lm.get_layer("embed")
        self.positions = lm.get_layer("positions")
        self.block = lm.get_layer("block")
        self.head = lm.get_layer("head")

    def call(self, token_ids, cache, index):
        x = self.positions(self.embed(token_ids), start_index=index)
        x, cache = self.block(x, cache=cache, cache_index=index)  # (B, 1, D)
        return self.head(x)[:, 0], cache  # (B, V), (B, 2, S_max, K, H)


MODELS = {
    "encoder_decoder": encoder_decoder,
    "decoder_lm": decoder_lm,
    "rnn_nmt": rnn_nmt,
}


def _cases(arity, seed, shapes):
    """Token ids for each (batch, length) of `shapes`; the first row ends
    in two padding ids (0)."""
    rng = np.random.default_rng(seed)
    cases = []
    for batch, length in shapes:
        inputs = []
        for _ in range(arity):
            ids = rng.integers(1, VOCAB, (batch, length)).astype("int32")
            ids[0, -2:] = 0
            inputs.append(ids)
        cases.append(inputs)
    return cases


def _signature(decode_step):
    """Token ids, cache and index of `DecodeStep`, batch dynamic except on
    PyTorch, which exports fixed shapes only (see `_TORCH_LAYER_NORM`)."""
    batch = 2 if BACKEND == "torch" else None
    cache = decode_step.block.init_cache(1, MAX_LENGTH)["self"]
    return [
        keras.InputSpec(shape=(batch, 1), dtype="int32"),
        keras.InputSpec(shape=(batch, *cache.shape[1:]), dtype="float32"),
        keras.InputSpec(shape=(), dtype="int32"),
    ]


def _export(model, path, fmt, **kwargs):
    with warnings.catch_warnings():
        # tf2onnx reads `np.object`, which NumPy 2 announces it will change.
        warnings.filterwarnings(
            "ignore", "In the future `np.object`", FutureWarning
        )
        if BACKEND == "torch":
            import torch

            # The TorchScript tracer that Keras's exporter runs warns
            # wherever a traced size is read as a number (Keras ops too);
            # PyTorch's dynamo ONNX exporter uses its own deprecated API.
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            warnings.filterwarnings(
                "ignore", r"`isinstance\(treespec, LeafSpec\)`", FutureWarning
            )
        model.export(path, format=fmt, verbose=False, **kwargs)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Exports every (model, format), runs all artefacts in one worker and
    returns `{(name, format): result}`: the worker's outputs with Keras's,
    or the exception the export raised."""
    root = tmp_path_factory.mktemp("export")
    keras.utils.set_random_seed(0)
    results, manifest = {}, []
    models = {name: build() for name, build in MODELS.items()}
    for seed, (name, model) in enumerate(models.items()):
        variants = [(fmt, fmt, CASES, None) for fmt in FORMATS]
        if FIXED is not None and (BACKEND, name, "onnx") in _EXPECTED:
            variant, shapes, batch = FIXED
            spec = keras.InputSpec(shape=(batch, shapes[0][1]), dtype="int32")
            specs = [spec] * len(model.inputs)
            signature = [specs if len(specs) > 1 else spec]
            variants.append((variant, "onnx", shapes, signature))
        for variant, fmt, shapes, signature in variants:
            key = (name, variant)
            cases = _cases(len(model.inputs), seed, shapes)
            expected = []
            for inputs in cases:
                args = inputs if len(inputs) > 1 else inputs[0]
                expected.append(keras.ops.convert_to_numpy(model(args)))
            data = {"count": len(cases), "arity": len(model.inputs)}
            for i, inputs in enumerate(cases):
                data.update({f"{i}/{j}": x for j, x in enumerate(inputs)})
            np.savez(root / f"{name}.{variant}.npz", **data)
            path = str(root / f"{name}.{variant}")
            kwargs = {} if signature is None else {"input_signature": signature}
            try:
                _export(model, path, fmt, **kwargs)
            except Exception as error:  # compared with _EXPECTED
                results[key] = {"error": error}
                continue
            out = str(root / f"{name}.{variant}.out.npz")
            pack = "list" if len(model.inputs) > 1 else "single"
            manifest.append(
                dict(format=fmt, path=path, pack=pack, kind="forward",
                     cases=str(root / f"{name}.{variant}.npz"), out=out)
            )  # fmt: skip
            results[key] = {"out": out, "expected": expected, "shapes": shapes}

    step = DecodeStep(models["decoder_lm"])
    start_ids = np.array([1, 5], "int32")
    cache = step.block.init_cache(len(start_ids), MAX_LENGTH)["self"]
    cache = keras.ops.convert_to_numpy(cache)  # (B, 2, S_max, K, H)
    generated = _keras_generate(step, start_ids, cache)
    np.savez(
        root / "generate.npz",
        start_ids=start_ids, cache=cache, max_length=GENERATE,
    )  # fmt: skip
    for fmt in FORMATS:
        key = ("decode_step", fmt)
        path = str(root / f"decode_step.{fmt}")
        try:
            _export(step, path, fmt, input_signature=_signature(step))
        except Exception as error:
            results[key] = {"error": error}
            continue
        out = str(root / f"decode_step.{fmt}.out.npz")
        manifest.append(
            dict(format=fmt, path=path, pack="args", kind="generate",
                 cases=str(root / "generate.npz"), out=out)
        )  # fmt: skip
        results[key] = {"out": out, "expected": generated}

    (root / "manifest.json").write_text(json.dumps(manifest))
    run = subprocess.run(
        [sys.executable, str(WORKER), str(root / "manifest.json")],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    for result in results.values():
        if "out" in result:
            with np.load(result["out"]) as data:
                result["got"] = {key: data[key] for key in data.files}
    return results


def _keras_generate(step, start_ids, cache):
    """Our greedy search over the Keras decode step: its tokens, and the
    logits of every step and the last cache of the same loop by hand."""

    def step_fn(token_ids, state):
        logits, new_cache = step(
            token_ids[:, None], state["cache"], state["index"]
        )
        return logits, {"cache": new_cache, "index": state["index"] + 1}

    state = {"cache": cache, "index": keras.ops.convert_to_tensor(0)}
    tokens = decoding.greedy_search(step_fn, state, start_ids, GENERATE)
    tokens = keras.ops.convert_to_numpy(tokens)
    # The same loop by hand, for the logits of every step and the cache.
    ids, logits = start_ids, []
    for index in range(GENERATE):
        step_logits, cache = step(
            ids[:, None], cache, keras.ops.convert_to_tensor(index)
        )
        logits.append(keras.ops.convert_to_numpy(step_logits))
        ids = np.argmax(logits[-1], axis=-1).astype("int32")
    return {
        "tokens": tokens,
        "logits": np.stack(logits, axis=1),  # (B, L, V)
        "cache": keras.ops.convert_to_numpy(cache),  # (B, 2, S_max, K, H)
    }


class ArtefactError(Exception):
    """An artefact failed to load or run in the worker."""


class KnownExportError(Exception):
    """The failure recorded in `_EXPECTED` for this case."""


# Failures inside Keras's exporters or the converters, per (backend,
# model, format): (exception type, pattern its message matches, cause).
_TORCH_LAYER_NORM = (
    "SymbolicValueError",
    "because it is not constant",
    "Keras exports to ONNX from PyTorch with dynamic shapes through the "
    "TorchScript tracer, which records `x.shape` as traced values; "
    "Keras's `ops.layer_normalization` passes them to "
    "`F.layer_norm` as `normalized_shape`, which that exporter needs "
    "constant (pytorch/pytorch#32282).",
)
_TORCH_SIGNATURE = (
    "Exception",
    "'list' object has no attribute 'shape'|mismatch between the "
    "structure of `inputs` and `dynamic_shapes`",
    "Keras builds `torch.export`'s `dynamic_shapes` from the top level of "
    "the input signature, which does not match a Functional model's "
    "nested inputs (keras/src/backend/torch/export.py, since "
    "keras-team/keras#22041); past that, the format needs torch_xla.",
)
_TORCH_XLA = (
    "ImportError",
    "torch_xla",
    "Keras exports a SavedModel from PyTorch through torch_xla, which has "
    "no release for this PyTorch (the newest, 2.9, needs torch 2.9).",
)
_TORCH_TAKE = (
    "UnsupportedOperatorError",
    "aten::ravel",
    "Keras's `ops.take` on PyTorch flattens indices of two or more "
    "dimensions with `Tensor.ravel`, which the TorchScript ONNX exporter "
    "has no conversion for (the relative position bias gathers its table "
    "by a (T, S) grid of buckets); past it, the layer norm above.",
)
_EXPECTED = {
    ("torch", "encoder_decoder", "onnx"): _TORCH_TAKE,
    ("torch", "decoder_lm", "onnx"): _TORCH_LAYER_NORM,
    ("torch", "rnn_nmt", "onnx"): (
        "AssertionError",
        "differs from Keras",
        "The TorchScript tracer unrolls `keras.ops.scan` (a Python loop on "
        "PyTorch) at the traced length, so the graph is wrong at other "
        "lengths (keras-team/keras#22076, keras-team/keras#23058).",
    ),
    **{("torch", name, "tf_saved_model"): _TORCH_SIGNATURE
       for name in MODELS},
    ("torch", "decode_step", "tf_saved_model"): _TORCH_XLA,
}  # fmt: skip


def _check(name, fmt, exported):
    result = exported[(name, fmt)]
    if "error" in result:
        raise result["error"]
    got = result["got"]
    if "error" in got:
        raise ArtefactError(str(got["error"]))
    if name == "decode_step":
        expected = result["expected"]
        np.testing.assert_array_equal(got["tokens"], expected["tokens"])
        for key in ("logits", "cache"):
            np.testing.assert_allclose(
                got[key], expected[key], rtol=0, atol=TOLERANCE, err_msg=key
            )
        return
    for i, expected in enumerate(result["expected"]):
        error = float(np.max(np.abs(got[str(i)] - expected)))
        print(f"{BACKEND} {name} {fmt} case {i}: max abs error {error:.2e}")
        assert got[str(i)].shape == expected.shape and error <= TOLERANCE, (
            f"{name} ({fmt}) differs from Keras on {result['shapes'][i]}: "
            f"shape {got[str(i)].shape} vs {expected.shape}, max abs error "
            f"{error}"
        )


def _params():
    params = []
    for name in (*MODELS, "decode_step"):
        fixed = ()
        if FIXED is not None and (BACKEND, name, "onnx") in _EXPECTED:
            fixed = (FIXED[0],) if name != "decode_step" else ()
        for fmt in (*FORMATS, *fixed):
            cause = _EXPECTED.get((BACKEND, name, fmt))
            marks = ()
            if cause is not None:
                marks = pytest.mark.xfail(
                    strict=True, raises=KnownExportError, reason=cause[2]
                )
            params.append(
                pytest.param(name, fmt, marks=marks, id=f"{name}-{fmt}")
            )
    return params


@pytest.mark.parametrize("name, fmt", _params())
def test_export_matches_keras(name, fmt, exported):
    cause = _EXPECTED.get((BACKEND, name, fmt))
    if cause is None:
        _check(name, fmt, exported)
        return
    kind, text, reason = cause
    try:
        _check(name, fmt, exported)
    except Exception as error:
        kinds = {kind} & {k.__name__ for k in type(error).__mro__}
        if kinds and re.search(text, str(error)):
            raise KnownExportError(reason) from error
        raise  # another failure than the known one: a real failure
