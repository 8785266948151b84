"""Runs exported models without Keras, in a fresh process.

    python tests/integration/export_worker.py MANIFEST.json

The manifest lists artefacts written by tests/integration/test_export.py:
each entry names its `format` ("tf_saved_model", loaded with
`tf.saved_model.load`, or "onnx", run by `onnxruntime.InferenceSession`),
its `path`, how its endpoint takes the inputs (`pack`: one tensor, one
list, or positional
arguments) and a `.npz` of input cases. A "forward" entry runs each case;
a "generate" entry runs a greedy decoding loop on a decode-step
artefact (token ids, cache, index -> logits, new cache). The results go
to the `.npz` named by `out`, or the error an artefact raised when loaded
or run. Neither Keras nor keras_attention is
imported: the artefacts must run on their own.
"""

import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


class _SavedModel:
    def __init__(self, path, pack):
        import tensorflow as tf

        self.loaded = tf.saved_model.load(path)  # owns the variables
        self.serve = self.loaded.serve
        self.pack = pack

    def __call__(self, inputs):
        if self.pack == "single":
            outputs = self.serve(inputs[0])
        elif self.pack == "list":
            outputs = self.serve(list(inputs))
        else:
            outputs = self.serve(*inputs)
        if not isinstance(outputs, (list, tuple)):
            outputs = [outputs]
        return [np.asarray(x) for x in outputs]


class _Onnx:
    def __init__(self, path):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3  # unused-initializer notices
        self.session = ort.InferenceSession(
            path, options, providers=["CPUExecutionProvider"]
        )
        self.names = [x.name for x in self.session.get_inputs()]

    def __call__(self, inputs):
        if len(inputs) != len(self.names):
            raise ValueError(
                f"{len(inputs)} inputs for the graph's inputs {self.names}"
            )
        return self.session.run(
            None, dict(zip(self.names, inputs, strict=True))
        )


def _load(entry):
    if entry["format"] == "onnx":
        return _Onnx(entry["path"])
    return _SavedModel(entry["path"], entry["pack"])


def _forward(run, cases):
    results = {}
    for i in range(int(cases["count"])):
        inputs = [cases[f"{i}/{j}"] for j in range(int(cases["arity"]))]
        results[str(i)] = run(inputs)[0]
    return results


def _generate(run, cases):
    """Greedy decoding: feed each step's argmax back, cache and index
    threaded through the artefact."""
    tokens = cases["start_ids"].astype("int32")  # (B,)
    cache = cases["cache"]
    generated, every_logits = [], []
    for index in range(int(cases["max_length"])):
        logits, cache = run(
            [tokens[:, None], cache, np.asarray(index, "int32")]
        )
        tokens = np.argmax(logits, axis=-1).astype("int32")  # (B,)
        generated.append(tokens)
        every_logits.append(logits)
    return {
        "tokens": np.stack(generated, axis=1),  # (B, L)
        "logits": np.stack(every_logits, axis=1),  # (B, L, V)
        "cache": cache,  # (B, 2, S_max, K, H) after the last step
    }


def main(manifest):
    with open(manifest) as f:
        entries = json.load(f)
    for entry in entries:
        with np.load(entry["cases"]) as data:
            cases = {key: data[key] for key in data.files}
        step = _generate if entry["kind"] == "generate" else _forward
        try:
            results = step(_load(entry), cases)
        except Exception as error:  # reported for the test to judge
            results = {"error": np.asarray(f"{type(error).__name__}: {error}")}
        np.savez(entry["out"], **results)
    print(json.dumps({"ran": len(entries)}))


if __name__ == "__main__":
    main(sys.argv[1])
