"""Translate a test set and score it: cased detokenized sacreBLEU with its signature, chrF,
and lowercased tokenized BLEU.

    python evaluate.py --workdir runs/m30k --split test_2016_flickr
    python evaluate.py --workdir runs/m30k --source test.en --reference test.de --output hyp.de
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from jaxformer.commands.common import add_decoding_flags, translator_from_flags
from jaxformer.commands.translate import read_lines
from jaxformer.data.parallel_text import DataError
from jaxformer.decoding.scoring import corpus_scores, format_scores
from jaxformer.decoding.translator import load_checkpoint


def split_pairs(workdir: str, split: str, max_examples: int | None) -> tuple[list[str], list[str]]:
    """(sources, references) of a split of the run's own dataset and language pair."""
    from jaxformer.data.pipeline import record_text
    from jaxformer.data.sources import get_builder, load_split

    _, metadata, _ = load_checkpoint(workdir, "latest", params=False)
    data = metadata["config"]["data"]
    languages = (data["source_language"], data["target_language"])
    builder = get_builder(data["name"], data.get("data_dir"), data.get("raw_dir"), data.get("download", False))
    records = load_split(builder, split, languages)
    count = len(records) if max_examples is None else min(max_examples, len(records))
    rows = records.__getitems__(list(range(count)))
    return [record_text(r, languages[0]) for r in rows], [record_text(r, languages[1]) for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decoding_flags(parser)
    parser.add_argument("--split", help="a split of the run's dataset, e.g. test_2016_flickr or validation")
    parser.add_argument("--source", help="source file, one sentence per line (with --reference)")
    parser.add_argument("--reference", help="reference translations, line-aligned with --source")
    parser.add_argument("--max_examples", type=int, help="score only the first N pairs")
    parser.add_argument("--output", help="also write the translations here")
    parser.add_argument("--json", help="also write the scores here as JSON")
    args = parser.parse_args(argv)
    if bool(args.split) == bool(args.source or args.reference) or bool(args.source) != bool(args.reference):
        parser.error("give either --split, or both --source and --reference")

    if args.split:
        sources, references = split_pairs(args.workdir, args.split, args.max_examples)
        name = args.split
    else:
        sources, references = read_lines(args.source), read_lines(args.reference)
        if len(sources) != len(references):
            raise DataError(
                f"line counts differ: {args.source} has {len(sources)} lines, {args.reference} has {len(references)}"
            )
        if args.max_examples is not None:
            sources, references = sources[: args.max_examples], references[: args.max_examples]
        name = args.source
    translator = translator_from_flags(args)
    start = time.perf_counter()
    hypotheses = translator.translate(sources, progress=True)
    seconds = time.perf_counter() - start
    scores = corpus_scores(hypotheses, references)
    scores.update(
        workdir=str(args.workdir), checkpoint=str(args.checkpoint), step=translator.step, data=name,
        method=args.method, beam_size=args.beam_size, alpha=args.alpha, decode_seconds=seconds,
    )
    print(f"{name}: {len(sources)} sentences, step {translator.step} ({args.checkpoint}), "
          f"{args.method}{' ' + str(args.beam_size) if args.method == 'beam' else ''}, {seconds:.1f}s")
    print(format_scores(scores))
    if args.output:
        pathlib.Path(args.output).write_text("".join(f"{line}\n" for line in hypotheses), encoding="utf-8")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(scores, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
