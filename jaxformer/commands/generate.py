"""Continue text with a decoder-only language model (configs/multi30k_lm.py), one prompt per
line: stdin to stdout, or file to file. Each output line is the prompt and its continuation.

jaxformer-generate --workdir runs/m30k_lm --method sample --top_k 20 < prompts.txt
jaxformer-generate --workdir runs/m30k_lm --method beam --max_new_tokens 20 --input prompts.txt --output out.txt
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m`: launched as the console script is, before jax loads (launch.py)
    from jaxformer.commands.launch import run_as_main

    run_as_main("jaxformer.commands.generate")

import argparse
import logging

from jaxformer.commands import common, decoding_flags


def build_parser() -> argparse.ArgumentParser:
    from jaxformer.decoding.generate import MAX_EXTRA_LENGTH, MAX_SEED, METHODS
    from jaxformer.decoding.language_model import CONTINUATION_TOKENS

    parser = common.make_parser(__doc__)
    decoding_flags.add_checkpoint_flags(parser, language_model=True)
    parser.add_argument("--method", choices=METHODS, default="greedy", help="search (default: greedy)")
    parser.add_argument("--beam_size", type=common.at_least(1), default=4, help="beam width (default: 4)")
    decoding_flags.add_length_penalty_flags(parser, language_model=True)
    decoding_flags.add_stop_flag(parser)
    decoding_flags.add_renormalize_flag(parser, language_model=True)
    parser.add_argument(
        "--max_new_tokens",
        type=common.integer_from(1, MAX_EXTRA_LENGTH),
        default=CONTINUATION_TOKENS,
        help=f"tokens added to each prompt, EOS included, at most {MAX_EXTRA_LENGTH} (default: {CONTINUATION_TOKENS})",
    )
    parser.add_argument(
        "--temperature",
        type=decoding_flags.sampling_temperature,
        default=1.0,
        help="sampling temperature (default: 1.0)",
    )
    parser.add_argument(
        "--top_k", type=common.at_least(0), default=0, help="sample among the k most likely; 0 = all (default: 0)"
    )
    parser.add_argument(
        "--seed",
        type=common.integer_from(0, MAX_SEED),
        default=0,
        help=f"sampling seed, 0 to {MAX_SEED}; the same seed, prompts and --batch_size sample alike (default: 0)",
    )
    decoding_flags.add_batch_size_flag(parser, "prompts")
    decoding_flags.add_progress_flag(parser)
    common.add_input_output_flags(parser, "prompts")
    return parser


def run(args: argparse.Namespace) -> int:
    from jaxformer.decoding.language_model import LanguageModel, check_kept_by_a_language_model

    prompts = decoding_flags.checked_input_lines(args, "prompts")
    check_kept_by_a_language_model(args.workdir, args.checkpoint)  # before beam search's flags read final/
    settings = decoding_flags.decode_settings_from_flags(args, max_extra_length=args.max_new_tokens)
    model = LanguageModel.from_workdir(
        args.workdir, args.checkpoint, settings, batch_size=args.batch_size, seed=args.seed
    )
    common.write_lines(args.output, model.complete(prompts, progress=not args.no_progress))
    return 0


def main(argv: list[str] | None = None) -> int:
    return common.run_command(build_parser(), run, argv, log_level=logging.INFO)
