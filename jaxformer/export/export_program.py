"""An export's program checked against config.json and its parameters: the search its function
was made for and the settings and model it holds fixed, its inputs and shapes, the parameters it
takes, and a sampling export's seed and random key. With numpy and jax alone.

serve.py (jaxformer/export/standalone.py) imports this module; `jaxformer-export` copies it beside
serve.py, so it imports no jaxformer module in an export: there serve.py gives it the names below
that it takes from standalone.py and export_files.py before running it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jax
import numpy as np

if __package__:  # jaxformer.export.export_program; an export's copy is given these by serve.py (`_import_beside`)
    from jaxformer.export.export_files import MAX_SEED
    from jaxformer.export.standalone import ExportError


# The search whose program jax.export named so (Exported.fun_name): jaxformer/export/program.py names
# each search's function, since a beam search of beam size 1 and greedy search take and return the
# same shapes. "generate_fn" is the beam search of exports written before greedy search and sampling
# could be exported; those written since, until their functions were named, say "search": unchecked.
PROGRAM_FUNCTIONS = {"beam_search": "beam", "greedy_search": "greedy", "sampling": "sample", "generate_fn": "beam"}


def program_inputs(config: dict[str, Any]) -> int:
    """How many inputs the program of config.json's search takes: params and source, and sampling's key."""
    return 3 if config["decoding"]["method"] == "sample" else 2


class SeedError(ValueError):
    """A seed outside a key's range, or one given to an export that draws nothing."""


def check_seed(config: dict[str, Any], seed: int | None) -> None:
    """A seed given for config.json's search (None: none given): a sampling export's, in a key's
    range; refused for another search, which draws nothing. Needs config.json alone, so `load`
    refuses a bad one before any parameter is read."""
    method = config["decoding"]["method"]
    if seed is None:
        return
    if method != "sample":
        raise SeedError(
            f"seed {seed}: this export's program is {method} search, which draws nothing; a seed applies to "
            "a sampling export (jaxformer-export --method sample)"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise SeedError(f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")


def checked_batch_size(batch_size: Any) -> int:
    """`batch_size` if it is an integer >= 1, Translator's rule (2.7, "4" and True were cast to 2, 4
    and 1); `load` checks a given one with the seed, before any parameter is read."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return batch_size


def first_key(config: dict[str, Any], seed: int | None, config_path) -> jax.Array | None:
    """A sampling export's key, which each batch's is split from in turn, as `Translator`'s, from
    `seed` (None: config.json's decoding.seed, checked by read_config); None for another search,
    which takes no seed."""
    check_seed(config, seed)
    if config["decoding"]["method"] != "sample":
        return None
    return random_key(config["decoding"]["seed"] if seed is None else seed, config, config_path)


def random_key(seed: int, config: dict[str, Any], config_path) -> jax.Array:
    """A key of config.json's program.key_impl (a sampling export's) from `seed`, as `jax.random.key` makes one."""
    try:
        return jax.random.key(seed, impl=config["program"]["key_impl"])
    except ValueError:  # a jax without that implementation, or an edited name
        raise ExportError(
            f"{config_path}: program.key_impl is {config['program']['key_impl']!r}, a random key implementation "
            "this jax does not have"
        ) from None


def check_program_shapes(config: dict[str, Any], program: jax.export.Exported, config_path, program_path) -> None:
    """config.json's search, beam size, extra length and longest source are the program's: inputs
    (params, source) or, sampling, (params, source, key), tokens [B, K, S + extra] out (K =
    decoding.beam_size for beam search, else 1), S bounded by the constraint jax.export wrote into
    the program's shape assertions at export time; a sampling program's key is the data of one key
    of config.json's program.key_impl; and the other settings it holds fixed (`check_fixed_settings`)."""
    decoding, serving = config["decoding"], config["serving"]
    method, inputs = decoding["method"], program_inputs(config)
    arguments = len(program.in_tree.children()[0].children()) if len(program.in_tree.children()) == 2 else None
    source = program.in_avals[len(program.in_avals) - inputs + 1].shape if arguments == inputs else ()
    tokens = program.out_avals[0].shape if len(program.out_avals) == 2 else ()
    extra = tokens[2] - source[1] if len(tokens) == 3 and len(source) == 2 else None
    # jax.export's own wording, fixed in the artifact when it was exported; a jax that words it
    # otherwise leaves only the bound unchecked here (the program still asserts it when called).
    bound = re.search(rb"symbolic shape constraint S <= (\d+)\.", program.mlir_module_serialized)
    if not isinstance(extra, int) or not isinstance(tokens[1], int):
        raise ExportError(
            f"{program_path} is not the program of decoding.method {method!r} in {config_path}: "
            f"{'params, source and key' if inputs == 3 else 'params and source'} in, tokens [B, K, S + extra] out "
            "expected"
        )
    if method == "sample":
        key = jax.random.key_data(random_key(0, config, config_path))
        if (program.in_avals[-1].shape, program.in_avals[-1].dtype) != (key.shape, key.dtype):
            raise ExportError(
                f"{program_path} takes a key {program.in_avals[-1].str_short()}, not the {key.dtype}{list(key.shape)} "
                f"of a {config['program']['key_impl']} key ({config_path}'s program.key_impl)"
            )
    if method != "beam" and tokens[1] != 1:
        raise ExportError(
            f"{config_path}: decoding.method is {method!r}, one hypothesis per sentence, but {program_path} "
            f"returns {tokens[1]}"
        )
    beam_size = decoding["beam_size"] if method == "beam" else 1  # the others' one, checked above
    for key, value, fixed, what in (
        ("decoding.beam_size", beam_size, tokens[1], "returns {} hypotheses per sentence"),
        ("decoding.max_extra_length", decoding["max_extra_length"], extra, "adds {} tokens to the source length"),
    ):
        if value != fixed:
            raise ExportError(f"{config_path}: {key} is {value}, but {program_path} {what.format(fixed)}")
    if bound is not None and serving["max_source_length"] > int(bound.group(1)):
        raise ExportError(
            f"{config_path}: serving.max_source_length is {serving['max_source_length']}, but {program_path} "
            f"takes sources of at most {int(bound.group(1))} tokens"
        )
    function = program_function(program, program_path)[0]
    made_for = PROGRAM_FUNCTIONS.get(function, method)  # a name it knows
    if made_for != method:
        raise ExportError(
            f"{config_path}: decoding.method is {method!r}, but {program_path} is the program of {made_for!r} "
            f"(its function, {function})"
        )
    check_fixed_settings(config, program, config_path, program_path)


def program_function(program: jax.export.Exported, program_path) -> tuple[str, dict[str, Any] | None]:
    """(the search the program's function is named for, the settings it holds fixed or None): its
    Exported.fun_name, "<search> <JSON object>" (jaxformer/export/program.py's function_name), or
    the search's name alone in exports written before the settings were recorded there."""
    function, _, recorded = str(getattr(program, "fun_name", "")).partition(" ")
    if not recorded:
        return function, None
    try:
        settings = json.loads(recorded)
    except ValueError:
        settings = None
    if not isinstance(settings, dict):
        raise ExportError(
            f"{program_path}: its function's name, {program.fun_name!r}, holds no JSON object of the settings "
            "it was exported with"
        )
    return function, settings


def check_fixed_settings(config: dict[str, Any], program: jax.export.Exported, config_path, program_path) -> None:
    """config.json's "decoding" values that the program holds fixed are the ones it was exported
    with, which its function's name records (`program_function`): a hand edit of one (a sampling
    export's top_k, a beam search's alpha) would change nothing. The seed is not among them (each
    batch's key is an input). So is its "model" (`check_fixed_model`). An export written before
    the record is not checked, nor its model where the record has none."""
    decoding = config["decoding"]
    fixed = dict(program_function(program, program_path)[1] or {})
    model = fixed.pop("model", None)
    for key, value in fixed.items():
        if _same(decoding, key, value):
            continue
        shown = json.dumps(decoding[key]) if key in decoding else "absent"
        if decoding["method"] == "beam" and key in ("temperature", "top_k"):
            raise ExportError(
                f"{config_path}: decoding.{key} is {shown}, but {program_path} is a beam search, which does not "
                f"sample (exported with {key} {json.dumps(value)}); export with --method sample to sample"
            )
        raise ExportError(
            f"{config_path}: decoding.{key} is {shown}, but {program_path} "
            f"{'samples' if decoding['method'] == 'sample' else 'searches'} with {key} {json.dumps(value)}, "
            "fixed when it was exported; export again to change it"
        )
    if model is not None:
        check_fixed_model(config, model, config_path, program_path)


def check_fixed_model(config: dict[str, Any], model: Any, config_path, program_path) -> None:
    """config.json's "model" is `model`, the one the program was traced with, which its function's
    name records: its dtypes, dropout rates (off: deterministic), activation, normalization,
    positions, attention implementation and sizes are in the program, and serve.py builds nothing
    from them (the parameters are held to the program's inputs, not to config.json's sizes), so a
    hand edit would change nothing. Held alike: the vocabulary sizes, which the tokenizers are
    held to first, and max_positions, which serve.py also reads to refuse longer sources."""
    given = config["model"] if isinstance(config.get("model"), dict) else {}
    if not isinstance(model, dict):
        raise ExportError(f"{program_path}: its function's name records the model as {model!r}, not a JSON object")
    for key, value in model.items():  # config.json's other keys are refused as unknown (read_config)
        if _same(given, key, value):
            continue
        shown = json.dumps(given[key]) if key in given else "absent"
        raise ExportError(
            f"{config_path}: model.{key} is {shown}, but {program_path} runs the model with {key} "
            f"{json.dumps(value)}, fixed when it was exported from the checkpoint; export again (from a run of "
            "the model you want) to change it"
        )


def _same(section: dict[str, Any], key: str, value: Any) -> bool:
    """Whether config.json's `section` holds `key` with the recorded `value` (true is not 1)."""
    given = section.get(key)
    return key in section and given == value and isinstance(given, bool) == isinstance(value, bool)


def check_parameters(params: Any, program: jax.export.Exported, params_path, program_path, inputs: int = 2) -> None:
    """The parameters are the ones the program takes: same names, shapes and dtypes (`inputs`:
    `program_inputs`, the params and the arrays after them)."""
    arrays = [jax.ShapeDtypeStruct((1, 1), np.int32)] * (inputs - 1)  # the source (and a key): leaves alike
    if jax.tree.structure(((params, *arrays), {})) != program.in_tree:
        raise ExportError(f"{params_path} does not hold the parameters that {program_path} takes (other names)")
    named = jax.tree_util.tree_flatten_with_path(params)[0]
    for (path, leaf), aval in zip(named, program.in_avals):
        if leaf.shape != aval.shape or leaf.dtype != aval.dtype:
            name = "/".join(str(key.key) for key in path)
            raise ExportError(
                f"{params_path}: tensor {name!r} is {leaf.dtype}{list(leaf.shape)}, but {program_path} takes "
                f"{aval.dtype}{list(aval.shape)}"
            )
