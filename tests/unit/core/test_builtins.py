"""The built-in mods' machinery (`keras_attention/_core/builtins.py`)
where it is more than a mod's elementwise meaning, which
`tests/unit/mods/test_mods.py` checks."""

import numpy as np
import pytest
from keras import ops

from keras_attention._core.builtins import along_diagonals
from tests.helpers import gradient
from tests.helpers import to_numpy


@pytest.mark.parametrize(
    "rows, cols", [(1, 1), (1, 4), (4, 1), (3, 5), (5, 3), (7, 2)]
)
def test_diagonals_laid_out_and_their_gradient(rows, cols):
    """The relative bias of a block laid along its diagonals: entry
    `(r, c)` of head `n` is `diagonals[n, c - r + R - 1]`, and each
    diagonal's gradient sums its entries' weights."""
    rng = np.random.default_rng(5)
    diagonals = rng.normal(size=(2, rows + cols - 1)).astype("float32")
    weights = rng.normal(size=(2, rows, cols)).astype("float32")
    expected = np.zeros((2, rows, cols), "float32")
    expected_grad = np.zeros_like(diagonals)
    for n in range(2):
        for r in range(rows):
            for c in range(cols):
                expected[n, r, c] = diagonals[n, c - r + rows - 1]
                expected_grad[n, c - r + rows - 1] += weights[n, r, c]

    def laid(d):
        return along_diagonals(d, rows, cols)

    np.testing.assert_array_equal(to_numpy(laid(diagonals)), expected)
    np.testing.assert_allclose(
        gradient(lambda d: ops.multiply(laid(d), weights), diagonals),
        expected_grad,
        rtol=1e-6,
        atol=1e-6,
    )
