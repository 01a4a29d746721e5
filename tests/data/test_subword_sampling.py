import collections

import numpy as np
import pytest

from jaxformer.data.pipeline import TokenizePair, eval_batches, train_dataset
from jaxformer.data.subword_sampling import SubwordSampling
from jaxformer.data.tokenizer import TokenizerError, train_tokenizer
from jaxformer.model.config import ConfigError
from jaxformer.tokens import EOS_ID
from jaxformer.training.experiment import default_config, validate
from tests.data.test_pipeline import corpus, data_section, unpack  # noqa: F401  (corpus: a fixture)

TEXT = "a big dog runs with the small child"


def sampled_dataset(corpus, sampling, **overrides):  # noqa: F811
    records, tokenizer = corpus
    data = data_section(**overrides)
    return train_dataset(records, TokenizePair.for_data(data, tokenizer, sampling=sampling), data)


def test_draws_follow_p_to_the_alpha_over_the_n_best(corpus):  # noqa: F811
    _, tokenizer = corpus
    candidates = tokenizer.nbest_encode(TEXT, 8)
    assert len(candidates) == 8
    assert tuple(candidates[0]) + (EOS_ID,) == tuple(tokenizer.encode(TEXT))  # the best is Viterbi's
    assert all(tokenizer.decode(ids) == TEXT for ids in candidates)
    # The reference: log P of a segmentation as the sum of its pieces' scores, read one by one.
    log_p = np.array([sum(tokenizer._processor.get_score(int(i)) for i in ids) for ids in candidates])
    assert np.all(np.diff(log_p) <= 1e-9)  # most likely first
    rng = np.random.default_rng(0)
    for alpha in (0.0, 0.3, 1.0):
        expected = np.exp(alpha * (log_p - log_p.max()))
        expected /= expected.sum()
        sampling = SubwordSampling(8, alpha)
        draws = collections.Counter(tuple(sampling.encode(tokenizer, TEXT, rng)[:-1]) for _ in range(4000))
        observed = np.array([draws[tuple(ids)] for ids in candidates]) / 4000
        assert sum(draws.values()) == sum(draws[tuple(ids)] for ids in candidates)  # nothing outside the n best
        np.testing.assert_allclose(observed, expected, atol=0.03)


def test_every_draw_decodes_to_the_text_and_ends_with_eos(corpus):  # noqa: F811
    records, tokenizer = corpus
    rng = np.random.default_rng(1)
    sampling = SubwordSampling(16, 0.1)
    for record in records[:50]:
        text = record["de"].decode()
        ids = sampling.encode(tokenizer, text, rng)
        assert ids.dtype == np.int32 and ids[-1] == EOS_ID and EOS_ID not in ids[:-1]
        assert tokenizer.decode(ids) == text
    assert list(sampling.encode(tokenizer, "", rng)) == [EOS_ID]


def test_training_stream_draws_anew_each_epoch_and_restores_exactly(corpus):  # noqa: F811
    records, tokenizer = corpus
    sampling = SubwordSampling(8, 0.1)
    best = {tokenizer.decode(tokenizer.encode(r["en"].decode())) for r in records}

    def pairs(iterator, n):
        return [pair for _ in range(n) for pair in unpack(next(iterator))]

    plain = pairs(iter(sampled_dataset(corpus, None)), 12)
    drawn = pairs(iter(sampled_dataset(corpus, sampling)), 12)
    assert drawn == pairs(iter(sampled_dataset(corpus, sampling)), 12)  # seeded: the same draws again
    assert drawn != plain
    assert {tokenizer.decode(source) for source, _ in drawn} <= best  # other pieces, the same sentences
    # One sentence read in many epochs comes in several segmentations.
    iterator = iter(sampled_dataset(corpus, sampling))
    segmentations = collections.defaultdict(set)
    for source, _ in pairs(iterator, 400):
        segmentations[tokenizer.decode(source)].add(source)
    assert max(len(s) for s in segmentations.values()) > 1
    # A restored iterator draws what the original drew.
    iterator = iter(sampled_dataset(corpus, sampling))
    pairs(iterator, 7)
    state = iterator.get_state()
    expected = [next(iterator) for _ in range(5)]
    fresh = iter(sampled_dataset(corpus, sampling))
    fresh.set_state(state)
    for want in expected:
        got = next(fresh)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_evaluation_reads_the_best_segmentation(corpus):  # noqa: F811
    records, tokenizer = corpus
    data = data_section()
    tokenize = TokenizePair.for_data(data, tokenizer, sampling=SubwordSampling(8, 0.0))
    plain = TokenizePair.for_data(data, tokenizer)
    for with_sampling, without in zip(eval_batches(records, tokenize, data), eval_batches(records, plain, data)):
        for key in without:
            np.testing.assert_array_equal(with_sampling[key], without[key])


def test_sampling_needs_a_unigram_model(corpus):  # noqa: F811
    records, _ = corpus
    bpe = train_tokenizer([r[k].decode() for r in records for k in ("en", "de")], vocab_size=60, model_type="bpe")
    with pytest.raises(TokenizerError, match=r"sampling_nbest=4: .* the en tokenizer is a bpe model"):
        TokenizePair.for_data(data_section(), bpe, sampling=SubwordSampling(4, 0.2))
    config = default_config()
    config.tokenizer.sampling_nbest = 4
    validate(config)  # unigram, the default
    config.tokenizer.model_type = "bpe"
    with pytest.raises(ConfigError, match=r"tokenizer.sampling_nbest=4: .*model_type='bpe'"):
        validate(config)
    config.tokenizer.model_type = "unigram"
    config.tokenizer.sampling_alpha = -1.0
    with pytest.raises(ConfigError, match=r"tokenizer.sampling_alpha=-1.0: must be a finite number >= 0"):
        validate(config)


def test_from_config_is_off_at_zero():
    section = default_config().tokenizer
    assert SubwordSampling.from_config(section) is None
    section.sampling_nbest = 16
    assert SubwordSampling.from_config(section) == SubwordSampling(16, section.sampling_alpha)
