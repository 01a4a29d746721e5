"""The exported beam search's symbolic shapes: the positional encoding's bound, the platforms, and
the settings it carries."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.decoding.generate import DecodeSettings, decoding_variant, make_generate_fn
from jaxformer.export.program import export_beam_search, source_spec
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
    program, failed = export_beam_search(config, settings, params, 16, ("cpu", "tpu", "cuda"))
    assert program.platforms == ("cpu", "cuda")
    assert failed == {"tpu": "NotImplementedError: no TPU lowering for this operation"}
    with pytest.raises(NotImplementedError):  # nothing lowers: the error itself, not an empty program
        export_beam_search(config, settings, params, 16, ("tpu",))
    with pytest.raises(ValueError, match="beam search"):
        export_beam_search(config, DecodeSettings(method="greedy"), params, 16)


def test_the_exported_search_scores_as_its_settings_say(symbolic_shapes_unchecked):
    """An export of a search with renormalize_after_bans decodes as the run's own search does with
    it (an imported OPUS-MT model's that renormalizes): the same hypotheses and scores, not log p."""
    config = preset("tiny", vocab_size=40, num_encoder_layers=1, num_decoder_layers=1)
    tokens = jnp.ones((1, 4), jnp.int32)
    params = nn.meta.unbox(Transformer(config).init(jax.random.key(0), tokens, tokens)["params"])
    config, params = decoding_variant(config, params)
    settings = DecodeSettings(beam_size=2, max_extra_length=3, renormalize_after_bans=True)
    program, _ = export_beam_search(config, settings, params, 16, ("cpu",))
    source = np.array([[5, 6, 7, 1], [8, 1, 0, 0]], np.int32)
    exported_tokens, exported_scores = program.call(params, source)
    tokens, scores = make_generate_fn(config, settings)(params, source)
    np.testing.assert_array_equal(exported_tokens, tokens)
    # Not log p: its scores lie 4 to 5 nats lower here (these hypotheses end at the limit, where EOS then costs 0).
    np.testing.assert_allclose(exported_scores, scores, rtol=1e-5, atol=1e-5)
