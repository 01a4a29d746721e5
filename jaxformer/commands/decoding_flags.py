"""The flags of the commands that decode (translate, evaluate, generate, export): which checkpoint,
the search and its settings, and the translator they describe; checked before any model is read."""

from __future__ import annotations

import argparse
import functools

from jaxformer.commands.common import (
    FlagError,
    at_least,
    check_stdout_open,
    integer_from,
    path_text,
    read_lines,
    ruled_number,
)
from jaxformer.commands.path_checks import check_readable_file, check_workdir, check_writable_file
from jaxformer.run.directory import CHECKPOINT_KINDS, parse_checkpoint_choice

# --batch_size's defaults, one rule for every command that decodes: 64 rows decode at once. translate
# and evaluate decode two batches at once, from two threads (Translator's parallel_batches: one search
# leaves a CPU core idle), where batches of 32 were measured faster than of 64 (README, Speed);
# generate and an export's loader decode one batch at a time. (An export's program takes any batch
# size: its batch size is the loader's, kept in config.json.)
DECODING_ROWS = 64
TRANSLATOR_BATCHES_AT_ONCE = 2  # Translator's parallel_batches


def add_batch_size_flag(parser: argparse.ArgumentParser, items: str, batches_at_once: int = 1, note: str = "") -> None:
    """--batch_size: `items` (sentences, prompts) per batch, `batches_at_once` decoding together,
    so that DECODING_ROWS rows decode at once by default; `note` follows what it is."""
    default = DECODING_ROWS // batches_at_once
    how = "two batches decode at once, from two threads" if batches_at_once == 2 else "one batch decodes at a time"
    parser.add_argument(
        "--batch_size",
        type=at_least(1),
        default=default,
        help=f"{items} per batch{note}; {how} (default: {default}, so that {DECODING_ROWS} rows decode at once, "
        "as in every decoding command)",
    )


def checkpoint_choice(value: str) -> str | int:
    """--checkpoint as the Python entry points read a `checkpoint` argument (`parse_checkpoint_choice`)."""
    try:
        return parse_checkpoint_choice(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be {', '.join(CHECKPOINT_KINDS)} or a step number, got {value!r}"
        ) from None


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the commands that translate: which checkpoint, the search, batches, --no_progress."""
    from jaxformer.decoding.generate import METHODS
    from jaxformer.decoding.sentence_batches import DEFAULT_MAX_SOURCE_TOKENS, MAX_SOURCE_TOKENS

    add_checkpoint_flags(parser)
    parser.add_argument("--method", choices=METHODS, help=f"search (default: {final_default('method')}beam)")
    add_beam_flags(parser)
    add_renormalize_flag(parser)
    add_sampling_flags(parser, "the same seed, input and --batch_size sample alike")
    add_batch_size_flag(parser, "sentences", batches_at_once=TRANSLATOR_BATCHES_AT_ONCE)
    parser.add_argument(
        "--max_source_tokens",
        type=integer_from(2, MAX_SOURCE_TOKENS),
        help=f"longer inputs are translated in pieces; at most {MAX_SOURCE_TOKENS}, and at most the model's "
        f"positions where it has a last one (default: {DEFAULT_MAX_SOURCE_TOKENS}, or its positions where fewer)",
    )
    add_progress_flag(parser)


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    """--no_progress: the decoding commands' bar on stderr (jaxformer/decoding/progress_bar.py) left off."""
    parser.add_argument("--no_progress", action="store_true", help="no progress bar on stderr")


def decode_settings_from_flags(args: argparse.Namespace, max_extra_length: int | None = None, chosen=None):
    """The DecodeSettings that --method, --beam_size, --alpha, --length_penalty, --stop,
    --max_extra_length, --temperature, --top_k and --renormalize_after_bans name (the commands ran
    `check_search_flags` on them with their other flags; those --checkpoint final's search settles
    are checked once it is read, by `with_chosen_search`). `max_extra_length`: generate's
    --max_new_tokens; None: --max_extra_length, settled. `chosen`: `final_search(args)`, when the
    caller read it already."""
    from jaxformer.decoding.generate import DecodeSettings

    chosen = final_search(args, chosen)
    args = with_chosen_search(args, chosen)
    max_extra_length = args.max_extra_length if max_extra_length is None else max_extra_length
    return DecodeSettings(
        method=args.method,
        beam_size=args.beam_size,
        alpha=resolved_alpha(args, max_extra_length, chosen)
        if args.method == "beam"
        else DecodeSettings.alpha,  # the others read none
        length_penalty=args.length_penalty,
        max_extra_length=max_extra_length,
        stop=args.stop,
        temperature=args.temperature,
        top_k=args.top_k,
        renormalize_after_bans=args.renormalize_after_bans,
    )


def add_sampling_flags(parser: argparse.ArgumentParser, seed_use: str) -> None:
    """--temperature, --top_k and --seed, as translate, evaluate and export take them (`seed_use`:
    what the seed does, for its help)."""
    from jaxformer.decoding.generate import MAX_SEED

    parser.add_argument(
        "--temperature", type=sampling_temperature, default=1.0, help="sampling temperature (default: 1.0)"
    )
    parser.add_argument("--top_k", type=at_least(0), default=0, help="sample among the k most likely tokens; 0 = all")
    parser.add_argument(
        "--seed",
        type=integer_from(0, MAX_SEED),
        default=0,
        help=f"sampling seed, 0 to {MAX_SEED}; {seed_use} (default: 0)",
    )


# Flags that one search reads and the others would ignore.
_SEARCH_ONLY_FLAGS = {
    "beam": ("beam_size", "alpha", "length_penalty", "stop"),
    "sample": ("temperature", "top_k", "seed"),
}


def check_search_flags(args: argparse.Namespace, chosen=None) -> None:
    """Beam search's flags (--beam_size, --alpha, --length_penalty, --stop) only with --method
    beam, sampling's (--temperature, --top_k, --seed) only with --method sample: under another
    search they would be ignored. A flag counts as given when its value is neither None (not
    given) nor DecodeSettings' default. Without --method the search is beam search, or with
    --checkpoint final the one its choice was made with (`chosen`, `final_search(args)`): until
    that is read (`chosen` None) the flags are not checked; `with_chosen_search` checks them then,
    before the parameters are read. (export's --method is beam unless given, whatever the run's
    final choice was made with.)"""
    from jaxformer.decoding.generate import DecodeSettings

    method, because = args.method, ""
    if method is None and args.checkpoint == "final":
        if chosen is None:
            return
        method = chosen.method
        because = (
            ": the search the run's final choice was made with, which --checkpoint final decodes with "
            "unless --method is given"
        )
    method = method or "beam"
    # --alpha's and --length_penalty's default: the run's choice, or 0.6 and gnmt
    defaults = {**vars(DecodeSettings()), "alpha": None, "length_penalty": None, "seed": 0}
    for applies_to, names in _SEARCH_ONLY_FLAGS.items():
        for name in names:
            value = getattr(args, name, None)
            if method != applies_to and value not in (None, defaults[name]):
                raise FlagError(f"--{name} {value} applies to --method {applies_to}, not {method}{because}")


def final_search(args: argparse.Namespace, chosen=None, metadata=None):
    """`chosen` when read already; else, with --checkpoint final without --method or under beam
    search, what final/'s metadata says of the search the run's choice was made with
    (`chosen_search`; `metadata`: final/'s, when the caller read it (the commands, from their one
    read of the checkpoint's metadata); else only the metadata is read, not its parameters), for
    all the flags and the translator settle from it; else None. --method greedy or sample, given,
    which take of final/'s search only its max_extra_length (`chosen_defaults`), leave it unread
    here: the translator settles their search from its one read of the checkpoint's metadata
    (`translator_from_flags`), before it names the choice's search."""
    from jaxformer.decoding.checkpoint_alpha import chosen_search

    if chosen is not None or getattr(args, "method", None) not in (None, "beam"):
        return chosen
    return chosen_search(args.workdir, args.checkpoint, metadata=metadata)


def with_chosen_search(args: argparse.Namespace, chosen) -> argparse.Namespace:
    """`args` with --method, --beam_size, --stop, --max_extra_length, --length_penalty and
    --renormalize_after_bans settled, once `check_search_flags` has checked them under the search
    they name: each as given; else, with --checkpoint final, the one the run's final choice was
    made with (`chosen`, `final_search(args)`; `chosen_defaults`: its alpha was chosen with them),
    logged; else DecodeSettings' (beam search, beam 4, current_length, 50, gnmt, false). Settled by
    `settled_search`, as `Translator.from_workdir` settles them. export's --method, beam unless
    given, is always given: it runs beam search whatever the choice's."""
    from jaxformer.decoding.checkpoint_alpha import SETTLED_FIELDS, settled_search

    check_search_flags(args, chosen)
    given = {name: getattr(args, name) for name in SETTLED_FIELDS if getattr(args, name, None) is not None}
    return argparse.Namespace(**{**vars(args), **settled_search(chosen, given, as_flags=True)})


def resolved_alpha(args: argparse.Namespace, max_extra_length: int, chosen) -> float:
    """--alpha when given; else, with --checkpoint final, the length penalty the run's final choice
    kept with those parameters (`chosen`, `final_search(args)`: the best of training.final_alphas,
    or decoding.alpha when it compared none), with a
    warning naming each setting of this search (--beam_size, --length_penalty, --stop,
    --renormalize_after_bans, `max_extra_length`) that differs from the search the choice was made
    with; else DecodeSettings' default (0.6). Decided by `checkpoint_alpha`, as
    `Translator.from_workdir` decides it. `args`: `with_chosen_search`'."""
    from jaxformer.decoding.checkpoint_alpha import checkpoint_alpha
    from jaxformer.decoding.generate import DecodeSettings

    search = DecodeSettings(
        beam_size=args.beam_size,
        length_penalty=args.length_penalty,
        max_extra_length=max_extra_length,
        stop=args.stop,
        renormalize_after_bans=args.renormalize_after_bans,
    )
    return checkpoint_alpha(chosen, search, args.alpha, override="--alpha")


def checked_input_lines(args: argparse.Namespace, what: str) -> list[str]:
    """The lines of --input (stdin by default), once --workdir, --input and --output are known to
    be usable; `what`: what they are ("sentences", "prompts"), named when read from a terminal."""
    check_workdir(args.workdir)
    check_search_flags(args)
    check_readable_file(args.input, "--input")
    check_writable_file(args.output, "--output", args.overwrite, {"--input": args.input})
    if args.output is None:
        check_stdout_open()
    return read_lines(args.input, what)


def translator_from_flags(args: argparse.Namespace, settings=None, chosen=None, loaded=None, tokenizers=None):
    """The translator the flags describe; `settings`: their DecodeSettings, `chosen`:
    `final_search(args)`, `loaded`: the checkpoint's `load_checkpoint`, and `tokenizers`: its
    metadata's `load_tokenizers()`, when made already. With --checkpoint final unread (no
    `chosen`) the search is settled from the translator's one read of its metadata (`settle_search`,
    as `final_search` would settle it), `settings` made before it (evaluate's under --method greedy
    or sample, which leave final/ unread) being without final/'s max_extra_length."""
    from jaxformer.decoding.translator import Translator

    settle_search = None
    if chosen is None and args.checkpoint == "final":
        settings = None
        settle_search = functools.partial(decode_settings_from_flags, args, args.max_extra_length)  # of its `chosen`
    elif settings is None:
        settings = decode_settings_from_flags(args, args.max_extra_length, chosen)
    return Translator.from_workdir(
        args.workdir,
        args.checkpoint,
        settings,
        chosen=chosen,
        settle_search=settle_search,
        loaded=loaded,
        tokenizers=tokenizers,
        batch_size=args.batch_size,
        **({} if args.max_source_tokens is None else {"max_source_tokens": args.max_source_tokens}),
        seed=args.seed,
    )


def add_beam_flags(parser: argparse.ArgumentParser) -> None:
    """--beam_size, --alpha, --length_penalty, --stop and --max_extra_length, as translate, evaluate
    and export take them."""
    from jaxformer.decoding.generate import MAX_EXTRA_LENGTH

    parser.add_argument("--beam_size", type=at_least(1), help=f"beam width (default: {final_default('beam_size')}4)")
    add_length_penalty_flags(parser)
    parser.add_argument(
        "--max_extra_length",
        type=integer_from(1, MAX_EXTRA_LENGTH),
        help=f"output tokens <= input tokens + this, at most {MAX_EXTRA_LENGTH} "
        f"(default: {final_default('max_extra_length')}50)",
    )
    add_stop_flag(parser, final=True)


def final_default(key: str) -> str:
    """The start of a flag's help default that --checkpoint final takes from final/ (`with_chosen_search`)."""
    return f"with --checkpoint final, the run's decoding.{key}, which its final choice was made with; else "


def add_stop_flag(parser: argparse.ArgumentParser, final: bool = False) -> None:
    """--stop: when beam search stops a sentence (beam_search.py); `final`: the command reads a
    translator's run, whose --checkpoint final settles it when not given (`with_chosen_search`)."""
    from jaxformer.decoding.beam_search import BEAM_STOPS
    from jaxformer.decoding.generate import DecodeSettings

    default = DecodeSettings().stop
    parser.add_argument(
        "--stop",
        choices=BEAM_STOPS,
        default=None if final else default,
        help="when beam search stops a sentence: exact, once no live hypothesis can win (transformers' "
        "early_stopping='never'); current_length, once none can win at its current length (early_stopping=False); "
        f"beam_full, once beam_size hypotheses have ended (fairseq; early_stopping=True) "
        f"(default: {final_default('stop') if final else ''}{default})",
    )


def length_penalty_alpha(text: str) -> float:
    """--alpha: at most MAX_ALPHA, the largest whose float32 penalty holds at any length."""
    from jaxformer.decoding.beam_search import ALPHA_RULE, is_valid_alpha

    return ruled_number(text, float, ALPHA_RULE, is_valid_alpha)


def sampling_temperature(text: str) -> float:
    """--temperature: > 0 and finite in float32, which the sampling divides its logits in."""
    from jaxformer.decoding.generate import TEMPERATURE_RULE, is_valid_temperature

    return ruled_number(text, float, TEMPERATURE_RULE, is_valid_temperature)


def add_length_penalty_flags(parser: argparse.ArgumentParser, language_model: bool = False) -> None:
    """--alpha and --length_penalty: the beam search's length normalisation (`language_model`: the
    command reads a language model's run, which has no final/ to take their defaults from)."""
    from jaxformer.decoding.beam_search import LENGTH_PENALTIES, MAX_ALPHA

    final_alpha = (
        "with --checkpoint final, the one its choice was made with under beam search: the best on validation "
        "of training.final_alphas, or decoding.alpha; else "
    )
    final_form = "with --checkpoint final, the one the run chose its alpha with, decoding.length_penalty; else "
    parser.add_argument(
        "--alpha",
        type=length_penalty_alpha,
        help=f"length penalty exponent, at most {MAX_ALPHA:g} (default: {'' if language_model else final_alpha}0.6)",
    )
    parser.add_argument(
        "--length_penalty",
        choices=LENGTH_PENALTIES,
        help="its form: gnmt, ((5 + |Y|) / 6)^alpha, or transformers, |Y|^alpha, as Hugging Face's beam "
        f"search (default: {'' if language_model else final_form}gnmt)",
    )


def true_or_false(text: str) -> bool:
    if text not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")
    return text == "true"


def add_renormalize_flag(parser: argparse.ArgumentParser, language_model: bool = False) -> None:
    """--renormalize_after_bans: how every search scores (search.py's module docstring;
    `language_model`: as `add_length_penalty_flags`)."""
    final_choice = (
        "with --checkpoint final under beam search, the run's decoding.renormalize_after_bans, which a --from_hf "
        "import of such a model sets; else "
    )
    parser.add_argument(
        "--renormalize_after_bans",
        type=true_or_false,
        metavar="{true,false}",
        help="true: score each step's log-probabilities over the tokens the search allows there (pad and BOS "
        "removed before the softmax; EOS alone, at no cost, at the length limit), as transformers' generate with "
        f"renormalize_logits=True; false: log p under the model (default: {'' if language_model else final_choice}"
        "false; greedy search and sampling choose the same tokens either way)",
    )


def add_checkpoint_flags(parser: argparse.ArgumentParser, language_model: bool = False) -> None:
    """--workdir and --checkpoint: which run's checkpoint a command reads (`language_model`: a
    language model's run, which has no best/ or final/)."""
    parser.add_argument("--workdir", type=path_text, required=True, help="the training run's directory")
    add_checkpoint_choice(parser, language_model=language_model)


def add_checkpoint_choice(parser: argparse.ArgumentParser, applies_to: str = "", language_model: bool = False) -> None:
    """--checkpoint: latest, best, averaged, final or a step (`applies_to`: the flag it goes with, for
    the help); for a `language_model`'s run, whose best and final `LanguageModel.from_workdir`
    refuses, the help names latest, averaged or a step."""
    kinds = (
        "latest, averaged"
        if language_model
        else "latest, best (validation BLEU), averaged, final (the run's final choice)"
    )
    parser.add_argument(
        "--checkpoint",
        type=checkpoint_choice,
        default="latest",
        help=f"{applies_to}{kinds}, or a step number (default: latest)",
    )
