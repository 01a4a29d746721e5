"""Flags shared by the decoding commands."""

from __future__ import annotations

import argparse
import logging

from jaxformer.decoding.generate import METHODS, DecodeSettings
from jaxformer.decoding.translator import Translator


def checkpoint_choice(value: str) -> str | int:
    return int(value) if value.isdigit() else value


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", required=True, help="the training run's directory")
    parser.add_argument(
        "--checkpoint", type=checkpoint_choice, default="latest",
        help="latest, best (validation BLEU), averaged, or a step number (default: latest)",
    )
    parser.add_argument("--method", choices=METHODS, default="beam", help="search (default: beam)")
    parser.add_argument("--beam_size", type=int, default=4, help="beam width (default: 4)")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent (default: 0.6)")
    parser.add_argument("--max_extra_length", type=int, default=50, help="output tokens <= input tokens + this (default: 50)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    parser.add_argument("--top_k", type=int, default=0, help="sample among the k most likely tokens; 0 = all")
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per decoding batch (default: 64)")
    parser.add_argument("--max_source_tokens", type=int, default=256, help="longer inputs are translated in pieces")


def translator_from_flags(args: argparse.Namespace) -> Translator:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    settings = DecodeSettings(
        method=args.method, beam_size=args.beam_size, alpha=args.alpha, max_extra_length=args.max_extra_length,
        temperature=args.temperature, top_k=args.top_k,
    )
    return Translator.from_workdir(
        args.workdir, args.checkpoint, settings, batch_size=args.batch_size, max_source_tokens=args.max_source_tokens
    )
