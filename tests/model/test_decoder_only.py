"""The decoder-only language model: the translator's decoder layers without cross-attention."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.model.cache import init_cache
from jaxformer.model.config import preset
from jaxformer.model.decoder import CausalDecoderLayer, DecoderLayer
from jaxformer.model.decoder_only import DecoderOnly
from jaxformer.model.transformer import Transformer, shift_right, stack_layers, unstack_layers
from jaxformer.tokens import EOS_ID, PAD_ID

# One worker for the module: its tests share programs (and module fixtures) that a second
# worker would trace, lower and fetch again.
pytestmark = pytest.mark.xdist_group("decoder-only")

TINY = preset("tiny", deterministic=True, architecture="decoder_only")
B, T = 3, 7


def translator_config(config):
    """The encoder-decoder model of the same sizes as the decoder-only `config`."""
    return config.replace(architecture="encoder_decoder")


def boxed_variables(config, length=T):
    """The initial variables with their logical axis names, as shapes only."""
    return jax.eval_shape(DecoderOnly(config).init, jax.random.key(0), jnp.ones((1, length), jnp.int32))


def init_params(config, length=T):
    tokens = jnp.ones((1, length), jnp.int32)
    return nn.meta.unbox(jax.jit(DecoderOnly(config).init)(jax.random.key(0), tokens)["params"])


def jit_apply(model, **kwargs):
    return jax.jit(lambda params, *args: model.apply({"params": params}, *args, **kwargs))


def text(key, rows, length, vocab_size):
    return jax.random.randint(key, (rows, length), 4, vocab_size)  # real tokens only: no pad/bos/eos


def decoder_inputs(key, rows=B, vocab_size=TINY.vocab_size):
    return shift_right(text(key, rows, T, vocab_size))  # [R, T]: BOS, then the text


def cached_logits(model, params, inputs, max_length):
    """Logits [R, T, V] from one jitted decode_step per position."""
    cache = init_cache(model.config, inputs.shape[0], max_length)
    step = jit_apply(model, method=DecoderOnly.decode_step)
    logits = []
    for position in range(inputs.shape[1]):
        step_logits, cache = step(params, inputs[:, position : position + 1], cache)
        logits.append(step_logits)
    assert int(cache.index) == inputs.shape[1]
    return jnp.stack(logits, axis=1)


# slow: pre-norm (about 2 s); covered in the default suite by tests/model/test_cache.py's
# test_cached_steps_equal_the_full_forward_pass[pre-norm] (the translator's decoder: the same layers and final norm,
# test_one_layer_implementation_serves_both_decoders) and [post-norm] here.
@pytest.mark.parametrize(
    "overrides",
    [{}, pytest.param({"normalization": "pre"}, marks=pytest.mark.slow), {"tie_output_embedding": False}],
    ids=["post-norm", "pre-norm", "untied"],
)
def test_cached_steps_equal_the_full_forward_pass(overrides):
    config = TINY.replace(**overrides)
    model, params = DecoderOnly(config), init_params(config)
    inputs = decoder_inputs(jax.random.key(1))
    full = jit_apply(model)(params, inputs)  # [B, T, V]
    assert full.shape == (B, T, config.vocab_size) and full.dtype == jnp.float32
    # A cache longer than the text: its unused positions must stay invisible.
    np.testing.assert_allclose(cached_logits(model, params, inputs, max_length=T + 4), full, atol=1e-5, rtol=1e-5)


# slow: pre-norm (about 2 s); covered in the default suite by [post] here (the segment masks do not depend on
# where the norm is) and tests/model/test_torch_equivalence.py's pre-norm language model.
@pytest.mark.parametrize("normalization", ["post", pytest.param("pre", marks=pytest.mark.slow)])
def test_packed_rows_equal_separate_rows(normalization):
    config = TINY.replace(normalization=normalization)
    model, params = DecoderOnly(config), init_params(config)
    apply = jit_apply(model)
    text_a, text_b = text(jax.random.key(2), 1, 3, TINY.vocab_size), text(jax.random.key(3), 1, 5, TINY.vocab_size)
    targets = jnp.concatenate([text_a, text_b, jnp.zeros((1, 2), jnp.int32)], axis=1)  # [1, 10]
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 2, 0, 0]])
    positions = jnp.array([[0, 1, 2, 0, 1, 2, 3, 4, 0, 0]])
    packed = apply(params, shift_right(targets, segments), segments, positions)  # [1, 10, V]
    np.testing.assert_allclose(packed[0, :3], apply(params, shift_right(text_a))[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(packed[0, 3:8], apply(params, shift_right(text_b))[0], atol=1e-5, rtol=0)


def test_causality_and_padding():
    model, params = DecoderOnly(TINY), init_params(TINY)
    apply = jit_apply(model)
    inputs = decoder_inputs(jax.random.key(4))
    logits = apply(params, inputs)
    changed = apply(params, inputs.at[:, 4].set(EOS_ID))
    np.testing.assert_allclose(changed[:, :4], logits[:, :4], atol=1e-6, rtol=0)
    assert not np.allclose(changed[:, 4:], logits[:, 4:], atol=1e-4)
    padded = apply(params, jnp.pad(inputs, ((0, 0), (0, 3)), constant_values=PAD_ID))
    np.testing.assert_allclose(padded[:, :T], logits, atol=1e-5, rtol=0)


def test_hidden_states_project_to_the_logits():
    config = TINY.replace(normalization="pre")
    model, params = DecoderOnly(config), init_params(config)
    inputs = decoder_inputs(jax.random.key(5))
    hidden, embedding = jit_apply(model, method=DecoderOnly.hidden_states)(params, inputs)  # [B, T, D], [V, D]
    np.testing.assert_array_equal(embedding, params["embedding"]["embedding"])
    np.testing.assert_allclose(hidden @ embedding.T, jit_apply(model)(params, inputs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("normalization", ["post", "pre"])
def test_parameter_tree_is_the_translators_decoder_without_cross_attention(normalization):
    config = TINY.replace(normalization=normalization)
    params = nn.meta.unbox(boxed_variables(config)["params"])
    assert set(params) == {"embedding", "decoder"}
    layers = {f"layer_{index}" for index in range(config.num_decoder_layers)}
    assert set(params["decoder"]) == layers | ({"final_norm"} if normalization == "pre" else set())
    tokens = jnp.ones((1, T), jnp.int32)
    translator = jax.eval_shape(Transformer(translator_config(config)).init, jax.random.key(0), tokens, tokens)
    translator_decoder = nn.meta.unbox(translator["params"]["decoder"])
    for layer in layers:
        kept = {key: value for key, value in translator_decoder[layer].items() if not key.startswith("cross_attention")}
        assert set(translator_decoder[layer]) - set(kept) == {"cross_attention", "cross_attention_norm"}
        assert jax.tree.map(lambda leaf: leaf.shape, params["decoder"][layer]) == jax.tree.map(
            lambda leaf: leaf.shape, kept
        )
    untied = nn.meta.unbox(boxed_variables(config.replace(tie_output_embedding=False))["params"])
    assert untied["decoder"]["logits_kernel"].shape == (config.d_model, config.vocab_size)


def test_one_layer_implementation_serves_both_decoders(monkeypatch):
    assert issubclass(CausalDecoderLayer, DecoderLayer)
    for shared in ("_sublayers", "_cached_step", "setup"):
        assert shared not in vars(CausalDecoderLayer)
        assert getattr(CausalDecoderLayer, shared) is getattr(DecoderLayer, shared)
    model, params = DecoderOnly(TINY), init_params(TINY)
    assert type(model.bind({"params": params}).decoder.stack.layer[0]) is CausalDecoderLayer

    # What runs is DecoderLayer._sublayers, with the cross-attention sub-layer left out.
    original, cross_attend_given = DecoderLayer._sublayers, []

    def spy(self, inputs, self_attend, cross_attend, deterministic):
        cross_attend_given.append(cross_attend is not None)
        return original(self, inputs, self_attend, cross_attend, deterministic)

    monkeypatch.setattr(DecoderLayer, "_sublayers", spy)
    inputs = decoder_inputs(jax.random.key(6))
    jit_apply(model).trace(params, inputs)  # tracing runs the Python, compiles nothing
    jit_apply(model, method=DecoderOnly.decode_step).trace(params, inputs[:, :1], init_cache(TINY, B, T))
    assert cross_attend_given == [False] * (2 * TINY.num_decoder_layers)


def test_the_source_side_is_given_exactly_to_a_decoder_with_cross_attention():
    model, params = DecoderOnly(TINY), init_params(TINY)
    inputs = decoder_inputs(jax.random.key(7))
    encoded = jnp.zeros((B, T, TINY.d_model))
    with pytest.raises(ValueError, match="no cross-attention .* takes no encoder output"):
        model.apply({"params": params}, inputs, method=lambda module, x: module.decoder.context(encoded, x))
    translator = jax.eval_shape(Transformer(translator_config(TINY)).init, jax.random.key(0), inputs, inputs)
    with pytest.raises(ValueError, match="needs the encoded source"):
        jax.eval_shape(
            lambda v: Transformer(translator_config(TINY)).apply(v, inputs, method=lambda module, x: module.decoder(x)),
            translator,
        )


@pytest.mark.parametrize(
    "overrides", [{"scan_layers": True}, {"remat_policy": "full"}, {"scan_layers": True, "remat_policy": "full"}]
)
def test_scan_and_remat_give_the_same_logits(overrides):
    config = TINY.replace(normalization="pre", **overrides)
    params = init_params(TINY.replace(normalization="pre"))
    inputs = decoder_inputs(jax.random.key(8))
    plain = jit_apply(DecoderOnly(TINY.replace(normalization="pre")))(params, inputs)
    converted = stack_layers(params) if config.scan_layers else params
    abstract = nn.meta.unbox(boxed_variables(config)["params"])
    assert jax.tree.structure(abstract) == jax.tree.structure(converted)
    np.testing.assert_allclose(jit_apply(DecoderOnly(config))(converted, inputs), plain, atol=1e-5, rtol=1e-5)
    assert jax.tree.structure(unstack_layers(converted)) == jax.tree.structure(params)


def test_bfloat16_compute_keeps_float32_params_and_logits():
    config = TINY.replace(dtype="bfloat16")
    params = init_params(config)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    inputs = decoder_inputs(jax.random.key(9))
    low = jit_apply(DecoderOnly(config))(params, inputs)
    high = jit_apply(DecoderOnly(TINY))(params, inputs)
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, high, atol=0.15)
    assert np.abs(np.asarray(low) - np.asarray(high)).max() > 0


@pytest.mark.parametrize(
    "overrides", [{}, {"normalization": "pre", "tie_output_embedding": False, "scan_layers": True}]
)
def test_every_parameter_has_logical_axis_names(overrides):
    params = boxed_variables(TINY.replace(**overrides))["params"]
    for path, leaf in jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
        assert isinstance(leaf, nn.LogicallyPartitioned), jax.tree_util.keystr(path)
        assert len(leaf.names) == leaf.value.ndim and None not in leaf.names, jax.tree_util.keystr(path)
    specs = nn.get_partition_spec(params)
    assert tuple(specs["embedding"]["embedding"]) == ("vocab", "embed")
    query = specs["decoder"]["layers"]["layer"] if "layers" in specs["decoder"] else specs["decoder"]["layer_0"]
    assert tuple(query["self_attention"]["query_kernel"])[-3:] == ("embed", "heads", "kv")
