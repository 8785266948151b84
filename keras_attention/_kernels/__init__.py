"""Every backend-specific path of the library, and the rule that picks one.

`_core` holds the attention math in `keras.ops` (its reference path);
this package holds what looks at the backend:

* the paths of dot-product attention (`PATHS`), each a named function with
  the signature `path(query, key, value, mask, structure, scale)`:
  `"reference"` (the core's reference math), `"chunked"` (blocks of
  queries and keys with an online softmax and a hand-written backward
  pass: memory O(block^2), the blocks that causal or windowed structure
  leaves empty skipped; `blockwise`) and `"fused"` (the backend's own
  kernel);
* `dispatch`: `choose`, the rule that picks a path, `force`, which
  overrides it (tests run every path on every backend through it), and
  `attention`, which runs the chosen one;
* `report`: what `explain()` says about a call;
* the KV-cache write (`update_kv_cache`) and the pieces of running
  programs (`runtime`);
* `backends`: the primitives of each backend (custom gradients, loops,
  the cache write, the fused kernel), one module a backend.
"""

from keras_attention._kernels import runtime as runtime
from keras_attention._kernels.blockwise import mod_blocks as mod_blocks
from keras_attention._kernels.cache import update_kv_cache as update_kv_cache
from keras_attention._kernels.dispatch import CHUNK_SIZE as CHUNK_SIZE
from keras_attention._kernels.dispatch import (
    CHUNKED_MIN_LENGTH as CHUNKED_MIN_LENGTH,
)
from keras_attention._kernels.dispatch import PATHS as PATHS
from keras_attention._kernels.dispatch import attention as attention
from keras_attention._kernels.dispatch import choose as choose
from keras_attention._kernels.dispatch import force as force
from keras_attention._kernels.dispatch import (
    has_fused_kernel as has_fused_kernel,
)
from keras_attention._kernels.dispatch import select as select
from keras_attention._kernels.report import Explanation as Explanation
from keras_attention._kernels.report import explain_call as explain_call
from keras_attention._kernels.runtime import scan_carries as scan_carries
from keras_attention._kernels.runtime import static_array as static_array
from keras_attention._kernels.runtime import static_dim as static_dim
from keras_attention._kernels.runtime import static_int as static_int
