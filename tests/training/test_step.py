"""The pure train step: (state, batch) -> (state, metrics), its dropout keyed by the state itself."""

import functools

import jax
import numpy as np
import pytest

from jaxformer.model.config import preset
from jaxformer.model.transformer import Transformer, shift_right
from jaxformer.training.experiment import default_config
from jaxformer.training.loss import token_losses
from jaxformer.training.optimizer import make_optimizer, rsqrt_schedule
from jaxformer.training.state import make_init_fn
from jaxformer.training.step import make_eval_step, make_train_step

# dropout 0.1: the key matters. One layer per stack: every kind of layer the step runs, at about a
# third less compilation than the preset's two.
CONFIG = preset("tiny", vocab_size=48, num_encoder_layers=1, num_decoder_layers=1)


def batch(seed):
    rng = np.random.default_rng(seed)
    inputs = rng.integers(4, 48, (4, 9)).astype(np.int32)
    targets = rng.integers(4, 48, (4, 8)).astype(np.int32)
    targets[1::2, 5:] = 0  # padding
    return {"inputs": inputs, "targets": targets}


@functools.cache  # one compilation of each step for the whole module: the states are immutable arrays
def setup(accumulation_steps=1):
    config = default_config()
    config.optimizer.warmup_steps = 3
    config.optimizer.accumulation_steps = accumulation_steps
    config.training.loss_chunk_tokens = 8  # 4 rows x 2 positions per chunk
    model = Transformer(CONFIG)
    optimizer, learning_rate = make_optimizer(config.optimizer, CONFIG.d_model)
    state = jax.jit(make_init_fn(model, optimizer, 9, 8))(0)
    return model, state, jax.jit(make_train_step(model, optimizer, learning_rate, config.training)), config


def dropout_loss(model, params, data, key):
    """The unfused label-smoothed loss sum of `data` under dropout keyed by `key`."""
    logits = model.apply(
        {"params": params}, data["inputs"], shift_right(data["targets"]), deterministic=False, rngs={"dropout": key}
    )
    return token_losses(logits, data["targets"], (data["targets"] != 0).astype(np.float32), 0.1)["loss_sum"]


@pytest.mark.parametrize("steps_before", [0, 3])
def test_dropout_is_keyed_by_fold_in_of_the_state_step(steps_before):
    model, state, train_fn, _ = setup()
    for seed in range(steps_before):
        state, _ = train_fn(state, batch(100 + seed))
    assert int(state.step) == steps_before
    data = batch(7)
    _, metrics = train_fn(state, data)
    loss = jax.jit(functools.partial(dropout_loss, model))
    own = loss(state.params, data, jax.random.fold_in(state.rng, steps_before))
    other = loss(state.params, data, jax.random.fold_in(state.rng, steps_before + 1))
    np.testing.assert_allclose(metrics["loss_sum"], own, rtol=1e-5)
    assert abs(float(own) - float(other)) > 1e-3  # so the key is really told apart


def test_the_step_is_pure_and_counts_micro_batches():
    _, state, train_fn, config = setup(accumulation_steps=2)
    first, metrics = train_fn(state, batch(0))
    again, metrics_again = train_fn(state, batch(0))  # same state and batch: same step, whatever ran before
    jax.tree.map(
        np.testing.assert_array_equal, jax.device_get((first, metrics)), jax.device_get((again, metrics_again))
    )
    rates = [float(metrics["learning_rate"])]
    state = first
    for seed in range(1, 4):
        state, metrics = train_fn(state, batch(seed))
        rates.append(float(metrics["learning_rate"]))
        assert int(state.step) == seed + 1  # every micro-batch is a train step
    schedule = rsqrt_schedule(CONFIG.d_model, config.optimizer.warmup_steps)
    np.testing.assert_allclose(rates, [schedule(0), schedule(0), schedule(1), schedule(1)], rtol=1e-6)  # per update


def test_eval_step_sums_the_deterministic_loss():
    model, state, _, config = setup()
    data = batch(3)
    metrics = jax.jit(make_eval_step(model, config.training))(state.params, data)
    logits = model.apply({"params": state.params}, data["inputs"], shift_right(data["targets"]), deterministic=True)
    expected = token_losses(logits, data["targets"], (data["targets"] != 0).astype(np.float32), 0.1)
    for key, value in expected.items():
        np.testing.assert_allclose(metrics[key], value, rtol=1e-6, err_msg=key)
    assert float(metrics["source_tokens"]) == data["inputs"].size


def test_bfloat16_matmuls_reach_the_fused_output_loss():
    """Under matmul_dtype=bfloat16 the step's fused output projection rounds its operands as the
    model's own logits do: the step's loss is the unfused loss of the same model with the same
    dropout key, and differs from the float32 model's."""
    mixed = CONFIG.replace(matmul_dtype="bfloat16")
    model = Transformer(mixed)
    _, state, _, config = setup()
    optimizer, learning_rate = make_optimizer(config.optimizer, mixed.d_model)
    step = jax.jit(make_train_step(model, optimizer, learning_rate, config.training))
    data = batch(11)
    new_state, metrics = step(state, data)
    key = jax.random.fold_in(state.rng, 0)
    expected = jax.jit(functools.partial(dropout_loss, model))(state.params, data, key)
    np.testing.assert_allclose(metrics["loss_sum"], expected, rtol=1e-5)
    full = jax.jit(functools.partial(dropout_loss, Transformer(CONFIG)))(state.params, data, key)
    assert abs(float(full) - float(expected)) > 1e-5
    assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(new_state.params))
