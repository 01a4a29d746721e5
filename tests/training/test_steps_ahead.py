import json
import signal
import subprocess
import sys

import pytest


class Outputs:
    """A step's outputs, as jax.block_until_ready sees them: waited for, or not yet."""

    def __init__(self, step: int, waited: list[int]):
        self.step, self.waited = step, waited

    def block_until_ready(self):
        self.waited.append(self.step)
        return self


def test_after_dispatching_a_step_the_loop_waits_for_the_one_before():
    """At most one step queued behind the one computing, and the next always queued before the
    wait: the device never waits on the loop's Python (its batch, its bookkeeping)."""
    from jaxformer.training.steps_ahead import StepsAhead

    ahead, waited = StepsAhead(), []
    for step in range(1, 6):
        ahead.dispatched({"loss": Outputs(step, waited)})
        assert waited == list(range(1, step))  # each step before this one, once, in order; not this one


# A tiny run of 12 steps, each slowed on the device (a host callback would not do: it makes JAX's
# CPU dispatch synchronous), on one CPU device as train.py runs here (with the 8 simulated devices
# JAX's CPU runtime itself kept the loop within two steps of the device). It notes how many steps
# the loop ran ahead of the device, and sends SIGTERM from a thread once the device has computed
# step 3, wherever the loop then is.
SLOWED_RUN = """
import json, os, signal, sys, threading
import jax, jax.numpy as jnp
from jaxformer.training import loop
from jaxformer.training.config_file import apply_overrides, load_config
from jaxformer.training.train_metrics import TrainMetrics

config = load_config("tiny")
steps = {"num_train_steps": 12, "log_every_steps": 12, "eval_every_steps": 12, "checkpoint_every_steps": 12}
overrides = [(f"training.{key}", str(value)) for key, value in steps.items()]
overrides += [("data.data_dir", sys.argv[2]), ("data.max_eval_examples", "8")]
apply_overrides(config, overrides + [("model.num_encoder_layers", "1"), ("model.num_decoder_layers", "1")])
real_make_step, real_add = loop.make_run_train_step, TrainMetrics.add

def make_slow_step(*args, **kwargs):
    train_step = real_make_step(*args, **kwargs)
    def step(state, batch):
        state, metrics = train_step(state, batch)
        spun = jax.lax.fori_loop(0, 3_000_000, lambda i, x: jnp.abs(jnp.sin(x + 1.0)), metrics["loss_sum"])
        return state, {**metrics, "loss_sum": metrics["loss_sum"] + jnp.minimum(spun, 0.0)}  # + 0
    return step

dispatched, unfinished, reached = [], [], []
def done():
    return sum(metrics["loss_sum"].is_ready() for metrics in dispatched)

def preempt_once_done(metrics):
    jax.block_until_ready(metrics)
    reached.append(done())
    os.kill(os.getpid(), signal.SIGTERM)

def noting_how_far_ahead(train_metrics, step, metrics):
    dispatched.append(metrics)
    unfinished.append(step - done())
    if step == 3:
        threading.Thread(target=preempt_once_done, args=(metrics,)).start()
    real_add(train_metrics, step, metrics)

loop.make_run_train_step, TrainMetrics.add = make_slow_step, noting_how_far_ahead
last = loop.train_and_evaluate(config, sys.argv[1])
print(json.dumps({"unfinished": unfinished, "reached": reached, "last": last}))
"""


@pytest.mark.slow  # a 12-step tiny run of slowed steps (about 15 s)
def test_a_sigterm_stops_the_run_at_the_step_the_device_computes_not_at_the_next_log_step(data_dir, tmp_path):
    """JAX dispatches steps asynchronously: the loop's Python ran up to the next log step (where
    it reads the metrics) ahead of the computation, and a SIGTERM, handled once it was back in
    Python, stopped the run there (50 steps on, with multi30k) instead of after the step under way."""
    from tests.training.test_loop import environment

    workdir = tmp_path / "run"
    command = [sys.executable, "-c", SLOWED_RUN, str(workdir), str(data_dir)]
    result = subprocess.run(command, env=environment(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads(result.stdout.splitlines()[-1])
    assert max(run["unfinished"]) <= 1, run  # the step just dispatched; before: up to the log step's 12
    last, reached = run["last"], run["reached"][0]
    assert last["stopped_by_signal"] == signal.SIGTERM and last["step"] <= reached + 2, run
    assert f"stopped by SIGTERM at step {last['step']}; checkpoint saved" in result.stderr
