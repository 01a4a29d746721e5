import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.model import masking
from jaxformer.model.attention import (
    MultiHeadAttention,
    dot_product_attention,
    dot_product_attention_weights,
    dropout_weights,
    masked_softmax,
)
from jaxformer.model.config import preset

B, T, S, N, H = 2, 5, 7, 3, 4


def numpy_attention(q, k, v, mask):
    """softmax over the allowed keys only, in float64; rows with no allowed key are zero."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    mask = np.broadcast_to(np.asarray(mask), (q.shape[0], q.shape[2], q.shape[1], k.shape[1]))
    out = np.zeros(q.shape)
    for b in range(q.shape[0]):
        for n in range(q.shape[2]):
            for t in range(q.shape[1]):
                allowed = np.flatnonzero(mask[b, n, t])
                if allowed.size == 0:
                    continue
                logits = k[b, allowed, n] @ q[b, t, n] / np.sqrt(q.shape[-1])
                weights = np.exp(logits - logits.max())
                out[b, t, n] = (weights / weights.sum()) @ v[b, allowed, n]
    return out


def random_qkv(key_length=S, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (B, T, N, H), dtype)
    k = jax.random.normal(keys[1], (B, key_length, N, H), dtype)
    v = jax.random.normal(keys[2], (B, key_length, N, H), dtype)
    return q, k, v


def masks():
    key_tokens = np.array([[5, 6, 7, 8, 9, 0, 0], [5, 6, 7, 0, 0, 0, 0]])
    query_tokens = np.array([[3, 4, 5, 6, 7], [3, 4, 5, 6, 7]])
    padding = masking.pairwise_mask(query_tokens != 0, key_tokens != 0)
    causal = masking.causal_mask(T)[..., :T]
    causal = jnp.pad(causal, ((0, 0), (0, 0), (0, 0), (0, S - T)))  # keys beyond T are "future"
    segments = masking.segment_mask(
        np.array([[1, 1, 2, 2, 2], [1, 1, 1, 1, 1]]), np.array([[1, 1, 1, 2, 2, 2, 0], [1] * 7])
    )
    return {
        "none": np.ones((1, 1, T, S), bool),
        "padding": padding,
        "causal": causal,
        "segment": masking.combine_masks(segments, padding),
        "causal+padding": masking.combine_masks(causal, padding),
    }


@pytest.mark.parametrize("mask_name", list(masks()))
def test_matches_jax_and_numpy(mask_name):
    mask = masks()[mask_name]
    q, k, v = random_qkv()
    ours = np.asarray(dot_product_attention(q, k, v, mask))
    np.testing.assert_allclose(ours, numpy_attention(q, k, v, mask), atol=1e-5, rtol=1e-5)
    reference = np.asarray(jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask), implementation="xla"))
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=1e-5)


def test_no_mask_equals_all_true_mask():
    q, k, v = random_qkv()
    np.testing.assert_allclose(
        dot_product_attention(q, k, v), dot_product_attention(q, k, v, np.ones((1, 1, T, S), bool)), atol=1e-6
    )


def test_fully_masked_row_is_finite_and_zero():
    q, k, v = random_qkv()
    mask = np.ones((B, 1, T, S), bool)
    mask[0, 0, 2, :] = False  # query 2 of row 0 may attend to nothing
    out = np.asarray(dot_product_attention(q, k, v, mask))
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[0, 2], 0.0)
    np.testing.assert_allclose(out, numpy_attention(q, k, v, mask), atol=1e-5)
    grads = jax.grad(lambda q: dot_product_attention(q, k, v, mask).sum())(q)
    assert np.isfinite(np.asarray(grads)).all()


def test_masked_softmax_and_its_gradient_match_a_where_based_reference():
    """The custom VJP (which reads only the output) against autodiff of the plain formulation:
    logits masked by a select, jax.nn.softmax, masked entries and empty rows zeroed."""
    logits = jax.random.normal(jax.random.key(7), (2, 3, 5, 6)) * 3.0
    mask = jax.random.bernoulli(jax.random.key(8), 0.6, (2, 1, 5, 6))
    mask = mask.at[1, 0, 3].set(False)  # an empty row

    def reference(logits):
        weights = jax.nn.softmax(jnp.where(mask, logits, -1e30), axis=-1)
        return jnp.where(mask, weights, 0.0)

    weights = masked_softmax(logits, mask)
    np.testing.assert_allclose(weights, reference(logits), atol=1e-6)
    np.testing.assert_array_equal(np.asarray(weights)[1, :, 3], 0.0)
    np.testing.assert_allclose(np.asarray(weights).sum(-1)[0], 1.0, atol=1e-6)
    cotangent = jax.random.normal(jax.random.key(9), logits.shape)
    ours = jax.grad(lambda x: jnp.sum(masked_softmax(x, mask) * cotangent))(logits)
    theirs = jax.grad(lambda x: jnp.sum(reference(x) * cotangent))(logits)
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(ours)[~np.broadcast_to(np.asarray(mask), logits.shape)], 0.0)


def test_softmax_runs_in_float32_for_bfloat16_inputs():
    q, k, v = random_qkv(dtype=jnp.bfloat16)
    weights = dot_product_attention_weights(q, k)
    assert weights.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(weights.sum(-1)), 1.0, atol=1e-6)
    out = dot_product_attention(q, k, v)
    assert out.dtype == jnp.bfloat16
    exact = numpy_attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), np.ones((1, 1, T, S), bool)
    )
    np.testing.assert_allclose(np.asarray(out, np.float32), exact, atol=5e-2)


def test_dropout_on_weights():
    weights = jnp.ones((200, 500))
    dropped = np.asarray(dropout_weights(weights, 0.25, jax.random.key(1)))
    assert set(np.unique(dropped)) == {0.0, np.float32(1 / 0.75)}
    assert abs((dropped == 0).mean() - 0.25) < 0.01
    q, k, v = random_qkv()
    with_dropout = dot_product_attention(q, k, v, dropout_rate=0.5, dropout_rng=jax.random.key(2))
    assert not np.allclose(with_dropout, dot_product_attention(q, k, v))


def test_module_matches_numpy_multi_head_attention():
    config = preset("tiny", d_model=12, num_heads=3)
    module = MultiHeadAttention(config)
    x = jax.random.normal(jax.random.key(3), (B, T, 12))
    memory = jax.random.normal(jax.random.key(4), (B, S, 12))
    mask = masks()["padding"]
    params = nn.meta.unbox(module.init(jax.random.key(5), x, memory, mask, True)["params"])
    out = module.apply({"params": params}, x, memory, mask, True)
    assert out.shape == (B, T, 12)

    def project(inputs, name):  # [B, L, D] -> [B, L, N, H]
        p = np.asarray(params[f"{name}_kernel"], np.float64)
        return np.einsum("bld,dnh->blnh", inputs, p) + np.asarray(params[f"{name}_bias"])

    heads = numpy_attention(project(x, "query"), project(memory, "key"), project(memory, "value"), mask)
    concatenated = heads.reshape(B, T, 12)  # Concat(head_1, ..., head_h)
    w_out = np.asarray(params["out_kernel"]).reshape(12, 12)
    expected = concatenated @ w_out + np.asarray(params["out_bias"])
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)


def test_attention_weights_can_be_captured_for_plots():
    from jaxformer.model.config import preset
    from jaxformer.model.transformer import Transformer

    config = preset("tiny", deterministic=True)
    model = Transformer(config)
    source = jnp.array([[5, 6, 7, 1, 0]])
    target = jnp.array([[3, 8, 9]])
    params = nn.meta.unbox(model.init(jax.random.key(0), source, target)["params"])
    logits, state = model.apply({"params": params}, source, target, mutable=["intermediates"])
    np.testing.assert_allclose(logits, model.apply({"params": params}, source, target), atol=1e-6)
    (weights,) = state["intermediates"]["decoder"]["layer_1"]["cross_attention"]["attention_weights"]
    assert weights.shape == (1, config.num_heads, 3, 5)  # [B, N, T, S]
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    assert (weights[..., 4] == 0).all()  # the padded source position gets no attention


@pytest.mark.parametrize(
    "mask, error, expected",
    [
        (
            np.where(np.ones((B, 1, T, S), bool), 0.0, -1e9),
            TypeError,
            "mask has dtype float64 (shape (2, 1, 5, 7)): a mask is boolean, True where a query may attend to a key "
            "(an additive mask of 0 and -inf would read inverted)",
        ),
        (
            np.ones((B, T, S), bool),
            ValueError,
            "mask has shape (2, 5, 7): it takes 4 dimensions [B, N, T, S] = [2, 3, 5, 7], B, N and T may be 1 "
            "(a [T, S] mask: mask[None, None])",
        ),
        (
            np.ones((B, 1, S, T), bool),
            ValueError,
            "mask has shape (2, 1, 7, 5): it takes [B, N, T, S] = [2, 3, 5, 7], B, N and T may be 1 "
            "(a [T, S] mask: mask[None, None])",
        ),
    ],
    ids=["an additive float mask", "a [B, T, S] mask", "a transposed mask"],
)
def test_a_mask_that_would_not_mean_what_it_says_is_refused_naming_it(mask, error, expected, monkeypatch):
    """An additive float mask (0 where allowed) was read as a boolean one, allowing only what it forbids;
    a [B, T, S] mask broadcast as [1, B, T, S], its batch rows read as heads where B = N (where not, as
    here, it and a transposed one failed in jnp.where naming no argument). Boolean and integer masks of
    [B, N, T, S], each of B, N and T or 1, pass."""
    monkeypatch.setattr(__import__("jaxtyping").config, "jaxtyping_disable", True)  # the suite's hook, not a user's
    q, k, v = random_qkv()
    with pytest.raises(error) as raised:
        dot_product_attention(q, k, v, jnp.asarray(mask) if mask.dtype == bool else mask)
    assert str(raised.value) == expected
    allowed = np.tril(np.ones((T, S), bool))[None, None]
    for given in (allowed, allowed.astype(np.int32), np.broadcast_to(allowed, (B, N, T, S))):
        np.testing.assert_allclose(dot_product_attention(q, k, v, given), numpy_attention(q, k, v, allowed), atol=1e-5)
