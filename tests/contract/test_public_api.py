"""The public API, its registration for saving, and its docstrings."""

import doctest
import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import pytest

import keras_attention
from keras_attention import convert
from keras_attention import datasets
from keras_attention import decoding
from keras_attention import distribution
from keras_attention import functional
from keras_attention import mods
from keras_attention import visualization
from keras_attention.layers import attention_decoder
from keras_attention.layers import attention_mechanism
from keras_attention.layers import bahdanau_attention
from keras_attention.layers import cross_attention
from keras_attention.layers import luong_attention
from keras_attention.layers import multi_head_self_attention
from keras_attention.layers import position_embedding
from keras_attention.layers import positional_encoding
from keras_attention.layers import relative_position_bias
from keras_attention.layers import rotary_embedding
from keras_attention.layers import sublayers
from keras_attention.layers import transformer_decoder_block
from keras_attention.layers import transformer_encoder_block

MODULE_FUNCTIONS = {
    convert: ["from_keras", "replace_transformer_layers", "to_keras"],
    decoding: [
        "beam_search",
        "clear_compiled_programs",
        "greedy_search",
        "sample",
    ],
    visualization: ["plot_attention", "save_figure"],
    mods: [
        "alibi",
        "and_masks",
        "block_mask",
        "causal",
        "chunked",
        "document",
        "or_masks",
        "prefix_lm",
        "relative_position_bias",
        "relative_position_bucket",
        "sink_tokens",
        "sliding_window",
        "soft_cap",
    ],
}
LAYER_CLASSES = [
    "AttentionDecoder",
    "AttentionMechanism",
    "BahdanauAttention",
    "CrossAttention",
    "LocationSensitiveAttention",
    "LuongAttention",
    "MonotonicAttention",
    "MultiHeadSelfAttention",
    "PositionEmbedding",
    "PositionalEncoding",
    "RelativePositionBias",
    "RotaryEmbedding",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
]
SUBMODULES = [
    "convert",
    "datasets",
    "decoding",
    "distribution",
    "functional",
    "mods",
    "visualization",
]
PUBLIC_NAMES = [*LAYER_CLASSES, "__version__", *SUBMODULES]
PUBLIC_FUNCTIONS = [
    "additive_score",
    "attend",
    "attention_weights",
    "causal_mask",
    "explain",
    "large_negative",
    "logits_dtype",
    "masked_softmax",
    "merge_masks",
    "monotonic_attention",
    "padding_to_attention_mask",
    "position_angles",
    "scaled_dot_product_attention",
    "segment_positions",
    "structure_mask",
]
DOCTESTED_MODULES = [
    convert,
    functional,
    mods,
    # ContextParallel is JAX's: its constructor refuses the other backends.
    *([distribution] if keras.backend.backend() == "jax" else []),
    decoding,
    visualization,
    datasets.builtin,
    datasets.vocabulary,
    datasets.parallel_corpus,
    attention_decoder,
    attention_mechanism,
    bahdanau_attention,
    luong_attention,
    multi_head_self_attention,
    cross_attention,
    positional_encoding,
    position_embedding,
    relative_position_bias,
    rotary_embedding,
    sublayers,
    transformer_encoder_block,
    transformer_decoder_block,
]


def defined_in(obj, module) -> bool:
    """Whether `obj` is defined in `module` or, for a package, in one of
    its submodules (a package re-exports what its submodules define)."""
    name = module.__name__
    return obj.__module__ == name or (
        hasattr(module, "__path__") and obj.__module__.startswith(name + ".")
    )


def submodules(module):
    """`module`, every module under it (for a package) and every module
    that defines a name it exports (`__all__`): where its docstring
    examples are."""
    found = {module.__name__: module}
    if hasattr(module, "__path__"):
        prefix = module.__name__ + "."
        for info in pkgutil.walk_packages(module.__path__, prefix):
            found[info.name] = importlib.import_module(info.name)
    for name in getattr(module, "__all__", ()):
        home = inspect.getmodule(getattr(module, name))
        if home is not None:
            found.setdefault(home.__name__, home)
    return list(found.values())


def test_public_api_is_pinned():
    assert sorted(keras_attention.__all__) == sorted(PUBLIC_NAMES)
    for name in PUBLIC_NAMES:
        assert hasattr(keras_attention, name), name
    # The functions `functional` defines or re-exports from the core.
    assert sorted(functional.__all__) == sorted(PUBLIC_FUNCTIONS)
    assert all(
        inspect.isfunction(getattr(functional, n)) for n in PUBLIC_FUNCTIONS
    )
    defined = sorted(
        name
        for name, obj in vars(functional).items()
        if inspect.isfunction(obj)
        and not name.startswith("_")
        and defined_in(obj, functional)
    )
    assert set(defined) <= set(PUBLIC_FUNCTIONS)


@pytest.mark.parametrize(
    "module", MODULE_FUNCTIONS, ids=[m.__name__ for m in MODULE_FUNCTIONS]
)
def test_module_functions_are_pinned_and_documented(module):
    public = sorted(
        name
        for name, obj in vars(module).items()
        if inspect.isfunction(obj)
        and not name.startswith("_")
        and defined_in(obj, module)
    )
    assert public == MODULE_FUNCTIONS[module]
    for name in public:
        function = getattr(module, name)
        doc = inspect.getdoc(function)
        assert "Returns:" in doc and "Examples:" in doc, name
        if inspect.signature(function).parameters:
            assert "Args:" in doc, name


# Run in a fresh process: here the test module has imported every
# submodule, which makes each an attribute of the package anyway.
FRESH_IMPORT = """
import os
import sys

if os.environ.get("KERAS_BACKEND") == "torch":
    import torch  # noqa: F401  (before tensorflow, as in conftest.py)
sys.modules["matplotlib"] = None  # as if the [viz] extra were missing

import keras_attention as ka

loaded = [
    name
    for name in ("babel", "num2words", "keras_attention.datasets",
                 "keras_attention.visualization")
    if name in sys.modules
]
assert not loaded, f"imported with the package: {loaded}"
import keras
import numpy as np

ids = ka.decoding.greedy_search(
    lambda ids, state: (keras.ops.one_hot(ids + 1, 3), state),
    (),
    np.array([0, 1]),
    max_length=1,
)
assert keras.ops.convert_to_numpy(ids).tolist() == [[1], [2]]
assert ka.functional.causal_mask is not None
assert len(ka.datasets.Vocabulary(["a"])) == 5
try:
    ka.visualization.plot_attention(np.eye(2))
except ImportError as error:
    assert "[viz]" in str(error), error
else:
    raise AssertionError("plot_attention drew without matplotlib")
assert {"datasets", "decoding", "functional", "visualization"} <= set(dir(ka))
try:
    ka.no_such_module
except AttributeError as error:
    assert "no_such_module" in str(error), error
else:
    raise AssertionError("ka.no_such_module")
print("ok")
"""


def test_submodules_are_attributes_of_a_fresh_import():
    """`import keras_attention as ka` gives `ka.decoding`, `ka.functional`,
    `ka.datasets` and `ka.visualization`; the last two, which serve the
    optional extras, are imported on first use, and none needs
    matplotlib, Babel or num2words to import."""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FRESH_IMPORT)],
        env={**os.environ, "KERAS_BACKEND": keras.backend.backend()},
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("ok")


def test_version_is_single_sourced():
    from keras_attention.version import __version__

    assert keras_attention.__version__ == __version__
    assert __version__.count(".") >= 2


@pytest.mark.parametrize("name", LAYER_CLASSES)
def test_layers_are_registered_for_safe_loading(name):
    cls = getattr(keras_attention, name)
    registered = keras.saving.get_registered_name(cls)
    assert registered == f"keras_attention>{name}"
    assert keras.saving.get_registered_object(registered) is cls


@pytest.mark.parametrize(
    "obj",
    [getattr(keras_attention, n) for n in LAYER_CLASSES]
    + [getattr(functional, n) for n in PUBLIC_FUNCTIONS],
    ids=LAYER_CLASSES + PUBLIC_FUNCTIONS,
)
def test_public_names_are_documented(obj):
    doc = inspect.getdoc(obj)
    assert doc and len(doc.splitlines()) >= 3, obj
    if inspect.isfunction(obj) and inspect.signature(obj).parameters:
        assert "Args:" in doc and "Returns:" in doc
    if inspect.isclass(obj) and obj is not keras_attention.AttentionMechanism:
        assert "Examples:" in doc and "References:" in doc and "$$" in doc


@pytest.mark.parametrize(
    "module", DOCTESTED_MODULES, ids=[m.__name__ for m in DOCTESTED_MODULES]
)
def test_docstring_examples_run(module):
    failed = attempted = 0
    for part in submodules(module):
        result = doctest.testmod(
            part,
            optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
            verbose=False,
        )
        failed, attempted = failed + result.failed, attempted + result.attempted
    assert failed == 0
    if module is not attention_mechanism:
        assert attempted > 0


def test_dataset_names_are_documented():
    names = [n for n in dir(datasets) if not n.startswith("_")]
    public = [n for n in names if n[0].isupper() or n.startswith("load_")]
    assert sorted(public) == [
        "AlignedPair",
        "ParallelCorpus",
        "Vocabulary",
        "load_dates",
        "load_numbers",
        "load_spelled_digits",
        "load_tsv",
    ]
    for name in public + [
        "alignment_error_rate",
        "char_tokens",
        "word_tokens",
    ]:
        doc = inspect.getdoc(getattr(datasets, name))
        assert doc and "Examples:" in doc, name


def test_only_the_kernels_package_touches_a_backend():
    """Layers and `functional.py` use keras.ops only; the private
    `_kernels` package is the marked place that may look at a backend."""
    import re

    package = Path(keras_attention.__file__).parent
    kernels = package / "_kernels"
    backend_import = re.compile(
        r"^\s*(import|from)\s+(jax|torch|tensorflow|keras\.src)\b", re.M
    )
    for path in package.rglob("*.py"):
        if kernels in path.parents:
            continue
        source = path.read_text(encoding="utf-8")
        assert not backend_import.search(source), path


# DESIGN.md's call signatures, in order; arguments added later follow them,
# so a positional call written against the contract keeps its meaning.
CONTRACT_CALLS = {
    keras_attention.MultiHeadSelfAttention: (
        "inputs", "padding_mask", "attention_mask", "use_causal_mask",
        "return_attention_scores", "cache", "cache_index", "training",
    ),
    keras_attention.CrossAttention: (
        "query", "value", "key", "value_mask", "attention_mask",
        "return_attention_scores", "training",
    ),
    keras_attention.TransformerEncoderBlock: (
        "inputs", "padding_mask", "attention_mask", "return_attention_scores",
        "training",
    ),
    keras_attention.TransformerDecoderBlock: (
        "inputs", "encoder_outputs", "padding_mask", "encoder_padding_mask",
        "attention_mask", "use_causal_mask", "cache", "cache_index",
        "return_attention_scores", "training",
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    "cls", CONTRACT_CALLS, ids=[c.__name__ for c in CONTRACT_CALLS]
)
def test_call_arguments_keep_the_contracts_order(cls):
    contract = CONTRACT_CALLS[cls]
    call = list(inspect.signature(cls.call).parameters)[1:]
    assert tuple(call[: len(contract)]) == contract
    spec = list(inspect.signature(cls.compute_output_spec).parameters)[1:]
    assert spec == call
