"""The encoder-only model: the translator's encoder against torch's, its tied masked-LM head and
its pooled output."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.model.config import preset
from jaxformer.model.encoder_only import EncoderOnly
from jaxformer.model.position import sinusoidal_table
from jaxformer.model.transformer import stack_layers
from jaxformer.tokens import PAD_ID
from jaxformer.training.sharding import DEFAULT_RULES
from tests.model.torch_weights import load_stack

TINY = preset("tiny", vocab_size=50, dropout_rate=0.0, deterministic=True, architecture="encoder_only")
B, S = 3, 7


def init_params(config):
    tokens = jnp.ones((1, S), jnp.int32)
    return nn.meta.unbox(jax.jit(EncoderOnly(config).init)(jax.random.key(0), tokens)["params"])


def jit_apply(config, method=None):
    model = EncoderOnly(config)
    return jax.jit(lambda params, *args: model.apply({"params": params}, *args, method=method))


def padded_tokens(vocab_size=TINY.vocab_size):
    tokens = jax.random.randint(jax.random.key(1), (B, S), 4, vocab_size)
    return tokens.at[0, 4:].set(PAD_ID).at[2, 2:].set(PAD_ID)  # rows of 4, 7 and 2 real tokens


def torch_encoder(torch, config, params):
    """torch.nn.TransformerEncoder with the flax encoder's weights (and a final LayerNorm with pre-norm)."""
    layer = torch.nn.TransformerEncoderLayer(
        config.d_model,
        config.num_heads,
        config.d_ff,
        dropout=0.0,
        activation=config.activation,
        layer_norm_eps=config.layer_norm_epsilon,
        batch_first=True,
        norm_first=config.normalization == "pre",
    )
    final_norm = (
        torch.nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon) if config.normalization == "pre" else None
    )
    encoder = torch.nn.TransformerEncoder(layer, config.num_encoder_layers, norm=final_norm, enable_nested_tensor=False)
    load_stack(encoder, params["encoder"])
    return encoder.eval()


@pytest.mark.parametrize("normalization", ["post", "pre"])
def test_encoder_matches_torch_transformer_encoder(normalization):
    torch = pytest.importorskip("torch")
    config = TINY.replace(normalization=normalization)
    params = init_params(config)
    tokens = padded_tokens()
    encoded = jit_apply(config, EncoderOnly.encode)(params, tokens)  # [B, S, D]
    # The model's input: scaled embedding + sinusoidal positions (dropout off).
    embedded = np.asarray(params["embedding"]["embedding"])[np.asarray(tokens)] * np.sqrt(config.d_model)
    inputs = torch.from_numpy((embedded + sinusoidal_table(S, config.d_model)).astype(np.float32))
    with torch.no_grad():
        expected = torch_encoder(torch, config, params)(
            inputs, src_key_padding_mask=torch.from_numpy(np.asarray(tokens) == PAD_ID)
        ).numpy()
    real = np.asarray(tokens) != PAD_ID  # padding queries are not compared: neither side uses them
    np.testing.assert_allclose(np.asarray(encoded)[real], expected[real], atol=1e-5, rtol=1e-5)


def test_masked_lm_logits_are_tied_to_the_embedding():
    params = init_params(TINY)
    tokens = padded_tokens()
    logits = jit_apply(TINY)(params, tokens)  # [B, S, V]
    assert logits.shape == (B, S, TINY.vocab_size) and logits.dtype == jnp.float32
    hidden, embedding = jit_apply(TINY, EncoderOnly.hidden_states)(params, tokens)  # [B, S, D], [V, D]
    np.testing.assert_array_equal(embedding, params["embedding"]["embedding"])
    np.testing.assert_allclose(logits, np.asarray(hidden) @ np.asarray(embedding).T, atol=1e-5, rtol=1e-5)
    assert "logits_kernel" not in params["encoder"] and set(params) == {"embedding", "encoder", "mlm_head"}


def test_pooled_is_the_mean_over_real_tokens():
    config = TINY.replace(normalization="pre")
    params = init_params(config)
    tokens = padded_tokens()
    encoded = np.asarray(jit_apply(config, EncoderOnly.encode)(params, tokens))  # [B, S, D]
    pooled = jit_apply(config, EncoderOnly.pooled)(params, tokens)  # [B, D]
    real = np.asarray(tokens) != PAD_ID
    expected = np.stack([encoded[row][real[row]].mean(axis=0) for row in range(B)])
    np.testing.assert_allclose(pooled, expected, atol=1e-6, rtol=1e-5)
    # More padding changes neither the real tokens' states nor their mean.
    longer = jnp.pad(tokens, ((0, 0), (0, 4)), constant_values=PAD_ID)
    np.testing.assert_allclose(jit_apply(config, EncoderOnly.pooled)(params, longer), pooled, atol=1e-5, rtol=0)


def test_a_row_of_padding_alone_is_filler_that_pools_to_zeros_and_changes_no_other_row():
    """Not refused: the last evaluation batch of a split is filled with such rows (eval_batches)."""
    params = init_params(TINY)
    tokens = padded_tokens().at[1].set(PAD_ID)  # rows of 4 real tokens, none, and 2
    pooled = np.asarray(jit_apply(TINY, EncoderOnly.pooled)(params, tokens))
    eager = np.asarray(EncoderOnly(TINY).apply({"params": params}, tokens, method="pooled"))  # concrete: unchecked too
    np.testing.assert_array_equal(pooled[1], np.zeros(TINY.d_model, np.float32))
    np.testing.assert_array_equal(eager[1], pooled[1])
    alone = np.asarray(jit_apply(TINY, EncoderOnly.pooled)(params, tokens[::2]))  # the real rows without the filler
    np.testing.assert_allclose(pooled[::2], alone, atol=1e-6, rtol=1e-5)
    assert np.abs(alone).sum(axis=1).min() > 0  # a real row's vector is not the filler's


@pytest.mark.parametrize("overrides", [{"scan_layers": True}, {"remat_policy": "full", "normalization": "pre"}])
def test_scan_and_remat_give_the_same_logits(overrides):
    plain_config = TINY.replace(normalization=overrides.get("normalization", "post"))
    config = plain_config.replace(**overrides)
    params = init_params(plain_config)
    tokens = padded_tokens()
    converted = stack_layers(params) if config.scan_layers else params
    scanned_or_remat = jit_apply(config)(converted, tokens)
    np.testing.assert_allclose(scanned_or_remat, jit_apply(plain_config)(params, tokens), atol=1e-5, rtol=1e-5)


def test_every_parameter_gets_a_gradient_and_bfloat16_stays_close():
    config = TINY.replace(activation="gelu")
    params = init_params(config)
    tokens = padded_tokens()

    def loss(params, config):
        logits = EncoderOnly(config).apply({"params": params}, tokens)
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 7])

    grads = jax.jit(jax.grad(loss), static_argnums=1)(params, config)
    for path, grad in jax.tree_util.tree_leaves_with_path(grads):
        assert np.isfinite(grad).all() and np.abs(grad).max() > 0, jax.tree_util.keystr(path)
    low = jit_apply(config.replace(dtype="bfloat16"))(params, tokens)
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, jit_apply(config)(params, tokens), atol=0.15)


@pytest.mark.parametrize("overrides", [{}, {"normalization": "pre", "scan_layers": True}])
def test_every_parameter_has_logical_axis_names_the_rules_map(overrides):
    tokens = jax.ShapeDtypeStruct((1, S), jnp.int32)
    params = jax.eval_shape(EncoderOnly(TINY.replace(**overrides)).init, jax.random.key(0), tokens)["params"]
    for path, leaf in jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
        where = jax.tree_util.keystr(path)
        assert isinstance(leaf, nn.LogicallyPartitioned) and len(leaf.names) == leaf.value.ndim, where
        nn.logical_to_mesh_axes(leaf.names, DEFAULT_RULES)  # raises on a name given twice
        assert set(leaf.names) <= {name for name, _ in DEFAULT_RULES}, (where, leaf.names)
    specs = nn.get_partition_spec(params)
    assert tuple(specs["mlm_head"]["dense"]["kernel"]) == ("mlp", "embed")
