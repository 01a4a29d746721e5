"""generate(): the cached search on a real model against decoding by recomputing the whole prefix."""

import argparse
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

from jaxformer.commands.decoding_flags import length_penalty_alpha
from jaxformer.decoding.beam_search import ALPHA_RULE, LENGTH_PENALTIES, MAX_ALPHA, is_valid_alpha, length_penalty
from jaxformer.decoding.generate import DecodeSettings, check_source_ids, generate, make_generate_fn
from jaxformer.model.config import ConfigError, preset
from jaxformer.model.transformer import Transformer
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID
from jaxformer.training.config_rules import VALUE_RULES

# One worker for the module: its tests share programs (and module fixtures) that a second
# worker would trace, lower and fetch again.
pytestmark = pytest.mark.xdist_group("generate")

CONFIG = preset("tiny", vocab_size=40, deterministic=True)
EXTRA = 5


@pytest.fixture(scope="module")
def params():
    model = Transformer(CONFIG)
    variables = model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))
    params = nn.meta.unbox(variables["params"])
    return params


def source_rows():
    source = jax.random.randint(jax.random.key(1), (3, 6), 4, CONFIG.vocab_size)
    source = source.at[:, -1].set(EOS_ID)
    return source.at[1, 3:].set(PAD_ID).at[1, 2].set(EOS_ID)  # row 1: 2 tokens + EOS


def recomputed_greedy(params, source, max_length):
    """Greedy decoding the way torch nn.Transformer users write it: the full decoder each step,
    the most likely token other than pad and BOS, EOS at the row's limit. (tokens, log p) per row."""
    model = Transformer(CONFIG)
    apply = jax.jit(lambda p, s, t: model.apply({"params": p}, s, t))
    limits = np.asarray((source != PAD_ID).sum(axis=1)) + EXTRA
    outputs = []
    for row in range(source.shape[0]):
        prefix, total = [BOS_ID], 0.0
        while True:
            # One compiled shape: the prefix padded to the longest; causal attention leaves the
            # logits at its last token unchanged by what follows.
            padded = jnp.asarray([prefix + [PAD_ID] * (max_length + 1 - len(prefix))])
            log_probs = np.asarray(jax.nn.log_softmax(apply(params, source[row : row + 1], padded)[0, len(prefix) - 1]))
            allowed = np.full(CONFIG.vocab_size, -np.inf)
            allowed[EOS_ID] = log_probs[EOS_ID]
            if len(prefix) < limits[row]:
                allowed = log_probs.copy()
                allowed[[PAD_ID, BOS_ID]] = -np.inf
            token = int(np.argmax(allowed))
            prefix.append(token)
            total += float(log_probs[token])  # the model's log-probability, EOS at the limit included
            if token == EOS_ID or len(prefix) - 1 == max_length:
                break
        outputs.append((prefix[1:], total))
    return outputs


def test_cached_greedy_equals_recomputation(params):
    source = source_rows()
    tokens, scores = make_generate_fn(CONFIG, DecodeSettings(method="greedy", max_extra_length=EXTRA))(params, source)
    assert tokens.shape == (3, 1, 6 + EXTRA)
    for row, (expected, log_prob) in enumerate(recomputed_greedy(params, source, 6 + EXTRA)):
        assert list(np.asarray(tokens[row, 0, : len(expected)])) == expected
        assert (np.asarray(tokens[row, 0, len(expected) :]) == PAD_ID).all()
        np.testing.assert_allclose(scores[row, 0], log_prob, rtol=1e-5, atol=1e-5)


def test_output_stops_at_source_length_plus_extra(params):
    source = source_rows()
    tokens, scores = jax.jit(lambda p, s: generate(Transformer(CONFIG), p, s, DecodeSettings(max_extra_length=EXTRA)))(
        params, source
    )
    assert tokens.shape == (3, 4, 6 + EXTRA) and scores.shape == (3, 4)
    limits = np.asarray((source != PAD_ID).sum(axis=1)) + EXTRA
    for row in range(3):
        for hypothesis in np.asarray(tokens[row]):
            length = int(np.argmax(hypothesis == EOS_ID)) + 1 if EOS_ID in hypothesis else len(hypothesis)
            assert EOS_ID in hypothesis and length <= limits[row]
            assert PAD_ID not in hypothesis[:length] and BOS_ID not in hypothesis[:length]
        assert (np.diff(np.asarray(scores[row])) <= 1e-6).all()  # best first


def test_sampling_is_seeded(params):
    source = source_rows()
    sample = make_generate_fn(CONFIG, DecodeSettings(method="sample", temperature=1.5, max_extra_length=EXTRA))
    first, _ = sample(params, source, jax.random.key(3))
    again, _ = sample(params, source, jax.random.key(3))
    other, _ = sample(params, source, jax.random.key(4))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize("seed", [5, np.int64(5), jnp.int32(5)], ids=["int", "numpy", "jax-scalar"])
def test_sampling_refuses_a_seed_given_for_its_key_naming_rng(params, seed, monkeypatch):
    """A seed in place of the key failed in jax.random.split ("invalid PRNG key data: expected
    key_data.ndim >= 1; got ndim=0"), naming no argument."""
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)  # a user's call: no annotation checks
    settings = DecodeSettings(method="sample", max_extra_length=EXTRA)
    message = (
        r"^rng must be a random key, got the int 5: pass jax\.random\.key\(5\)$"
        if np.ndim(seed) == 0 and not isinstance(seed, jax.Array)
        else r"^rng must be a random key, got an array of dtype int32, shape \(\): pass jax\.random\.key\(seed\)$"
    )
    with pytest.raises(TypeError, match=message):
        make_generate_fn(CONFIG, settings)(params, source_rows(), seed)
    with pytest.raises(TypeError, match=r"^rng must be a random key"):  # inside a caller's jit: at trace time
        jax.jit(lambda p, s, r: generate(Transformer(CONFIG), p, s, settings, r))(params, source_rows(), seed)


def test_sampling_takes_a_new_or_a_raw_key():
    settings = DecodeSettings(method="sample", max_extra_length=EXTRA)
    shapes = jax.ShapeDtypeStruct(source_rows().shape, jnp.int32)
    params = jax.eval_shape(Transformer(CONFIG).init, jax.random.key(0), shapes, shapes)["params"]
    for key in (jax.random.key(3), jax.random.PRNGKey(3)):  # jax.random.PRNGKey's raw uint32 [2] too
        tokens, _ = jax.eval_shape(make_generate_fn(CONFIG, settings).jitted, params, shapes, key)
        assert tokens.shape == (3, 1, 6 + EXTRA)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="nucleus"):
        DecodeSettings(method="nucleus")


@pytest.mark.parametrize(
    "values,message",
    [
        (dict(alpha=float("nan")), r"alpha must be a finite number from 0 to 4 \(above it .*\), got nan"),
        (dict(alpha=-0.5), r"alpha must be a finite number from 0 to 4 \(above it .*\), got -0.5"),
        (dict(method="sample", temperature=0.0), r"temperature must be a finite number > 0 that float32 holds"),
        (  # float32's inf, with numpy's overflow warning, where sampling divides by it: every token alike
            dict(method="sample", temperature=1e39),
            r"^temperature must be a finite number > 0 that float32 holds \(at most 3.4028235e\+38\), got 1e\+39$",
        ),
        (dict(method="sample", top_k=-5), r"top_k must be >= 0 \(0: the whole vocabulary\), got -5"),
        (dict(beam_size=0), r"beam_size must be >= 1, got 0"),
        (dict(max_extra_length=0), r"max_extra_length must be from 1 to 4096, got 0"),
        (dict(max_extra_length=10**9), r"max_extra_length must be from 1 to 4096, got 1000000000"),
    ],
)
def test_settings_that_would_decode_wrongly_are_refused(values, message):
    with pytest.raises(ValueError, match=message):
        DecodeSettings(**values)


@pytest.mark.parametrize("form", LENGTH_PENALTIES)
def test_the_largest_alpha_keeps_the_float32_length_penalty_finite_at_any_length(form):
    """MAX_ALPHA's penalty is finite, as the search computes it, at the longest hypothesis its int32
    token count allows, and the limit is near the overflow (|Y|^alpha's, 128 / 31 = 4.13, computed
    here in float64): alpha 4.2 or a huge one make the penalty inf there."""
    longest = 2**31 - 1
    assert np.isfinite(length_penalty(longest, MAX_ALPHA, form))
    assert MAX_ALPHA <= np.log(np.finfo(np.float32).max) / np.log(longest) < MAX_ALPHA * 1.05
    with np.errstate(over="ignore"):
        assert np.isinf(length_penalty(longest, 1e39, form))
    assert np.isinf(length_penalty(longest, 4.2, "transformers"))


@pytest.mark.parametrize("alpha", [1e39, 1e308, 100.0, float(np.nextafter(MAX_ALPHA, np.inf))])
def test_an_alpha_whose_length_penalty_overflows_float32_is_refused(alpha):
    """Finite, but ((5 + |Y|) / 6)^alpha or |Y|^alpha is inf in the search's float32 at some length it
    can reach, and every hypothesis would score 0."""
    with pytest.raises(ValueError, match=rf"^alpha must be {re.escape(ALPHA_RULE)}, got {re.escape(str(alpha))}$"):
        DecodeSettings(alpha=alpha)
    assert "the length penalty overflows float32 on a hypothesis of up to 2**31 - 1 tokens" in ALPHA_RULE
    assert DecodeSettings(alpha=MAX_ALPHA).alpha == MAX_ALPHA


@pytest.mark.parametrize("alpha", [0.0, 0.6, 4.0, -0.0, -1e-12, 4.000001, math.nan, math.inf, -math.inf])
def test_every_alpha_check_is_the_one_rule(alpha):
    """DecodeSettings, --alpha and the config's decoding.alpha and training.final_alphas accept the
    alphas is_valid_alpha does, a finite number from 0 to 4, and refuse the others with ALPHA_RULE."""
    valid = math.isfinite(alpha) and 0 <= alpha <= 4
    assert MAX_ALPHA == 4 and is_valid_alpha(alpha) == valid
    for check, problem in (
        (lambda: DecodeSettings(alpha=alpha), ValueError),
        (lambda: length_penalty_alpha(str(alpha)), argparse.ArgumentTypeError),
    ):
        if valid:
            check()
        else:
            with pytest.raises(problem, match=re.escape(ALPHA_RULE)):
                check()
    assert VALUE_RULES["decoding.alpha"][0](alpha) == valid
    assert VALUE_RULES["training.final_alphas"][0]((0.6, alpha)) == valid
    assert is_valid_alpha(np.float32(alpha)) == is_valid_alpha(int(alpha) if valid else alpha) == valid  # the config's


@pytest.mark.parametrize(
    "values,message",
    [
        (dict(beam_size=2.0), r"^beam_size must be an integer, got 2.0$"),
        (dict(beam_size="4"), r"^beam_size must be an integer, got '4'$"),
        (dict(beam_size=True), r"^beam_size must be an integer, got True$"),
        (dict(max_extra_length=2.5), r"^max_extra_length must be an integer, got 2.5$"),
        (dict(top_k=np.float32(3)), r"^top_k must be an integer, got 3.0$"),
        (dict(alpha="0.6"), r"^alpha must be a number, got '0.6'$"),
        (dict(alpha=False), r"^alpha must be a number, got False$"),
        (dict(temperature=None), r"^temperature must be a number, got None$"),
        (dict(method=None), r"^method must be a string, got None$"),
        (dict(stop=1), r"^stop must be a string, got 1$"),
        (dict(length_penalty=b"gnmt"), r"^length_penalty must be a string, got b'gnmt'$"),
        (dict(renormalize_after_bans=1), r"^renormalize_after_bans must be True or False, got 1$"),
        (dict(renormalize_after_bans="false"), r"^renormalize_after_bans must be True or False, got 'false'$"),
    ],
)
def test_settings_of_the_wrong_type_are_refused_before_anything_is_traced(values, message):
    with pytest.raises(ValueError, match=message):
        DecodeSettings(**values)


def test_numpy_settings_are_pythons():
    settings = DecodeSettings(
        beam_size=np.int64(3),
        alpha=np.float32(0.5),
        max_extra_length=np.int32(7),
        top_k=1,
        renormalize_after_bans=np.True_,
    )
    assert settings == DecodeSettings(beam_size=3, alpha=0.5, max_extra_length=7, top_k=1, renormalize_after_bans=True)
    assert type(settings.beam_size) is int and type(settings.alpha) is float
    assert type(settings.renormalize_after_bans) is bool
    assert DecodeSettings(alpha=1, temperature=2).alpha == 1  # an int is a number


@pytest.mark.parametrize(
    "architecture,use", [("decoder_only", "continue_prompts or LanguageModel"), ("encoder_only", "")]
)
def test_generate_refuses_a_model_that_does_not_translate(architecture, use):
    config = CONFIG.replace(architecture=architecture)
    message = f"^make_generate_fn translates with an encoder_decoder model, not architecture='{architecture}'.*{use}"
    with pytest.raises(ConfigError, match=message):
        make_generate_fn(config, DecodeSettings(max_extra_length=EXTRA))


@pytest.mark.parametrize(
    "bad_id,row,position", [(CONFIG.vocab_size, 0, 2), (10**6, 2, 0), (-1, 1, 4)], ids=["vocab", "huge", "negative"]
)
def test_generate_names_a_source_id_outside_the_vocabulary(params, bad_id, row, position):
    generate_fn = make_generate_fn(CONFIG, DecodeSettings(method="greedy", max_extra_length=EXTRA))
    source = np.array(source_rows())
    source[row, position] = bad_id
    message = (
        rf"^source id {bad_id} at row {row}, position {position} is outside the model's source vocabulary \[0, 40\)$"
    )
    for given in (source, source.tolist(), source.astype(np.int64)):
        with pytest.raises(ValueError, match=message):
            generate_fn(params, given)
    on_device = jnp.asarray(source)
    for check in (lambda: generate_fn(params, on_device), lambda: check_source_ids(on_device, CONFIG.vocab_size)):
        with pytest.raises(ValueError, match=message):
            check()  # a jax.Array: copied to the host and checked, not NaN rows


def test_generate_refuses_a_source_past_the_models_positions(params):
    """make_generate_fn's search encoded a source of more ids than the model's max_positions (an
    imported model's), positions the model never had, without a word, where translate splits such
    a sentence and translate_ids refuses it: refused in one line naming the row, its length and the
    limit. The padding after a row's ids is no position."""
    source = np.array(source_rows())  # rows of 6, 3 (then padding) and 6 ids
    greedy = DecodeSettings(method="greedy", max_extra_length=EXTRA)
    bounded = make_generate_fn(CONFIG.replace(max_positions=5), greedy)
    message = r"^source row 0 has 6 ids before its padding, more than the model's 5 positions \(model.max_positions\): "
    for given in (source, jnp.asarray(source), source.tolist()):
        with pytest.raises(ValueError, match=message):  # was searched
            bounded(params, given)
    check_source_ids(source[1:2], CONFIG.vocab_size, max_positions=3)  # 3 ids, then padding to 6: they fit
    with pytest.raises(ValueError, match=r"^source row 0 has 3 ids before its padding, more than the model's 2 "):
        check_source_ids(source[1:2], CONFIG.vocab_size, max_positions=2)


def test_generate_names_a_source_of_the_wrong_shape_or_dtype(params):
    generate_fn = make_generate_fn(CONFIG, DecodeSettings(method="greedy", max_extra_length=EXTRA))
    source = np.array(source_rows())
    for given, error, message in (
        (source[0], ValueError, r"must be ids \[batch, length\] \(2-D\), got shape \(6,\): .* pass source\[None\]$"),
        (source[None], ValueError, r"must be ids \[batch, length\] \(2-D\), got shape \(1, 3, 6\)$"),
        ([[5, 6, EOS_ID], [5, EOS_ID]], ValueError, "must be ids \\[batch, length\\]: got rows of different lengths$"),
        (source.astype(np.float32), TypeError, r"ids must be integers, got dtype float32 \(shape \(3, 6\)\)$"),
        (jnp.asarray(source, jnp.float32), TypeError, "ids must be integers, got dtype float32"),
        (source > 3, TypeError, "ids must be integers, got dtype bool"),
    ):
        with pytest.raises(error, match="^source " + message):
            generate_fn(params, given)
    with pytest.raises(TypeError, match="got dtype float32"):  # inside a jitted program: when it is traced
        jax.jit(lambda source: generate_fn(params, source))(jnp.asarray(source, jnp.float32))
    expected = generate_fn(params, source.astype(np.int32))
    for given in (source.astype(np.int64), source.astype(np.uint8), source.tolist(), jnp.asarray(source, jnp.int16)):
        tokens, scores = generate_fn(params, given)  # any integers: cast to int32
        np.testing.assert_array_equal(tokens, expected[0])
        np.testing.assert_array_equal(scores, expected[1])


@pytest.mark.parametrize(
    "given, message",
    [
        (np.zeros((0, 6), np.int32), r"has shape \(0, 6\), its batch dimension empty: .* at least one row, each "),
        (np.zeros((3, 0), np.int32), r"has shape \(3, 0\), its length dimension empty: "),
        (np.zeros((0, 0), np.int64), r"has shape \(0, 0\), its batch and length dimensions empty: "),
        ([[]], r"has shape \(1, 0\), its length dimension empty: "),  # not numpy's float64 for it
        (jnp.zeros((0, 6), jnp.int32), r"has shape \(0, 6\), its batch dimension empty: "),
        ([], r"must be ids \[batch, length\] \(2-D\), got shape \(0,\)$"),  # no source\[None\] hint
    ],
    ids=["no_rows", "no_ids", "neither", "list_of_an_empty_row", "jax_no_rows", "empty_list"],
)
def test_generate_names_an_empty_source_dimension(given, message):
    generate_fn = make_generate_fn(CONFIG, DecodeSettings(method="greedy", max_extra_length=EXTRA))
    with pytest.raises(ValueError, match="^source " + message):
        generate_fn({}, given)  # refused before the parameters are read or anything is compiled
    if isinstance(given, np.ndarray):  # inside a jitted program: when it is traced
        with pytest.raises(ValueError, match="^source " + message):
            jax.jit(lambda source: generate_fn({}, source))(given)


def test_generate_checks_separate_vocabularies_by_the_source_side():
    config = CONFIG.replace(source_vocab_size=60, share_embeddings=False)
    generate_fn = make_generate_fn(config, DecodeSettings(method="greedy", max_extra_length=EXTRA))
    with pytest.raises(ValueError, match=r"source id 60 at row 0, position 1 .* \[0, 60\)$"):
        generate_fn({}, np.array([[59, 60, EOS_ID]]))  # refused before the parameters are read


def test_generate_refuses_padding_before_a_rows_last_id(params):
    """A left-padded row ([PAD, PAD, ids..., EOS]) or one with PAD inside was searched as given: the
    encoder's mask dropped the PAD, the ids after it were encoded at shifted positions, and the row
    translated otherwise than unpadded, without a word (translate_ids refuses the same). Refused in
    one line naming the row and position; a row of PAD alone (a batch's filler) still passes."""
    generate_fn = make_generate_fn(CONFIG, DecodeSettings(method="greedy", max_extra_length=EXTRA))
    source = np.array(source_rows())  # row 1: 2 ids + EOS, then padding
    left_padded = source.copy()
    left_padded[1] = np.roll(source[1], 3)  # PAD, PAD, PAD, 2 ids, EOS
    message = r"^source row 1 has PAD \(0\) at position 0, before its last id at position 5: padding goes only after "
    for given in (left_padded, jnp.asarray(left_padded), left_padded.tolist()):
        with pytest.raises(ValueError, match=message):
            generate_fn(params, given)
    gap = source.copy()
    gap[2, 1] = PAD_ID
    with pytest.raises(
        ValueError, match=r"^source row 2 has PAD \(0\) at position 1, before its last id at position 5"
    ):
        generate_fn(params, gap)
    filler = source.copy()
    filler[2] = PAD_ID
    tokens, _ = generate_fn(params, filler)
    np.testing.assert_array_equal(tokens[:2], generate_fn(params, source)[0][:2])
