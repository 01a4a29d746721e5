"""Shared pieces of the benchmarks: configs, analytic FLOPs, timing and the jitted train step
(their command line and table: command_line.py)."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.configs import multi30k
from jaxformer.model.architectures import build_model
from jaxformer.model.config import TransformerConfig, preset
from jaxformer.model.transformer import Transformer
from jaxformer.tokens import NUM_SPECIAL_TOKENS
from jaxformer.training.experiment import default_config, model_config
from jaxformer.training.objectives import objective_for
from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.state import init_params, make_init_fn
from jaxformer.training.step import make_train_step

# ------------------------------------------------------------------------------------------
# Model sizes.
# ------------------------------------------------------------------------------------------

# name -> (model config, batch size, source length, target length)
CONFIGS: dict[str, Callable[[], tuple[TransformerConfig, int, int, int]]] = {
    "tiny": lambda: (preset("tiny"), 32, 64, 64),
    "small": lambda: (
        preset(
            "base", vocab_size=8192, d_model=256, num_heads=4, d_ff=1024, num_encoder_layers=3, num_decoder_layers=3
        ),
        32,
        64,
        64,
    ),
    "base": lambda: (preset("base", vocab_size=32_000), 16, 64, 64),
    "multi30k": lambda: _experiment_shapes(multi30k.get_config()),
}


def _experiment_shapes(experiment) -> tuple[TransformerConfig, int, int, int]:
    """An experiment config's model (its tokenizer.vocab_size pieces: per language, separate
    embeddings, where the config has separate vocabularies, as multi30k does) and training batch:
    data.batch_size packed rows of data.max_length tokens each side. The model computes in float32
    whatever the config's matmul_dtype: the benchmarks compare precisions as rows of their own."""
    model = model_config(experiment, experiment.tokenizer.vocab_size).replace(matmul_dtype=None)
    return model, experiment.data.batch_size, experiment.data.max_length, experiment.data.max_length


# --smoke: the tiny preset on a few short rows.
SMOKE = (preset("tiny"), 4, 16, 16)


def small_config(**overrides: Any) -> TransformerConfig:
    """The `small` model (vocab 8192 shared, d 256, 4 heads, 3+3 layers, d_ff 1024): a small
    translator, not jaxformer/configs/multi30k.py's model (that is the `multi30k` size)."""
    return CONFIGS["small"]()[0].replace(**overrides)


# ------------------------------------------------------------------------------------------
# Analytic FLOPs.
# ------------------------------------------------------------------------------------------


def forward_flops(config: TransformerConfig, batch: int, source_length: int, target_length: int) -> float:
    """Matmul FLOPs of one forward pass (2 FLOPs per multiply-add), counted from the config.

    With D = d_model, F = d_ff, V = vocab_size, S / T = source / target length, per row:

      encoder layer:  Q, K, V, O projections 4 * 2SD^2; scores QK^T 2S^2D; weighted sum 2S^2D;
                      FFN 2 * 2SDF
      decoder layer:  self-attention 4 * 2TD^2 + 2 * 2T^2D;
                      cross-attention Q, O on the target 2 * 2TD^2, K, V on the source 2 * 2SD^2,
                      scores and weighted sum 2 * 2TSD; FFN 2 * 2TDF
      output:         logits against the whole vocabulary 2TDV

    A decoder-only model (`config.architecture == "decoder_only"`) has no encoder and no
    cross-attention: `num_decoder_layers` self-attention + FFN layers over the T target tokens,
    and the output; `source_length` is not read.

    Attention is counted over the full T x T (and S x S, T x S) score matrices, masked entries
    included, since that is what the einsum implementation computes. Embedding lookups, softmax,
    LayerNorm, biases and the loss are not matmuls and are left out. A training step costs
    3x this (the backward pass is two matmuls per forward matmul): see `train_flops`.
    """
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    s, t = source_length, target_length
    encoder_layer = 8 * s * d * d + 4 * s * s * d + 4 * s * d * f
    cross_attention = 4 * t * d * d + 4 * s * d * d + 4 * t * s * d
    decoder_layer = 8 * t * d * d + 4 * t * t * d + 4 * t * d * f
    output = 2 * t * d * v
    if config.architecture == "decoder_only":
        return float(batch) * (config.num_decoder_layers * decoder_layer + output)
    decoder_layer += cross_attention
    per_row = config.num_encoder_layers * encoder_layer + config.num_decoder_layers * decoder_layer + output
    return float(batch) * per_row


def train_flops(config: TransformerConfig, batch: int, source_length: int, target_length: int) -> float:
    """Model FLOPs of one training step: 3x `forward_flops` (forward + backward)."""
    return 3.0 * forward_flops(config, batch, source_length, target_length)


# ------------------------------------------------------------------------------------------
# Timing.
# ------------------------------------------------------------------------------------------


def time_calls(fn: Callable[[], Any], iters: int, budget_s: float = float("inf"), warmup: int = 1) -> list[float]:
    """Seconds per call of `fn()` (results blocked on), after `warmup` untimed calls.

    Stops early, after at least one timed call, once the timed calls have used `budget_s`.
    """
    return time_interleaved({"fn": fn}, iters, budget_s, warmup)["fn"]


def time_interleaved(
    fns: Mapping[str, Callable[[], Any]], iters: int, budget_s: float = float("inf"), warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds per call of each of `fns` (results blocked on), timed in turn: `iters` rounds of
    one call of each, after `warmup` untimed calls of each. A slow moment on a shared machine
    then falls on every function alike, so the ratio of their times holds up better than that
    of runs one after the other.

    Stops early, after at least one round, once one function's timed calls have used `budget_s`.
    """
    for fn in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(fn())
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
        if max(sum(seconds) for seconds in times.values()) > budget_s:
            break
    return times


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


class TrainSteps:
    """Calls `compiled(state, batch)`, a train step that donates its state, each call on the
    state the previous one returned: `runner()` takes one step and returns its metrics."""

    def __init__(self, compiled, state: Any, batch: dict):
        self.compiled, self.state, self.batch = compiled, state, batch

    def __call__(self) -> Any:
        self.state, metrics = self.compiled(self.state, self.batch)
        return metrics


def time_train_steps(compiled, state: Any, batch: dict, iters: int, budget_s: float) -> tuple[float, Any]:
    """(median seconds per call, the state after the last call) of `compiled(state, batch)`, a
    train step that donates its state: each call takes the state the previous one returned."""
    steps = TrainSteps(compiled, state, batch)
    seconds = median(time_calls(steps, iters, budget_s))
    return seconds, steps.state


def compile_timed(jitted, *args) -> tuple[Any, float]:
    """(compiled executable, seconds spent lowering and compiling) for `jitted(*args)`."""
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return compiled, time.perf_counter() - start


def memory_bytes(compiled) -> dict[str, float]:
    """Argument, output, temporary and total (less aliased) bytes of a compiled program; NaN where unknown."""
    try:
        stats = compiled.memory_analysis()
        argument, output = float(stats.argument_size_in_bytes), float(stats.output_size_in_bytes)
        temp, alias = float(stats.temp_size_in_bytes), float(stats.alias_size_in_bytes)
    except Exception:  # some backends return None or raise
        return {"argument": math.nan, "output": math.nan, "temp": math.nan, "total": math.nan}
    return {"argument": argument, "output": output, "temp": temp, "total": argument + output + temp - alias}


def xla_flops(compiled) -> float:
    """XLA's own FLOP count of a compiled program (NaN where the backend gives none)."""
    try:
        analysis = compiled.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
        return float(analysis.get("flops", math.nan))
    except Exception:
        return math.nan


def matmul_rates_gflops(size: int = 2048, iters: int = 5) -> list[float]:
    """Float32 GFLOP/s of each of `iters` calls of a jitted [size, size] @ [size, size] on the
    default device (after one untimed call): what MFU is measured against."""
    keys = jax.random.split(jax.random.key(0), 2)
    a = jax.random.normal(keys[0], (size, size), jnp.float32)
    b = jax.random.normal(keys[1], (size, size), jnp.float32)
    matmul = jax.jit(jnp.dot)
    return [2.0 * size**3 / seconds / 1e9 for seconds in time_calls(lambda: matmul(a, b), iters)]


def torch_matmul_peak_gflops(size: int = 2048, iters: int = 5) -> float:
    """The same float32 matmul rate (median of `iters` calls) for torch on the CPU, for comparison."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2.0 * size**3 / median(time_calls(lambda: torch.mm(a, b), iters)) / 1e9


# ------------------------------------------------------------------------------------------
# Batches and the train step (as jaxformer/training/loop.py builds it, on one device).
# ------------------------------------------------------------------------------------------


def random_batch(
    seed: int,
    config: TransformerConfig,
    batch: int,
    source_length: int,
    target_length: int,
    features: Sequence[str] = ("inputs", "targets"),
) -> dict[str, np.ndarray]:
    """Dense rows of random non-special tokens (no padding), int32: {"inputs", "targets"}, or
    only the `features` named (a language model's objective reads one side). Each side's ids
    come from its own vocabulary: the inputs from `config.encoder_vocab_size` (the source's, with
    separate vocabularies), the targets from `config.vocab_size`."""
    rng = np.random.default_rng(seed)
    data = {
        "inputs": rng.integers(NUM_SPECIAL_TOKENS, config.encoder_vocab_size, (batch, source_length), dtype=np.int32),
        "targets": rng.integers(NUM_SPECIAL_TOKENS, config.vocab_size, (batch, target_length), dtype=np.int32),
    }
    return {name: data[name] for name in features}


def make_train(config: TransformerConfig, source_length: int, target_length: int, seed: int = 0):
    """(initial TrainState, jitted `(state, batch) -> (state, metrics)`): the project's model of
    `config.architecture` (`build_model`) and its objective (`objective_for`: translation, or the
    causal LM for "decoder_only"), optimizer, init function and train step with the experiment
    config's default `optimizer` and `training` sections, jitted as the training loop does
    (state donated), on one device."""
    experiment = default_config()
    model = build_model(config)
    optimizer, learning_rate = make_optimizer(experiment.optimizer, config.d_model)
    state = jax.jit(make_init_fn(model, optimizer, source_length, target_length))(seed)
    train_step = make_train_step(model, optimizer, learning_rate, experiment.training, objective_for(config))
    return state, jax.jit(train_step, donate_argnums=0)


def random_params(config: TransformerConfig, seed: int = 0) -> Any:
    """Random plain (unboxed) parameters of `Transformer(config)`."""
    return jax.jit(lambda key: init_params(Transformer(config), key, 4, 4))(jax.random.key(seed))


def torch_available() -> bool:
    """Whether torch imports: installed, and not broken (a library it cannot load, a Python it was
    not built for), so that --torch skips its rows with a note instead of a traceback."""
    try:
        import torch  # noqa: F401
    except (ImportError, OSError):  # a torch built against missing shared libraries raises OSError
        return False
    return True


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@contextlib.contextmanager
def jax_config(name: str, value: Any) -> Iterator[None]:
    """jax's config option `name` set to `value` while open, its earlier value put back after."""
    previous = getattr(jax.config, name)
    jax.config.update(name, value)
    try:
        yield
    finally:
        jax.config.update(name, previous)
