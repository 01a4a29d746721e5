import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.training.loss import token_losses
from jaxformer.training.output_loss import chunk_length, projected_token_losses

B, T, D, V = 3, 12, 8, 29


def inputs(seed=0):
    keys = jax.random.split(jax.random.key(seed), 4)
    hidden = jax.random.normal(keys[0], (B, T, D))
    embedding = jax.random.normal(keys[1], (V, D)) * 0.7
    random = jax.random.randint(keys[2], (B, T), 0, V)
    best = jnp.argmax(jnp.einsum("BTD,VD->BTV", hidden, embedding), axis=-1)
    targets = jnp.where(jax.random.bernoulli(keys[3], 0.5, (B, T)), best, random)  # about half are hits
    weights = (jnp.arange(T)[None, :] < jnp.array([[12], [7], [1]])).astype(jnp.float32)  # padded rows
    return hidden, embedding, targets, weights


def reference(hidden, embedding, targets, weights, smoothing, compute_dtype=jnp.float32):
    logits = jnp.einsum(
        "BTD,VD->BTV", hidden.astype(compute_dtype), embedding.astype(compute_dtype), preferred_element_type=jnp.float32
    )
    return token_losses(logits, targets, weights, smoothing)


@pytest.mark.parametrize("chunk_tokens", [0, 3, 12, 18, 36, 1000])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_sums_and_gradients_equal_the_unfused_loss(chunk_tokens, smoothing):
    hidden, embedding, targets, weights = inputs()
    fused = jax.jit(lambda: projected_token_losses(hidden, embedding, targets, weights, smoothing, chunk_tokens))()
    expected = reference(hidden, embedding, targets, weights, smoothing)
    assert set(fused) == set(expected)
    assert float(expected["correct"]) >= 10  # the accuracy is compared on real hits
    for key in expected:
        np.testing.assert_allclose(fused[key], expected[key], rtol=1e-6, err_msg=key)
    assert float(fused["correct"]) == float(expected["correct"])  # a count: exact

    def loss(fn):
        return jax.grad(lambda h, e: fn(h, e)["loss_sum"], argnums=(0, 1))(hidden, embedding)

    grads = jax.jit(
        lambda: loss(lambda h, e: projected_token_losses(h, e, targets, weights, smoothing, chunk_tokens))
    )()
    expected_grads = loss(lambda h, e: reference(h, e, targets, weights, smoothing))
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-6)


@pytest.mark.parametrize("chunk_tokens", [0, 12, 36])  # one chunk, chunks of 4 positions, one chunk
def test_reduced_precision_matmuls_give_the_unfused_sums(chunk_tokens):
    """compute_dtype=bfloat16: the logits come from bfloat16 operands (float32 accumulation),
    as in the unfused model under dtype=bfloat16; the loss maths stays float32. Jitted, with one
    chunk as well: there XLA:CPU once compiled the embedding's gradient to a dot it could not run
    with bfloat16 operands on AVX512-BF16 machines."""
    hidden, embedding, targets, weights = inputs(2)
    fused = jax.jit(
        lambda: projected_token_losses(hidden, embedding, targets, weights, 0.1, chunk_tokens, jnp.bfloat16)
    )()
    expected = reference(hidden, embedding, targets, weights, 0.1, jnp.bfloat16)
    for key in expected:
        np.testing.assert_allclose(fused[key], expected[key], rtol=1e-6, err_msg=key)
    grads = jax.jit(
        jax.grad(
            lambda h, e: projected_token_losses(h, e, targets, weights, 0.1, chunk_tokens, jnp.bfloat16)["loss_sum"],
            argnums=(0, 1),
        )
    )(hidden, embedding)
    assert [g.dtype for g in grads] == [hidden.dtype, embedding.dtype]
    expected_grads = jax.grad(lambda h, e: reference(h, e, targets, weights, 0.1)["loss_sum"], argnums=(0, 1))(
        hidden, embedding
    )
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(got, want, atol=0.05 * float(jnp.max(jnp.abs(want))))  # bfloat16 gradients


def test_the_logits_are_never_whole():
    """With chunks, no [B, T, V] array appears outside the loop over chunks, forward or backward."""
    hidden, embedding, targets, weights = inputs()

    def loss(h, e):
        return projected_token_losses(h, e, targets, weights, 0.1, 12)["loss_sum"]  # chunks of 4 positions

    shapes = [
        var.aval.shape
        for eqn in jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(hidden, embedding).eqns
        for var in eqn.outvars
    ]
    assert all(len(shape) < 3 or shape[-1] != V for shape in shapes), shapes


def test_cotangent_of_the_loss_scales_the_gradient():
    hidden, embedding, targets, weights = inputs(1)
    grad = jax.grad(lambda h: 2.5 * projected_token_losses(h, embedding, targets, weights, 0.1, 12)["loss_sum"])(hidden)
    expected = jax.grad(lambda h: 2.5 * reference(h, embedding, targets, weights, 0.1)["loss_sum"])(hidden)
    np.testing.assert_allclose(grad, expected, atol=1e-5)


def test_chunk_length_divides_the_target_length():
    assert chunk_length(4, 64, 0) == 64
    assert chunk_length(4, 64, 512) == 64
    assert chunk_length(32, 64, 512) == 16
    assert chunk_length(32, 60, 512) == 15
    assert chunk_length(32, 7, 100) == 1  # no divisor fits: one position at a time
    assert chunk_length(1000, 8, 10) == 1


@pytest.mark.parametrize("chunk_tokens", [0, 12])
def test_an_output_bias_is_added_to_the_logits_and_gets_its_gradient(chunk_tokens):
    hidden, embedding, targets, weights = inputs()
    bias = jax.random.normal(jax.random.key(5), (V,))

    def fused(h, e, b):
        return projected_token_losses(h, e, targets, weights, 0.1, chunk_tokens, bias=b)

    def unfused(h, e, b):
        logits = jnp.einsum("BTD,VD->BTV", h, e) + b[None, None]
        return token_losses(logits, targets, weights, 0.1)

    got, want = jax.jit(fused)(hidden, embedding, bias), unfused(hidden, embedding, bias)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
    grads = jax.jit(jax.grad(lambda *a: fused(*a)["loss_sum"], argnums=(0, 1, 2)))(hidden, embedding, bias)
    expected_grads = jax.grad(lambda *a: unfused(*a)["loss_sum"], argnums=(0, 1, 2))(hidden, embedding, bias)
    for got_grad, want_grad in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(got_grad, want_grad, atol=2e-6, rtol=1e-6)
