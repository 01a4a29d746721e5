"""Corpus scores as papers and sacreBLEU report them."""

from __future__ import annotations

from collections.abc import Sequence

import sacrebleu


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float | str]:
    """Cased detokenized sacreBLEU (the number to quote, with its signature), chrF, and
    lowercased 13a-tokenized BLEU (closest to the tokenized, lowercased BLEU of older papers)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf, lowercase = sacrebleu.BLEU(), sacrebleu.CHRF(), sacrebleu.BLEU(lowercase=True, tokenize="13a")
    refs = [list(references)]
    bleu_score = bleu.corpus_score(list(hypotheses), refs)
    chrf_score = chrf.corpus_score(list(hypotheses), refs)
    lowercase_score = lowercase.corpus_score(list(hypotheses), refs)
    return {
        "bleu": bleu_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "bleu_detail": str(bleu_score),
        "chrf": chrf_score.score,
        "chrf_signature": str(chrf.get_signature()),
        "lowercase_bleu": lowercase_score.score,
        "lowercase_bleu_signature": str(lowercase.get_signature()),
        "sentences": len(hypotheses),
    }


def format_scores(scores: dict[str, float | str]) -> str:
    """Three report lines: BLEU with signature, chrF with signature, lowercase tokenized BLEU."""
    return "\n".join(
        [
            f"BLEU {scores['bleu']:.2f}  ({scores['bleu_detail']})  signature: {scores['bleu_signature']}",
            f"chrF {scores['chrf']:.2f}  signature: {scores['chrf_signature']}",
            f"lowercase tokenized BLEU {scores['lowercase_bleu']:.2f}  signature: {scores['lowercase_bleu_signature']}",
        ]
    )
