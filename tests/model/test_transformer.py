import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.model.config import preset
from jaxformer.model.position import segment_positions
from jaxformer.model.transformer import Transformer, shift_right
from jaxformer.tokens import BOS_ID, PAD_ID

# One worker for the module: its tests share programs (and module fixtures) that a second
# worker would trace, lower and fetch again.
pytestmark = pytest.mark.xdist_group("transformer")

TINY = preset("tiny", deterministic=True)


def init_params(config, source_length=6, target_length=5):
    source = jnp.ones((1, source_length), jnp.int32)
    target = jnp.ones((1, target_length), jnp.int32)
    return nn.meta.unbox(jax.jit(Transformer(config).init)(jax.random.key(0), source, target)["params"])


def jit_apply(model, **kwargs):
    return jax.jit(lambda params, *args: model.apply({"params": params}, *args, **kwargs))


def random_tokens(key, shape, vocab_size):
    return jax.random.randint(key, shape, 4, vocab_size)  # real tokens only: no pad/bos/eos


# slow: the pre-norm model's causality, padding and packing (about 7 s, its programs compiled); covered in
# the default suite by the same tests' [post] (the masks do not depend on where the norm is) and
# tests/model/test_torch_equivalence.py's pre-norm cases (the whole pre-norm model, padded, as torch computes it).
@pytest.fixture(scope="module", params=["post", pytest.param("pre", marks=pytest.mark.slow)])
def model_and_params(request):
    config = TINY.replace(normalization=request.param)
    model = Transformer(config)
    return model, init_params(config), jit_apply(model)


def test_output_shape_and_dtype_without_allocating():
    model = Transformer(preset("base"))
    source = jax.ShapeDtypeStruct((3, 11), jnp.int32)
    target = jax.ShapeDtypeStruct((3, 7), jnp.int32)
    variables = jax.eval_shape(model.init, jax.random.key(0), source, target)
    logits = jax.eval_shape(lambda v, s, t: model.apply(v, s, t, deterministic=True), variables, source, target)
    assert logits.shape == (3, 7, 37_000) and logits.dtype == jnp.float32


def test_causality(model_and_params):
    model, params, apply = model_and_params
    source = random_tokens(jax.random.key(1), (2, 6), TINY.vocab_size)
    target = random_tokens(jax.random.key(2), (2, 8), TINY.vocab_size)
    logits = apply(params, source, target)
    for t in (1, 4, 7):
        changed = target.at[:, t].set((target[:, t] + 1 - 4) % (TINY.vocab_size - 4) + 4)
        changed_logits = apply(params, source, changed)
        np.testing.assert_allclose(changed_logits[:, :t], logits[:, :t], atol=1e-6, rtol=0)
        assert not np.allclose(changed_logits[:, t:], logits[:, t:], atol=1e-4)


def test_padding_invariance(model_and_params):
    model, params, apply = model_and_params
    source = random_tokens(jax.random.key(3), (2, 6), TINY.vocab_size).at[1, 4:].set(PAD_ID)
    target = random_tokens(jax.random.key(4), (2, 5), TINY.vocab_size).at[1, 3:].set(PAD_ID)
    logits = apply(params, source, target)
    padded_source = jnp.pad(source, ((0, 0), (0, 5)))
    padded_target = jnp.pad(target, ((0, 0), (0, 3)))
    for s, t in ((padded_source, target), (source, padded_target), (padded_source, padded_target)):
        padded_logits = apply(params, s, t)
        np.testing.assert_allclose(padded_logits[0, :5], logits[0, :5], atol=1e-5, rtol=0)
        np.testing.assert_allclose(padded_logits[1, :3], logits[1, :3], atol=1e-5, rtol=0)
    # The source padding really is masked: a pad-free but otherwise equal row differs.
    unmasked = apply(params, source.at[1, 4:].set(5), target)
    assert not np.allclose(unmasked[1, :3], logits[1, :3], atol=1e-4)


def test_packed_rows_equal_separate_rows(model_and_params):
    model, params, apply = model_and_params
    vocab = TINY.vocab_size
    src_a, src_b = random_tokens(jax.random.key(5), (1, 4), vocab), random_tokens(jax.random.key(6), (1, 3), vocab)
    tgt_a, tgt_b = random_tokens(jax.random.key(7), (1, 3), vocab), random_tokens(jax.random.key(8), (1, 5), vocab)
    # Pack both pairs into one row of 9 source and 9 target tokens.
    source = jnp.concatenate([src_a, src_b, jnp.zeros((1, 2), jnp.int32)], axis=1)
    target = jnp.concatenate([tgt_a, tgt_b, jnp.zeros((1, 1), jnp.int32)], axis=1)
    source_segments = jnp.array([[1, 1, 1, 1, 2, 2, 2, 0, 0]])
    target_segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 2, 0]])
    source_positions = jnp.array([[0, 1, 2, 3, 0, 1, 2, 0, 0]])
    target_positions = jnp.array([[0, 1, 2, 0, 1, 2, 3, 4, 0]])
    packed = apply(params, source, target, source_segments, target_segments, source_positions, target_positions)
    np.testing.assert_allclose(packed[0, :3], apply(params, src_a, tgt_a)[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(packed[0, 3:8], apply(params, src_b, tgt_b)[0], atol=1e-5, rtol=0)
    # Segments without positions mean the same packed row (they counted on across it before).
    np.testing.assert_array_equal(segment_positions(source_segments)[:, :7], source_positions[:, :7])
    np.testing.assert_array_equal(segment_positions(target_segments)[:, :8], target_positions[:, :8])
    derived = apply(params, source, target, source_segments, target_segments)
    np.testing.assert_allclose(derived[0, :8], packed[0, :8], atol=1e-6, rtol=0)


def test_encode_and_decode_methods_compose_to_call():
    model, params = Transformer(TINY), init_params(TINY)
    source = random_tokens(jax.random.key(9), (2, 6), TINY.vocab_size)
    target = random_tokens(jax.random.key(10), (2, 4), TINY.vocab_size)
    encoded = jit_apply(model, method=Transformer.encode)(params, source)
    assert encoded.shape == (2, 6, TINY.d_model)
    logits = jit_apply(model, method="decode")(params, encoded, source, target)
    # Two programs compiled apart may order a sum otherwise: CI once saw 1.19e-6 (10 units in the
    # last place) on a logit of 1.007; a wrong composition moves logits by far more than 1e-5.
    np.testing.assert_allclose(logits, jit_apply(model)(params, source, target), atol=1e-5, rtol=0)


def test_dropout_is_random_in_training_and_off_when_deterministic():
    config = preset("tiny", dropout_rate=0.3, attention_dropout_rate=0.2, activation_dropout_rate=0.2)
    model, params = Transformer(config), init_params(config)
    source = random_tokens(jax.random.key(11), (2, 6), config.vocab_size)
    target = random_tokens(jax.random.key(12), (2, 4), config.vocab_size)
    train_apply = jax.jit(lambda params, rng: model.apply({"params": params}, source, target, rngs={"dropout": rng}))
    train = [train_apply(params, jax.random.key(i)) for i in (0, 1)]
    assert not np.allclose(train[0], train[1])
    evaluation = jit_apply(model, deterministic=True)(params, source, target)
    by_config = jit_apply(Transformer(config.replace(deterministic=True)))(params, source, target)
    np.testing.assert_array_equal(evaluation, by_config)
    assert not np.allclose(train[0], evaluation)
    with pytest.raises(Exception, match="dropout"):
        jax.eval_shape(lambda: model.apply({"params": params}, source, target))  # training needs a dropout rng


@pytest.mark.parametrize("normalization", ["post", "pre"])
def test_every_parameter_gets_a_gradient(normalization):
    config = TINY.replace(normalization=normalization, activation="gelu")
    model, params = Transformer(config), init_params(config)
    source = random_tokens(jax.random.key(13), (2, 6), config.vocab_size)
    target = random_tokens(jax.random.key(14), (2, 5), config.vocab_size)

    def loss(params):
        logits = model.apply({"params": params}, source, target)
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 7])

    grads = jax.jit(jax.grad(loss))(params)
    for path, grad in jax.tree_util.tree_leaves_with_path(grads):
        assert np.isfinite(grad).all() and np.abs(grad).max() > 0, jax.tree_util.keystr(path)
    assert ("final_norm" in params["encoder"]) == (normalization == "pre")


def test_variants_change_the_model():
    source = random_tokens(jax.random.key(15), (2, 6), TINY.vocab_size)
    target = random_tokens(jax.random.key(16), (2, 4), TINY.vocab_size)

    def logits(config):
        return jit_apply(Transformer(config))(init_params(config), source, target)

    relu = logits(TINY)
    assert not np.allclose(relu, logits(TINY.replace(activation="gelu")), atol=1e-4)
    assert not np.allclose(relu, logits(TINY.replace(normalization="pre")), atol=1e-4)
    untied = init_params(TINY.replace(share_embeddings=False, tie_output_embedding=False))
    assert {"source_embedding", "target_embedding"} <= set(untied)
    assert untied["decoder"]["logits_kernel"].shape == (TINY.d_model, TINY.vocab_size)


def reduced_against_float32(config, atol):
    """(model, params, source, target) of `config`, a reduced-precision TINY, after checking that
    its parameters are float32 and its logits float32, within `atol` of TINY's and not equal."""
    model, params = Transformer(config), init_params(config)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    source = random_tokens(jax.random.key(17), (2, 6), config.vocab_size)
    target = random_tokens(jax.random.key(18), (2, 4), config.vocab_size)
    low = jit_apply(model)(params, source, target)
    high = jit_apply(Transformer(TINY))(params, source, target)
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, high, atol=atol)
    assert np.abs(np.asarray(low) - np.asarray(high)).max() > 0
    return model, params, source, target


def test_bfloat16_compute_keeps_float32_params_and_logits():
    reduced_against_float32(TINY.replace(dtype="bfloat16"), atol=0.15)


def test_bfloat16_matmuls_round_the_weight_products_operands_only():
    """matmul_dtype=bfloat16 under float32 compute: every weight product (Q, K, V, W^O, the
    feed-forward pair, the tied output projection) is a bf16 x bf16 -> float32 dot; the attention
    scores and weighted sums stay float32 x float32; the logits are float32 and near the float32
    model's, not equal to them."""
    config = TINY.replace(matmul_dtype="bfloat16")
    assert config.dtype == jnp.float32 and config.matmul_operand_dtype == jnp.bfloat16
    model, params, source, target = reduced_against_float32(config, atol=0.05)

    text = jax.jit(lambda p: model.apply({"params": p}, source, target)).lower(params).as_text()
    dots = re.findall(r"dot_general.*: \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\) -> tensor<[^>]*x(\w+)>", text)
    layers_e, layers_d = config.num_encoder_layers, config.num_decoder_layers
    weight_products = layers_e * (4 + 2) + layers_d * (4 + 4 + 2) + 1  # attention 4, feed-forward 2, output 1
    attention_products = 2 * (layers_e + 2 * layers_d)  # scores and weighted sum per attention
    assert sorted(dots) == sorted(
        [("bf16", "bf16", "f32")] * weight_products + [("f32", "f32", "f32")] * attention_products
    )


def test_shift_right():
    targets = jnp.array([[7, 8, 9, 1, 0], [5, 1, 0, 0, 0]])
    np.testing.assert_array_equal(shift_right(targets), [[BOS_ID, 7, 8, 9, 0], [BOS_ID, 5, 0, 0, 0]])
    packed = jnp.array([[7, 8, 1, 5, 1, 0]])
    segments = jnp.array([[1, 1, 1, 2, 2, 0]])
    np.testing.assert_array_equal(shift_right(packed, segments), [[BOS_ID, 7, 8, BOS_ID, 5, 0]])


def test_swish_is_silu():
    from jaxformer.model.layers import activation_function

    x = jnp.linspace(-6.0, 6.0, 25)
    np.testing.assert_allclose(activation_function("swish")(x), x / (1.0 + np.exp(-np.asarray(x))), rtol=1e-6)


def test_squared_relu_is_relu_squared_and_changes_the_model():
    from jaxformer.model.layers import activation_function

    x = np.linspace(-6.0, 6.0, 25, dtype=np.float32)
    np.testing.assert_array_equal(activation_function("squared_relu")(jnp.asarray(x)), np.maximum(x, 0.0) ** 2)
    gradient = jax.grad(lambda v: jnp.sum(activation_function("squared_relu")(v)))(jnp.asarray(x))
    np.testing.assert_allclose(gradient, 2.0 * np.maximum(x, 0.0), rtol=1e-6)
    source = random_tokens(jax.random.key(17), (2, 6), TINY.vocab_size)
    target = random_tokens(jax.random.key(18), (2, 4), TINY.vocab_size)
    params = init_params(TINY)  # the same parameters: the activation has none of its own
    relu = jit_apply(Transformer(TINY))(params, source, target)
    squared = jit_apply(Transformer(TINY.replace(activation="squared_relu")))(params, source, target)
    assert not np.allclose(relu, squared, atol=1e-4)


def test_logits_bias_is_added_to_the_logits_and_to_each_decoding_step():
    from jaxformer.model.cache import init_cache
    from jaxformer.model.config import preset as make_preset

    config = make_preset("tiny", logits_bias=True, position_layout="halves", activation="swish", deterministic=True)
    model = Transformer(config)
    source, target = jnp.array([[5, 6, 7, 1, 0]]), jnp.array([[3, 8, 9]])
    params = nn.meta.unbox(model.init(jax.random.key(0), source, target)["params"])
    assert params["decoder"]["logits_bias"].shape == (config.vocab_size,)
    bias = jax.random.normal(jax.random.key(1), (config.vocab_size,))
    biased = {**params, "decoder": {**params["decoder"], "logits_bias": bias}}
    # Jitted: each apply compiles once rather than dispatching every op eagerly.
    forward = jax.jit(lambda params: model.apply({"params": params}, source, target))
    without, with_bias = forward(params), forward(biased)
    np.testing.assert_allclose(with_bias - without, np.broadcast_to(bias, without.shape), atol=1e-5)
    context = model.apply({"params": biased}, source, method=Transformer.encoder_context)
    decode_step = jax.jit(
        lambda tokens, cache: model.apply({"params": biased}, tokens, cache, context, method=Transformer.decode_step)
    )
    cache = init_cache(config, 1, 3)
    for position in range(3):
        step_logits, cache = decode_step(target[:, position : position + 1], cache)
        np.testing.assert_allclose(step_logits[0], with_bias[0, position], atol=1e-5)
