"""Batches padded to a source length compiled already: fewer compilations, the same results as
each sentence translated alone in a batch of its own bucket."""

import numpy as np
import pytest

from jaxformer.decoding import generate, sentence_batches
from jaxformer.decoding.generate import DecodeSettings
from jaxformer.decoding.translator import Translator
from jaxformer.tokens import EOS_ID, PAD_ID
from tests.conftest import read_raw

pytestmark = pytest.mark.xdist_group("decoding-workdir")


def test_padded_length_reuses_a_compiled_length_while_the_buffer_grows_little():
    padded = sentence_batches.padded_length
    assert padded(20, 16) == 32  # nothing compiled: its own bucket
    assert padded(20, 16, {48, 128}, 2.0) == 48  # the shortest that fits
    assert padded(20, 16, {48}) == 32  # growth 1: always its own bucket
    assert padded(40, 16, {32}, 4.0) == 48  # shorter than the batch: no use
    # With 50 extra tokens the buffer is 66 for a 16-token bucket, 82 for 32, 98 for 48:
    # at most 1.25 x longer, the 32-token bucket may take 48 (98 <= 102.5), the 16-token one not.
    assert padded(20, 16, {48}, 1.25, extra_length=50) == 48
    assert padded(5, 16, {48}, 1.25, extra_length=50) == 16
    assert padded(5, 16, {32, 48}, 1.25, extra_length=50) == 32  # 82 <= 82.5
    assert padded(5, 16, {48}, 1.25) == 16  # without extra tokens: 48 > 1.25 x 16


def test_longest_batch_first_sets_the_length_the_others_reuse():
    lengths = [40, 3, 18, 7, 33, 12, 5, 60, 9]
    sources = [np.append(np.full(n - 1, 7, np.int32), EOS_ID) for n in lengths]
    compiled = set()
    batches = list(
        sentence_batches.length_sorted_batches(
            sources, 3, 16, PAD_ID, EOS_ID, compiled_lengths=compiled, max_buffer_growth=2.0, extra_length=50
        )
    )
    # 64 + 50 <= 2 x (32 + 50) and <= 2 x (16 + 50): every batch takes the first one's length.
    assert [batch.shape for _, batch in batches] == [(3, 64)] * 3 and compiled == {64}
    bucketed = sentence_batches.length_sorted_batches(sources, 3, 16, PAD_ID, EOS_ID)
    assert [batch.shape for _, batch in bucketed] == [(3, 64), (3, 32), (3, 16)]  # the default: growth 1
    for indices, batch in batches:
        for row, index in enumerate(indices):
            np.testing.assert_array_equal(batch[row, : lengths[index]], sources[index])
            assert not batch[row, lengths[index] :].any()  # padding
        assert all(batch[row, 0] == EOS_ID for row in range(len(indices), 3))  # empty filler rows


def test_fewer_sentences_than_a_batch_take_the_power_of_two_that_holds_them():
    sources = [np.array([7, 7, EOS_ID], np.int32)] * 3
    for batch_size, rows in ((2048, 4), (3, 3), (2, 2), (1, 1)):
        shapes = [
            batch.shape for _, batch in sentence_batches.length_sorted_batches(sources, batch_size, 16, 0, EOS_ID)
        ]
        assert shapes == [(rows, 16)] * -(-3 // batch_size), batch_size
    assert [b.shape for _, b in sentence_batches.length_sorted_batches(sources[:1], 64, 16, 0, EOS_ID)] == [(1, 16)]


@pytest.fixture(scope="module")
def mixed_sentences():
    """Short and long sentences, so their buckets differ (16 and 48 tokens for the tiny tokenizer)."""
    short = read_raw("val.en.gz", 6)
    long = [" ".join(read_raw("val.en.gz", 12)[i : i + 2]) for i in (6, 8)]
    return [long[0], *short[:3], long[1], *short[3:]]


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param(DecodeSettings(method="greedy", max_extra_length=6), marks=pytest.mark.slow),  # 8 s; beam's stays
        DecodeSettings(beam_size=3, max_extra_length=6),
    ],
    ids=["greedy", "beam"],
)
def test_padding_to_a_compiled_length_changes_no_result(decoding_workdir, mixed_sentences, settings):
    # Growth 4: every batch padded to the longest one's length, whatever max_extra_length.
    together = Translator.from_workdir(decoding_workdir, settings=settings, batch_size=4, max_buffer_growth=4.0)
    config, params, tokenizer = together.config, together.params, together.tokenizer
    alone = Translator(config, params, tokenizer, settings, batch_size=4, max_buffer_growth=1.0)
    buckets = {16 * -(-len(together.tokenizer.encode(s)) // 16) for s in mixed_sentences}
    assert len(buckets) > 1  # else nothing is padded beyond its bucket

    nbest = together.translate_nbest(mixed_sentences)
    assert together.compiled_lengths == [max(buckets)]  # one compilation for every batch
    expected = [alone.translate_nbest([sentence])[0] for sentence in mixed_sentences]
    assert alone.compiled_lengths == sorted(buckets)
    # Texts exactly, every hypothesis; scores to float32 rounding (a longer padded key length
    # changes how the CPU's matmuls block their sums).
    assert [[text for text, _ in hypotheses] for hypotheses in nbest] == [
        [text for text, _ in hypotheses] for hypotheses in expected
    ]
    np.testing.assert_allclose(
        [[score for _, score in hypotheses] for hypotheses in nbest],
        [[score for _, score in hypotheses] for hypotheses in expected],
        rtol=1e-6,
    )
    assert len({hypotheses[0][0] for hypotheses in nbest}) > 1


def nbest_texts_and_scores(translator, sentences):
    nbest = translator.translate_nbest(sentences)
    return [[text for text, _ in hypotheses] for hypotheses in nbest], [[s for _, s in h] for h in nbest]


@pytest.mark.parametrize("stop", [pytest.param("exact", marks=pytest.mark.slow), "beam_full"])  # 8 s each
def test_a_growing_decoder_cache_changes_no_result(decoding_workdir, mixed_sentences, monkeypatch, stop):
    """The decoder cache starting at 4 positions and doubling (4, 8, 16, 32, then 48 + 30) gives
    the translations and scores of one cache of 78 positions from the start."""
    settings = DecodeSettings(beam_size=3, max_extra_length=30, stop=stop)
    results = {}
    for first in (4, 10**6):
        monkeypatch.setattr(generate, "FIRST_CACHE_LENGTH", first)
        translator = Translator.from_workdir(decoding_workdir, settings=settings, batch_size=4, max_buffer_growth=4.0)
        results[first] = nbest_texts_and_scores(translator, mixed_sentences)
    assert results[4][0] == results[10**6][0]
    np.testing.assert_allclose(results[4][1], results[10**6][1], rtol=1e-6)
    lengths = [len(text.split()) for texts in results[4][0] for text in texts]
    assert max(lengths) > 8  # some outputs outgrow the first caches


@pytest.mark.parametrize(
    "settings",
    [
        DecodeSettings(beam_size=3, max_extra_length=6, stop="beam_full"),
        pytest.param(DecodeSettings(method="sample"), marks=pytest.mark.slow),  # about 11 s; beam's stays
    ],
    ids=["beam", "sample"],
)
def test_parallel_batches_change_no_result(decoding_workdir, mixed_sentences, settings):
    """Batches decoded three at a time, from three threads, give the results of one at a time,
    in input order, samples included (their keys are drawn in batch order)."""
    results = [
        nbest_texts_and_scores(
            Translator.from_workdir(decoding_workdir, settings=settings, batch_size=2, parallel_batches=parallel),
            mixed_sentences,
        )
        for parallel in (1, 3)
    ]
    assert results[0] == results[1]
    assert len(set(map(tuple, results[0][0]))) > 1


def test_parallel_batches_must_be_positive(decoding_workdir):
    with pytest.raises(ValueError, match="^parallel_batches must be an integer >= 1, got 0$"):
        Translator.from_workdir(decoding_workdir, parallel_batches=0)


def test_a_long_sentences_hypotheses_are_the_best_combinations_of_its_pieces():
    import itertools

    from jaxformer.decoding.sentence_batches import join_pieces

    rng = np.random.default_rng(0)
    owners = [0, 1, 1, 1, 3]  # sentence 1 in three pieces; sentence 2 empty (no piece)
    decoded = [
        [(np.array([piece * 10 + k]), float(score)) for k, score in enumerate(sorted(rng.normal(size=4))[::-1])]
        for piece in range(len(owners))
    ]
    joined = join_pieces(owners, decoded, 4, decode=lambda tokens: f"w{int(tokens[0])}")
    assert joined[0] == [(f"w{k}", score) for k, (_, score) in enumerate(decoded[0])]
    assert joined[2] == [("", 0.0)] and len(joined[3]) == 4
    every = sorted(
        (
            (" ".join(f"w{int(t[0])}" for t, _ in combo), sum(s for _, s in combo))
            for combo in itertools.product(*decoded[1:4])
        ),
        key=lambda hypothesis: -hypothesis[1],
    )  # all 64 combinations: the exhaustive reference
    assert [text for text, _ in joined[1]] == [text for text, _ in every[:4]]
    np.testing.assert_allclose([score for _, score in joined[1]], [score for _, score in every[:4]], rtol=1e-12)


def test_a_hypothesis_cut_after_a_word_start_piece_ends_without_a_space(decoding_workdir):
    from jaxformer.decoding.sentence_batches import join_pieces
    from jaxformer.run.loading import load_checkpoint

    tokenizer = load_checkpoint(decoding_workdir, params=False)[1].load_tokenizer()
    words = list(tokenizer.encode("Ein Mann", add_eos=False))
    (word_start,) = [i for i in range(tokenizer.vocab_size) if tokenizer.pieces([i]) == ["\u2581"]]
    cut = np.array([*words, word_start, EOS_ID, PAD_ID])  # the length limit's EOS after a lone "▁"
    complete = np.array([*words, EOS_ID, PAD_ID, PAD_ID])
    assert tokenizer.decode(cut) == "Ein Mann " and tokenizer.decode(complete) == "Ein Mann"  # sentencepiece's
    owners = [0, 1, 1]  # sentence 1 in two pieces
    decoded = [[(cut, -1.0), (complete, -2.0)], [(cut, -1.0)], [(complete, -1.5)]]
    joined = join_pieces(owners, decoded, 2, tokenizer.decode)
    assert joined == [[("Ein Mann", -1.0), ("Ein Mann", -2.0)], [("Ein Mann Ein Mann", -2.5)]]  # one space between
