import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.training.loss import (
    label_smoothed_cross_entropy,
    logits_gradient,
    negative_log_likelihood,
    token_accuracy,
    token_terms,
    weighted_sums,
)


def numpy_smoothed_loss(logits, targets, weights, smoothing):
    """KL(smoothed one-hot || softmax) per token, summed with weights, in float64."""
    logits = np.asarray(logits, np.float64)
    vocab = logits.shape[-1]
    log_probs = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    soft = np.full(logits.shape, smoothing / (vocab - 1))
    np.put_along_axis(soft, np.asarray(targets)[..., None], 1.0 - smoothing, axis=-1)
    kl = (soft * (np.log(np.where(soft > 0, soft, 1.0)) - log_probs)).sum(-1)
    return (kl * weights).sum(), np.sum(weights)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_matches_numpy_reference(smoothing):
    logits = jax.random.normal(jax.random.key(0), (3, 5, 11)) * 3
    targets = jax.random.randint(jax.random.key(1), (3, 5), 0, 11)
    weights = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], np.float32)
    loss_sum, weight = label_smoothed_cross_entropy(logits, targets, jnp.asarray(weights), smoothing)
    expected_sum, expected_weight = numpy_smoothed_loss(logits, targets, weights, smoothing)
    np.testing.assert_allclose(loss_sum, expected_sum, rtol=1e-5)
    assert weight == expected_weight == 9


def test_padding_is_ignored_and_perfect_prediction_scores_zero():
    targets = jnp.array([[2, 3, 0]])
    weights = jnp.array([[1.0, 1.0, 0.0]])
    vocab, smoothing = 6, 0.1
    # Logits whose softmax is exactly the smoothed target distribution.
    soft = np.full((1, 3, vocab), smoothing / (vocab - 1))
    np.put_along_axis(soft, np.asarray(targets)[..., None], 1 - smoothing, axis=-1)
    loss_sum, _ = label_smoothed_cross_entropy(jnp.log(jnp.asarray(soft, jnp.float32)), targets, weights, smoothing)
    assert abs(float(loss_sum)) < 1e-5
    garbage = jnp.asarray(soft, jnp.float32).at[0, 2].set(100.0)  # the padded position can hold anything
    np.testing.assert_allclose(
        label_smoothed_cross_entropy(jnp.log(jnp.asarray(soft, jnp.float32)), targets, weights)[0],
        label_smoothed_cross_entropy(jnp.log(garbage), targets, weights)[0],
        atol=1e-6,
    )


def test_nll_and_accuracy():
    logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.5, 0.25, 0.25]]]))
    targets = jnp.array([[0, 1, 2]])
    weights = jnp.array([[1.0, 1.0, 0.0]])
    nll, weight = negative_log_likelihood(logits, targets, weights)
    np.testing.assert_allclose(nll, -np.log(0.7) - np.log(0.3), rtol=1e-6)
    correct, _ = token_accuracy(logits, targets, weights)
    assert float(correct) == 1.0 and float(weight) == 2.0


def test_gradient_is_softmax_minus_smoothed_target():
    """d(loss_sum)/d(logits) = w * (softmax(logits) - smoothed one-hot), per token."""
    vocab, smoothing = 7, 0.1
    logits = jax.random.normal(jax.random.key(2), (2, 3, vocab)) * 2
    targets = jnp.array([[1, 4, 6], [0, 2, 5]])
    weights = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    grad = jax.grad(lambda x: label_smoothed_cross_entropy(x, targets, weights, smoothing)[0])(logits)
    soft = np.full(logits.shape, smoothing / (vocab - 1))
    np.put_along_axis(soft, np.asarray(targets)[..., None], 1.0 - smoothing, axis=-1)
    expected = (np.asarray(jax.nn.softmax(logits)) - soft) * np.asarray(weights)[..., None]
    np.testing.assert_allclose(grad, expected, atol=1e-6)


def test_accuracy_counts_the_arg_max():
    logits = jax.random.normal(jax.random.key(3), (4, 9, 13))
    random = jax.random.randint(jax.random.key(4), (4, 9), 0, 13)
    targets = jnp.where(jnp.arange(9) % 2 == 0, jnp.argmax(logits, -1), random)  # about half are hits
    weights = jnp.ones((4, 9))
    correct, _ = token_accuracy(logits, targets, weights)
    assert float(correct) == float(np.sum(np.argmax(np.asarray(logits), -1) == np.asarray(targets)))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_closed_form_gradient_is_the_gradient_of_the_terms(smoothing):
    """`logits_gradient` (what the fused output loss uses) = autodiff of `token_terms`' loss."""
    logits = jax.random.normal(jax.random.key(5), (2, 4, 9)) * 3
    targets = jax.random.randint(jax.random.key(6), (2, 4), 0, 9)
    weights = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    terms = token_terms(logits, targets, smoothing)
    autodiff = jax.grad(lambda x: weighted_sums(token_terms(x, targets, smoothing), weights)["loss_sum"])(logits)
    np.testing.assert_allclose(logits_gradient(terms, weights, smoothing), autodiff, atol=1e-6)
    np.testing.assert_allclose(terms.exp / terms.total[..., None], jax.nn.softmax(logits), rtol=1e-6)
