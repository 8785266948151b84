"""LoRA (Hu et al., 2021) on the attention layers and Transformer blocks."""

import keras
import numpy as np
import pytest

import keras_attention as ka
from tests.helpers import to_numpy

B, T, S, D, N = 2, 5, 4, 8, 2


def data(seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(B, T, D)).astype("float32"),
        rng.normal(size=(B, S, D)).astype("float32"),
    )


def make(kind):
    keras.utils.set_random_seed(0)
    x, enc = data()
    if kind == "self":
        layer = ka.MultiHeadSelfAttention(N)
        layer.build(x.shape)
        call = lambda lay: lay(x)  # noqa: E731
    elif kind == "cross":
        layer = ka.CrossAttention(N)
        layer.build(x.shape, enc.shape)
        call = lambda lay: lay(x, enc)  # noqa: E731
    elif kind == "encoder":
        layer = ka.TransformerEncoderBlock(N, 16)
        layer.build(x.shape)
        call = lambda lay: lay(x)  # noqa: E731
    else:
        layer = ka.TransformerDecoderBlock(N, 16)
        layer.build(x.shape, enc.shape)
        call = lambda lay: lay(x, encoder_outputs=enc)  # noqa: E731
    return layer, call


def lora_kernels(layer):
    return [
        w
        for sub in layer._flatten_layers()
        if getattr(sub, "lora_enabled", False)
        for w in (sub.lora_kernel_a, sub.lora_kernel_b)
    ]


def assert_merged_kernels_give(lora, layer, plain, plain_call):
    """The merged kernels W + alpha/r A B of `layer`, copied into `plain`
    (a copy without LoRA), give `lora`: the frozen kernels plus the
    low-rank path."""
    pairs = zip(layer._flatten_layers(), plain._flatten_layers(), strict=True)
    for sub, copy in pairs:
        if getattr(sub, "lora_enabled", False):
            copy._kernel.assign(sub.kernel)
    np.testing.assert_allclose(
        to_numpy(plain_call(plain)), lora, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "kind, targets, adapted",
    [
        ("self", None, 2),
        ("cross", ["query_dense", "key_dense", "output_dense"], 3),
        ("encoder", None, 2),
        ("decoder", ["value_dense", "feedforward_output_dense"], 3),
    ],
)
def test_only_adapters_train_and_merge_is_exact(kind, targets, adapted):
    layer, call = make(kind)
    before = to_numpy(call(layer))
    kwargs = {} if targets is None else {"targets": targets}
    layer.enable_lora(2, lora_alpha=4.0, b_initializer="ones", **kwargs)
    adapters = lora_kernels(layer)
    assert len(adapters) == 2 * adapted
    assert {id(w) for w in layer.trainable_weights} == {id(w) for w in adapters}
    lora = to_numpy(call(layer))
    assert np.max(np.abs(lora - before)) > 1e-3  # B = 1: the update acts
    assert_merged_kernels_give(lora, layer, *make(kind))


def test_training_step_moves_only_adapters():
    x, _ = data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((T, D)), ka.TransformerEncoderBlock(N, 16, name="b")]
    )
    block = model.layers[0]
    block.enable_lora(2)
    adapters = {w.path for w in lora_kernels(block)}
    before = {w.path: to_numpy(w) for w in model.weights}
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.train_on_batch(x, np.ones_like(x))
    moved = {
        w.path
        for w in model.weights
        if not np.array_equal(to_numpy(w), before[w.path])
    }
    # B starts at zero, so only B gets a gradient in the first step.
    assert moved == {p for p in adapters if p.endswith("lora_kernel_b")}


def test_lora_gradients_match_merged_kernel():
    """d loss / d B through the adapter equals (alpha/r) A^T dL/dW of the
    merged kernel."""
    layer, call = make("self")
    layer.enable_lora(2, targets="query_dense", b_initializer="ones")
    dense = layer.query_dense
    x, _ = data()
    a = to_numpy(dense.lora_kernel_a)

    def loss_and_grads(variables):
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            with tf.GradientTape() as tape:
                loss = keras.ops.sum(layer(x) ** 2)
            return [to_numpy(g) for g in tape.gradient(loss, variables)]
        if keras.backend.backend() == "torch":
            loss = keras.ops.sum(layer(x) ** 2)
            values = [v.value for v in variables]
            import torch

            return [to_numpy(g) for g in torch.autograd.grad(loss, values)]
        import jax

        def f(values):
            mapping = list(zip(variables, values, strict=True))
            with keras.StatelessScope(state_mapping=mapping):
                return keras.ops.sum(layer(x) ** 2)

        return [to_numpy(g) for g in jax.grad(f)([v.value for v in variables])]

    (grad_b,) = loss_and_grads([dense.lora_kernel_b])
    # The same layer with the adapter merged and LoRA's B frozen at its
    # value: the gradient of the kernel itself.
    merged = to_numpy(dense.kernel)
    plain, _ = make("self")
    plain.query_dense._kernel.assign(merged)
    layer_kernel = plain.query_dense._kernel
    layer, saved = plain, layer
    (grad_w,) = loss_and_grads([layer_kernel])
    layer = saved
    alpha_over_r = 1.0  # lora_alpha defaults to the rank
    expected = alpha_over_r * np.einsum("dnr,dnh->rh", a, grad_w)
    np.testing.assert_allclose(grad_b, expected, rtol=1e-4, atol=1e-5)


def test_save_load_keeps_merged_weights(tmp_path):
    x, _ = data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((T, D)), ka.TransformerEncoderBlock(N, 16)]
    )
    model.layers[0].enable_lora(2, b_initializer="ones")
    expected = to_numpy(model(x))
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(
        to_numpy(restored(x)), expected, rtol=1e-6, atol=1e-6
    )
    block = restored.layers[0]
    assert lora_kernels(block) == []
    # The reloaded block can be adapted again, on top of the merge.
    block.enable_lora(2)
    np.testing.assert_allclose(
        to_numpy(restored(x)), expected, rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rank": 0}, "Received: rank=0"),
        ({"rank": 2, "lora_alpha": -1.0}, "Received: lora_alpha=-1.0"),
        ({"rank": 2, "targets": ["gate"]}, r"Received: targets=\('gate',\)"),
        ({"rank": 2, "targets": []}, r"Received: targets=\(\)"),
    ],
)
def test_bad_arguments(kwargs, message):
    layer = ka.MultiHeadSelfAttention(N, name="mhsa")
    layer.build((B, T, D))
    with pytest.raises(ValueError, match=r"layer 'mhsa'.*" + message):
        layer.enable_lora(**kwargs)


def test_unbuilt_and_twice():
    layer = ka.TransformerEncoderBlock(N, 16, name="blk")
    with pytest.raises(ValueError, match="needs a built layer"):
        layer.enable_lora(2)
    layer.build((B, T, D))
    layer.enable_lora(2)
    with pytest.raises(ValueError, match="already enabled"):
        layer.enable_lora(2)


@pytest.mark.parametrize("kind", ["cross", "decoder"])
def test_adapters_alone_save_and_load(kind, tmp_path):
    """The adapters go to a small file of their own and come back into a
    fresh layer (another name) with the base weights: same outputs."""
    layer, call = make(kind)
    targets = ["query_dense", "value_dense", "output_dense"]
    layer.enable_lora(2, lora_alpha=4.0, b_initializer="ones", targets=targets)
    for i, w in enumerate(lora_kernels(layer)):
        w.assign(w + 0.01 * i)  # the saved values are the adapters' own
    want = to_numpy(call(layer))
    path = tmp_path / "adapters.npz"
    layer.save_lora_weights(str(path))
    with np.load(path) as stored:
        assert len(stored.files) == len(lora_kernels(layer))

    fresh, fresh_call = make(kind)  # the same base weights (same seed)
    assert fresh.name != layer.name
    fresh.enable_lora(2, lora_alpha=4.0, targets=targets)
    fresh.load_lora_weights(str(path))
    np.testing.assert_array_equal(to_numpy(fresh_call(fresh)), want)

    other, _ = make(kind)
    with pytest.raises(ValueError, match="same `targets`"):
        other.load_lora_weights(str(path))  # LoRA not enabled
    other.enable_lora(3, lora_alpha=4.0, targets=targets)
    with pytest.raises(ValueError, match="saved `rank`"):
        other.load_lora_weights(str(path))
    plain, _ = make(kind)
    with pytest.raises(ValueError, match="needs LoRA enabled"):
        plain.save_lora_weights(str(tmp_path / "none.npz"))


def make_rnn(kind):
    """An RNN attention layer, built, and a call on fixed inputs."""
    keras.utils.set_random_seed(0)
    x, enc = data()
    mechanisms = {
        "bahdanau": lambda: ka.BahdanauAttention(6),
        "luong-concat": lambda: ka.LuongAttention("concat", units=6),
        "location": lambda: ka.LocationSensitiveAttention(6, 2, 3),
        "monotonic": lambda: ka.MonotonicAttention(6),
    }
    if kind == "decoder":
        layer = ka.AttentionDecoder(
            keras.layers.GRUCell(D), ka.LuongAttention("general")
        )
        layer.build(x.shape, enc.shape)
    else:
        layer = mechanisms[kind]()
        layer.build(x.shape, enc.shape)
    return layer, lambda lay: lay(x, enc)


@pytest.mark.parametrize(
    "kind, adapted",
    [
        ("bahdanau", 2),
        ("luong-concat", 2),
        ("location", 3),
        ("monotonic", 2),
        ("decoder", 2),  # Luong general's key and W_c
    ],
)
def test_rnn_attention_lora_adapts_every_projection(kind, adapted, tmp_path):
    layer, call = make_rnn(kind)
    before = to_numpy(call(layer))
    layer.enable_lora(2, b_initializer="ones")
    adapters = lora_kernels(layer)
    assert len(adapters) == 2 * adapted
    assert {id(w) for w in layer.trainable_weights} == {id(w) for w in adapters}
    lora = to_numpy(call(layer))
    assert np.max(np.abs(lora - before)) > 1e-4
    assert_merged_kernels_give(lora, layer, *make_rnn(kind))
    # The adapters alone, into a fresh layer with the same base weights.
    layer.save_lora_weights(str(tmp_path / "adapters.npz"))
    fresh, fresh_call = make_rnn(kind)
    fresh.enable_lora(2)
    fresh.load_lora_weights(str(tmp_path / "adapters.npz"))
    np.testing.assert_array_equal(to_numpy(fresh_call(fresh)), lora)


def test_luong_dot_has_no_projection_to_adapt():
    layer = ka.LuongAttention("dot")
    layer.build((B, T, D), (B, S, D))
    message = r"LuongAttention.*has no projections for LoRA.*targets=\(\)"
    with pytest.raises(ValueError, match=message):
        layer.enable_lora(2)
    with pytest.raises(ValueError, match="has no projections for LoRA"):
        layer.enable_lora(2, targets="query_dense")
