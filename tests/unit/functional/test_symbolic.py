"""Every public function of `functional` on `keras.Input` tensors: a
functional model built from it gives the eager numbers."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import functional as F
from tests.helpers import rng
from tests.helpers import to_numpy

B, T, S, H = 2, 3, 4, 5


def _arrays():
    g = rng(4)
    return {
        "q": g.standard_normal((B, T, H)).astype("float32"),
        "k": g.standard_normal((B, S, H)).astype("float32"),
        "v": g.standard_normal((B, S, 2)).astype("float32"),
        "logits": g.standard_normal((B, T, S)).astype("float32"),
        "weights": g.random((B, T, S)).astype("float32"),
        "mask": np.arange(S)[None, None, :] < np.array([[[2]], [[S]]]),
        "padding": np.arange(S)[None, :] < np.array([[2], [S]]),
        "hidden": g.standard_normal((B, T, H)).astype("float32"),
        "hidden_k": g.standard_normal((B, S, H)).astype("float32"),
        "vector": g.standard_normal((H,)).astype("float32"),
    }


FUNCTIONS = {
    "scaled_dot_product_attention": (
        ("q", "k", "v", "mask"),
        lambda q, k, v, m: F.scaled_dot_product_attention(
            q, k, v, mask=m, is_causal=True
        ),
    ),
    "scaled_dot_product_attention scores": (
        ("q", "k", "v", "mask"),
        lambda q, k, v, m: F.scaled_dot_product_attention(
            q, k, v, mask=m, return_attention_scores=True
        )[1],
    ),
    "attention_weights": (
        ("q", "k", "mask"),
        lambda q, k, m: F.attention_weights(q, k, m),
    ),
    "attend": (("weights", "v"), F.attend),
    "masked_softmax": (("logits", "mask"), F.masked_softmax),
    "merge_masks": (
        ("mask", "mask"),
        lambda a, b: ops.cast(F.merge_masks(a, b), "float32"),
    ),
    "padding_to_attention_mask": (
        ("padding",),
        lambda p: ops.cast(F.padding_to_attention_mask(p, T), "float32"),
    ),
    "additive_score": (
        ("hidden", "hidden_k"),
        lambda q, k: F.additive_score(q, k, _arrays()["vector"]),
    ),
}


@pytest.mark.parametrize("name", tuple(FUNCTIONS))
def test_function_on_keras_inputs_gives_the_eager_numbers(name):
    names, fn = FUNCTIONS[name]
    arrays = [_arrays()[n] for n in names]
    inputs = [keras.Input(a.shape[1:], dtype=str(a.dtype)) for a in arrays]
    model = keras.Model(inputs, fn(*inputs))
    symbolic = model([ops.convert_to_tensor(a) for a in arrays])
    eager = fn(*[ops.convert_to_tensor(a) for a in arrays])
    np.testing.assert_allclose(to_numpy(symbolic), to_numpy(eager), atol=1e-6)


def test_several_calls_in_one_model_save_and_load(tmp_path):
    """Two attention operations in one functional model have their own
    names, and the model round-trips through `.keras`."""
    q, k, v = keras.Input((T, H)), keras.Input((S, H)), keras.Input((S, 2))
    model = keras.Model(
        [q, k, v],
        [
            F.scaled_dot_product_attention(q, k, v),
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
        ],
    )
    arrays = _arrays()
    data = [ops.convert_to_tensor(arrays[n]) for n in ("q", "k", "v")]
    before = [to_numpy(x) for x in model(data)]
    path = tmp_path / "attention.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    for old, new in zip(before, loaded(data), strict=True):
        np.testing.assert_allclose(to_numpy(new), old, atol=1e-6)
    assert not np.allclose(before[0], before[1])  # causal differs
