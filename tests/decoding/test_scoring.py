"""BLEU's tokenizer follows the target language as sacreBLEU's own choice does (BLEU(trg_lang=...)):
text without spaces between words scored with 13a is one token a sentence, BLEU 0 short of an
exact match."""

import importlib.util

import pytest
import sacrebleu

from jaxformer.decoding import scoring

# (translations, references) of the same sentences in each language, no translation exactly its reference.
PAIRS = {
    "ja": (
        ["大きい猫は魚を食べる。", "小さい犬は本を読んだ。", "子供は家を見る"],
        ["大きい猫が魚を食べる。", "小さい犬は本を読む。", "子供は家を見る。"],
    ),
    "zh": (
        ["大猫吃鱼。", "小狗在读书了。", "孩子看房子"],
        ["大猫吃鱼了。", "小狗在读书。", "孩子看房子。"],
    ),
    "ko": (
        ["큰 고양이가 생선을 먹는다.", "작은 개는 책을 읽었다.", "아이가 집을 본다"],
        ["큰 고양이는 생선을 먹는다.", "작은 개는 책을 읽는다.", "아이는 집을 본다."],
    ),
    "en": (
        ["The big cat eats the fish.", "the small dog read a book.", "A child sees the house"],
        ["The big cat eats a fish.", "The small dog reads a book.", "A child sees the house."],
    ),
    "de": (
        ["Die große Katze frisst den Fisch.", "der kleine Hund las ein Buch.", "Ein Kind sieht das Haus"],
        ["Die große Katze frisst einen Fisch.", "Der kleine Hund liest ein Buch.", "Ein Kind sieht das Haus."],
    ),
}
MECAB = {"ja": "MeCab", "ko": "mecab_ko"}  # the modules ja-mecab and ko-mecab need (the ja and ko extras)


@pytest.mark.parametrize("language", list(PAIRS))
def test_bleu_of_a_target_language_is_sacrebleus_for_that_language(language):
    if language in MECAB and importlib.util.find_spec(MECAB[language]) is None:
        pytest.skip(f"{MECAB[language]} is not installed (pip install 'jaxformer[{language}]')")
    hypotheses, references = PAIRS[language]
    scores = scoring.corpus_scores(hypotheses, references, scoring.bleu_tokenizer(language))
    bleu, lowercase = sacrebleu.BLEU(trg_lang=language), sacrebleu.BLEU(trg_lang=language, lowercase=True)
    assert scores["bleu"] == bleu.corpus_score(hypotheses, [references]).score
    assert scores["lowercase_bleu"] == lowercase.corpus_score(hypotheses, [references]).score
    assert (scores["bleu_signature"], scores["lowercase_bleu_signature"]) == (
        str(bleu.get_signature()),
        str(lowercase.get_signature()),
    )
    assert scores["chrf"] == sacrebleu.CHRF().corpus_score(hypotheses, [references]).score  # chrF as before
    if language in ("en", "de"):  # 13a, as every language had: the same scores as sacreBLEU's default
        assert "tok:13a" in scores["bleu_signature"]
        assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score
    elif language in ("ja", "zh"):  # scored at all: 13a sees one token a sentence (Korean has spaces)
        assert scores["bleu"] > 0 == sacrebleu.corpus_bleu(hypotheses, [references]).score


def test_a_named_tokenizer_wins_and_a_region_keeps_its_languages():
    assert [scoring.bleu_tokenizer(code) for code in ("zh", "zh_TW", "zh-Hant", "ja", "ja_JP", "ko", "th")] == [
        "zh",
        "zh",
        "zh",
        "ja-mecab",
        "ja-mecab",
        "ko-mecab",
        "13a",  # sacreBLEU has none for Thai: 'char' is named
    ]
    assert scoring.bleu_tokenizer("ja", "char") == "char" and scoring.bleu_tokenizer("de", "intl") == "intl"
    hypotheses, references = PAIRS["ja"]
    scores = scoring.corpus_scores(hypotheses, references, "char")
    assert scores["bleu"] == sacrebleu.BLEU(tokenize="char").corpus_score(hypotheses, [references]).score
    assert "tok:char" in scores["bleu_signature"] and "tok:char" in scores["lowercase_bleu_signature"]


@pytest.mark.parametrize("language, tokenize, module", [("ja", "ja-mecab", "ja_mecab"), ("ko", "ko-mecab", "ko_mecab")])
def test_a_tokenizer_that_cannot_be_built_is_one_line_with_its_remedy(language, tokenize, module, monkeypatch):
    monkeypatch.setattr(f"sacrebleu.tokenizers.tokenizer_{module}.MeCab", None)  # as without the extra
    problem = scoring.bleu_tokenizer_problem(tokenize, language, "--bleu_tokenize")
    assert problem.startswith(
        f"BLEU of target language {language!r} is scored with sacreBLEU's {tokenize!r} tokenizer, which cannot be "
        "built here (RuntimeError: "
    )
    assert problem.endswith(
        f": install it with pip install 'jaxformer[{language}]', or name another tokenizer with --bleu_tokenize "
        "(e.g. 'char')"
    )
    assert "\n" not in problem
    assert scoring.bleu_tokenizer_problem("zh", "zh", "--bleu_tokenize") is None  # built in: nothing to install
    assert scoring.bleu_tokenizer_problem("char", language, "--bleu_tokenize") is None
