"""The exported beam search's symbolic shapes: the positional encoding's bound, the platforms, and
the settings it carries."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.decoding.generate import DecodeSettings, decoding_variant, make_generate_fn
from jaxformer.export.program import export_search, source_spec
from jaxformer.model import position
from jaxformer.model.config import preset
from jaxformer.model.transformer import Transformer


def test_a_symbolic_length_takes_the_exact_table_of_its_bound(symbolic_shapes_unchecked):
    (length,) = jax.export.symbolic_shape("S", constraints=["S <= 100"])
    assert position._upper_bound(length) == 100
    assert position._upper_bound(length + 50) == 150
    assert position._upper_bound(2 * length + 1) == 201

    def encode(x):  # [B, S] -> [1, S, D]
        return position.positional_encoding(x.shape[1], 16)

    program = jax.export.export(jax.jit(encode))(source_spec(100))
    for length in (1, 37, 100):
        np.testing.assert_array_equal(
            program.call(np.zeros((2, length), np.int32))[0], position.sinusoidal_table(length, 16)
        )


def test_an_unbounded_symbolic_length_is_an_error_naming_the_fix():
    (length,) = jax.export.symbolic_shape("S")
    with pytest.raises(ValueError, match="needs an upper bound: export with a constraint such as 'S <= 1024'"):
        position._upper_bound(length)


def test_platforms_that_do_not_lower_are_left_out_and_named(symbolic_shapes_unchecked, monkeypatch):
    config = preset("tiny", vocab_size=40, num_encoder_layers=1, num_decoder_layers=1)
    tokens = jnp.ones((1, 4), jnp.int32)
    params = nn.meta.unbox(Transformer(config).init(jax.random.key(0), tokens, tokens)["params"])
    config, params = decoding_variant(config, params)
    settings = DecodeSettings(beam_size=2, max_extra_length=3)
    real_export = jax.export.export

    def export_without_tpu(function, platforms):  # as if the TPU lowering of some operation were missing
        if "tpu" in platforms:
            raise NotImplementedError("no TPU lowering for this operation\n(more lines)")
        return real_export(function, platforms=platforms)

    monkeypatch.setattr(jax.export, "export", export_without_tpu)
    program, failed = export_search(config, settings, params, 16, ("cpu", "tpu", "cuda"))
    assert program.platforms == ("cpu", "cuda")
    assert failed == {"tpu": "NotImplementedError: no TPU lowering for this operation"}
    with pytest.raises(NotImplementedError):  # nothing lowers: the error itself, not an empty program
        export_search(config, settings, params, 16, ("tpu",))


def test_the_exported_search_scores_as_its_settings_say(symbolic_shapes_unchecked):
    """An export of a search with renormalize_after_bans decodes as the run's own search does with
    it (an imported OPUS-MT model's that renormalizes): the same hypotheses and scores, not log p."""
    config = preset("tiny", vocab_size=40, num_encoder_layers=1, num_decoder_layers=1)
    tokens = jnp.ones((1, 4), jnp.int32)
    params = nn.meta.unbox(Transformer(config).init(jax.random.key(0), tokens, tokens)["params"])
    config, params = decoding_variant(config, params)
    settings = DecodeSettings(beam_size=2, max_extra_length=3, renormalize_after_bans=True)
    program, _ = export_search(config, settings, params, 16, ("cpu",))
    source = np.array([[5, 6, 7, 1], [8, 1, 0, 0]], np.int32)
    exported_tokens, exported_scores = program.call(params, source)
    tokens, scores = make_generate_fn(config, settings)(params, source)
    np.testing.assert_array_equal(exported_tokens, tokens)
    # Not log p: its scores lie 4 to 5 nats lower here (these hypotheses end at the limit, where EOS then costs 0).
    np.testing.assert_allclose(exported_scores, scores, rtol=1e-5, atol=1e-5)


POSITIONS = 8  # the model's max_positions, as an imported OPUS-MT model has them
NEAR_THE_LAST_POSITION = DecodeSettings(beam_size=2, max_extra_length=6)  # S + 6 > POSITIONS for S >= 3


def _searches_within_positions(settings):
    """(a tiny model with max_positions POSITIONS and its parameters, decoding variant; its search
    exported with symbolic B and S <= POSITIONS; the export's program)."""
    config = preset("tiny", vocab_size=40, num_encoder_layers=1, num_decoder_layers=1, max_positions=POSITIONS)
    tokens = jnp.ones((1, 4), jnp.int32)
    params = nn.meta.unbox(Transformer(config).init(jax.random.key(0), tokens, tokens)["params"])
    config, params = decoding_variant(config, params)
    specs = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), params), source_spec(POSITIONS)
    symbolic = jax.export.export(make_generate_fn(config, settings).jitted, platforms=("cpu",))(*specs)
    program, _ = export_search(config, settings, params, POSITIONS, ("cpu",))
    return (config, params), symbolic, program


def test_a_symbolic_length_is_searched_within_the_models_positions(symbolic_shapes_unchecked):
    """A model with max_positions P searched a symbolic S in S + max_extra_length tokens, past its
    positions, where a concrete S gets min(S + max_extra_length, P); the export's program still
    returns its format's S + max_extra_length (the columns past P are padding: below)."""
    _, symbolic, program = _searches_within_positions(NEAR_THE_LAST_POSITION)
    length = symbolic.in_avals[-1].shape[1]
    assert symbolic.out_avals[0].shape[2] == jax.core.min_dim(length + 6, POSITIONS)  # was S + 6
    assert program.out_avals[0].shape[2] - program.in_avals[-1].shape[1] == 6


@pytest.mark.slow  # three searches compiled (about 7 s); the shapes are checked in the default suite above
def test_a_symbolic_length_near_the_last_position_gives_the_concrete_searchs_tokens(symbolic_shapes_unchecked):
    (config, params), symbolic, program = _searches_within_positions(NEAR_THE_LAST_POSITION)
    source = np.array([[5, 6, 7, 8, 9, 10, 1], [8, 1, 0, 0, 0, 0, 0]], np.int32)  # S = 7
    expected_tokens, expected_scores = make_generate_fn(config, NEAR_THE_LAST_POSITION)(params, source)
    assert expected_tokens.shape[2] == POSITIONS
    tokens, scores = symbolic.call(params, source)
    np.testing.assert_array_equal(tokens, expected_tokens)  # its shape too: was [B, K, S + 6]
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
    exported_tokens, exported_scores = program.call(params, source)
    assert exported_tokens.shape[2] == source.shape[1] + NEAR_THE_LAST_POSITION.max_extra_length
    np.testing.assert_array_equal(exported_tokens[:, :, :POSITIONS], expected_tokens)
    assert not exported_tokens[:, :, POSITIONS:].any()  # padding: no row reaches past P
    np.testing.assert_allclose(exported_scores, expected_scores, rtol=1e-5, atol=1e-5)
