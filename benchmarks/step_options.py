"""Interleaved A/B of the train step's implementation choices, at fixed shapes, in one run.

    python -m benchmarks.step_options [--configs small,base] [--iters 10] [--json FILE]

Each variant is the project's train step (benchmarks.common.make_train's, dropout on) with one
choice changed; the variants of a config are timed in turn, one step of each per round, so a busy
machine slows all alike and `speedup` (the baseline's median step time over the variant's) holds.

- `flax_dropout`: every dropout through `flax.linen.Dropout` and `jax.random.bernoulli` (jax's
  Threefry, a rolled loop on CPU), as before `jaxformer/model/dropout.py`: the baseline. The
  other rows use the fused dropout, which draws the same masks.
- `fused_dropout`: jaxformer's dropout, loss chunks of `training.loss_chunk_tokens`'s default.
- `loss_chunk_N`: the fused dropout with the output projection and loss in chunks of N target
  tokens (`training.loss_chunk_tokens`).
- `no_dropout`: dropout rate 0, the floor any dropout implementation can reach.
- `rbg_dropout`, `unsafe_rbg_dropout`: the masks from `jax.random.bernoulli` under jax's other
  random-bit generators (`jax_default_prng_impl`: XLA's RngBitGenerator, with Threefry or no
  Threefry at all for splitting and folding in), which large JAX trainers use on TPUs as the
  cheaper generator; different bits from the same seed.
- `vd_embedding_grad`: the fused dropout with the output embedding's gradient contracted
  straight to [V, D] in each loss chunk, as `jaxformer/training/output_loss.py` did before it
  accumulated [D, V] and transposed the sum once.
- `bfloat16`: the fused dropout with `model.dtype=bfloat16` (float32 parameters): the weight
  projections through `jaxformer/model/projection.py`, whose forward pass and both gradients
  are bf16 x bf16 -> float32 dots (the CPU's bf16 dot instructions where it has them).
- `bfloat16_matmuls`: the fused dropout with `model.matmul_dtype=bfloat16` under float32
  compute: only the weight products' operands (Q, K, V, W^O, the feed-forward pair and the
  fused output projection) are rounded to bf16, bf16 x bf16 -> float32 dots both ways; the
  residual stream, LayerNorm, softmax and attention scores stay float32 (a TPU's default matmul
  precision).
- `rdrop`: the fused dropout with R-Drop (`training.rdrop_alpha=5`): every row twice, under two
  dropout draws, and the pairs' divergence in the fused loss; what a step of `multi30k` costs.
- `rdrop_exp`: `rdrop` with the divergence's probabilities exponentiated again from the
  log-probabilities, as `loss.pair_consistency` did before it took the softmax `token_terms` has.
- `bfloat16_autodiff`: `bfloat16`, the projections a plain bf16 einsum differentiated by jax, as
  before that module: bf16-output gradient dots, which XLA:CPU runs on a slower path.
  No bf16 row is in `--smoke`: XLA:CPU (jax 0.10.2) leaves some of the tiny model's bf16 dots
  out of its YNNPACK fusions, and its fallback (DotThunk) has no
  bf16 x bf16 -> float32 dot, so bf16 training of models that small fails on a CPU.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp

from benchmarks.command_line import add_configs_flag, parse_args, parser, report
from benchmarks.common import (
    CONFIGS,
    SMOKE,
    TrainSteps,
    compile_timed,
    jax_config,
    median,
    random_batch,
    time_interleaved,
)
from jaxformer.model import attention, decoder, encoder, layers
from jaxformer.model.architectures import build_model
from jaxformer.training import output_loss
from jaxformer.training.experiment import default_config
from jaxformer.training.loss import logits_gradient, pair_consistency, token_terms, weighted_sums
from jaxformer.training.objectives import objective_for
from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.state import make_init_fn
from jaxformer.training.step import make_train_step

COLUMNS = (
    "config",
    "variant",
    "batch",
    "src_len",
    "tgt_len",
    "loss_chunk_tokens",
    "step_ms",
    "tokens_per_s",
    "speedup",
)
CHUNKS = (256, 128)
RDROP_ALPHA = 5.0  # multi30k's


def bernoulli_dropout(inputs, rate: float, key):
    """Inverted dropout on a `jax.random.bernoulli` mask, as `flax.linen.Dropout` computes it."""
    keep = jax.random.bernoulli(key, 1.0 - rate, inputs.shape)
    return jnp.where(keep, inputs / (1.0 - rate), 0.0).astype(inputs.dtype)


@contextlib.contextmanager
def flax_dropout() -> Iterator[None]:
    """While open, the model's modules build `flax.linen.Dropout` and attention draws its mask
    with `jax.random.bernoulli` (trace and compile inside)."""
    saved = [(module, "Dropout", module.Dropout) for module in (encoder, decoder, layers)]
    saved.append((attention, "dropout", attention.dropout))
    for module, name, _ in saved[:-1]:
        setattr(module, name, nn.Dropout)
    attention.dropout = bernoulli_dropout
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _vd_sums_and_grads(hidden, embedding, bias, targets, weights, smoothing, chunk_tokens, compute_dtype, rdrop_alpha):
    """`output_loss._sums_and_grads` as it was (float32, no bias, no R-Drop): each chunk's
    embedding gradient contracted to [V, D] and summed as [V, D]."""
    if rdrop_alpha:
        raise ValueError("the [V, D] embedding-gradient row times plain steps only (training.rdrop_alpha=0)")
    batch, length, d_model = hidden.shape
    chunk = output_loss.chunk_length(batch, length, chunk_tokens)
    num_chunks = length // chunk

    def one_chunk(hidden, targets, weights):
        logits = jnp.einsum("BTD,VD->BTV", hidden, embedding, preferred_element_type=jnp.float32)
        terms = token_terms(logits, targets, smoothing)
        sums = {k: v for k, v in weighted_sums(terms, weights).items() if k in output_loss._SUMS}
        grad_logits = logits_gradient(terms, weights, smoothing)
        grad_hidden = jnp.einsum("BTV,VD->BTD", grad_logits, embedding, preferred_element_type=jnp.float32)
        grad_embedding = jnp.einsum("BTV,BTD->VD", grad_logits, hidden, preferred_element_type=jnp.float32)
        return sums, grad_hidden, grad_embedding

    def split(x):  # [B, T, ...] -> [C, B, t, ...]
        return jnp.moveaxis(x.reshape(batch, num_chunks, chunk, *x.shape[2:]), 1, 0)

    def body(carry, pieces):
        sums, grad_embedding = carry
        piece_sums, grad_hidden, piece_grad_embedding = one_chunk(*pieces)
        return (jax.tree.map(jnp.add, sums, piece_sums), grad_embedding + piece_grad_embedding), grad_hidden

    initial = ({key: jnp.zeros((), jnp.float32) for key in output_loss._SUMS}, jnp.zeros(embedding.shape))
    (sums, grad_embedding), grad_hidden = jax.lax.scan(body, initial, (split(hidden), split(targets), split(weights)))
    return sums, jnp.moveaxis(grad_hidden, 0, 1).reshape(batch, length, d_model), (grad_embedding, None)


@contextlib.contextmanager
def prng_impl(name: str) -> Iterator[None]:
    """While open, jax's keys (the train state's dropout key included) are of generator `name`
    (`jax_default_prng_impl`), so the model's dropout draws with `jax.random.bernoulli` on them
    (trace and compile inside)."""
    with jax_config("jax_default_prng_impl", name):
        yield


@contextlib.contextmanager
def vd_embedding_grad() -> Iterator[None]:
    """While open, the fused output loss computes the embedding's gradient as [V, D] in each
    chunk (`_vd_sums_and_grads`; trace and compile inside)."""
    current = output_loss._sums_and_grads
    output_loss._sums_and_grads = _vd_sums_and_grads
    try:
        yield
    finally:
        output_loss._sums_and_grads = current


@contextlib.contextmanager
def exponentiated_pair_probs() -> Iterator[None]:
    """While open, R-Drop's pair divergence computes its probabilities as exp(log-probabilities)
    instead of taking the softmax from `token_terms` (trace and compile inside)."""
    current = output_loss.pair_consistency
    output_loss.pair_consistency = lambda log_probs, probs: pair_consistency(log_probs, jnp.exp(log_probs))
    try:
        yield
    finally:
        output_loss.pair_consistency = current


def _plain_projection(spec, inputs, kernel, operand_dtype=None):
    """A plain einsum of the inputs as they come (the bfloat16 model's own operand dtype)."""
    del operand_dtype
    return jnp.einsum(spec, inputs, kernel)


@contextlib.contextmanager
def autodiff_projections() -> Iterator[None]:
    """While open, the model's weight projections are plain einsums differentiated by jax
    (trace and compile inside)."""
    saved = [(module, module.project) for module in (attention, layers)]
    for module, _ in saved:
        module.project = _plain_projection
    try:
        yield
    finally:
        for module, value in saved:
            module.project = value


def compiled_step(
    config, batch: dict, source_length: int, target_length: int, loss_chunk_tokens: int, rdrop_alpha: float = 0.0
) -> TrainSteps:
    """The train step of `config` with `training.loss_chunk_tokens` and `training.rdrop_alpha`
    set, compiled and ready to run."""
    experiment = default_config()
    experiment.training.loss_chunk_tokens = loss_chunk_tokens
    experiment.training.rdrop_alpha = rdrop_alpha
    model = build_model(config)
    optimizer, learning_rate = make_optimizer(experiment.optimizer, config.d_model)
    state = jax.jit(make_init_fn(model, optimizer, source_length, target_length))(0)
    step = make_train_step(model, optimizer, learning_rate, experiment.training, objective_for(config))
    compiled, _ = compile_timed(jax.jit(step, donate_argnums=0), state, batch)
    return TrainSteps(compiled, state, batch)


def bench(
    name: str, config, batch_size: int, source_length: int, target_length: int, iters: int, bfloat16: bool = True
) -> list[dict]:
    batch = random_batch(0, config, batch_size, source_length, target_length)
    default_chunk = default_config().training.loss_chunk_tokens
    plain = contextlib.nullcontext
    variants = {  # name: (model config, loss chunk tokens, what its step is traced under, R-Drop's alpha)
        "flax_dropout": (config, default_chunk, flax_dropout, 0.0),
        "fused_dropout": (config, default_chunk, plain, 0.0),
        **{f"loss_chunk_{chunk}": (config, chunk, plain, 0.0) for chunk in CHUNKS if chunk != default_chunk},
        "no_dropout": (config.replace(dropout_rate=0.0), default_chunk, plain, 0.0),
        "rbg_dropout": (config, default_chunk, functools.partial(prng_impl, "rbg"), 0.0),
        "unsafe_rbg_dropout": (config, default_chunk, functools.partial(prng_impl, "unsafe_rbg"), 0.0),
        "vd_embedding_grad": (config, default_chunk, vd_embedding_grad, 0.0),
        "rdrop": (config, default_chunk, plain, RDROP_ALPHA),
        "rdrop_exp": (config, default_chunk, exponentiated_pair_probs, RDROP_ALPHA),
    }
    if bfloat16:
        variants["bfloat16"] = (config.replace(dtype="bfloat16"), default_chunk, plain, 0.0)
        variants["bfloat16_matmuls"] = (config.replace(matmul_dtype="bfloat16"), default_chunk, plain, 0.0)
        variants["bfloat16_autodiff"] = (config.replace(dtype="bfloat16"), default_chunk, autodiff_projections, 0.0)
    steps = {}
    for variant, (variant_config, chunk, context, rdrop_alpha) in variants.items():
        with context():
            steps[variant] = compiled_step(variant_config, batch, source_length, target_length, chunk, rdrop_alpha)
    seconds = {variant: median(times) for variant, times in time_interleaved(steps, iters).items()}
    return [
        {
            "config": name,
            "variant": variant,
            "batch": batch_size,
            "src_len": source_length,
            "tgt_len": target_length,
            "loss_chunk_tokens": variants[variant][1],
            "step_ms": 1000 * seconds[variant],
            "tokens_per_s": batch_size * target_length / seconds[variant],
            "speedup": seconds["flax_dropout"] / seconds[variant],
        }
        for variant in steps
    ]


def main(argv=None) -> list[dict]:
    arguments = parser("step_options", __doc__)
    default_configs = ["small", "base"]
    add_configs_flag(arguments, default_configs)
    args = parse_args(arguments, argv, smoke_sets={"configs": default_configs})
    sizes = {"smoke": SMOKE} if args.smoke else {name: CONFIGS[name]() for name in args.configs}
    iters = args.iters or (2 if args.smoke else 10)
    rows = [row for name, size in sizes.items() for row in bench(name, *size, iters, bfloat16=not args.smoke)]
    notes = ["  speedup: flax_dropout's median step time over the row's, timed interleaved in this run"]
    return report("step_options", rows, COLUMNS, args.json, "train-step options, interleaved", notes)


if __name__ == "__main__":
    main()
