"""Rematerialisation, scanned layers and fused attention compute the same model."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.model.config import ConfigError, preset
from jaxformer.model.transformer import Transformer
from jaxformer.training.loss import label_smoothed_cross_entropy

# One worker for the module: its tests share programs (and module fixtures) that a second
# worker would trace, lower and fetch again.
pytestmark = pytest.mark.xdist_group("memory-options")

CONFIG = preset("tiny", deterministic=True, num_encoder_layers=3, num_decoder_layers=2)


def batch():
    source = jax.random.randint(jax.random.key(1), (2, 7), 4, 64).at[1, 5:].set(0)
    target = jax.random.randint(jax.random.key(2), (2, 6), 4, 64).at[1, 4:].set(0)
    return source, target


def plain_params():
    source, target = batch()
    return nn.meta.unbox(jax.jit(Transformer(CONFIG).init)(jax.random.key(0), source, target)["params"])


def stack_layers(params):
    """The plain model's per-layer parameters stacked the way nn.scan stores them."""
    stacked = {key: value for key, value in params.items() if key not in ("encoder", "decoder")}
    for stack in ("encoder", "decoder"):
        layers = sorted((k for k in params[stack] if k.startswith("layer_")), key=lambda k: int(k.split("_")[1]))
        stacked[stack] = {k: v for k, v in params[stack].items() if not k.startswith("layer_")}
        stacked[stack]["layers"] = {
            "layer": jax.tree.map(lambda *xs: jnp.stack(xs), *[params[stack][k] for k in layers])
        }
    return stacked


def loss_and_grads(config, params):
    source, target = batch()
    model = Transformer(config)

    def loss(params):
        logits = model.apply({"params": params}, source, target)
        total, weight = label_smoothed_cross_entropy(logits, target, (target != 0).astype(jnp.float32))
        return total / weight

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.fixture(scope="module")
def reference():
    params = plain_params()
    return params, loss_and_grads(CONFIG, params)


# slow: "dots" (about 4 s, its program compiled); covered in the default suite by [dots_no_batch] (a dots
# policy: the same checkpoint_dots family of jax.checkpoint_policies, saving fewer products) and [full].
@pytest.mark.parametrize("policy", ["full", pytest.param("dots", marks=pytest.mark.slow), "dots_no_batch"])
def test_remat_gives_the_same_loss_and_gradients(reference, policy):
    params, (loss, grads) = reference
    remat_loss, remat_grads = loss_and_grads(CONFIG.replace(remat_policy=policy), params)
    np.testing.assert_allclose(remat_loss, loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), remat_grads, grads)


@pytest.mark.parametrize("remat_policy", ["none", "full"])
def test_scanned_layers_give_the_same_loss_and_gradients(reference, remat_policy):
    params, (loss, grads) = reference
    config = CONFIG.replace(scan_layers=True, remat_policy=remat_policy)
    source, target = batch()
    abstract = jax.eval_shape(Transformer(config).init, jax.random.key(0), source, target)["params"]
    stacked = stack_layers(params)
    assert jax.tree.structure(nn.meta.unbox(abstract)) == jax.tree.structure(stacked)
    scan_loss, scan_grads = loss_and_grads(config, stacked)
    np.testing.assert_allclose(scan_loss, loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), scan_grads, stack_layers(grads))
    names = abstract["encoder"]["layers"]["layer"]["self_attention"]["query_kernel"].names
    assert names == ("layers", "embed", "heads", "kv")


@pytest.mark.parametrize("implementation", ["xla", "cudnn"])
def test_fused_attention_gives_the_same_loss(reference, implementation):
    params, (loss, _) = reference
    fused_loss, _ = loss_and_grads(CONFIG.replace(attention_implementation=implementation), params)
    np.testing.assert_allclose(fused_loss, loss, rtol=1e-5)  # "cudnn" falls back to XLA on a CPU


def _saved_products(config, params):
    """(dot_general outputs, named bf16 weight products) that remat keeps for the backward pass."""
    import contextlib
    import io

    from jax.ad_checkpoint import print_saved_residuals

    source, target = batch()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(lambda p: jnp.sum(Transformer(config).apply({"params": p}, source, target)), params)
    text = printed.getvalue()
    return text.count("output of dot_general"), text.count("weight_product")


# "dots" (about 10 s) under -m slow: "dots_no_batch" keeps the same check of the bf16 operands in the default suite.
@pytest.mark.parametrize("policy", [pytest.param("dots", marks=pytest.mark.slow), "dots_no_batch"])
def test_dots_policies_keep_the_same_products_with_bf16_operands(policy):
    """bf16 weight products are custom_vjp calls, not dot_generals: without their name the dots
    policies would keep none of them and recompute everything, as "full" does."""
    config = preset("tiny", deterministic=True, num_encoder_layers=1, num_decoder_layers=1, remat_policy=policy)
    source, target = batch()
    params = nn.meta.unbox(Transformer(config).init(jax.random.key(0), source, target)["params"])
    dots, named = _saved_products(config, params)
    assert dots > 0 and named == 0
    for narrow in (dict(matmul_dtype="bfloat16"), dict(dtype="bfloat16")):
        narrow_dots, narrow_named = _saved_products(config.replace(**narrow), params)
        assert narrow_named > 0 and narrow_dots + narrow_named == dots, narrow  # every product kept, as in float32
    assert _saved_products(config.replace(remat_policy="full", matmul_dtype="bfloat16"), params) == (0, 0)


def test_unknown_options_are_errors():
    with pytest.raises(ConfigError, match="remat_policy='some'"):
        preset("tiny", remat_policy="some")
    with pytest.raises(ConfigError, match="attention_implementation='flash'"):
        preset("tiny", attention_implementation="flash")
