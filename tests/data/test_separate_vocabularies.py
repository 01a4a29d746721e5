"""Separate source and target vocabularies (tokenizer.separate_vocabularies) short of a run of
train.py: the model's source embedding of its own, its sharding, each side's tokenizer trained on
its own text and checked on resume, and the pipeline and translator encoding each side with its
own (test_tokenizer_options.py has the config's checks and the runs)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from jaxformer.data.pipeline import TokenizePair
from jaxformer.data.tokenizer import TokenizerError, train_tokenizer
from jaxformer.errors import CheckpointError
from jaxformer.model.config import ConfigError, preset
from jaxformer.model.transformer import Transformer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.metadata import CheckpointMetadata
from jaxformer.training import sharding
from tests.data.test_tokenizer_options import ENGLISH, GERMAN, tiny_config

# -- the model: a source vocabulary of its own --------------------------------------------------


def test_source_vocab_size_shapes_the_source_embedding_only():
    config = preset("tiny", vocab_size=64, source_vocab_size=48, share_embeddings=False)
    assert config.encoder_vocab_size == 48 and preset("tiny").encoder_vocab_size == preset("tiny").vocab_size
    source = jnp.array([[47, 5, 1, 0]], jnp.int32)  # the last source id exists in the source vocabulary only
    target = jnp.array([[3, 63, 7]], jnp.int32)
    variables = jax.jit(Transformer(config).init)(jax.random.key(0), source, target)
    params = nn.meta.unbox(variables)["params"]
    assert params["source_embedding"]["embedding"].shape == (48, 32)
    assert params["target_embedding"]["embedding"].shape == (64, 32)
    logits = jax.jit(lambda variables: Transformer(config).apply(variables, source, target, deterministic=True))(
        variables
    )
    assert logits.shape == (1, 3, 64)

    @jax.jit
    def encode(params):
        return Transformer(config).apply({"params": params}, source, method=Transformer.encode, deterministic=True)

    def changed(name, row):
        embedding = params[name]["embedding"]
        return {**params, name: {"embedding": embedding.at[row].add(1.0)}}

    encoded = encode(params)
    assert encoded.shape == (1, 4, 32)
    assert not np.allclose(encode(changed("source_embedding", 47)), encoded)  # the encoder reads the source rows
    np.testing.assert_array_equal(encode(changed("target_embedding", 47)), encoded)  # and never the target's
    specs = nn.get_partition_spec(variables["params"])
    assert tuple(specs["source_embedding"]["embedding"]) == ("vocab", "embed")
    assert tuple(specs["target_embedding"]["embedding"]) == ("vocab", "embed")

    with pytest.raises(ConfigError, match=r"source_vocab_size=48: differs from vocab_size=64.*share_embeddings=False"):
        preset("tiny", vocab_size=64, source_vocab_size=48)
    with pytest.raises(ConfigError, match="source_vocab_size=3"):
        preset("tiny", source_vocab_size=3, share_embeddings=False)
    assert preset("tiny", source_vocab_size=64, vocab_size=64).encoder_vocab_size == 64  # equal sizes may share


def test_separate_embeddings_are_sharded_like_the_shared_one():
    config = preset("tiny", vocab_size=64, source_vocab_size=48, d_model=64, num_heads=8, share_embeddings=False)
    mesh = sharding.make_mesh((2, 2, 2))
    rules = sharding.DEFAULT_RULES
    tokens = jax.ShapeDtypeStruct((8, 12), jnp.int32)

    def init(rng):
        return Transformer(config).init(rng, jnp.ones(tokens.shape, jnp.int32), jnp.ones(tokens.shape, jnp.int32))

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(init, jax.random.key(0))
        shardings = sharding.logical_shardings(boxed, mesh, rules)
        params = jax.jit(lambda rng: nn.meta.unbox(init(rng)), out_shardings=shardings)(jax.random.key(0))["params"]
    for name, rows in (("source_embedding", 48), ("target_embedding", 64)):
        embedding = params[name]["embedding"]
        assert embedding.shape == (rows, 64) and embedding.sharding.spec == PartitionSpec("tensor", "fsdp")
        assert embedding.addressable_shards[0].data.shape == (rows // 2, 32)


# -- the run's tokenizers, without the training loop ---------------------------------------------


def records(count=3000):
    return [{"en": en.encode(), "de": de.encode()} for en, de in zip(ENGLISH[:count], GERMAN[:count])]


def test_a_separate_vocabulary_too_small_names_its_language(tmp_path):
    from jaxformer.training.run_tokenizer import tokenizer_for_run

    config = tiny_config()
    config.tokenizer.separate_vocabularies, config.model.share_embeddings = True, False
    config.tokenizer.vocab_size = 10
    with pytest.raises(TokenizerError) as raised:
        tokenizer_for_run(config, RunDirectory(tmp_path), records(40), None)
    assert str(raised.value).startswith(
        "the 'en' tokenizer (separate vocabularies): cannot train a 10-piece unigram tokenizer on 40 sentences: "
    )
    assert "\n" not in str(raised.value)


def test_separate_tokenizers_are_trained_on_their_own_side(tmp_path):
    from jaxformer.training.run_tokenizer import tokenizer_for_run

    config = tiny_config()
    config.tokenizer.separate_vocabularies, config.model.share_embeddings = True, False
    config.tokenizer.vocab_size, config.tokenizer.model_type = 300, "bpe"
    run = RunDirectory(tmp_path)
    tokenizers = tokenizer_for_run(config, run, records(), None)
    assert not tokenizers.shared and tokenizers.source.vocab_size == tokenizers.target.vocab_size == 300
    assert run.tokenizer_file.read_bytes() == tokenizers.source.model_proto
    assert run.target_tokenizer_file.read_bytes() == tokenizers.target.model_proto
    german_letters = set("äöüßÄÖÜ")
    source_pieces, target_pieces = tokenizers.source.pieces(range(300)), tokenizers.target.pieces(range(300))
    assert not any(german_letters & set(piece) for piece in source_pieces)  # English text only
    assert any(german_letters & set(piece) for piece in target_pieces)

    saved = CheckpointMetadata(
        config={},
        model={},
        tokenizer=tokenizers.source.model_proto,
        target_tokenizer=tokenizers.target.model_proto,
        data_fingerprint=None,
        step=7,
    )
    run.target_tokenizer_file.unlink()
    restored = tokenizer_for_run(config, run, None, (saved, "checkpoint 7"))  # nothing trained: no records
    assert run.target_tokenizer_file.read_bytes() == restored.target.model_proto == tokenizers.target.model_proto

    tokenizers.source.save(run.target_tokenizer_file)  # a valid model of the same size, but not the target's
    with pytest.raises(CheckpointError) as raised:
        tokenizer_for_run(config, run, None, (saved, "checkpoint 7"))
    assert f"{run.target_tokenizer_file} is not the tokenizer stored in checkpoint 7" in str(raised.value)

    with pytest.raises(CheckpointError, match="checkpoint 7 has separate source and target vocabularies, but"):
        tokenizer_for_run(tiny_config(), run, None, (saved, "checkpoint 7"))


# -- pipeline and translator ------------------------------------------------------------------


def test_tokenize_pair_encodes_each_side_with_its_tokenizer():
    source, target = train_tokenizer(ENGLISH[:2000], 200, "bpe"), train_tokenizer(GERMAN[:2000], 300, "bpe")
    record = {"en": ENGLISH[0].encode(), "de": GERMAN[0].encode()}
    pair = TokenizePair(source, "en", "de", target)(record)
    assert pair["inputs"].tolist() == source.encode(ENGLISH[0]).tolist()
    assert pair["targets"].tolist() == target.encode(GERMAN[0]).tolist()
    assert pair["targets"].tolist() != source.encode(GERMAN[0]).tolist()
    shared = TokenizePair(source, "en", "de")(record)
    assert shared["targets"].tolist() == source.encode(GERMAN[0]).tolist()


def test_translator_checks_each_vocabulary():
    from jaxformer.decoding.translator import Translator

    source, target = train_tokenizer(ENGLISH[:2000], 200, "bpe"), train_tokenizer(GERMAN[:2000], 300, "bpe")
    config = preset("tiny", vocab_size=300, source_vocab_size=200, share_embeddings=False)
    translator = Translator(config, None, source, target_tokenizer=target)
    assert translator.tokenizer is source and translator.target_tokenizer is target
    with pytest.raises(ValueError, match="the model's source vocabulary has 200 tokens, its tokenizer 300"):
        Translator(config, None, target, target_tokenizer=target)
    with pytest.raises(ValueError, match="the model's target vocabulary has 300 tokens, its tokenizer 200"):
        Translator(config, None, source, target_tokenizer=source)
    with pytest.raises(ValueError, match="source vocabulary has 300 tokens, its tokenizer 200"):
        Translator(preset("tiny", vocab_size=300), None, source)
