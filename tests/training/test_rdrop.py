"""R-Drop (training.rdrop_alpha): the fused loss's pair divergence and its closed-form gradient
against autodiff of the unfused maths, and the train step's pairs against the model run on the
repeated batch by hand."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxformer.model.transformer import Transformer, shift_right
from jaxformer.training.experiment import ConfigError, default_config, validate
from jaxformer.training.loss import token_losses
from jaxformer.training.metrics import summarize
from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.output_loss import projected_token_losses
from jaxformer.training.state import make_init_fn
from jaxformer.training.step import make_train_step
from tests.training.test_step import CONFIG, batch  # the tiny model and its batches

# One worker for the module: its tests share programs (and module fixtures) that a second
# worker would trace, lower and fetch again.
pytestmark = pytest.mark.xdist_group("rdrop")

P, T, D, V = 3, 12, 8, 29  # pairs, target length, width, vocabulary
ALPHA = 5.0


def pair_inputs(seed=0):
    """Hidden states of P examples under two dropout draws each (rows 2i, 2i + 1), their shared
    targets and weights (repeated per pair), and an output projection and bias."""
    keys = jax.random.split(jax.random.key(seed), 5)
    hidden = jax.random.normal(keys[0], (P, 1, T, D)) + 0.3 * jax.random.normal(keys[1], (P, 2, T, D))
    embedding = jax.random.normal(keys[2], (V, D)) * 0.7
    targets = jax.random.randint(keys[3], (P, T), 0, V)
    weights = (jnp.arange(T)[None, :] < jnp.array([[12], [7], [1]])).astype(jnp.float32)  # padded rows
    bias = jax.random.normal(keys[4], (V,)) * 0.5
    return hidden.reshape(2 * P, T, D), embedding, jnp.repeat(targets, 2, 0), jnp.repeat(weights, 2, 0), bias


def reference(hidden, embedding, bias, targets, weights, smoothing, alpha):
    """R-Drop's objective written out on whole logits: the pair's mean label-smoothed loss plus
    alpha / 2 times 1/2 (KL(p || q) + KL(q || p)), per example token."""
    logits = jnp.einsum("BTD,VD->BTV", hidden, embedding) + bias[None, None]
    sums = {key: 0.5 * value for key, value in token_losses(logits, targets, weights, smoothing).items()}
    log_probs = jax.nn.log_softmax(logits).reshape(P, 2, T, V)
    log_p, log_q = log_probs[:, 0], log_probs[:, 1]
    kl_pq = jnp.sum(jnp.exp(log_p) * (log_p - log_q), -1)
    kl_qp = jnp.sum(jnp.exp(log_q) * (log_q - log_p), -1)
    sums["consistency_sum"] = jnp.sum(0.5 * (kl_pq + kl_qp) * weights[::2])
    sums["loss_sum"] = sums["loss_sum"] + 0.5 * alpha * sums["consistency_sum"]
    return sums


@pytest.mark.parametrize("chunk_tokens", [0, 6, 36, 1000])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_pair_divergence_and_its_gradient_equal_autodiff(chunk_tokens, with_bias):
    hidden, embedding, targets, weights, bias = pair_inputs()
    bias = bias if with_bias else jnp.zeros(V)

    def fused(h, e, b):
        b = b if with_bias else None
        return projected_token_losses(h, e, targets, weights, 0.1, chunk_tokens, bias=b, rdrop_alpha=ALPHA)

    got = jax.jit(fused)(hidden, embedding, bias)
    want = reference(hidden, embedding, bias, targets, weights, 0.1, ALPHA)
    assert float(want["consistency_sum"]) > 1.0  # the copies really disagree
    np.testing.assert_allclose(got["weight"], 0.5 * float(jnp.sum(weights)))  # each example's tokens once
    for key in want:
        if key != "weight":
            np.testing.assert_allclose(got[key], want[key], rtol=2e-6, err_msg=key)

    argnums = (0, 1, 2) if with_bias else (0, 1)
    grads = jax.jit(jax.grad(lambda *args: fused(*args)["loss_sum"], argnums=argnums))(hidden, embedding, bias)
    expected = jax.grad(lambda *args: reference(*args, targets, weights, 0.1, ALPHA)["loss_sum"], argnums=argnums)(
        hidden, embedding, bias
    )
    for got_grad, want_grad in zip(grads, expected):
        np.testing.assert_allclose(got_grad, want_grad, atol=3e-6, rtol=2e-5)


def test_identical_copies_diverge_by_nothing_and_train_like_one():
    hidden, embedding, targets, weights, _ = pair_inputs()
    one, one_targets, one_weights = hidden[::2], targets[::2], weights[::2]
    twice = jnp.repeat(one, 2, 0)

    def loss(h, e, t, w, alpha):
        return projected_token_losses(h, e, t, w, 0.1, 36, rdrop_alpha=alpha)

    paired, plain = loss(twice, embedding, targets, weights, ALPHA), loss(one, embedding, one_targets, one_weights, 0.0)
    np.testing.assert_allclose(paired["consistency_sum"], 0.0, atol=1e-5)
    for key in plain:
        np.testing.assert_allclose(paired[key], plain[key], rtol=1e-6, err_msg=key)
    paired_grad = jax.grad(lambda e: loss(twice, e, targets, weights, ALPHA)["loss_sum"])(embedding)
    plain_grad = jax.grad(lambda e: loss(one, e, one_targets, one_weights, 0.0)["loss_sum"])(embedding)
    np.testing.assert_allclose(paired_grad, plain_grad, atol=2e-6, rtol=1e-5)


def test_an_odd_batch_is_refused():
    hidden, embedding, targets, weights, _ = pair_inputs()
    with pytest.raises(ValueError, match="an even batch, not 5 rows"):
        projected_token_losses(hidden[:5], embedding, targets[:5], weights[:5], rdrop_alpha=1.0)


@functools.cache
def setup(dropout_rate):
    config = default_config()
    config.optimizer.warmup_steps = 3
    config.training.loss_chunk_tokens = 16
    config.training.rdrop_alpha = ALPHA
    model = Transformer(dataclasses.replace(CONFIG, dropout_rate=dropout_rate))
    optimizer, learning_rate = make_optimizer(config.optimizer, CONFIG.d_model)
    state = jax.jit(make_init_fn(model, optimizer, 9, 8))(0)
    return model, state, jax.jit(make_train_step(model, optimizer, learning_rate, config.training))


def hand_written_loss(model, params, data, key):
    """R-Drop's loss per example token, by hand: the batch's rows each repeated, the model run
    under dropout keyed by `key`, the unfused loss and the pairs' divergence."""
    repeated = {name: np.repeat(value, 2, axis=0) for name, value in data.items()}
    logits = model.apply(
        {"params": params},
        repeated["inputs"],
        shift_right(repeated["targets"]),
        deterministic=False,
        rngs={"dropout": key},
    )  # [2B, T, V]
    weights = (repeated["targets"] != 0).astype(np.float32)
    cross_entropy = token_losses(logits, repeated["targets"], weights, 0.1)["loss_sum"]
    log_probs = jax.nn.log_softmax(logits)
    log_p, log_q = log_probs[0::2], log_probs[1::2]
    divergence = 0.5 * jnp.sum((jnp.exp(log_p) - jnp.exp(log_q)) * (log_p - log_q), -1)  # [B, T]
    return (cross_entropy + ALPHA * jnp.sum(divergence * weights[::2])) / jnp.sum(weights)


# Without dropout (-m slow): the pair is one prediction twice, which the loss's own test checks
# (test_identical_copies_diverge_by_nothing_and_train_like_one); the step's pairing is checked at 0.1.
@pytest.mark.parametrize("dropout_rate", [pytest.param(0.0, marks=pytest.mark.slow), 0.1])
def test_the_train_step_pairs_every_row_with_itself_under_its_dropout_key(dropout_rate):
    model, state, train_fn = setup(dropout_rate)
    data = batch(3)
    _, metrics = train_fn(state, data)
    key = jax.random.fold_in(state.rng, 0)
    reference = jax.jit(jax.value_and_grad(hand_written_loss, argnums=1), static_argnums=0)  # one program
    loss, grads = reference(model, state.params, data, key)
    np.testing.assert_allclose(float(metrics["loss_sum"]) / float(metrics["weight"]), float(loss), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["grad_norm"]), float(optax.tree.norm(grads)), rtol=1e-4)
    assert float(metrics["weight"]) == float(np.sum(data["targets"] != 0))  # examples' tokens, counted once
    summary = summarize(jax.device_get(metrics))
    if dropout_rate == 0:
        assert summary["consistency"] < 1e-6  # one prediction twice
    else:
        assert summary["consistency"] > 1e-3  # two dropout draws


def test_rdrop_is_refused_for_a_masked_language_model_and_below_zero():
    config = default_config()
    config.training.rdrop_alpha = -1.0
    with pytest.raises(ConfigError, match=r"training.rdrop_alpha=-1.0: must be a finite number >= 0"):
        validate(config)
    config.training.rdrop_alpha = 5.0
    config.model.architecture = "encoder_only"
    with pytest.raises(ConfigError, match="masks each copy of a row differently"):
        validate(config)
