"""Every public layer under a mixed-precision policy.

Run over the registry of layer cases: with `mixed_float16` or
`mixed_bfloat16` the variables stay float32, the outputs come in the
compute dtype, finite, and close to the float32 layer's with the same
weights (to the half dtype's resolution).
"""

import keras
import numpy as np
import pytest

from tests.contract import registry
from tests.helpers import to_numpy

TOLERANCE = {"float16": 0.05, "bfloat16": 0.3}  # relative to max(1, |out|)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", registry.CASES)
def test_half_compute_dtype_matches_float32(name, policy):
    args, kwargs = registry.call_inputs(name)
    reference = registry.make(name)
    want = keras.tree.flatten(reference(*args, **kwargs))
    layer = registry.make(name, dtype=policy)
    layer(*args, **kwargs)
    layer.set_weights(reference.get_weights())
    for variable in layer.weights:
        dtype = keras.backend.standardize_dtype(variable.dtype)
        assert dtype == "float32", variable.path
    got = keras.tree.flatten(layer(*args, **kwargs))
    compute = policy.split("_")[1]
    for a, b in zip(got, want, strict=True):
        assert keras.backend.standardize_dtype(a.dtype) == compute
        a, b = to_numpy(a), to_numpy(b)
        assert np.all(np.isfinite(a))
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(
            a, b, rtol=0, atol=TOLERANCE[compute] * scale
        )
