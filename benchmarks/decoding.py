"""Decoding speed: greedy and beam-4 search with the KV cache versus recomputing the decoder.

    python -m benchmarks.decoding [--batch-sizes 1,32,128] [--length 64] [--iters 5] [--torch] [--json FILE]

The `small` model with random parameters translates random 32-token sources. Every output is
forced to exactly `--length` tokens: the search runs with max_length = length and the special
tokens (pad, EOS, unk, BOS) are masked out of the logits, so all variants do the same work.

  kv         jaxformer's cached decoding: Transformer.encoder_context once, then
             Transformer.decode_step per token (the callback jaxformer.decoding.generate
             builds, plus the mask), under jaxformer.decoding.search's greedy search /
             jaxformer.decoding.beam_search's beam search.
  recompute  no cache: the encoder once, then at every step Transformer.decode over a
             fixed [rows, length] buffer of the tokens so far (static shapes, jitted, what an
             nn.Transformer-style user writes in JAX), reading the logits at the current
             position, under the same search functions.
  library    (--library) make_generate_fn(DecodeSettings(...)) unmodified, with
             max_extra_length set so the output is at most `length` tokens; EOS is not
             masked, so rows may stop early (tokens counted from the output).
  torch      (--torch) the PyTorch reference's greedy decoding by recomputation (growing
             prefix, last position projected), forced to `length` tokens.

Tokens per second count the returned (best) hypothesis: batch * length per call, not beams.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.command_line import check_torch, names, parse_args, parser, positive_integers, report
from benchmarks.common import compile_timed, median, random_params, small_config, time_calls
from jaxformer.commands.common import at_least
from jaxformer.decoding.beam_search import beam_search
from jaxformer.decoding.generate import DecodeSettings, decoding_variant, make_generate_fn
from jaxformer.decoding.search import NEG_INF, SearchSpec, greedy_search
from jaxformer.model.cache import init_cache
from jaxformer.model.config import preset
from jaxformer.model.transformer import Transformer
from jaxformer.tokens import BOS_ID, EOS_ID, NUM_SPECIAL_TOKENS, PAD_ID

COLUMNS = (
    "search",
    "impl",
    "batch",
    "out_len",
    "sentences_per_s",
    "tokens_per_s",
    "call_ms",
    "compile_s",
    "kv_speedup",
)
SEARCHES = ("greedy", "beam")  # beam: DEFAULTS.beam_size
DEFAULTS = DecodeSettings()  # the paper's beam size and length penalty, as translate.py uses them


def suppress_specials(logits: jax.Array) -> jax.Array:
    """Logits [R, V] with pad, EOS, unk and BOS made impossible: outputs run to the length limit."""
    special = jnp.arange(logits.shape[-1])[None, :] < NUM_SPECIAL_TOKENS  # [1, V]
    return jnp.where(special, NEG_INF, logits)


def _search(tokens_to_logits, cache, batch: int, method: str, length: int):
    spec = SearchSpec(batch, length, BOS_ID, EOS_ID)  # no limits: outputs are cut at `length`
    if method == "beam":
        tokens, _ = beam_search(tokens_to_logits, cache, spec, DEFAULTS.beam_size, DEFAULTS.alpha)
        return tokens[:, 0]  # [B, L], the best hypothesis
    if method != "greedy":
        raise ValueError(f"search {method!r}: not one of {SEARCHES}")
    tokens, _ = greedy_search(tokens_to_logits, cache, spec)
    return tokens


def kv_decode(model: Transformer, params, source: jax.Array, method: str, length: int) -> jax.Array:
    """Cached decoding of `length` forced tokens: [B, length]."""
    context = model.apply({"params": params}, source, method=Transformer.encoder_context)

    def tokens_to_logits(tokens, cache):
        logits, cache = model.apply({"params": params}, tokens, cache, context, method=Transformer.decode_step)
        return suppress_specials(logits), cache

    # The search repeats the cache rows per beam itself.
    return _search(tokens_to_logits, init_cache(model.config, source.shape[0], length), source.shape[0], method, length)


def recompute_decode(model: Transformer, params, source: jax.Array, method: str, length: int) -> jax.Array:
    """Decoding by recomputation over a fixed-length token buffer: [B, length]."""
    beams = {"greedy": 1, "beam": DEFAULTS.beam_size}[method]
    encoded = model.apply({"params": params}, source, method=Transformer.encode)  # [B, S, D]
    encoded, source_rows = jnp.repeat(encoded, beams, axis=0), jnp.repeat(source, beams, axis=0)  # row r: source r // K

    def tokens_to_logits(tokens, cache):  # tokens [R, 1]; cache: (buffer [R, length], index [])
        buffer, index = cache
        buffer = jax.lax.dynamic_update_slice_in_dim(buffer, tokens, index, axis=1)  # decoder inputs so far
        logits = model.apply({"params": params}, encoded, source_rows, buffer, method=Transformer.decode)  # [R, L, V]
        logits = jax.lax.dynamic_index_in_dim(logits, index, axis=1, keepdims=False)  # [R, V]
        return suppress_specials(logits), (buffer, index + 1)

    cache = (jnp.full((source.shape[0], length), PAD_ID, jnp.int32), jnp.zeros((), jnp.int32))
    return _search(tokens_to_logits, cache, source.shape[0], method, length)


def _row(search, impl, batch, out_len, seconds, compile_s=None, tokens=None):
    tokens = batch * out_len if tokens is None else tokens
    return dict(
        search=search,
        impl=impl,
        batch=batch,
        out_len=out_len,
        sentences_per_s=batch / seconds,
        tokens_per_s=tokens / seconds,
        call_ms=1e3 * seconds,
        compile_s=compile_s,
    )


def bench_jax(impl: str, model, params, source, method: str, length: int, iters: int, budget_s: float) -> dict:
    decode = {"kv": kv_decode, "recompute": recompute_decode}[impl]
    compiled, compile_s = compile_timed(
        jax.jit(functools.partial(decode, model, method=method, length=length)), params, source
    )
    output = np.asarray(compiled(params, source))
    assert output.shape == (source.shape[0], length) and (output >= NUM_SPECIAL_TOKENS).all(), "length not forced"
    seconds = median(time_calls(lambda: compiled(params, source), iters, budget_s, warmup=0))
    return _row(method, impl, source.shape[0], length, seconds, compile_s)


def bench_library(config, params, source, method: str, length: int, iters: int, budget_s: float) -> dict:
    settings = dataclasses.replace(DEFAULTS, method=method, max_extra_length=max(1, length - source.shape[1]))
    generate_fn = make_generate_fn(config, settings)
    tokens, _ = generate_fn(params, source)
    best = np.asarray(tokens)[:, 0]  # [B, L]: tokens up to and including EOS, then padding
    produced = int((best != PAD_ID).sum())
    seconds = median(time_calls(lambda: generate_fn(params, source), iters, budget_s, warmup=0))
    row = _row(method, "library", source.shape[0], length, seconds, tokens=produced)
    row["out_len"] = produced / source.shape[0]  # mean output length
    return row


def bench_torch(config, source: np.ndarray, length: int, iters: int, budget_s: float) -> dict:
    from benchmarks import torch_reference as reference

    model = reference.TorchTransformer(config, max_length=max(length, source.shape[1]) + 1)
    tensor = reference.as_tensor(source)
    seconds = median(
        time_calls(lambda: reference.greedy_decode(model, tensor, length, force_length=True), iters, budget_s)
    )
    return _row("greedy", "torch", source.shape[0], length, seconds)


def main(argv=None) -> list[dict]:
    arguments = parser("decoding", __doc__, budget_of="a row", torch=True)
    arguments.add_argument(
        "--batch-sizes",
        type=positive_integers,
        default=None,
        help="comma-separated source rows per call (default 1,32,128; not with --smoke)",
    )
    arguments.add_argument(
        "--length", type=at_least(1), default=None, help="forced output length, tokens (default 64; not with --smoke)"
    )
    arguments.add_argument(
        "--source-length", type=at_least(1), default=None, help="source tokens per row (default 32; not with --smoke)"
    )
    arguments.add_argument(
        "--searches",
        type=names(SEARCHES),
        default=list(SEARCHES),
        help=f"comma-separated, of {', '.join(SEARCHES)} (default {','.join(SEARCHES)})",
    )
    arguments.add_argument(
        "--library", action="store_true", help="also time make_generate_fn unmodified (no forced length)"
    )
    smoke_sets = {"batch_sizes": [1, 32, 128], "length": 64, "source_length": 32}
    args = parse_args(arguments, argv, smoke_sets)
    if args.torch and "greedy" not in args.searches:
        arguments.error("argument --torch: the torch reference decodes greedily only; add greedy to --searches")
    if args.smoke:
        config, batch_sizes, args.length, args.source_length = preset("tiny"), [2], 8, 6
        iters = args.iters or 2
    else:
        config, batch_sizes = small_config(), args.batch_sizes
        iters = args.iters or 5
    if args.library and args.length <= args.source_length:  # make_generate_fn writes up to S + max_extra_length > S
        arguments.error(
            f"argument --length: with --library, must exceed --source-length ({args.source_length}) for outputs "
            f"of at most --length tokens, got {args.length}"
        )
    with_torch = check_torch(args)  # after the flags' checks: a bad flag is one line, without torch's note
    config, params = decoding_variant(config, random_params(config))
    model = Transformer(config)
    rows = []
    for batch in batch_sizes:
        rng = np.random.default_rng(batch)
        source = rng.integers(
            NUM_SPECIAL_TOKENS, config.encoder_vocab_size, (batch, args.source_length), dtype=np.int32
        )
        for method in args.searches:
            kv = bench_jax("kv", model, params, source, method, args.length, iters, args.budget_s)
            recompute = bench_jax("recompute", model, params, source, method, args.length, iters, args.budget_s)
            kv["kv_speedup"] = recompute["call_ms"] / kv["call_ms"]
            rows += [kv, recompute]
            if args.library:
                rows.append(bench_library(config, params, source, method, args.length, iters, args.budget_s))
            if with_torch and method == "greedy":
                rows.append(bench_torch(config, source, args.length, iters, args.budget_s))
    title = (
        f"decoding: forced {args.length}-token outputs from {args.source_length}-token sources, "
        f"d_model {config.d_model}"
    )
    return report("decoding", rows, COLUMNS, args.json, title)


if __name__ == "__main__":
    main()
