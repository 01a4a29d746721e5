"""x W: an activation times a weight, in the compute dtype, accumulated in float32 both ways.

With float32 compute this is `jnp.einsum`, nothing else. With a narrower compute dtype
(bfloat16) every product of the projection, in the forward pass and in both gradients, is the
narrow inputs' dot accumulated and returned in float32, then rounded once to the compute dtype.
That is what a bf16 matmul means on GPUs and TPUs anyway; it matters on CPUs, where XLA runs
bf16 x bf16 -> float32 dots on the processor's bf16 dot-product instructions (AVX512-BF16:
1.5-1.8x the float32 rate for the model's shapes, measured here), but bf16 x bf16 -> bf16 ones,
which autodiff would produce for the gradients, on a slower generic path (0.6-0.7x float32).

Gradients: for out = einsum("A,W->O", x, w), dx = einsum("O,W->A", g, w) and
dw = einsum("O,A->W", g, x), which holds for any spec in which every letter appears in exactly
two of A, W and O (no batch letters shared by all three; those are the attention score
products, left to `jnp.einsum`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxformer.typing import Array


def _operands_and_output(spec: str) -> tuple[str, str, str]:
    inputs, output = spec.replace(" ", "").split("->")
    lhs, rhs = inputs.split(",")
    for letter in set(lhs + rhs + output):
        if (letter in lhs) + (letter in rhs) + (letter in output) != 2:
            raise ValueError(f"projection {spec!r}: letter {letter!r} must appear in exactly two of its three terms")
    return lhs, rhs, output


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _accumulated(spec: str, inputs: Array, kernel: Array) -> Array:
    return jnp.einsum(spec, inputs, kernel, preferred_element_type=jnp.float32).astype(inputs.dtype)


def _accumulated_forward(spec, inputs, kernel):
    return _accumulated(spec, inputs, kernel), (inputs, kernel)


def _accumulated_backward(spec, residuals, grad):
    inputs, kernel = residuals
    lhs, rhs, output = _operands_and_output(spec)
    grad = grad.astype(inputs.dtype)
    grad_inputs = jnp.einsum(f"{output},{rhs}->{lhs}", grad, kernel, preferred_element_type=jnp.float32)
    grad_kernel = jnp.einsum(f"{output},{lhs}->{rhs}", grad, inputs, preferred_element_type=jnp.float32)
    return grad_inputs.astype(inputs.dtype), grad_kernel.astype(kernel.dtype)


_accumulated.defvjp(_accumulated_forward, _accumulated_backward)


def project(spec: str, inputs: Array, kernel: Array) -> Array:
    """einsum(spec, inputs, kernel) in their common dtype: plain `jnp.einsum` for float32 (or
    wider) operands; for narrower ones (bfloat16), float32-accumulated products in the forward
    pass and in both gradients, each rounded once to that dtype. `spec` names a weight
    projection: every letter in exactly two of its three terms."""
    _operands_and_output(spec)
    if inputs.dtype != kernel.dtype:
        raise ValueError(f"projection {spec!r}: inputs {inputs.dtype} and kernel {kernel.dtype} differ")
    if jnp.finfo(inputs.dtype).bits >= 32:
        return jnp.einsum(spec, inputs, kernel)
    return _accumulated(spec, inputs, kernel)
