"""Parameter counts against the paper and a closed form; logical axis names on every parameter."""

import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.model.config import PRESETS, preset
from jaxformer.model.transformer import Transformer


def abstract_variables(config):
    """Parameter shapes through jax.eval_shape: nothing is allocated."""
    tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    return jax.eval_shape(Transformer(config).init, jax.random.key(0), tokens, tokens)


def closed_form_count(vocab, d_model, d_ff, layers, shared=True, tied=True, pre_norm=False):
    attention = 4 * (d_model * d_model + d_model)  # W^Q, W^K, W^V, W^O with biases
    feed_forward = d_model * d_ff + d_ff + d_ff * d_model + d_model
    norm = 2 * d_model  # scale and bias
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    embeddings = vocab * d_model * (1 if shared else 2) + (0 if tied else d_model * vocab)
    final_norms = 2 * norm if pre_norm else 0
    return embeddings + layers * (encoder_layer + decoder_layer) + final_norms


def count(variables):
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(nn.meta.unbox(variables)))


@pytest.mark.parametrize(
    "name,d_model,d_ff,paper_millions",
    [("base", 512, 2048, 65), ("big", 1024, 4096, 213)],
)
def test_paper_models(name, d_model, d_ff, paper_millions):
    config = preset(name, vocab_size=37_000)
    total = count(abstract_variables(config))
    assert total == closed_form_count(37_000, d_model, d_ff, 6)
    assert abs(total - paper_millions * 1e6) / (paper_millions * 1e6) < 0.04, total


@pytest.mark.parametrize(
    "overrides,shared,tied,pre_norm",
    [
        (dict(share_embeddings=False), False, True, False),
        (dict(share_embeddings=False, tie_output_embedding=False), False, False, False),
        (dict(normalization="pre"), True, True, True),
    ],
)
def test_variant_counts(overrides, shared, tied, pre_norm):
    config = preset("tiny", **overrides)
    expected = closed_form_count(config.vocab_size, config.d_model, config.d_ff, 2, shared, tied, pre_norm)
    assert count(abstract_variables(config)) == expected


@pytest.mark.parametrize(
    "overrides", [dict(), dict(normalization="pre", share_embeddings=False, tie_output_embedding=False)]
)
def test_every_parameter_has_logical_axis_names(overrides):
    config = preset("base", **overrides)
    params = abstract_variables(config)["params"]
    leaves = jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert len(leaves) > 100
    known = {"vocab", "embed", "heads", "kv", "mlp"}
    for path, leaf in leaves:
        where = jax.tree_util.keystr(path)
        assert isinstance(leaf, nn.LogicallyPartitioned), f"{where} has no logical axis names"
        assert len(leaf.names) == leaf.value.ndim, where
        assert set(leaf.names) <= known, (where, leaf.names)
    specs = nn.get_partition_spec(params)
    if config.share_embeddings:
        assert tuple(specs["shared_embedding"]["embedding"]) == ("vocab", "embed")
    else:
        assert tuple(specs["source_embedding"]["embedding"]) == ("vocab", "embed")
        assert tuple(specs["decoder"]["logits_kernel"]) == ("embed", "vocab")
    assert tuple(specs["encoder"]["layer_0"]["self_attention"]["query_kernel"]) == ("embed", "heads", "kv")
    assert tuple(specs["decoder"]["layer_0"]["feed_forward"]["wi_kernel"]) == ("embed", "mlp")


def readme_presets_table():
    """README's Presets table: {preset: its row's cells}."""
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("## Presets") :]
    section = section[: section.index("\n## ")]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| `")]
    return {cells[0].strip().strip("`"): [cell.strip() for cell in cells[1:]] for cells in rows}


def test_the_readme_presets_table_gives_each_presets_values_and_count():
    table = readme_presets_table()
    assert list(table) == list(PRESETS)
    for name, (d_model, heads, d_ff, layers, dropout, vocabulary, parameters, _paper) in table.items():
        config = preset(name)
        encoder, decoder = (int(number) for number in layers.split("+"))
        said = (int(d_model), int(heads), int(d_ff), encoder, decoder, float(dropout), int(vocabulary.replace(",", "")))
        assert said == (
            config.d_model,
            config.num_heads,
            config.d_ff,
            config.num_encoder_layers,
            config.num_decoder_layers,
            config.dropout_rate,
            config.vocab_size,
        ), name
        assert int(parameters.replace(",", "")) == count(abstract_variables(config)["params"]), name
