"""x W: an activation times a weight, its operands in the matmul dtype, accumulated in float32.

With float32 operands this is `jnp.einsum`, nothing else. With narrower ones (bfloat16: the
compute dtype itself, or `TransformerConfig.matmul_dtype` under a float32 compute dtype) every
product of the projection, in the forward pass and in both gradients, is the narrow operands'
dot accumulated and returned in float32, then cast once to the dtype of the inputs (of the
incoming gradient, for the backward products). That is what a bf16 matmul means on GPUs and
TPUs anyway; it matters on CPUs, where XLA runs bf16 x bf16 -> float32 dots on the processor's
bf16 dot-product instructions (AVX512-BF16: 1.5-1.8x the float32 rate for the model's shapes,
measured here), but bf16 x bf16 -> bf16 ones, which autodiff would produce for the gradients,
on a slower generic path (0.6-0.7x float32). The backward pass keeps the operands in the narrow
dtype, so a float32 model with bf16 matmuls also saves half the projections' activations.

Gradients: for out = einsum("A,W->O", x, w), dx = einsum("O,W->A", g, w) and
dw = einsum("O,A->W", g, x), which holds for any spec in which every letter appears in exactly
two of A, W and O (no batch letters shared by all three; those are the attention score
products, left to `jnp.einsum`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxformer.typing import Array


def _operands_and_output(spec: str) -> tuple[str, str, str]:
    inputs, output = spec.replace(" ", "").split("->")
    lhs, rhs = inputs.split(",")
    for letter in set(lhs + rhs + output):
        if (letter in lhs) + (letter in rhs) + (letter in output) != 2:
            raise ValueError(f"projection {spec!r}: letter {letter!r} must appear in exactly two of its three terms")
    return lhs, rhs, output


# The name of a narrow-operand weight product's output, for remat policies (model/layers.py).
WEIGHT_PRODUCT = "weight_product"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _accumulated(spec: str, operand_dtype, inputs: Array, kernel: Array) -> Array:
    product = jnp.einsum(
        spec, inputs.astype(operand_dtype), kernel.astype(operand_dtype), preferred_element_type=jnp.float32
    )
    return product.astype(inputs.dtype)


def _accumulated_forward(spec, operand_dtype, inputs, kernel):
    # The operands are kept narrow: the backward products read them as such.
    return _accumulated(spec, operand_dtype, inputs, kernel), (
        inputs.astype(operand_dtype),
        kernel.astype(operand_dtype),
    )


def _accumulated_backward(spec, operand_dtype, residuals, grad):
    inputs, kernel = residuals
    lhs, rhs, output = _operands_and_output(spec)
    # The cotangent has the output's dtype, which is the original inputs' and kernel's (project
    # requires them equal).
    wide = grad.dtype
    grad = grad.astype(operand_dtype)
    grad_inputs = jnp.einsum(f"{output},{rhs}->{lhs}", grad, kernel, preferred_element_type=jnp.float32)
    grad_kernel = jnp.einsum(f"{output},{lhs}->{rhs}", grad, inputs, preferred_element_type=jnp.float32)
    return grad_inputs.astype(wide), grad_kernel.astype(wide)


_accumulated.defvjp(_accumulated_forward, _accumulated_backward)


def project(spec: str, inputs: Array, kernel: Array, operand_dtype=None) -> Array:
    """einsum(spec, inputs, kernel) in the inputs' dtype, its operands in `operand_dtype` (None:
    the inputs' own). Float32 operands: plain `jnp.einsum`. Narrower ones (bfloat16):
    float32-accumulated products of the narrow operands in the forward pass and in both
    gradients, each cast once to the inputs' dtype. `spec` names a weight projection: every
    letter in exactly two of its three terms."""
    _operands_and_output(spec)
    if inputs.dtype != kernel.dtype:
        raise ValueError(f"projection {spec!r}: inputs {inputs.dtype} and kernel {kernel.dtype} differ")
    operand_dtype = inputs.dtype if operand_dtype is None else jnp.dtype(operand_dtype)
    if jnp.finfo(operand_dtype).bits > jnp.finfo(inputs.dtype).bits:
        raise ValueError(f"projection {spec!r}: operand dtype {operand_dtype} is wider than the inputs' {inputs.dtype}")
    if jnp.finfo(operand_dtype).bits >= 32:
        return jnp.einsum(spec, inputs, kernel)
    # Named: remat's dots policies see a custom_vjp call here, not the dot_general inside it.
    return checkpoint_name(_accumulated(spec, operand_dtype, inputs, kernel), WEIGHT_PRODUCT)
