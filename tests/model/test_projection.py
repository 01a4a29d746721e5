"""project(): plain einsum for float32; float32-accumulated products both ways for bfloat16
operands, whether the inputs are bfloat16 or float32 ones rounded to a bfloat16 matmul dtype."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.model.projection import project

SPECS = [
    ("BLD,DF->BLF", (2, 5, 8), (8, 12)),
    ("BLD,DNH->BLNH", (2, 5, 8), (8, 2, 4)),
    ("BLNH,NHD->BLD", (2, 5, 2, 4), (2, 4, 8)),
]


def _operands(lhs_shape, rhs_shape, dtype, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(keys[0], lhs_shape, jnp.float32).astype(dtype)
    w = jax.random.normal(keys[1], rhs_shape, jnp.float32).astype(dtype)
    return x, w, keys[2]


def _loss(fn, spec, probe):
    return lambda x, w: jnp.sum(fn(spec, x, w).astype(jnp.float32) * probe)


@pytest.mark.parametrize("spec, lhs_shape, rhs_shape", SPECS)
def test_float32_is_plain_einsum_bit_for_bit(spec, lhs_shape, rhs_shape):
    x, w, key = _operands(lhs_shape, rhs_shape, jnp.float32)
    probe = jax.random.normal(key, jnp.einsum(spec, x, w).shape)
    np.testing.assert_array_equal(project(spec, x, w), jnp.einsum(spec, x, w))
    ours = jax.grad(_loss(project, spec, probe), argnums=(0, 1))(x, w)
    plain = jax.grad(_loss(jnp.einsum, spec, probe), argnums=(0, 1))(x, w)
    for a, b in zip(ours, plain):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("spec, lhs_shape, rhs_shape", SPECS)
def test_bfloat16_values_and_gradients_match_float32_maths_rounded_once(spec, lhs_shape, rhs_shape):
    x, w, key = _operands(lhs_shape, rhs_shape, jnp.bfloat16)
    out = project(spec, x, w)
    assert out.dtype == jnp.bfloat16
    # The reference: the same bf16 values in float32 arithmetic, rounded to bf16 at the end.
    exact = jnp.einsum(spec, x.astype(jnp.float32), w.astype(jnp.float32))
    np.testing.assert_array_equal(out, exact.astype(jnp.bfloat16))

    probe = jax.random.normal(key, out.shape).astype(jnp.bfloat16).astype(jnp.float32)
    grads = jax.grad(_loss(project, spec, probe), argnums=(0, 1))(x, w)
    reference = jax.grad(_loss(jnp.einsum, spec, probe), argnums=(0, 1))(x.astype(jnp.float32), w.astype(jnp.float32))
    for grad, expected, operand in zip(grads, reference, (x, w)):
        assert grad.dtype == operand.dtype == jnp.bfloat16
        # One rounding of the float32 sum: within half a bf16 ulp (2^-8 relative) of it.
        np.testing.assert_allclose(
            np.asarray(grad, np.float32), np.asarray(expected), rtol=2**-8, atol=1e-6 * float(jnp.abs(expected).max())
        )


def _dot_types(lowered_text: str) -> list[tuple[str, str, str]]:
    """(lhs, rhs, result) element types of every dot_general jax emits."""
    pattern = r"dot_general.*: \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\) -> tensor<[^>]*x(\w+)>"
    return re.findall(pattern, lowered_text)


def test_bfloat16_program_asks_for_float32_accumulated_dots_only():
    """The point of the module: XLA:CPU runs bf16 x bf16 -> f32 dots on the CPU's bf16
    instructions and bf16 x bf16 -> bf16 ones on a slower path. The forward pass and both
    gradients here are the former; autodiff of a plain bf16 einsum gives the latter."""
    spec, lhs_shape, rhs_shape = SPECS[0]
    x, w, key = _operands(lhs_shape, rhs_shape, jnp.bfloat16)
    probe = jax.random.normal(key, (2, 5, 12))

    def dots(fn):
        return _dot_types(jax.jit(jax.value_and_grad(_loss(fn, spec, probe), argnums=(0, 1))).lower(x, w).as_text())

    assert dots(project) == [("bf16", "bf16", "f32")] * 3
    assert dots(jnp.einsum) == [("bf16", "bf16", "bf16")] * 3


@pytest.mark.parametrize("spec, lhs_shape, rhs_shape", SPECS)
def test_float32_inputs_with_bfloat16_operands_round_the_operands_only(spec, lhs_shape, rhs_shape):
    """The product of the bf16-rounded operands, summed in float32 and returned in float32 (no
    rounding of the result); the gradients are float32 products of the bf16-rounded cotangent
    with the other bf16-rounded operand."""
    x, w, key = _operands(lhs_shape, rhs_shape, jnp.float32)
    out = project(spec, x, w, jnp.bfloat16)
    assert out.dtype == jnp.float32

    def rounded(a):
        return a.astype(jnp.bfloat16).astype(jnp.float32)

    np.testing.assert_allclose(out, jnp.einsum(spec, rounded(x), rounded(w)), rtol=1e-6, atol=1e-6)
    assert not np.allclose(out, jnp.einsum(spec, x, w), rtol=1e-5, atol=1e-5)  # the rounding is real

    probe = jax.random.normal(key, out.shape)  # float32, not representable in bf16
    grads = jax.grad(_loss(lambda s, a, b: project(s, a, b, jnp.bfloat16), spec, probe), argnums=(0, 1))(x, w)
    lhs, rhs, output = spec.split("->")[0].split(",") + [spec.split("->")[1]]
    expected = (
        jnp.einsum(f"{output},{rhs}->{lhs}", rounded(probe), rounded(w)),
        jnp.einsum(f"{output},{lhs}->{rhs}", rounded(probe), rounded(x)),
    )
    for grad, reference in zip(grads, expected):
        assert grad.dtype == jnp.float32
        np.testing.assert_allclose(grad, reference, rtol=1e-6, atol=1e-6)


def test_float32_inputs_with_bfloat16_operands_ask_for_float32_accumulated_bf16_dots():
    spec, lhs_shape, rhs_shape = SPECS[0]
    x, w, key = _operands(lhs_shape, rhs_shape, jnp.float32)
    probe = jax.random.normal(key, (2, 5, 12))
    loss = _loss(lambda s, a, b: project(s, a, b, jnp.bfloat16), spec, probe)
    lowered = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(x, w).as_text()
    assert _dot_types(lowered) == [("bf16", "bf16", "f32")] * 3


def test_operands_wider_than_the_inputs_are_refused():
    with pytest.raises(ValueError, match="wider"):
        project("LD,DF->LF", jnp.ones((2, 3), jnp.bfloat16), jnp.ones((3, 4), jnp.bfloat16), jnp.float32)


@pytest.mark.parametrize("spec", ["BTD,BSD->BTS", "ij,jk->ij", "ij,jk->ikl"])
def test_specs_that_are_not_projections_are_refused(spec):
    lhs, rhs = spec.split("->")[0].split(",")
    with pytest.raises(ValueError, match="exactly two"):
        project(spec, jnp.ones((2,) * len(lhs)), jnp.ones((2,) * len(rhs)))


def test_mixed_operand_dtypes_are_refused():
    with pytest.raises(ValueError, match="differ"):
        project("LD,DF->LF", jnp.ones((2, 3), jnp.float32), jnp.ones((3, 4), jnp.bfloat16))
