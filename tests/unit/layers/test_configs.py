"""Every layer's config is the one release 0.1.0 wrote: each layer config
in the 0.1.0 checkpoint (every public layer, nested ones included) makes a
layer whose `get_config` gives it back, key for key."""

import json
import zipfile
from pathlib import Path

import keras
import pytest

import keras_attention  # noqa: F401  (registers the layers)

CHECKPOINT = (
    Path(__file__).resolve().parents[2]
    / "data"
    / "checkpoint_0_1"
    / "model.keras"
)


def _saved_layers():
    """`(class_name, serialized layer)` of every keras_attention layer in
    the checkpoint's config, outermost first."""
    with zipfile.ZipFile(CHECKPOINT) as archive:
        config = json.loads(archive.read("config.json"))
    found = []

    def walk(node):
        if isinstance(node, dict):
            if str(node.get("registered_name", "")).startswith(
                "keras_attention>"
            ):
                found.append((node["class_name"], node))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    return found


SAVED = _saved_layers()
# Layers and constructor arguments added since the checkpoint was saved;
# an argument's config entry is its default when the checkpoint's layers
# are made again.
ADDED_LAYERS = {"RelativePositionBias"}
ADDED_ARGUMENTS = {
    "attention_activation": "tanh",
    "max_wavelength": 10000.0,
    "score_mod": None,
    "use_bias": True,
    "use_rms_norm": False,
}


def test_the_checkpoint_holds_every_public_layer():
    names = {name for name, _ in SAVED}
    assert (
        names
        == {
            name
            for name in keras_attention.__all__
            if isinstance(getattr(keras_attention, name), type)
        }
        - {"AttentionMechanism"}
        - ADDED_LAYERS
    )


def _plain(node):
    """`node` as JSON holds it (tuples as lists), without the ids of
    objects shared within one saved file."""
    if isinstance(node, dict):
        return {
            k: _plain(v) for k, v in node.items() if k != "shared_object_id"
        }
    if isinstance(node, (list, tuple)):
        return [_plain(v) for v in node]
    return node


@pytest.mark.parametrize(
    "serialized", [s for _, s in SAVED], ids=[n for n, _ in SAVED]
)
def test_config_is_the_one_0_1_0_wrote(serialized):
    layer = keras.saving.deserialize_keras_object(serialized)
    again = keras.saving.serialize_keras_object(layer)["config"]
    for name, default in ADDED_ARGUMENTS.items():
        if name not in serialized["config"] and name in again:
            assert again.pop(name) == default, name
    assert _plain(again) == _plain(serialized["config"])
