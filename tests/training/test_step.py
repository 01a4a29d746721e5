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
def setup(accumulation_steps=1, model_config=CONFIG, eps=None):
    config = default_config()
    config.optimizer.warmup_steps = 3
    if eps is not None:
        config.optimizer.eps = eps
    config.optimizer.accumulation_steps = accumulation_steps
    config.training.loss_chunk_tokens = 8  # 4 rows x 2 positions per chunk
    model = Transformer(model_config)
    optimizer, learning_rate = make_optimizer(config.optimizer, model_config.d_model)
    state = jax.jit(make_init_fn(model, optimizer, 9, 8))(0)
    step = make_train_step(model, optimizer, learning_rate, config.training, accumulation_steps=accumulation_steps)
    return model, state, jax.jit(step), config


def dropout_loss(model, params, data, key):
    """The unfused label-smoothed loss sum of `data` under dropout keyed by `key`."""
    logits = model.apply(
        {"params": params}, data["inputs"], shift_right(data["targets"]), deterministic=False, rngs={"dropout": key}
    )
    return token_losses(logits, data["targets"], (data["targets"] != 0).astype(np.float32), 0.1)["loss_sum"]


# slow: a state at step 0 (about 2 s); covered in the default suite by [3], whose key fold_in(rng, 3) a key
# fixed at step 0's would miss.
@pytest.mark.parametrize("steps_before", [pytest.param(0, marks=pytest.mark.slow), 3])
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


def test_the_step_is_pure_and_every_step_is_an_update():
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
        assert int(state.step) == seed + 1
    schedule = rsqrt_schedule(CONFIG.d_model, config.optimizer.warmup_steps)
    np.testing.assert_allclose(rates, [schedule(step) for step in range(4)], rtol=1e-6)  # one update a step


@pytest.mark.slow  # about 30 s of compiling two steps: the default suite is near its 10-minute limit
def test_micro_batches_give_the_whole_batchs_token_weighted_update():
    """Micro-batches of unequal token counts (rows 0 and 2 full, 1 and 3 padded): their summed
    gradients over the whole batch's weight are one batch's gradient, not a mean of means."""
    still = CONFIG.replace(dropout_rate=0.0)
    # Adam's eps far above every gradient: its first update is linear in the gradient (not its sign).
    _, state, whole_step, _ = setup(1, still, eps=1e3)
    _, _, accumulating_step, _ = setup(2, still, eps=1e3)
    data = batch(5)
    assert (data["targets"][0::2] != 0).sum() != (data["targets"][1::2] != 0).sum()
    whole, whole_metrics = whole_step(state, data)
    accumulated, metrics = accumulating_step(state, data)
    for key in ("loss_sum", "weight", "nll_sum", "correct", "source_tokens", "grad_norm", "learning_rate"):
        np.testing.assert_allclose(metrics[key], whole_metrics[key], rtol=2e-5, err_msg=key)
    moved = jax.tree.map(lambda new, old: new - old, whole.params, state.params)
    moved_accumulated = jax.tree.map(lambda new, old: new - old, accumulated.params, state.params)
    # new - old is exact only to the new parameter's last bit: a summation order that rounds an
    # update the other way moves it one unit in the last place (seen once in the slow set), far
    # below what a mean of the micro-batches' means would change (16 against 10 tokens), and half
    # the elements move more than 1,000 units. 1e-12: the key biases, whose gradient is zero but
    # for rounding (softmax ignores them).
    for path, a, b, new in zip(
        *zip(*jax.tree.leaves_with_path(moved_accumulated)), jax.tree.leaves(moved), jax.tree.leaves(whole.params)
    ):
        a, b, last_bit = np.asarray(a), np.asarray(b), np.spacing(np.abs(np.asarray(new)))
        far = np.abs(a - b) > last_bit + 1e-12 + 1e-4 * np.abs(b)
        assert not far.any(), (
            f"{jax.tree_util.keystr(path)}: {far.sum()} of {far.size} differ: {a[far][:4]} against {b[far][:4]}"
        )
    assert int(accumulated.step) == int(whole.step) == 1


def test_each_micro_batch_has_its_own_dropout_key():
    model, state, accumulating_step, _ = setup(accumulation_steps=2)
    data = batch(6)
    _, metrics = accumulating_step(state, data)
    loss = jax.jit(functools.partial(dropout_loss, model))
    parts = [{key: value[index::2] for key, value in data.items()} for index in range(2)]  # rows i, i + 2
    keys = [jax.random.fold_in(state.dropout_key(), index) for index in range(2)]
    np.testing.assert_allclose(
        metrics["loss_sum"], sum(loss(state.params, p, k) for p, k in zip(parts, keys)), rtol=1e-5
    )


def test_eval_step_sums_the_deterministic_loss():
    model, state, _, config = setup()
    data = batch(3)
    metrics = jax.jit(make_eval_step(model, config.training))(state.params, data)
    logits = model.apply({"params": state.params}, data["inputs"], shift_right(data["targets"]), deterministic=True)
    expected = token_losses(logits, data["targets"], (data["targets"] != 0).astype(np.float32), 0.1)
    for key, value in expected.items():
        np.testing.assert_allclose(metrics[key], value, rtol=1e-6, err_msg=key)
    assert float(metrics["source_tokens"]) == data["inputs"].size


@pytest.mark.slow  # to the slow set (about 8 s): the default suite ran 10 min 28 s on a 2-core Intel VM (2026-12-06)
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
