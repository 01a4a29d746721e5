"""Array type aliases and the one letter legend used in every einsum and shape comment.

    B  batch                  S  source (key) length     T  target (query) length
    D  model width (d_model)  N  attention heads         H  head size (d_model / N)
    F  feed-forward width     V  vocabulary

In attention, T is the query length and S the key length, so self-attention over the
source reads "B S N H" for both; cross-attention reads queries "B T N H", keys "B S N H".
"""

import jax
import numpy as np
from jaxtyping import Bool, Float, Int

# jax arrays and tracers, or the NumPy arrays host code passes in (jit converts them).
Array = jax.Array | np.ndarray

__all__ = ["Array", "Bool", "Float", "Int"]
