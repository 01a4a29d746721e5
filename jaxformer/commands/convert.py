"""Convert between Hugging Face MarianMT (OPUS-MT) models and jaxformer runs.

jaxformer-convert --from_hf opus-mt-en-de --output runs/opus-en-de
jaxformer-convert --to_hf runs/m30k_shared --checkpoint best --output hf/m30k-en-de

--from_hf reads a transformers MarianMT directory (config.json, model.safetensors or
pytorch_model.bin, source.spm, target.spm, vocab.json) into a new run directory that
jaxformer-translate, jaxformer-evaluate, jaxformer-export and training.init_from read as a trained
run. --to_hf writes a run's checkpoint as a directory that MarianMTModel.from_pretrained and
MarianTokenizer.from_pretrained load (needs the interop extra: torch and transformers), for a run
with one shared vocabulary (MarianMT has one: multi30k's separate vocabularies are refused).
Neither overwrites an existing --output; both write it whole or not at all: staged in a hidden
folder beside it and renamed into place once complete (jaxformer/staged_folder.py, as
jaxformer-export does), so that a kill -9 leaves it as it was, and the next conversion removes
the killed one's staging folder, saying so.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m`: launched as the console script is, before jax loads (launch.py)
    from jaxformer.commands.launch import run_as_main

    run_as_main("jaxformer.commands.convert")

import argparse
import logging
import signal
import sys
from collections.abc import Callable

from jaxformer.commands import common, decoding_flags, path_checks
from jaxformer.run.directory import checkpoint_name
from jaxformer.training.signals import RaiseOnSignal, Stopped


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser(__doc__)
    direction = parser.add_mutually_exclusive_group(required=True)
    # --from-hf and --to-hf: the spellings of earlier releases.
    direction.add_argument(
        "--from_hf", "--from-hf", type=common.path_text, metavar="DIR", help="a transformers MarianMT directory"
    )
    direction.add_argument(
        "--to_hf", "--to-hf", type=common.path_text, metavar="WORKDIR", help="a jaxformer run directory"
    )
    parser.add_argument(
        "--output", type=common.path_text, required=True, help="the directory to write (absent or empty)"
    )
    decoding_flags.add_checkpoint_choice(parser, applies_to="--to_hf: ")
    # None: not given, so that a flag of the other direction is refused even at its default value.
    parser.set_defaults(checkpoint=None)
    parser.add_argument("--source_language", help="--from_hf: the run's source language (default: the model's)")
    parser.add_argument("--target_language", help="--from_hf: the run's target language (default: the model's)")
    parser.add_argument(
        "--max_positions",
        type=common.at_least(1),
        help="--to_hf: the longest sequence transformers' position table holds (default: the run's "
        "model.max_positions, which an imported model keeps, else 512)",
    )
    return parser


# The flags of one direction; each defaults to None, "not given", and --to_hf's get their
# values in _to_hf.
_DIRECTION_FLAGS = {
    "from_hf": ("source_language", "target_language"),
    "to_hf": ("checkpoint", "max_positions"),
}


def run(args: argparse.Namespace) -> int:
    direction = "from_hf" if args.from_hf is not None else "to_hf"
    for applies_to, flags in _DIRECTION_FLAGS.items():
        for name in flags:
            if applies_to != direction and getattr(args, name) is not None:
                raise common.FlagError(f"--{name} applies to --{applies_to}, not --{direction}")
    # Python's KeyboardInterrupt, raised inside torch's or transformers' writes, was at times dropped
    # there: the command went on and exited 0. Held until their calls return (or raised again where
    # they dropped it: `check`), a Ctrl-C ends the command as every Ctrl-C does, its staged output
    # removed; one once the output is in place (`finish`) is a note.
    try:
        with RaiseOnSignal(signums=(signal.SIGINT,)) as signals:
            report = _from_hf(args, signals.finish) if args.from_hf is not None else _to_hf(args, signals.finish)
            signals.check()
            signals.finish()
    except Stopped:
        raise KeyboardInterrupt from None
    print(report)
    if signals.late_signum is not None:
        print(f"SIGINT came once {args.output} was written whole: it is complete; exiting with 0", file=sys.stderr)
    return 0


def _from_hf(args: argparse.Namespace, on_placed: Callable[[], None]) -> str:
    from jaxformer.interop import marian

    # marian named neither the flag nor a missing folder ("nonexist is not a directory").
    path_checks.check_workdir(args.from_hf, "--from_hf", "a transformers MarianMT directory")
    converted = marian.import_marian(
        args.from_hf, args.output, args.source_language, args.target_language, on_placed=on_placed
    )
    config = converted.config
    # Each setting of the model's that the flags cannot reproduce (its sampling's, a pad it leaves unbanned) on a
    # line of its own, after them.
    return "\n".join(
        (
            f"converted {args.from_hf} to {args.output}: {config.num_encoder_layers}+{config.num_decoder_layers} "
            f"layers, d_model {config.d_model}, {config.vocab_size} tokens; decode it as transformers' generate does "
            f"by default with {' '.join(converted.search_flags)}",
            *converted.unreproduced,
        )
    )


def _to_hf(args: argparse.Namespace, on_placed: Callable[[], None]) -> str:
    from jaxformer.interop import marian_export

    path_checks.check_workdir(args.to_hf, "--to_hf")
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise common.FlagError("--to_hf needs transformers and torch: pip install 'jaxformer[interop]'") from None
    checkpoint = "latest" if args.checkpoint is None else args.checkpoint
    output = marian_export.export_marian(args.to_hf, args.output, checkpoint, args.max_positions, on_placed)
    return f"wrote {args.to_hf} ({checkpoint_name(checkpoint)}) to {output} (transformers MarianMT)"


def main(argv: list[str] | None = None) -> int:
    return common.run_command(build_parser(), run, argv, log_level=logging.INFO)
