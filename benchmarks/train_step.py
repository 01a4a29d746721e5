"""Fixed-shape train-step throughput and model-FLOPs utilisation (MFU).

    python -m benchmarks.train_step [--configs tiny,small,base] [--architecture decoder_only]
        [--iters 10] [--torch] [--json FILE]

Each config trains on one batch of dense random rows (no padding) with the project's train step
(jaxformer.training.step.train_step, Adam + clipping, dropout on), jitted as the training loop
does: the translator (`--architecture encoder_decoder`, the default) or a decoder-only causal
language model of the same size (`--architecture decoder_only`: the decoder's layers without
cross-attention, the CausalLanguageModel objective, no source side). With --torch the PyTorch
reference of the same architecture trains on the same batch, its steps interleaved with
jaxformer's (one of each per round), so a busy machine slows both alike. MFU is the analytic
model FLOP rate (benchmarks.common.train_flops) over the float32 matmul rate of a jitted
2048 x 2048 `jnp.dot` measured in the same run: the median of 10 calls (the statistic the step
times use), measured before and after the rows, the higher of the two. `mfu_vs_fastest_pct` is
the stricter figure against the fastest single matmul call seen.
"""

from __future__ import annotations

from benchmarks.command_line import add_configs_flag, check_torch, parse_args, parser, report
from benchmarks.common import (
    CONFIGS,
    SMOKE,
    TrainSteps,
    compile_timed,
    make_train,
    matmul_rates_gflops,
    median,
    random_batch,
    time_interleaved,
    torch_matmul_peak_gflops,
    train_flops,
    xla_flops,
)
from jaxformer.model.config import ARCHITECTURES
from jaxformer.training.experiment import default_config
from jaxformer.training.objectives import objective_for
from jaxformer.training.state import count_parameters

COLUMNS = (
    "config",
    "impl",
    "batch",
    "src_len",
    "tgt_len",
    "params_M",
    "compile_s",
    "step_ms",
    "tokens_per_s",
    "model_gflop",
    "xla_gflop",
    "achieved_gflops",
    "peak_gflops",
    "mfu_pct",
    "mfu_vs_fastest_pct",
    "jax_over_torch",
)
# The architectures with a torch reference (benchmarks/torch_reference.py's MODELS).
BENCHMARKED = ("encoder_decoder", "decoder_only")


def torch_step(config, data: dict):
    """(parameter count, `() -> loss`: one step of the torch reference of `config.architecture`
    on `data`, the batch jaxformer trains on)."""
    from benchmarks import torch_reference as reference

    model = reference.build(config, max_length=max(v.shape[1] for v in data.values()))
    step = reference.make_train_step(model, config.d_model)
    tensors = [reference.as_tensor(value) for value in data.values()]  # (source,) targets
    return sum(p.numel() for p in model.parameters()), lambda: step(*tensors)


def bench(
    name: str, config, batch: int, source_length: int, target_length: int, iters: int, budget_s: float, with_torch: bool
) -> list[dict]:
    """The jaxformer row and, with torch, the torch row of one config, their steps timed in turn."""
    if config.architecture == "decoder_only":
        source_length = None  # no source side: the model reads the targets only
    features = objective_for(config).features
    data = random_batch(0, config, batch, source_length or 1, target_length, features)
    state, train_fn = make_train(config, source_length or 1, target_length)
    compiled, compile_s = compile_timed(train_fn, state, data)
    calls, params = {"jaxformer": TrainSteps(compiled, state, data)}, {"jaxformer": count_parameters(state.params)}
    if with_torch:
        params["torch"], calls["torch"] = torch_step(config, data)
    times = time_interleaved(calls, iters, budget_s)
    flops = train_flops(config, batch, source_length or 0, target_length)
    rows = []
    for impl, seconds in ((impl, median(times[impl])) for impl in calls):
        rows.append(
            dict(
                config=name,
                architecture=config.architecture,
                impl=impl,
                batch=batch,
                src_len=source_length,
                tgt_len=target_length,
                params_M=params[impl] / 1e6,
                params=params[impl],
                step_ms=seconds * 1e3,
                tokens_per_s=batch * target_length / seconds,
                model_gflop=flops / 1e9,
                achieved_gflops=flops / seconds / 1e9,
            )
        )
    rows[0].update(compile_s=compile_s, xla_gflop=xla_flops(compiled) / 1e9)
    if with_torch:
        rows[0]["jax_over_torch"] = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    return rows


def model_settings(config) -> str:
    """What a config's model trains with beyond its sizes: norm, activation, dropout, embeddings."""
    if config.share_embeddings:
        embeddings = "one embedding for both sides"
    else:
        embeddings = f"a separate source embedding ({config.encoder_vocab_size} pieces)"
    return (
        f"{config.normalization}-norm, {config.activation}, dropout {config.dropout_rate} (attention "
        f"{config.attention_dropout_rate}, activation {config.activation_dropout_rate}), {embeddings}, "
        f"{'tied' if config.tie_output_embedding else 'untied'} output embedding"
    )


def settings(setups, with_torch: bool, torch_threads: int | None) -> list[str]:
    """Footnotes: what every row ran with, each model's size, and the parameter counts compared.
    A model setting that differs between the configs (multi30k's dropout) is given per config."""
    experiment = default_config()
    optimizer, training = experiment.optimizer, experiment.training
    config = setups[0][1]
    models = {name: model_settings(config) for name, config, *_ in setups}
    shared = len(set(models.values())) == 1
    lines = [
        f"settings: {config.architecture}, {models[setups[0][0]] + ', ' if shared else ''}Adam({optimizer.b1}, "
        f"{optimizer.b2}, {optimizer.eps}), warmup {optimizer.warmup_steps}, clip {optimizer.clip_norm}, label "
        f"smoothing {training.label_smoothing}, loss chunks of {training.loss_chunk_tokens} tokens; float32",
        "  dense random rows (no padding); tokens_per_s counts the target tokens of a step",
    ]
    if with_torch:
        from benchmarks import torch_reference as reference

        lines.append(
            f"  torch: {reference.MODELS[config.architecture].__name__} (benchmarks/torch_reference.py), the same "
            f"settings, intra-op threads {reference.torch.get_num_threads()}{'' if torch_threads else ' (all cores)'}"
        )
    for name, config, batch, *_ in setups:
        layers = (
            f"{config.num_decoder_layers} layers"
            if config.architecture == "decoder_only"
            else f"{config.num_encoder_layers}+{config.num_decoder_layers} layers"
        )
        lines.append(
            f"  {name}: vocab {config.vocab_size}, d {config.d_model}, {config.num_heads} heads, "
            f"{layers}, d_ff {config.d_ff}, batch {batch}{'' if shared else '; ' + models[name]}"
        )
    return lines


def parameter_notes(rows: list[dict]) -> list[str]:
    """A footnote per config whose torch row has parameters: equal counts, or the difference."""
    by_config: dict[str, dict[str, int]] = {}
    for row in rows:
        by_config.setdefault(row["config"], {})[row["impl"]] = row["params"]
    lines = []
    for name, counts in by_config.items():
        if "torch" in counts:
            jax_count, torch_count = counts["jaxformer"], counts["torch"]
            verdict = "equal" if jax_count == torch_count else f"torch has {torch_count - jax_count:+,}"
            lines.append(f"  {name}: parameters jaxformer {jax_count:,}, torch {torch_count:,} ({verdict})")
    return lines


def as_architecture(config, architecture: str):
    """A translator's sizes as `architecture`: a language model keeps the target side's vocabulary
    as its one embedding (multi30k's separate source vocabulary and untied embeddings aside)."""
    if architecture == "encoder_decoder":
        return config.replace(architecture=architecture)
    return config.replace(architecture=architecture, share_embeddings=True, source_vocab_size=None, logits_bias=False)


def main(argv=None) -> list[dict]:
    arguments = parser("train_step", __doc__, budget_of="a row", torch=True)
    default_configs = ["tiny", "small", "base"]
    add_configs_flag(arguments, default_configs)
    arguments.add_argument(
        "--architecture",
        default="encoder_decoder",
        choices=[name for name in ARCHITECTURES if name in BENCHMARKED],
        help="the translator (encoder_decoder) or a causal language model of the same size (decoder_only)",
    )
    args = parse_args(arguments, argv, smoke_sets={"configs": default_configs})
    with_torch = check_torch(args)
    if args.smoke:
        setups = [("smoke", *SMOKE)]
        iters, peak_size = args.iters or 2, 256
    else:
        setups = [(name, *CONFIGS[name]()) for name in args.configs]
        iters, peak_size = args.iters or 10, 2048
    setups = [(name, as_architecture(config, args.architecture), *shape) for name, config, *shape in setups]
    peak_iters = 3 if args.smoke else 10
    rates_before = matmul_rates_gflops(peak_size, iters=peak_iters)
    rows = []
    for name, config, batch, source_length, target_length in setups:
        rows += bench(name, config, batch, source_length, target_length, iters, args.budget_s, with_torch)
    rates_after = matmul_rates_gflops(peak_size, iters=peak_iters)
    before, after = median(rates_before), median(rates_after)
    peak, fastest = max(before, after), max(rates_before + rates_after)
    for row in rows:
        row["peak_gflops"] = peak
        row["mfu_pct"] = 100.0 * row["achieved_gflops"] / peak
        row["mfu_vs_fastest_pct"] = 100.0 * row["achieved_gflops"] / fastest
    title = (
        f"train step ({args.architecture}), peak f32 matmul {peak:,.0f} GFLOP/s ({peak_size}^2 XLA, median of "
        f"{peak_iters} calls; before the rows {before:,.0f}, after {after:,.0f}; fastest call {fastest:,.0f})"
    )
    if with_torch:
        title += f"; torch's f32 matmul {torch_matmul_peak_gflops(peak_size, iters=peak_iters):,.0f} GFLOP/s (median)"
    notes = settings(setups, with_torch, args.torch_threads) + parameter_notes(rows)
    return report("train_step", rows, COLUMNS, args.json, title, notes)


if __name__ == "__main__":
    main()
