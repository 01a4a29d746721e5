import numpy as np
import pytest
import sentencepiece as spm

from jaxformer.data.sentencepiece_proto import model_pb2
from jaxformer.data.tokenizer import Tokenizer, TokenizerError, train_tokenizer
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SENTENCES = [
    "A man in an orange hat starring at something.",
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Two young, White males are outside near many bushes.",
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
] * 50


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_trains_with_fixed_special_ids_and_round_trips(model_type, tmp_path):
    tokenizer = train_tokenizer(SENTENCES, vocab_size=64, model_type=model_type)
    assert tokenizer.vocab_size == 64
    assert tokenizer.pieces([PAD_ID, EOS_ID, UNK_ID, BOS_ID]) == ["<pad>", "</s>", "<unk>", "<s>"]
    ids = tokenizer.encode(SENTENCES[1])
    assert ids.dtype == np.int32 and ids[-1] == EOS_ID and (ids[:-1] > BOS_ID).all()
    assert tokenizer.decode(ids) == SENTENCES[1]
    assert tokenizer.decode(np.concatenate([[BOS_ID], ids, [PAD_ID, PAD_ID]])) == SENTENCES[1]
    (tmp_path / "spm.tmp").write_text("a file of the user's")  # never a save's temporary
    tokenizer.save(tmp_path / "spm.model")
    assert (tmp_path / "spm.tmp").read_text() == "a file of the user's"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["spm.model", "spm.tmp"]
    assert (
        Tokenizer.load(tmp_path / "spm.model").encode(SENTENCES[0]).tolist() == tokenizer.encode(SENTENCES[0]).tolist()
    )
    batch = tokenizer.encode(SENTENCES[:3], add_eos=False)
    assert [b.tolist() for b in batch] == [tokenizer.encode(s, add_eos=False).tolist() for s in SENTENCES[:3]]


def test_rejects_models_with_other_special_ids(tmp_path):
    import io

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES), model_writer=model, vocab_size=60, minloglevel=2)
    with pytest.raises(ValueError, match=r"\(pad, eos, unk, bos\) ids.*Tokenizer.from_sentencepiece_file"):
        Tokenizer(model.getvalue())


def test_unknown_model_type():
    with pytest.raises(ValueError, match="model_type='word'"):
        train_tokenizer(SENTENCES, 100, model_type="word")


def test_unusable_model_files_are_named(tmp_path):
    from jaxformer.data.tokenizer import TokenizerError
    from jaxformer.errors import UserError

    tokenizer = train_tokenizer(SENTENCES, vocab_size=64)
    cases = {
        "truncated.model": tokenizer.model_proto[: len(tokenizer.model_proto) // 2],
        "garbage.model": np.random.default_rng(0).bytes(500),
        "empty.model": b"",
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(TokenizerError) as raised:
            Tokenizer.load(path)
        assert isinstance(raised.value, UserError) and str(path) in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(TokenizerError, match="missing.model"):
        Tokenizer.load(tmp_path / "missing.model")


def test_a_vocabulary_too_large_for_the_corpus_is_one_tokenizer_error():
    with pytest.raises(
        TokenizerError, match=r"cannot train a 500-piece unigram tokenizer on 2 sentences: .*<= \d+"
    ) as error:
        train_tokenizer(["hello world", "a b c"], 500)
    assert "\n" not in str(error.value) and "smaller tokenizer.vocab_size" in str(error.value)


def test_a_vocabulary_too_small_for_the_corpus_characters_asks_for_a_larger_one():
    sentences = ["".join(chr(ord("a") + (i * 7 + j) % 26) for j in range(12)) for i in range(40)]
    with pytest.raises(TokenizerError, match=r"cannot train a 10-piece unigram tokenizer on 40 sentences: ") as error:
        train_tokenizer(sentences, 10)
    assert str(error.value).endswith("(set a larger tokenizer.vocab_size, or a smaller tokenizer.character_coverage)")
    assert "smaller tokenizer.vocab_size" not in str(error.value)


def test_a_corpus_of_sentences_all_too_long_for_sentencepiece_says_so():
    """sentencepiece leaves out sentences over 4,192 bytes (paragraphs, documents): with nothing
    left, its own reason is an assertion on an internal list, which the advice explains."""
    sentences = [" ".join(["alpha", "beta", "gamma", "delta"][(i + j) % 4] for j in range(900)) for i in range(4)]
    with pytest.raises(TokenizerError, match=r"cannot train a 40-piece unigram tokenizer on 4 sentences: ") as error:
        train_tokenizer(sentences, 40)
    assert "\n" not in str(error.value)
    assert str(error.value).endswith("(sentencepiece trains on sentences of up to 4,192 bytes, and none is that short)")
    train_tokenizer([sentence[:4192] for sentence in sentences], 20)  # at the limit: read
    with pytest.raises(TokenizerError, match="none is that short"):  # a byte over it: left out
        train_tokenizer([sentence[:4193] for sentence in sentences], 20)


def test_word_starts_mark_one_piece_a_word():
    """Each whitespace-separated word of a text begins with one piece that word_starts marks, and
    none of its other pieces is marked; a model that marks word ends instead marks none."""
    tokenizer = train_tokenizer(SENTENCES, vocab_size=64)
    starts = tokenizer.word_starts
    assert starts.shape == (64,) and starts.dtype == bool and not starts[[PAD_ID, EOS_ID, UNK_ID, BOS_ID]].any()
    for sentence in SENTENCES[:4] + ["(ein) Mann , 123 ü"]:
        assert starts[tokenizer.encode(sentence, add_eos=False)].sum() == len(sentence.split()), sentence
    model = model_pb2.ModelProto()
    model.ParseFromString(tokenizer.model_proto)
    model.trainer_spec.treat_whitespace_as_suffix = True
    assert Tokenizer(model.SerializeToString()).word_starts is None
