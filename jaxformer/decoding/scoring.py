"""Corpus scores as papers and sacreBLEU report them."""

from __future__ import annotations

from collections.abc import Sequence

import sacrebleu

from jaxformer.errors import first_line

BLEU_TOKENIZERS = tuple(sacrebleu.BLEU.TOKENIZERS)
# sacreBLEU's own choice for a target language (sacrebleu.BLEU(trg_lang=...), its command line's
# -l src-trg): 13a splits at spaces and punctuation, so text without spaces between words would be
# one token a sentence, and BLEU 0 short of an exact match. Any other language gets 13a.
TOKENIZER_BY_LANGUAGE = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}
# The extra of jaxformer that installs what a tokenizer needs (as sacrebleu[ja] and sacrebleu[ko] do).
TOKENIZER_EXTRAS = {"ja-mecab": "ja", "ko-mecab": "ko"}


def bleu_tokenizer(target_language: str, configured: str | None = None) -> str:
    """The sacreBLEU tokenizer BLEU and lowercase BLEU split `target_language` text with: the one
    `configured` names, else sacreBLEU's choice for the language. A region or script after the
    language ('zh_TW', 'zh-Hant') is the language's, which sacreBLEU would not recognise."""
    if configured is not None:
        return configured
    language = target_language.replace("_", "-").split("-")[0].lower()
    return TOKENIZER_BY_LANGUAGE.get(language, sacrebleu.BLEU.TOKENIZER_DEFAULT)


def bleu_tokenizer_problem(tokenize: str, target_language: str, choose: str) -> str | None:
    """Why sacreBLEU cannot build the tokenizer `tokenize` here (a module it needs is missing), in
    one line with the remedy; `choose` says where another tokenizer is named. None when it can."""
    try:
        sacrebleu.BLEU(tokenize=tokenize)
    except Exception as error:  # whatever stops sacreBLEU building it: scoring would stop the same way
        extra = TOKENIZER_EXTRAS.get(tokenize)
        install = f"install it with pip install 'jaxformer[{extra}]', or " if extra else ""
        return (
            f"BLEU of target language {target_language!r} is scored with sacreBLEU's {tokenize!r} tokenizer, "
            f"which cannot be built here ({first_line(error)}): {install}name another tokenizer with {choose} "
            "(e.g. 'char')"
        )
    return None


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], tokenize: str) -> dict[str, float | str]:
    """Cased detokenized sacreBLEU (the number to quote, with its signature), chrF, and lowercased
    BLEU (closest to the tokenized, lowercased BLEU of older papers), both BLEUs with sacreBLEU's
    tokenizer `tokenize` (bleu_tokenizer: 13a but for Chinese, Japanese and Korean)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = sacrebleu.BLEU(tokenize=tokenize), sacrebleu.CHRF()
    lowercase = sacrebleu.BLEU(lowercase=True, tokenize=tokenize)
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
