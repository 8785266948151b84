"""Every path of `scaled_dot_product_attention` with a mask mod or a
score mod gives the float64 NumPy reference's outputs and gradients: of
the query, key and value, and of the tensors and Keras variables a score
mod holds. The mods themselves are checked in `tests/unit/mods`.

The blockwise path runs in blocks of 3 over 8 queries and 10 keys, so
that every kind of block pair (empty, partial, full, padded) occurs.
"""

import dataclasses
import functools
import re
import typing

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention import functional as F
from keras_attention import mods
from tests.autodiff import SMALL_CHUNK
from tests.autodiff import TOLERANCES
from tests.autodiff import assert_close
from tests.autodiff import cotangents
from tests.autodiff import error
from tests.autodiff import flex_trains
from tests.autodiff import np_sdpa_grads
from tests.autodiff import path_context
from tests.autodiff import value_and_grads
from tests.helpers import np_alibi_bias
from tests.helpers import np_mask_mod
from tests.helpers import np_structure_mask
from tests.helpers import np_t5_bucket
from tests.helpers import rng

B, T, S = 2, 8, 10
LAYOUTS = {  # query shape, key shape, value dim
    "3d": ((B, T, 4), (B, S, 4), 3),
    "gqa": ((B, T, 4, 4), (B, S, 2, 4), 3),
}
QUERY_IDS = np.array([[1, 1, 1, 2, 2, 2, 2, 3], [4, 4, 4, 4, 4, 5, 5, 5]])
KEY_IDS = np.array(
    [[1, 1, 1, 2, 2, 2, 2, 3, 3, 0], [4, 4, 4, 4, 4, 5, 5, 5, 5, 5]]
)
PREFIX = np.array([3, 0])
# FlexAttention (forced on the fused path) is a path of its own where it
# has a backward pass; elsewhere `test_flex_outputs_equal_float64_reference`
# checks its outputs.
PATHS = ("reference", "chunked", "fused", *(("flex",) if flex_trains() else ()))


def per_head(batch, head, q_idx, kv_idx):
    """A pattern of its own in each row of the batch and head."""
    return (q_idx + kv_idx + head + 2 * batch) % 4 != 0


def causal_function(batch, head, q_idx, kv_idx):
    return kv_idx <= q_idx


def np_per_head(heads):
    b, n, i, j = np.ix_(range(B), range(heads), range(T), range(S))
    return (i + j + n + 2 * b) % 4 != 0


MASK_MODS = {  # name: (mod, NumPy spec or a function of the head count)
    "causal": (mods.causal(), ("causal", None)),
    "window 3": (mods.sliding_window(3), ("sliding_window", 3)),
    "window (2, 1)": (mods.sliding_window((2, 1)), ("sliding_window", (2, 1))),
    "document": (
        mods.document((QUERY_IDS, KEY_IDS)),
        ("document", (QUERY_IDS, KEY_IDS)),
    ),
    "prefix_lm": (mods.prefix_lm(PREFIX), ("prefix_lm", PREFIX)),
    "chunked": (mods.chunked(4), ("chunked", 4)),
    "sinks or window": (
        mods.or_masks(mods.sink_tokens(2), mods.sliding_window(2)),
        ("or", [("sink_tokens", 2), ("sliding_window", 2)]),
    ),
    "causal chunks": (
        mods.and_masks(mods.causal(), mods.chunked(3)),
        ("and", [("causal", None), ("chunked", 3)]),
    ),
    "per batch and head": (per_head, np_per_head),
    # Causal as a function of its own: evaluated into a map of blocks,
    # where mods.causal() runs as is_causal does.
    "causal function": (causal_function, ("causal", None)),
    "block mask": (
        mods.block_mask(mods.causal(), B, 4, T, S, block_size=SMALL_CHUNK),
        ("causal", None),
    ),
    "block mask of chunks": (
        mods.block_mask(mods.chunked(4), B, 4, T, S, block_size=SMALL_CHUNK),
        ("chunked", 4),
    ),
}


def inputs(layout, seed=0):
    q_shape, k_shape, value_dim = LAYOUTS[layout]
    generator = rng(seed)
    q = generator.standard_normal(q_shape).astype("float32")
    k = generator.standard_normal(k_shape).astype("float32")
    v = generator.standard_normal((*k_shape[:-1], value_dim)).astype("float32")
    # Example 0 has two padded keys; one query of example 1 sees none.
    mask = np.arange(S)[None, None, :] < np.array([S - 2, S])[:, None, None]
    mask = np.broadcast_to(mask, (B, T, S)).copy()
    mask[1, 2] = False
    return q, k, v, mask


def heads_of(q):
    return 1 if q.ndim == 3 else q.shape[2]


def np_visible(spec, q, mask, **structure):
    """The reference `(B, N, T, S)` visibility of a case (`spec=None`:
    without a mask mod)."""
    heads = heads_of(q)
    if spec is None:
        visible = np.ones((B, heads, T, S), bool)
    elif callable(spec):
        visible = spec(heads)
    else:
        visible = np_mask_mod(spec, B, heads, T, S)
    visible = visible & np_structure_mask(B, T, S, **structure)[:, None]
    return visible & mask[:, None]


def attention(path, dtype, mask, mask_mod, score_mod=None, **structure):
    """`fn(q, k, v, *held)` on `path` in `dtype`; `score_mod(*held)` makes
    the score mod from the tensors it will hold."""

    def fn(q, k, v, *held):
        with path_context(path):
            return F.scaled_dot_product_attention(
                *(ops.cast(x, dtype) for x in (q, k, v)),
                mask=mask,
                mask_mod=mask_mod,
                score_mod=None if score_mod is None else score_mod(*held),
                **structure,
            )

    return fn


def run_cases(cases, arrays, variables=(), copies=False):
    """Outputs and gradients of every `(what, fn)` case on the same
    inputs, in one differentiated program; with `copies`, every case gets
    the same cotangents (cases that must agree with each other)."""
    count = len(arrays)

    def every_case(*xs):
        return [
            fn(*xs[count * i : count * (i + 1)])
            for i, (_, fn) in enumerate(cases)
        ]

    outputs, grads, variable_grads = value_and_grads(
        every_case,
        list(arrays) * len(cases),
        variables,
        copies=len(cases) if copies else 1,
    )
    seeds = cotangents([o.shape for o in outputs])
    return outputs, grads, variable_grads, seeds


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(MASK_MODS))
def test_mask_mod_paths_equal_float64_reference(name, layout):
    """Each mask mod with a padding mask (and a query that sees no key),
    on every path: outputs and q, k, v gradients."""
    q, k, v, mask = inputs(layout)
    mod, spec = MASK_MODS[name]
    cases = [
        (f"mask mod {path}", "float32", attention(path, "float32", mask, mod))
        for path in PATHS
    ]
    cases.append(
        (
            "mask mod chunked",
            "bfloat16",
            attention("chunked", "bfloat16", mask, mod),
        )
    )
    check(cases, (q, k, v), np_visible(spec, q, mask))


def check(cases, arrays, visible, transform=None, held_grads=None):
    """Every case against `np_sdpa_grads` with this visibility; with
    `held_grads(dbias)`, the gradients of the tensors the score mod
    holds too."""
    q, k, v = arrays[:3]
    outputs, grads, _, seeds = run_cases(
        [(what, fn) for what, _, fn in cases], arrays
    )
    count = len(arrays)
    for i, (what, dtype, _) in enumerate(cases):
        *want, dbias = np_sdpa_grads(
            q,
            k,
            v,
            visible,
            False,
            seeds[i],
            bias_grad=True,
            **(transform or {}),
        )
        names = ["q", "k", "v"]
        if held_grads is not None:
            want += held_grads(dbias)
            names += [f"held {n}" for n in range(count - 3)]
        assert_close(
            what,
            dtype,
            [outputs[i]],
            grads[count * i : count * (i + 1)],
            want[:1],
            want[1:],
            names,
        )


COMBINED = [  # a mask mod and the structure arguments it meets
    ("prefix_lm", {"is_causal": True}),
    ("chunked", {"sliding_window": 3, "segment_ids": (QUERY_IDS, KEY_IDS)}),
    ("sinks or window", {"is_causal": "bottom_right"}),
    # Built-in mods that cannot join the arguments' structure (another
    # alignment, a second set of ids) stay mods; one that can narrows the
    # band.
    ("causal", {"is_causal": "bottom_right"}),
    ("document", {"segment_ids": (QUERY_IDS, np.roll(KEY_IDS, 1, 1))}),
    ("window (2, 1)", {"is_causal": True}),
]


@pytest.mark.parametrize("name, structure", COMBINED)
def test_mask_mods_combine_with_the_structure_arguments(name, structure):
    q, k, v, mask = inputs("gqa")
    mod, spec = MASK_MODS[name]
    cases = [
        (
            f"mask mod + structure {path}",
            "float32",
            attention(path, "float32", mask, mod, **structure),
        )
        for path in (*PATHS, "symbolic")
        if path != "symbolic" or "segment_ids" not in structure
    ]
    check(cases, (q, k, v), np_visible(spec, q, mask, **structure))


WIDE_WINDOWS = {  # a window over more than one block: (mask mod, structure)
    "window (4, 0)": (None, {"sliding_window": (4, 0)}),
    "mod window (4, 0)": (mods.sliding_window((4, 0)), {}),
    "causal window 5": (None, {"is_causal": True, "sliding_window": 5}),
}


@pytest.mark.parametrize("name", list(WIDE_WINDOWS))
def test_windows_wider_than_a_block_equal_float64_reference(name):
    """A window of 5 keys over blocks of 3: a key block is seen whole by
    some query blocks and in part by others, in the backward pass as in
    the forward one (outputs and q, k, v gradients)."""
    q, k, v, mask = inputs("gqa")
    mod, structure = WIDE_WINDOWS[name]
    cases = [
        (
            f"{name} {path}",
            "float32",
            attention(path, "float32", mask, mod, **structure),
        )
        for path in ("reference", "chunked")
    ]
    spec = None if mod is None else ("sliding_window", (4, 0))
    check(cases, (q, k, v), np_visible(spec, q, mask, **structure))


BUILT_IN = {  # name: (the mods, the arguments they are)
    "causal": ({"mask_mod": mods.causal()}, {"is_causal": True}),
    "window": (
        {"mask_mod": mods.sliding_window((2, 1))},
        {"sliding_window": (2, 1)},
    ),
    "causal window": (
        {"mask_mod": mods.and_masks(mods.causal(), mods.sliding_window(3))},
        {"sliding_window": 3, "is_causal": True},
    ),
    "document": (
        {"mask_mod": mods.document((QUERY_IDS, KEY_IDS))},
        {"segment_ids": (QUERY_IDS, KEY_IDS)},
    ),
    "block mask": (
        {"mask_mod": MASK_MODS["block mask"][0]},
        {"is_causal": True},
    ),
    "soft cap": (
        {"score_mod": mods.soft_cap(2.0)},
        {"logit_soft_cap": 2.0},
    ),
    "alibi": ({"score_mod": mods.alibi(4)}, {"alibi": True}),
}


@pytest.mark.parametrize("name", list(BUILT_IN))
def test_built_in_mods_run_as_the_structure_arguments(name):
    """A built-in mod is the structure argument it names: the same
    structure, the same `explain()`, the same numbers on every path."""
    from keras_attention._core import Structure

    q, k, v, mask = inputs("gqa")
    given, arguments = BUILT_IN[name]
    q, k, v = (ops.convert_to_tensor(x) for x in (q, k, v))
    made = [
        Structure.of_call("test", q, k, **kwargs)
        for kwargs in (given, arguments)
    ]
    for structure in made:
        assert structure.mask_mod is None and structure.score_mod is None
    bands = [(s.left, s.right, s.offset) if s.band else None for s in made]
    assert bands[0] == bands[1]
    assert len({(s.alibi, s.soft_cap, s.has_segments) for s in made}) == 1
    for path in PATHS:
        with path_context(path):
            outputs = [
                ops.convert_to_numpy(
                    F.scaled_dot_product_attention(q, k, v, mask, **kwargs)
                )
                for kwargs in (given, arguments)
            ]
            reports = [str(F.explain(q, k, **kw)) for kw in (given, arguments)]
        np.testing.assert_array_equal(*outputs)
        assert reports[0] == reports[1]


def relative_bias(table):
    return mods.relative_position_bias(table, num_buckets=8, max_distance=6)


def np_relative_bias(table, heads):
    bias = np.zeros((B, heads, T, S))
    for i in range(T):
        for j in range(S):
            bias[:, :, i, j] = table[np_t5_bucket(j - i, 8, 6, True)]
    return bias


def np_table_grads(dbias):
    grads = np.zeros((8, dbias.shape[1]))
    for i in range(T):
        for j in range(S):
            bucket = np_t5_bucket(j - i, 8, 6, True)
            grads[bucket] += dbias[:, :, i, j].sum(0)
    return [grads]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_relative_position_bias_and_its_table_gradients(layout):
    """T5's bias with a mask mod: the table's gradients are summed block
    by block on the blockwise path and equal the reference's."""
    q, k, v, mask = inputs(layout)
    heads = heads_of(q)
    table = rng(1).standard_normal((8, heads)).astype("float32")
    mod, spec = MASK_MODS["sinks or window"]
    cases = [
        (
            f"relative bias {path}",
            "float32",
            attention(path, "float32", mask, mod, relative_bias),
        )
        for path in PATHS
    ]
    check(
        cases,
        (q, k, v, table),
        np_visible(spec, q, mask),
        {"bias": np_relative_bias(table, heads)},
        np_table_grads,
    )


@pytest.mark.parametrize("name", ["soft cap", "alibi"])
def test_built_in_score_mods_equal_their_arguments(name):
    """`mods.soft_cap` and `mods.alibi` give what `logit_soft_cap` and
    `alibi=True` give (top-left), on every path."""
    q, k, v, mask = inputs("gqa")
    heads = heads_of(q)
    score_mod = (
        (lambda: mods.soft_cap(2.0))
        if name == "soft cap"
        else (lambda: mods.alibi(heads))
    )
    transform = (
        {"soft_cap": 2.0}
        if name == "soft cap"
        else {"bias": np_alibi_bias(heads, T, S)}
    )
    cases = [
        (
            f"{name} mod {path}",
            dtype,
            attention(path, dtype, mask, None, score_mod),
        )
        for path in PATHS
        for dtype in ("float32", "bfloat16")
    ]
    check(
        cases,
        (q, k, v),
        np.broadcast_to(mask[:, None], (B, heads, T, S)),
        transform,
    )


def test_score_mod_variables_get_gradients_on_every_path():
    """A score mod that closes over a Keras variable (a learned scale per
    head) and a tensor: both get the reference's gradients, with a mask
    mod, segment ids, the soft cap and ALiBi applied after it."""
    q, k, v, mask = inputs("gqa")
    heads = heads_of(q)
    generator = rng(2)
    scale = keras.Variable(
        (1.0 + 0.3 * generator.standard_normal(heads)).astype("float32")
    )
    shift = generator.standard_normal(heads).astype("float32")

    def score_mod(shift):
        def mod(score, batch, head, q_idx, kv_idx):
            return score * ops.take(scale, head) + ops.take(shift, head)

        return mod

    mod, _ = MASK_MODS["per batch and head"]
    structure = {
        "segment_ids": (QUERY_IDS, KEY_IDS),
        "logit_soft_cap": 3.0,
        "alibi": True,
    }
    fns = [
        attention(path, "float32", mask, mod, score_mod, **structure)
        for path in PATHS
    ]
    outputs, grads, variable_grads, _ = run_cases(
        [(p, fn) for p, fn in zip(PATHS, fns, strict=True)],
        (q, k, v, shift),
        [scale],
        copies=True,
    )
    # The reference path against itself in float64 is the NumPy test
    # above; here every path must give its outputs and gradients.
    names = ["q", "k", "v", "shift"]
    for i, path in enumerate(PATHS[1:], start=1):
        assert_close(
            f"score mod variable {path}",
            "float32",
            [outputs[i]],
            grads[4 * i : 4 * i + 4],
            [outputs[0]],
            grads[:4],
            names,
        )
    assert np.abs(variable_grads[0]).max() > 1e-3
    # One variable on every path: its gradient is the sum of equal
    # contributions, each the reference's.
    reference_only = run_cases([(PATHS[0], fns[0])], (q, k, v, shift), [scale])
    np.testing.assert_allclose(
        variable_grads[0],
        len(PATHS) * reference_only[2][0],
        rtol=1e-4,
        atol=1e-5,
    )


FLEX_CASES = {  # name: (layout, mask mod, score mod, structure, dtype)
    **{
        f"{name} {layout}": (layout, name, None, {}, "float32")
        for name in MASK_MODS
        for layout in LAYOUTS
    },
    **{
        f"{name} with {sorted(structure)}": (
            "gqa",
            name,
            None,
            structure,
            "float32",
        )
        for name, structure in COMBINED
    },
    **{
        f"relative bias {layout}": (
            layout,
            "sinks or window",
            "relative",
            {},
            "float32",
        )
        for layout in LAYOUTS
    },
    **{
        f"{score} {dtype}": ("gqa", None, score, {}, dtype)
        for score in ("soft cap", "alibi")
        for dtype in ("float32", "bfloat16")
    },
    "every argument": (
        "gqa",
        "per batch and head",
        "relative",
        {"segment_ids": (QUERY_IDS, KEY_IDS), "alibi": True},
        "float32",
    ),
    "soft cap then alibi": (
        "gqa",
        "causal chunks",
        None,
        {"logit_soft_cap": 3.0, "alibi": True},
        "float32",
    ),
}


def flex_score_mod(name, heads):
    """`(score mod, transform of np_sdpa_grads)` of a case of FLEX_CASES."""
    if name == "relative":
        table = rng(1).standard_normal((8, heads)).astype("float32")
        return relative_bias(table), {"bias": np_relative_bias(table, heads)}
    if name == "soft cap":
        return mods.soft_cap(2.0), {"soft_cap": 2.0}
    if name == "alibi":
        return mods.alibi(heads), {"bias": np_alibi_bias(heads, T, S)}
    return None, {}


@pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="FlexAttention is PyTorch's"
)
@pytest.mark.parametrize("case", list(FLEX_CASES))
def test_flex_outputs_equal_float64_reference(case):
    """The fused path forced through PyTorch's FlexAttention: each mask
    mod with a padding mask and a query that sees no key, with the
    structure arguments, and the score mods, against the float64
    reference (outputs: on a CPU, PyTorch has no backward pass for it;
    on a GPU the gradient tests run it as a path of their own)."""
    import torch

    layout, name, score, structure, dtype = FLEX_CASES[case]
    q, k, v, mask = inputs(layout)
    heads = heads_of(q)
    mask_mod, spec = MASK_MODS[name] if name else (None, None)
    score_mod, transform = flex_score_mod(score, heads)
    hiding = {  # the structure arguments that hide keys
        k: v
        for k, v in structure.items()
        if k not in ("alibi", "logit_soft_cap")
    }
    visible = np_visible(spec, q, mask, **hiding)
    if structure.get("alibi"):
        alibi = np_alibi_bias(heads, T, S)
        transform["bias"] = transform.get("bias", 0.0) + alibi
    if "logit_soft_cap" in structure:
        transform["soft_cap"] = structure["logit_soft_cap"]
    arguments = dict(mask=mask, mask_mod=mask_mod, score_mod=score_mod)
    inputs_ = [ops.cast(x, dtype) for x in (q, k, v)]
    with torch.no_grad(), path_context("flex"):
        report = str(F.explain(*inputs_, **arguments, **structure))
        output = F.scaled_dot_product_attention(
            *inputs_, **arguments, **structure
        )
    assert "PyTorch's flex_attention" in report, report
    want = np_sdpa_grads(
        q, k, v, visible, False, np.zeros(output.shape), **transform
    )[0]
    got = ops.convert_to_numpy(ops.cast(output, "float32"))
    assert error(got, want) <= TOLERANCES[dtype][0], error(got, want)


_HIDDEN_SCALE = []


class _Hidden:
    """Holds a helper where a mod's holdings are not searched (a class)."""

    @staticmethod
    def scale():
        return _HIDDEN_SCALE[0]


def test_a_variable_a_mod_reads_unseen_is_refused_on_the_blockwise_path():
    """A score mod that reads a trainable variable through a class's
    static method: the reference path differentiates it as it runs; the
    blockwise path, which must hold it to differentiate it and cannot
    find it there, refuses rather than drop its gradient."""
    _HIDDEN_SCALE[:] = [keras.Variable(2.0, name="hidden_scale")]
    q, k, v, mask = inputs("gqa")

    def mod(score, batch, head, q_idx, kv_idx):
        return score * _Hidden.scale()

    with path_context("reference"):
        F.scaled_dot_product_attention(q, k, v, score_mod=mod)
    with (
        path_context("chunked"),
        pytest.raises(ValueError, match="reads the trainable Keras var"),
    ):
        F.scaled_dot_product_attention(q, k, v, score_mod=mod)


def test_hidden_keys_get_exactly_zero_gradients():
    """Keys that a mask mod hides from every query get gradients of
    exactly 0 on every path, also through a score mod."""
    q, k, v, _ = inputs("gqa")

    def hides_two(batch, head, q_idx, kv_idx):
        return (kv_idx != 2) & (kv_idx != 7)

    cases = [
        (path, attention(path, "float32", None, hides_two, relative_bias))
        for path in PATHS
    ]
    table = rng(3).standard_normal((8, heads_of(q))).astype("float32")
    _, grads, _, _ = run_cases(cases, (q, k, v, table))
    for i in range(len(PATHS)):
        for grad in grads[4 * i + 1 : 4 * i + 3]:  # key, value
            assert np.all(grad[:, [2, 7]] == 0.0)
            assert np.abs(grad).max() > 0


@pytest.mark.parametrize(
    "mod, message",
    [
        (
            lambda b, h, q, k: ops.cast(q >= k, "float32"),
            "must return booleans",
        ),
        (lambda b, h, q, k: ops.ones((3, 3), "bool"), "must return booleans"),
        ("causal", "`mask_mod` must be a callable"),
    ],
)
def test_bad_mask_mods_raise(mod, message):
    q, k, v, _ = inputs("gqa")
    flex = ("flex",) if keras.backend.backend() == "torch" else ()
    for path in ("auto", *flex):
        with (
            path_context(path),
            pytest.raises(
                ValueError, match=f"scaled_dot_product_attention: .*{message}"
            ),
        ):
            F.scaled_dot_product_attention(q, k, v, mask_mod=mod)


@pytest.mark.parametrize(
    "mod, message",
    [
        (lambda s, b, h, q, k: s[..., :1], "must return float logits"),
        (lambda s, b, h, q, k: q >= k, "must return float logits"),
        (3.0, "`score_mod` must be a callable"),
    ],
)
def test_bad_score_mods_raise(mod, message):
    q, k, v, _ = inputs("gqa")
    flex = ("flex",) if keras.backend.backend() == "torch" else ()
    for path in ("reference", "chunked", *flex):
        with (
            path_context(path),
            pytest.raises(
                ValueError, match=f"scaled_dot_product_attention: .*{message}"
            ),
        ):
            F.scaled_dot_product_attention(q, k, v, score_mod=mod)


@pytest.mark.parametrize("name", ["alibi", "relative_position_bias"])
def test_score_mods_for_another_head_count_raise(name):
    """ALiBi's slopes and T5's table are per head: made for 3 heads and
    given 4 (a gather past the end, which some backends clamp silently),
    they raise a ValueError that names them."""
    q, k, v, _ = inputs("gqa")
    mod = (
        mods.alibi(3)
        if name == "alibi"
        else relative_bias(np.zeros((8, 3), "float32"))
    )
    what = "num_heads" if name == "alibi" else "table"
    message = f"{name}: `{what}` is for 3 heads; the attention has 4"
    for path in ("reference", "chunked"):
        with (
            path_context(path),
            pytest.raises(ValueError, match=re.escape(message)),
        ):
            F.scaled_dot_product_attention(q, k, v, score_mod=mod)


def test_explain_counts_the_block_pairs_a_mask_mod_leaves():
    """`explain` evaluates the mask mod into the blockwise path's map:
    causal attention over 12 positions in blocks of 3 visits the 4
    diagonal pairs (partial) and the 6 below them (full)."""
    q = keras.KerasTensor((B, 12, 4, 4))
    with path_context("chunked"):
        report = F.explain(
            q,
            q,
            mask_mod=causal_function,
            score_mod=mods.alibi(4),
            logit_soft_cap=5.0,  # before ALiBi: the mod stays a mod
        )
        # With a window: the band's blocks are in the map too.
        windowed = F.explain(q, q, mask_mod=causal_function, sliding_window=4)
    assert report.path == "chunked"
    assert "10 of 16 block pairs visited (62%; 6 without" in report.structure
    assert "score mod alibi(4) applied inside each block" in report.structure
    assert "7 of 16 block pairs visited (44%; 0 without" in windowed.structure
    layer = ka_layer()
    report = layer.explain(8, mask_mod=per_head)
    assert "mask mod function per_head evaluated" in report.structure
    assert "RelativePositionBias (layer 'bias')" in report.structure


def test_visited_fraction_counts_partial_blocks():
    """The dispatch's fraction of visited block pairs for a mask mod
    function it evaluates: a window of 2 keys over 12 positions in blocks
    of 3 leaves only partial blocks (the diagonal and the one below it),
    and every one of them is visited, as NumPy counts them."""
    from keras_attention._core import Structure
    from keras_attention._kernels.blockwise import plan

    length, block = 12, SMALL_CHUNK

    def window(batch, head, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx > q_idx - 2)

    q = ops.zeros((B, length, 4, 4))
    structure = Structure.of_call("test", q, q, mask_mod=window)
    fraction = plan.visited_fraction(structure, B, 4, length, length, block)
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    visible = (j <= i) & (j > i - 2)  # (T, S)
    pairs = visible.reshape(length // block, block, length // block, block)
    want = pairs.any(axis=(1, 3)).mean()  # 7 of 16
    assert not pairs.all(axis=(1, 3)).any()  # no full block
    np.testing.assert_allclose(ops.convert_to_numpy(fraction), want)


def ka_layer():
    layer = ka.MultiHeadSelfAttention(
        2, score_mod=ka.RelativePositionBias(name="bias")
    )
    layer.build((1, 8, 8))
    return layer


@pytest.mark.parametrize("pattern", ["chunks", "prefix"])
def test_the_automatic_path_skips_blocks_where_that_is_faster(pattern):
    """1024 positions in the dispatch's blocks of 256: chunks of 256 leave
    4 of the 16 block pairs, a prefix-LM mask with a prefix of 512 leaves
    11. A fused kernel that would take the pattern as a dense mask
    (PyTorch on CPU) leaves the first to the blockwise path and runs the
    second; without a fused kernel both run blockwise. The automatic
    path gives the reference's outputs and gradients."""
    length, block = 1024, ka._kernels.CHUNK_SIZE
    generator = rng(3)
    q, k, v = (
        generator.standard_normal((B, length, heads, 4)).astype("float32")
        for heads in (2, 1, 1)
    )
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    mod, visible = {
        "chunks": (mods.chunked(block), i // block == j // block),
        "prefix": (mods.prefix_lm(np.full(B, 512)), (j < 512) | (j <= i)),
    }[pattern]
    report = F.explain(q, k, v, mask_mod=mod)
    sparse = ka._kernels.backends.current().sparse_blocks_beat_fused()
    if not ka._kernels.has_fused_kernel():
        assert report.path == "chunked"
    elif sparse and pattern == "chunks":
        assert report.path == "chunked"
        assert "leaves 25% of the block pairs" in report.refused["fused"]
    else:
        assert report.path == "fused"
    cases = [
        (
            "mask mod auto T=1024",
            "float32",
            attention("auto", "float32", None, mod),
        )
    ]
    visible = np.broadcast_to(visible, (B, 2, length, length))
    check(cases, (q, k, v), visible)


@pytest.mark.parametrize("offset", [-1, 0])
def test_a_score_mod_takes_the_blockwise_path_on_long_sequences(offset):
    """A score mod refuses the fused kernel. Without one, the path the
    cost model picks for every block pair; beside PyTorch's CPU kernel, from
    `KERNEL_MIN_LENGTH` (below, the reference is faster there); on a
    GPU, the reference."""
    kernels = ka._kernels
    length = kernels.dispatch.KERNEL_MIN_LENGTH + offset
    q = keras.KerasTensor((B, length, 2, 4))
    report = F.explain(q, q, score_mod=lambda score, *indices: 2 * score)
    if not kernels.has_fused_kernel():  # every block pair: by the cost
        cost = kernels.dispatch.BLOCKWISE_COST[keras.backend.backend()]
        assert report.path == ("chunked" if cost < 1 else "reference")
    elif kernels.backends.current().sparse_blocks_beat_fused():
        assert report.path == ("chunked" if offset == 0 else "reference")
        assert "score mod" in report.refused["fused"]
    else:
        assert report.path == "reference"


def test_a_block_mask_is_read_only_where_its_sizes_fit():
    """A map of the call's sizes is read (a map emptied by hand gives
    zeros); one of other sizes is not (the mod itself decides): of
    another batch size, or of blocks of 5 where the call is forced to
    blocks of 3."""
    q, k, v, _ = inputs("gqa")
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for batch, block, expect_zeros in (
        (B, SMALL_CHUNK, True),
        (1, SMALL_CHUNK, False),
        (B, 5, False),
    ):
        mask = mods.block_mask(causal_function, batch, 4, T, S, block)
        mask.blocks = ops.zeros_like(mask.blocks)  # every pair "empty"
        with path_context("chunked"):
            got = F.scaled_dot_product_attention(q, k, v, mask_mod=mask)
        expected = np.zeros_like(ops.convert_to_numpy(want))
        if not expect_zeros:
            expected = ops.convert_to_numpy(want)
        np.testing.assert_allclose(
            ops.convert_to_numpy(got), expected, atol=1e-5
        )


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="a graph of unknown batch size is TensorFlow's",
)
@pytest.mark.parametrize("path", ["auto", "chunked"])
def test_a_block_mask_in_a_graph_of_unknown_batch_size(path):
    """Inside a `tf.function` whose batch size is unknown (as `fit` and
    `predict` trace), a block mask and document ids are compared with the
    call's sizes without asking a traced size for a truth value."""
    import tensorflow as tf

    q = inputs("gqa")[0]
    mask = mods.block_mask(causal_function, B, 4, T, T, SMALL_CHUNK)
    ids = mods.document(ops.convert_to_tensor(QUERY_IDS))
    spec = tf.TensorSpec((None, T, 4, 4))

    @tf.function(input_signature=[spec])
    def attend(x):
        with path_context(path):
            return [
                F.scaled_dot_product_attention(x, x, x, mask_mod=mod)
                for mod in (mask, ids)
            ]

    got = attend(ops.convert_to_tensor(q))
    for out, mod in zip(got, (causal_function, ids), strict=True):
        want = F.scaled_dot_product_attention(q, q, q, mask_mod=mod)
        np.testing.assert_allclose(
            ops.convert_to_numpy(out), ops.convert_to_numpy(want), atol=1e-5
        )


def test_a_block_mask_sets_the_block_size_of_the_call():
    """Unforced, the blockwise path runs blocks of the block mask's size:
    `explain()` names it, the map is read (emptied by hand, it gives
    zeros), and the outputs are the mod's."""
    q, k, v, _ = inputs("gqa")
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # A function's map is read; a built-in mod's joins the structure
    # (read from its ranges) and keeps the block size.
    for size, mod in ((3, causal_function), (5, causal_function),
                      (5, mods.causal())):  # fmt: skip
        mask = mods.block_mask(mod, B, 4, T, S, block_size=size)
        with ka._kernels.force("chunked"):
            report = F.explain(q, k, v, mask_mod=mask)
            got = F.scaled_dot_product_attention(q, k, v, mask_mod=mask)
            mask.blocks = ops.zeros_like(mask.blocks)  # every pair "empty"
            emptied = F.scaled_dot_product_attention(q, k, v, mask_mod=mask)
        assert f"blocks of {size} queries and keys" in report.structure
        np.testing.assert_allclose(
            ops.convert_to_numpy(got), ops.convert_to_numpy(want), atol=1e-5
        )
        if mod is causal_function:
            np.testing.assert_array_equal(ops.convert_to_numpy(emptied), 0.0)
            # explain() reads the same map, at the same block size.
            blocks = np.tril(np.ones((-(-T // size), -(-S // size))))
            assert (
                f"read from its block mask of {size}-row blocks: "
                f"{int(blocks.sum())} of {blocks.size} block pairs visited"
            ) in report.structure


ALL_PATHS = ("reference", "chunked", "fused", "flex")


@pytest.mark.parametrize(
    "mod, message",
    [
        (lambda b, h, q, k: None, "dtype NoneType"),
        # Data for other rows or lengths: a ValueError before any path
        # (else one backend clamps the gather and answers silently).
        (mods.document(QUERY_IDS[:1]), "Received: segment_ids.shape=(1, 8)"),
        (mods.document(QUERY_IDS[:, :6]), "shape (B, T) = (2, 8)"),
        (
            mods.and_masks(mods.causal(), mods.document(np.ones((2, 9), int))),
            "Received: segment_ids.shape=(2, 9)",
        ),
        (mods.prefix_lm(PREFIX[:1]), "shape (B,) = (2,)"),
        (mods.prefix_lm(np.array([1, 2, 3])), "prefix_lengths.shape=(3,)"),
        # Mods of the wrong kind or arity.
        (mods.alibi(4), "`mask_mod` is called as `mask_mod(batch, head,"),
        (lambda b, h, q: q > 0, "cannot take those arguments"),
    ],
)
@pytest.mark.parametrize("path", ALL_PATHS)
def test_mods_that_do_not_fit_the_call_raise(mod, message, path):
    q, k, v, _ = inputs("gqa")
    k, v = k[:, :T], v[:, :T]
    with (
        path_context(path),
        pytest.raises(ValueError, match=re.escape(message)),
    ):
        F.scaled_dot_product_attention(q, k, v, mask_mod=mod)


@pytest.mark.parametrize(
    "path",
    ("chunked", *(("flex",) if keras.backend.backend() == "torch" else ())),
)
def test_a_mod_of_the_whole_grid_is_refused_where_blocks_run(path):
    """A mod that adds a `(T, S)` tensor computes on the whole grid only:
    on a block of it the library names the mod, not a backend's
    broadcasting error."""
    q, k, v, _ = inputs("gqa")
    whole = np.zeros((T, S), "float32")
    with (
        path_context(path),
        pytest.raises(ValueError, match="must compute elementwise"),
    ):
        F.scaled_dot_product_attention(
            q, k, v, score_mod=lambda s, b, h, qi, ki: s + whole
        )


def test_tensors_a_mod_reads_through_a_global_container_get_gradients():
    """A score mod that reads its tensor from a module-level dict, set
    inside the differentiated function: the blockwise path finds it there
    and gives the reference's gradient."""
    q, k, v, _ = inputs("gqa")

    def run(scale):
        GLOBAL_SCALES["scale"] = scale
        return F.scaled_dot_product_attention(q, k, v, score_mod=_global_mod)

    assert_blockwise_scale_gradient(run)


def assert_blockwise_scale_gradient(run):
    """`run(scale)`'s gradient for a scale of 0.7: not zero on the
    reference path, and the same on the blockwise path."""
    scale = np.array(0.7, "float32")
    grads = {}
    for path in ("reference", "chunked"):
        with path_context(path):
            _, (grads[path],), _ = value_and_grads(run, (scale,))
    assert abs(float(grads["reference"])) > 1e-3
    np.testing.assert_allclose(grads["chunked"], grads["reference"], rtol=1e-4)


class _SlottedScale:
    """A score mod that holds its scale in a slot (no `__dict__`)."""

    __slots__ = ("__scale",)

    def __init__(self, scale):
        self.__scale = scale

    def __call__(self, score, batch, head, q_idx, kv_idx):
        return score * self.__scale


@dataclasses.dataclass(frozen=True, slots=True)
class _FrozenScale:
    scale: object

    def __call__(self, score, batch, head, q_idx, kv_idx):
        return score * self.scale


class _SelfCopyScale(_SlottedScale):
    """Copied, it is itself: the path must not write into it."""

    __slots__ = ()

    def __copy__(self):
        return self


class _TupleScale(typing.NamedTuple):
    scale: object

    def __call__(self, score, batch, head, q_idx, kv_idx):
        return score * self.scale


@pytest.mark.parametrize(
    "mod_class", [_SlottedScale, _FrozenScale, _SelfCopyScale, _TupleScale]
)
def test_tensors_a_mod_holds_in_slots_get_gradients(mod_class):
    """A score mod object with `__slots__` (a private slot, a frozen
    dataclass, one whose copy is itself, a named tuple): the blockwise
    path finds the tensor it holds and gives the reference's gradient of
    it, and leaves the mod as it was."""
    q, k, v, _ = inputs("gqa")

    def run(scale):
        mod = mod_class(scale)
        outputs = F.scaled_dot_product_attention(q, k, v, score_mod=mod)
        slotted = isinstance(mod, _SlottedScale)
        held = mod._SlottedScale__scale if slotted else mod.scale
        assert held is scale  # the path wrote nothing into the mod
        return outputs

    assert_blockwise_scale_gradient(run)


GLOBAL_SCALES = {}


def _global_mod(score, batch, head, q_idx, kv_idx):
    return score * GLOBAL_SCALES["scale"]


_GLOBAL_SCALE = None  # a trainable variable, set by the test below


def _default_mod(scale):
    def mod(score, batch, head, q_idx, kv_idx, scale=scale):
        return score * scale

    return mod


def _global_variable_mod(score, batch, head, q_idx, kv_idx):
    return score * _GLOBAL_SCALE


@pytest.mark.parametrize("held", ["default argument", "global"])
def test_variables_a_mod_holds_by_default_or_global_get_gradients(held):
    """A score mod that reads a trainable Keras variable from its default
    argument or from a module-level global: the blockwise path finds it
    and gives the reference path's gradient of it (and of q, k, v)."""
    global _GLOBAL_SCALE
    scale = keras.Variable(np.float32(0.7), name="held_scale")
    _GLOBAL_SCALE = scale
    mod = _global_variable_mod if held == "global" else _default_mod(scale)
    q, k, v, mask = inputs("gqa")
    results = {
        path: run_cases(
            [(path, attention(path, "float32", mask, None, lambda: mod))],
            (q, k, v),
            [scale],
        )
        for path in ("reference", "chunked")
    }
    (want, want_grads, [want_scale], _) = results["reference"]
    (got, got_grads, [got_scale], _) = results["chunked"]
    assert abs(float(want_scale)) > 1e-3
    np.testing.assert_allclose(got_scale, want_scale, rtol=1e-4, atol=1e-6)
    assert_close(
        f"variable by {held}",
        "float32",
        got,
        got_grads,
        want,
        want_grads,
        ["q", "k", "v"],
    )


def test_mods_of_any_signature_that_takes_their_arguments_run():
    """A wrapper (`functools.wraps` keeps the wrapped function's
    signature on record) and a mod of `*args` are checked by what they
    take themselves, and give the mod's outputs."""
    q, k, v, _ = inputs("gqa")

    @functools.wraps(causal_function)
    def wrapped_score(score, batch, head, q_idx, kv_idx):
        return ops.where(
            causal_function(batch, head, q_idx, kv_idx), score, -1e9
        )

    def any_mask(*indices):
        return causal_function(*indices)

    want = F.scaled_dot_product_attention(q, k, v, mask_mod=causal_function)
    for arguments in ({"score_mod": wrapped_score}, {"mask_mod": any_mask}):
        got = F.scaled_dot_product_attention(q, k, v, **arguments)
        np.testing.assert_allclose(
            ops.convert_to_numpy(got), ops.convert_to_numpy(want), atol=1e-5
        )


@pytest.mark.parametrize("path", ("reference", "chunked"))
def test_a_mod_running_out_of_memory_is_not_relabelled(path):
    """Memory running out inside a mod reaches the caller as itself (code
    may catch it to retry with less), not as the library's `ValueError`."""
    q, k, v, _ = inputs("gqa")

    def mod(batch, head, q_idx, kv_idx):
        raise MemoryError("out of memory")

    with path_context(path), pytest.raises(MemoryError):
        F.scaled_dot_product_attention(q, k, v, mask_mod=mod)
