"""The primitives each backend provides, one module a backend.

Every module here defines the same names, so the rest of the kernels ask
`current()` for a primitive instead of branching on the backend:

* `custom_gradient(forward, backward)`: a function with a hand-written
  backward pass (`jax.custom_vjp`, `tf.custom_gradient`,
  `torch.autograd.Function`);
* `fori_loop(start, end, body, carry)`: a loop over a traced range;
* `scan_carries(f, init, xs)`: every carry of a scan, stacked;
* `leading_sum(x)`: `x` summed over its leading axis;
* `top_k(x, k)`: the `k` largest entries of the last axis and their
  indices, best first, equal values in index order;
* `write_kv_cache(cache, key, value, index)`: the KV-cache write;
* `block_buffer(zeros)`, `read_block(buffer, index)`,
  `write_block(buffer, index, block)` and `stacked_blocks(buffer)`: the
  blockwise loops' output buffers, one block written at a time, without
  copying the whole buffer per write;
* `fused_kernel(query, key, value, mask, is_causal, scale, bias)` (the
  backend's attention kernel, which every backend has so that the path
  can be forced and checked), `has_fused_kernel()` (whether it is worth
  choosing on this device), `fused_refusal(query, value)` (inputs it
  cannot take) and `sparse_blocks_beat_fused()` (whether the blockwise
  path, skipping the blocks a structure leaves empty, beats the kernel
  when few are left: `dispatch.SPARSE_FRACTION`);
* running programs: `without_gradients()`, `compile_function(fn)`,
  `PROGRAMS_TAKE_VARIABLES`, `is_symbolic_dim(value)`, `is_exporting()`,
  `host_array(tensor)` (a tensor's value as a NumPy array, or `None`
  when reading it would bake a traced value or synchronise a device), and
  `device_name()`.

A module is imported when it is first asked for, so a user with one
backend installed never imports the others.
"""

import importlib

import keras

_MODULES = {}


def current():
    """The primitives module of Keras's backend.

    Imported once, then read from a plain dictionary: `torch.compile`
    (which traces the mods FlexAttention calls) cannot trace an import.
    """
    backend = keras.backend.backend()
    if backend not in _MODULES:
        _MODULES[backend] = importlib.import_module(
            f"keras_attention._kernels.backends.{backend}"
        )
    return _MODULES[backend]
