"""`_core.steps`: the positions `0 .. T - 1` for a known, a dynamic and a
symbolic length. The symbolic form (a cumulative sum) is what lets ONNX
export from JAX keep sequence lengths dynamic; the export itself is run
in tests/integration/test_export.py."""

import numpy as np
from keras import ops

from keras_attention import _core
from tests.helpers import BACKEND


def test_steps_are_arange_for_every_kind_of_length():
    np.testing.assert_array_equal(
        ops.convert_to_numpy(_core.steps(5)), range(5)
    )
    x = ops.ones((2, 7, 3))
    got = ops.convert_to_numpy(_core.steps(ops.shape(x)[1]))
    np.testing.assert_array_equal(got, range(7))
    if BACKEND == "jax":  # a symbolic length, as under jax.export
        import jax
        from jax import export

        (length,) = export.symbolic_shape("t")

        def positions(x):
            return _core.steps(x.shape[0]) + ops.zeros_like(x, "int32")

        exported = export.export(jax.jit(positions))(
            jax.ShapeDtypeStruct((length,), "float32")
        )
        got = exported.call(np.zeros(6, "float32"))
        np.testing.assert_array_equal(np.asarray(got), range(6))
