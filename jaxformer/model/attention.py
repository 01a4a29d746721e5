"""Scaled dot-product attention (a pure function) and the multi-head attention module.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V          (section 3.2.1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O                (section 3.2.2)

The head split and merge are folded into the projection einsums: W^Q is stored as
[D, N, H], so "BTD,DNH->BTNH" projects and splits in one step, and W^O as [N, H, D].
"""

from __future__ import annotations

import functools
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.model.config import TransformerConfig
from jaxformer.model.dropout import dropout
from jaxformer.model.projection import project
from jaxformer.model.shape_checks import check_mask
from jaxformer.typing import Array, Bool, Float

logger = logging.getLogger(__name__)

# Einsum specs by the layout of keys and values: [B, S, N, H] as projected, or heads-major
# [B, N, S, H] as the decoding caches store them (see cache.py).
_SCORES = {False: "BTNH,BSNH->BNTS", True: "BTNH,BNSH->BNTS"}
_WEIGHTED_SUM = {False: "BNTS,BSNH->BTNH", True: "BNTS,BNSH->BTNH"}
# Keys and values [B, S, N, H], or [B, N, S, H] as the decoding cache holds them (heads_major=True):
# the two middle axes are left unchecked, the mask's S is checked against the logits.
KeysOrCachedKeys = Float[Array, "B _ _ H"]
# The name scope of softmax(Q K^T / sqrt(d_k)) V inside MultiHeadAttention.attend: a profile's
# operations under it are the attention core, the products beside it the weight projections.
ATTENTION_CORE = "attention_core"


@jax.custom_vjp
def masked_softmax(logits: Float[Array, "... S"], mask: Bool[Array, "... S"]) -> Float[Array, "... S"]:
    """softmax over the last axis, restricted to where `mask` (broadcast to `logits`) is True.

    Masked entries get weight 0, and a row with nothing unmasked is all zeros rather than NaN
    or uniform. The backward pass, y * (g - sum(g * y)), needs only the output: masked entries
    and empty rows have y = 0 and so get no gradient without another pass over the mask. At
    long lengths the [B, N, T, S] softmax is memory-bound on CPUs, and this saves three of its
    passes per attention (the mask's select in both directions, and the zeroing where).
    """
    logits = jnp.where(mask, logits, -jnp.inf)
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isneginf(row_max), 0.0, row_max)  # an empty row: exp(-inf) = 0 below
    unnormalized = jnp.exp(logits - row_max)
    total = jnp.sum(unnormalized, axis=-1, keepdims=True)
    return unnormalized / jnp.where(total > 0.0, total, 1.0)


def _masked_softmax_forward(logits, mask):
    weights = masked_softmax(logits, mask)
    return weights, weights


def _masked_softmax_backward(weights, cotangent):
    weighted_sum = jnp.sum(cotangent * weights, axis=-1, keepdims=True)
    return weights * (cotangent - weighted_sum), None


masked_softmax.defvjp(_masked_softmax_forward, _masked_softmax_backward)


def dot_product_attention_weights(
    query: Float[Array, "B T N H"],
    key: KeysOrCachedKeys,
    mask: Bool[Array, "#B #N #T S"] | None = None,
    *,
    heads_major: bool = False,
) -> Float[Array, "B N T S"]:
    """softmax(Q K^T / sqrt(H)) over the keys where `mask` allows, in float32.

    `mask` broadcasts to [B, N, T, S] (True = attend). A query with no key to attend to
    (a padding query) gets all-zero weights rather than NaN. With `heads_major`, `key` is
    [B, N, S, H].
    """
    batch, length, heads, _ = query.shape
    check_mask(mask, (batch, heads, length, key.shape[2 if heads_major else 1]))
    query = query / jnp.sqrt(query.shape[-1]).astype(query.dtype)
    logits = jnp.einsum(_SCORES[heads_major], query, key, preferred_element_type=jnp.float32)  # [B, N, T, S]
    if mask is None:
        return jax.nn.softmax(logits, axis=-1)
    return masked_softmax(logits, mask)  # [B, N, T, S]


def dropout_weights(weights: Float[Array, ...], rate: float, rng: jax.Array) -> Float[Array, ...]:
    """Inverted dropout: zero each weight with probability `rate`, rescale the rest."""
    return dropout(weights, rate, rng)


def dot_product_attention(
    query: Float[Array, "B T N H"],
    key: Float[Array, "B S N H"],
    value: Float[Array, "B S N H"],
    mask: Bool[Array, "#B #N #T S"] | None = None,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
) -> Float[Array, "B T N H"]:
    """Scaled dot-product attention per head; the output has `value`'s dtype.

    The softmax runs in float32 whatever the compute dtype. Dropout on the attention
    weights applies when `dropout_rng` is given and `dropout_rate` > 0.
    """
    weights = dot_product_attention_weights(query, key, mask)  # [B, N, T, S] float32
    if dropout_rng is not None and dropout_rate > 0.0:
        weights = dropout_weights(weights, dropout_rate, dropout_rng)
    return jnp.einsum("BNTS,BSNH->BTNH", weights.astype(value.dtype), value)  # [B, T, N, H]


def fused_attention(
    query: Float[Array, "B T N H"],
    key: Float[Array, "B S N H"],
    value: Float[Array, "B S N H"],
    mask: Bool[Array, "#B #N #T S"] | None,
    implementation: str,
) -> Float[Array, "B T N H"]:
    """`jax.nn.dot_product_attention` ("xla", or "cudnn" for the fused GPU kernel).

    cuDNN needs a GPU and 16-bit inputs; where it cannot run, JAX raises while tracing and the
    XLA implementation is used instead. Rows with no key to attend to (padding queries) get
    the mean of the values rather than zeros; nothing downstream reads them.
    """
    check_mask(mask, (query.shape[0], query.shape[2], query.shape[1], key.shape[1]))
    if implementation == "cudnn":
        try:
            return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation="cudnn")
        except Exception as error:  # noqa: BLE001  (JAX raises several types for unsupported cases)
            _warn_cudnn_fallback(error)
    return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation="xla")


@functools.lru_cache(maxsize=1)
def _warn_cudnn_fallback_once() -> None:
    logger.warning("cuDNN attention is unavailable here; using the XLA implementation")


def _warn_cudnn_fallback(error: Exception) -> None:
    logger.debug("cuDNN attention failed: %s", error)
    _warn_cudnn_fallback_once()


def project_to_heads(
    inputs: Float[Array, "B L D"], kernel: Float[Array, "D N H"], bias: Float[Array, "N H"], operand_dtype=None
) -> Float[Array, "B L N H"]:
    """The Q, K or V projection, split into heads: x W + b (the product's operands in
    `operand_dtype`, None: the inputs' dtype; see projection.py)."""
    return project("BLD,DNH->BLNH", inputs, kernel, operand_dtype) + bias[None, None]  # [B, L, N, H]


def merge_heads(
    heads: Float[Array, "B L N H"], kernel: Float[Array, "N H D"], bias: Float[Array, D], operand_dtype=None
) -> Float[Array, "B L D"]:
    """Concatenates the heads and applies the output projection W^O (operands as in project_to_heads)."""
    return project("BLNH,NHD->BLD", heads, kernel, operand_dtype) + bias[None, None]  # [B, L, D]


class MultiHeadAttention(nn.Module):
    """Multi-head attention: self-attention when `inputs_kv` is `inputs_q`, else cross-attention.

    Besides the full call, `key_value` and `attend` expose the two halves, so incremental
    decoding can cache keys and values and attend to them later with new queries.
    """

    config: TransformerConfig

    def _projection(self, name: str, kernel_names: tuple[str, ...], bias_names: tuple[str, ...], num_in_axes: int):
        """A kernel (Xavier-uniform over its fan-in and fan-out axes) and a zero bias."""
        config = self.config
        sizes = {"embed": config.d_model, "heads": config.num_heads, "kv": config.head_dim}
        in_axes = tuple(range(num_in_axes))
        out_axes = tuple(range(num_in_axes, len(kernel_names)))
        init = nn.initializers.xavier_uniform(in_axis=in_axes, out_axis=out_axes)
        kernel = self.param(
            f"{name}_kernel",
            nn.with_logical_partitioning(init, kernel_names),
            tuple(sizes[axis] for axis in kernel_names),
            config.param_dtype,
        )
        bias = self.param(
            f"{name}_bias",
            nn.with_logical_partitioning(nn.initializers.zeros_init(), bias_names),
            tuple(sizes[axis] for axis in bias_names),
            config.param_dtype,
        )
        return kernel, bias

    def setup(self):
        heads, out = (("embed", "heads", "kv"), ("heads", "kv")), (("heads", "kv", "embed"), ("embed",))
        self.query = self._projection("query", *heads, num_in_axes=1)
        self.key = self._projection("key", *heads, num_in_axes=1)
        self.value = self._projection("value", *heads, num_in_axes=1)
        self.out = self._projection("out", *out, num_in_axes=2)

    def _heads(self, projection, inputs: Float[Array, "B L D"]) -> Float[Array, "B L N H"]:
        config = self.config
        dtype = config.dtype
        kernel, bias = projection
        return project_to_heads(
            inputs.astype(dtype), kernel.astype(dtype), bias.astype(dtype), config.matmul_operand_dtype
        )

    def key_value(self, inputs_kv: Float[Array, "B S D"]) -> tuple[Float[Array, "B S N H"], Float[Array, "B S N H"]]:
        """The keys and values of `inputs_kv`, split into heads."""
        return self._heads(self.key, inputs_kv), self._heads(self.value, inputs_kv)

    def attend(
        self,
        inputs_q: Float[Array, "B T D"],
        key: KeysOrCachedKeys,
        value: KeysOrCachedKeys,
        mask: Bool[Array, "#B #N #T S"] | None = None,
        deterministic: bool | None = None,
        heads_major: bool = False,
    ) -> Float[Array, "B T D"]:
        """Queries from `inputs_q` attend to ready-made keys and values; heads merged by W^O.

        With `heads_major`, `key` and `value` are [B, N, S, H] (cached decoding).
        """
        config = self.config
        deterministic = config.deterministic if deterministic is None else deterministic
        query = self._heads(self.query, inputs_q)  # [B, T, N, H]
        use_dropout = not deterministic and config.attention_dropout_rate > 0.0
        # Named apart from the Q and W^O products around it, so that profiles and traces
        # (benchmarks/step_profile.py) can tell softmax(Q K^T) V from the weight products.
        with jax.named_scope(ATTENTION_CORE):
            if config.attention_implementation == "jaxformer" or use_dropout or heads_major:
                weights = dot_product_attention_weights(query, key, mask, heads_major=heads_major)  # [B, N, T, S] f32
                # Kept only when the caller asks for them (apply(..., mutable=["intermediates"])), for plots.
                self.sow("intermediates", "attention_weights", weights)
                if use_dropout:
                    weights = dropout_weights(weights, config.attention_dropout_rate, self.make_rng("dropout"))
                attended = jnp.einsum(_WEIGHTED_SUM[heads_major], weights.astype(value.dtype), value)  # [B, T, N, H]
            else:
                attended = fused_attention(query, key, value, mask, config.attention_implementation)  # [B, T, N, H]
        kernel, bias = self.out
        return merge_heads(
            attended, kernel.astype(config.dtype), bias.astype(config.dtype), config.matmul_operand_dtype
        )  # [B, T, D]

    def __call__(
        self,
        inputs_q: Float[Array, "B T D"],
        inputs_kv: Float[Array, "B S D"],
        mask: Bool[Array, "#B #N #T S"] | None = None,
        deterministic: bool | None = None,
    ) -> Float[Array, "B T D"]:
        key, value = self.key_value(inputs_kv)  # [B, S, N, H] each
        return self.attend(inputs_q, key, value, mask, deterministic)
