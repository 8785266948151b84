"""The backend-free core that every other module imports.

It holds what two modules of the library share: the `Structure` of an
attention call (`structure`), the one reference computation of
dot-product attention (`reference`), the masked softmax and its masking
constant (`masking`), the angles of sinusoidal and rotary positions
(`positions`) and the checks of attention inputs (`checks`). It uses
`keras.ops` and NumPy only, and imports nothing else of the library: the
kernels, `functional` and the layers import it, never the other way.
"""

from keras_attention._core.builtins import alibi_slopes as alibi_slopes
from keras_attention._core.builtins import segments_visible as segments_visible
from keras_attention._core.checks import check_inputs as check_inputs
from keras_attention._core.checks import host_integers as host_integers
from keras_attention._core.checks import is_tensor as is_tensor
from keras_attention._core.checks import same_size as same_size
from keras_attention._core.checks import static_dim as static_dim
from keras_attention._core.masking import expand_mask as expand_mask
from keras_attention._core.masking import large_negative as large_negative
from keras_attention._core.masking import logits_dtype as logits_dtype
from keras_attention._core.masking import masked_softmax as masked_softmax
from keras_attention._core.masking import merge_masks as merge_masks
from keras_attention._core.positions import angles as angles
from keras_attention._core.positions import steps as steps
from keras_attention._core.reference import attend as attend
from keras_attention._core.reference import (
    attention_weights as attention_weights,
)
from keras_attention._core.reference import grouped_logits as grouped_logits
from keras_attention._core.reference import reference as reference
from keras_attention._core.reference import (
    reference_weights as reference_weights,
)
from keras_attention._core.structure import Structure as Structure
