"""The public API from a user's own JAX code: only `jaxformer`'s top-level names are imported."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer
from jaxformer import Transformer, TransformerConfig


def test_jitted_apply_from_public_api():
    config = TransformerConfig(
        vocab_size=100, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=1, num_decoder_layers=1
    )
    model = Transformer(config)
    source = jnp.array([[10, 11, 12, 1, 0]])
    target = jnp.array([[3, 20, 21]])
    params = jax.jit(model.init)(jax.random.key(0), source, target)["params"]
    apply = jax.jit(lambda params, source, target: model.apply({"params": params}, source, target, deterministic=True))
    logits = apply(params, source, target)
    assert logits.shape == (1, 3, 100) and np.isfinite(np.asarray(logits)).all()
    encoded = jax.jit(lambda p, s: model.apply({"params": p}, s, deterministic=True, method="encode"))(params, source)
    decoded = jax.jit(lambda p, e, s, t: model.apply({"params": p}, e, s, t, deterministic=True, method="decode"))(
        params, encoded, source, target
    )
    np.testing.assert_allclose(decoded, logits, atol=1e-6)


def test_every_exported_name_resolves():
    """Each name of `jaxformer.__all__` is imported on first use from the module said to hold it;
    one that module no longer defines would fail only where a user first touches it."""
    unresolved = []
    for name in jaxformer.__all__:
        try:
            getattr(jaxformer, name)
        except (AttributeError, ImportError) as error:
            unresolved.append(f"{name}: {error}")
    assert not unresolved, unresolved


SECTION = "Using the model from JAX"


def readme_section_python_blocks(title: str) -> list[str]:
    """The python blocks of README.md's section `## title`, in order."""
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def run_blocks(blocks: list[str]) -> dict:
    """The names the blocks define, run in order in one namespace, as a reader pastes them."""
    namespace = {}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"README.md, {SECTION}, python block {number}", "exec"), namespace)
    return namespace


def check_the_transformer_example(namespace: dict) -> None:
    config, (batch, source_length) = namespace["config"], namespace["source"].shape
    assert namespace["logits"].shape == (batch, namespace["target"].shape[1], config.vocab_size)
    np.testing.assert_allclose(namespace["logits_again"], namespace["logits"], atol=1e-5)
    assert not np.allclose(namespace["train_logits"], namespace["logits"])
    assert namespace["tokens"].shape == (batch, 4, source_length + 10) and namespace["scores"].shape == (batch, 4)


def test_readme_example_runs():
    """The section's first block, the Transformer's (about 4 s: the default suite runs it alone)."""
    check_the_transformer_example(run_blocks(readme_section_python_blocks(SECTION)[:1]))


@pytest.mark.slow  # 10-15 s on 2 cores: the later blocks build two more models, eagerly, at the first's size
def test_every_readme_example_runs_in_order():
    """Every python block of the section, in order in one namespace (the later ones use the first's
    config and arrays): the Transformer, then EncoderOnly and DecoderOnly."""
    blocks = readme_section_python_blocks(SECTION)
    assert len(blocks) >= 2, f"{SECTION}: the Transformer's example, then EncoderOnly and DecoderOnly's"
    namespace = run_blocks(blocks)
    check_the_transformer_example(namespace)
    config, (batch, source_length) = namespace["config"], namespace["source"].shape
    assert namespace["mlm_logits"].shape == (batch, source_length, config.vocab_size)
    assert namespace["sentence_vectors"].shape == (batch, config.d_model)
    assert namespace["next_token_logits"].shape == (batch, namespace["target"].shape[1], config.vocab_size)
    for name in ("mlm_logits", "sentence_vectors", "next_token_logits"):
        assert np.isfinite(np.asarray(namespace[name])).all(), name
