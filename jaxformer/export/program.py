"""A search as a serialized `jax.export` program, with symbolic batch and source length.

The program is `make_generate_fn(config, settings)` (jaxformer/decoding/generate.py): beam search,
greedy search or sampling, as `settings.method` says, its tokens padded to S + max_extra_length
(`program_fn`), lowered once for source int32 [B, S] with B and S symbolic, S <= max_source_length
(the positional encoding needs a bound: jaxformer/model/position.py), so one file serves every
batch size and source length. Sampling takes a third input, its batch's random key as
`jax.random.key_data` gives it (uint32 [2] for jax's default threefry2x32 keys; `key_spec`): a
typed key is no array a loader can build without jax's key types, and the loader splits the
keys itself, as `Translator` does, one per batch. It is lowered for several platforms at once
where jax can do so from this machine; a platform whose lowering fails is left out and reported,
not fatal.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.decoding.checkpoint_alpha import SEARCH_NAMES
from jaxformer.decoding.generate import DecodeSettings, make_generate_fn
from jaxformer.errors import first_line
from jaxformer.model.config import TransformerConfig
from jaxformer.tokens import PAD_ID

logger = logging.getLogger(__name__)

PLATFORMS = ("cpu", "cuda", "tpu")
KNOWN_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def source_spec(max_source_length: int) -> jax.ShapeDtypeStruct:
    """int32 [B, S], both symbolic, 1 <= S <= max_source_length."""
    batch, length = jax.export.symbolic_shape("B, S", constraints=[f"S <= {int(max_source_length)}"])
    return jax.ShapeDtypeStruct((batch, length), jnp.int32)


def key_impl() -> str:
    """The name of the random key implementation `jax.random.key` makes here (threefry2x32 unless
    jax_default_prng_impl says otherwise): `Translator`'s keys, which a sampling program takes."""
    return str(jax.random.key_impl(jax.random.key(0)))


def key_spec() -> jax.ShapeDtypeStruct:
    """The raw data of one `key_impl()` key, as `jax.random.key_data` gives it: uint32 [2] for threefry2x32."""
    return jax.ShapeDtypeStruct(jax.random.key_data(jax.random.key(0)).shape, jnp.uint32)


def program_fn(config: TransformerConfig, settings: DecodeSettings):
    """`make_generate_fn(config, settings)` with the export's inputs, (params, source) or for sampling
    (params, source, key data), and output: tokens [B, K, S + max_extra_length] (K = 1 but for beam
    search). A model with max_positions P searches in a buffer of min(S + max_extra_length, P)
    tokens, as `generate` bounds it; the columns past P, which no row reaches, are padding."""
    generate_fn = make_generate_fn(config, settings).jitted
    impl = key_impl()

    def padded(tokens, source):
        if config.max_positions is None:
            return tokens  # [B, K, S + max_extra_length] already
        missing = source.shape[1] + settings.max_extra_length - tokens.shape[2]  # symbolic: max(0, S + extra - P)
        return jax.lax.pad(tokens, jnp.int32(PAD_ID), ((0, 0, 0), (0, 0, 0), (0, missing, 0)))

    if settings.method == "sample":

        def search(params, source, key_data):
            tokens, scores = generate_fn(params, source, jax.random.wrap_key_data(key_data, impl=impl))
            return padded(tokens, source), scores

    else:

        def search(params, source):
            tokens, scores = generate_fn(params, source)
            return padded(tokens, source), scores

    search.__name__ = search.__qualname__ = function_name(config, settings)
    return jax.jit(search)


def fixed_settings(settings: DecodeSettings) -> dict[str, Any]:
    """The settings of `settings`' search that its program holds fixed once lowered, as config.json's
    "decoding" records them (`exporter.decoding_record`): a beam search's every DecodeSettings
    field (temperature and top_k, which it never reads, included), greedy search's and sampling's
    those they read. The method is the program's function; sampling's seed is no setting of it (the
    loader passes each batch's key)."""
    if settings.method == "beam":
        return {key: value for key, value in dataclasses.asdict(settings).items() if key != "method"}
    read = ["max_extra_length", "renormalize_after_bans"]
    read += ["temperature", "top_k"] if settings.method == "sample" else []
    return {key: getattr(settings, key) for key in read}


def function_name(config: TransformerConfig, settings: DecodeSettings) -> str:
    """The name the program records (Exported.fun_name, inside the program file, whose SHA-256
    config.json holds): its search, by which the loader tells a beam search of beam size 1 from
    greedy search, whose shapes are the same, then a space and as JSON `fixed_settings` and, under
    "model", `config.to_dict()`, config.json's "model": the loader holds config.json's "decoding"
    and "model" against them (a hand edit there would change nothing: a dtype, a dropout rate or
    the attention's implementation is traced into the program, and none shows in a parameter's
    shape). jax.export keeps the name as given (its MLIR module's name is a sanitized copy)."""
    search = "sampling" if settings.method == "sample" else f"{settings.method}_search"
    return f"{search} {json.dumps(fixed_settings(settings) | {'model': config.to_dict()}, sort_keys=True)}"


def export_search(
    config: TransformerConfig,
    settings: DecodeSettings,
    params: Any,
    max_source_length: int,
    platforms: Sequence[str] = PLATFORMS,
) -> tuple[jax.export.Exported, dict[str, str]]:
    """(the program of `settings`' search for the platforms that lower, {platform: why not} for the others).

    `config` and `params` are the decoding variant's (`decoding_variant`); only the shapes and
    dtypes of `params` matter. If no platform lowers, the first platform's error is raised.
    """
    generate_fn = program_fn(config, settings)
    specs = (
        jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype), params),
        source_spec(max_source_length),
        *([key_spec()] if settings.method == "sample" else []),
    )
    platforms = tuple(platforms)
    try:
        return jax.export.export(generate_fn, platforms=platforms)(*specs), {}
    except Exception:  # noqa: BLE001  (a platform's lowering can fail in any way; find which below)
        if len(platforms) == 1:
            raise
    working, failed, first_error = [], {}, None
    for platform in platforms:
        try:
            jax.export.export(generate_fn, platforms=(platform,))(*specs)
            working.append(platform)
        except Exception as error:  # noqa: BLE001
            first_error = first_error or error
            failed[platform] = first_line(error)
            logger.warning("cannot export the %s for %s: %s", SEARCH_NAMES[settings.method], platform, failed[platform])
    if not working:
        raise first_error
    return jax.export.export(generate_fn, platforms=tuple(working))(*specs), failed
