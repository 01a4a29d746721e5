import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.model.config import PRESETS, ConfigError, TransformerConfig, preset, set_python_scalar_fields


def test_presets_follow_the_paper():
    base, big = preset("base"), preset("big")
    assert (base.d_model, base.num_heads, base.d_ff, base.num_encoder_layers, base.num_decoder_layers) == (
        512,
        8,
        2048,
        6,
        6,
    )
    assert (big.d_model, big.num_heads, big.d_ff, big.dropout_rate) == (1024, 16, 4096, 0.3)
    assert base.dropout_rate == 0.1 and base.head_dim == 64 and big.head_dim == 64
    assert base.normalization == "post" and base.share_embeddings and base.tie_output_embedding
    assert set(PRESETS) == {"tiny", "base", "big"}


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(d_model=100, num_heads=8), r"d_model=100: must be divisible by num_heads=8"),
        (dict(num_heads=0), r"num_heads=0: must be a positive integer"),
        (dict(d_ff=-1), r"d_ff=-1: must be a positive integer"),
        (dict(num_encoder_layers=2.5), r"num_encoder_layers=2.5: must be a positive integer"),
        (dict(dropout_rate=1.0), r"dropout_rate=1.0: must lie in \[0, 1\)"),
        (dict(attention_dropout_rate=-0.1), r"attention_dropout_rate=-0.1: must lie in \[0, 1\)"),
        (dict(vocab_size=4), r"vocab_size=4: must exceed the 4 special tokens"),
        (dict(activation="tanh"), r"activation='tanh'"),
        (dict(position_layout="stacked"), r"position_layout='stacked'"),
        (dict(max_positions=1), r"max_positions=1: must be None or an integer >= 2"),
        (
            dict(logits_bias=True, architecture="decoder_only"),
            r"logits_bias=True: applies to architecture='encoder_decoder' only, not 'decoder_only'$",
        ),
        (
            dict(max_positions=48, architecture="decoder_only"),
            r"max_positions=48: applies to architecture='encoder_decoder' only, not 'decoder_only'$",
        ),
        # Not "set share_embeddings=False" first, which a language model refuses in turn.
        (
            dict(source_vocab_size=100, architecture="decoder_only"),
            r"source_vocab_size=100: applies to architecture='encoder_decoder' only, not 'decoder_only'$",
        ),
        (
            dict(source_vocab_size=100, architecture="encoder_only"),
            r"source_vocab_size=100: applies to architecture='encoder_decoder' only, not 'encoder_only'$",
        ),
        (dict(source_vocab_size=100), r"source_vocab_size=100: differs from vocab_size=.*set share_embeddings=False$"),
        (
            dict(architecture="decoder_only", share_embeddings=False),
            r"share_embeddings=False: architecture='decoder_only' has one embedding.*tie_output_embedding=False$",
        ),
        (
            dict(architecture="encoder_only", share_embeddings=False),
            r"share_embeddings=False: architecture='encoder_only' has one embedding matrix, nothing to share",
        ),
        (
            dict(architecture="encoder_only", tie_output_embedding=False),
            r"tie_output_embedding=False: architecture='encoder_only': its",
        ),
        (dict(scan_layers="False"), r"scan_layers='False': must be True or False"),
        (dict(deterministic="no"), r"deterministic='no': must be True or False"),
        (dict(tie_output_embedding=0), r"tie_output_embedding=0: must be True or False"),
        (dict(layer_norm_epsilon="x"), r"layer_norm_epsilon='x': must be a finite number > 0"),
        # inf was taken: the sinusoids of every frequency but the first were constant, and the run trained on
        (dict(position_base=float("inf")), r"position_base=inf: must be a finite number greater than 1$"),
        (dict(position_base=1.0), r"position_base=1.0: must be a finite number greater than 1$"),
        (dict(normalization="sandwich"), r"normalization='sandwich'"),
        (dict(dtype="int32"), r"dtype='int32': must be one of 'float32', 'bfloat16', 'float16'$"),
        (dict(dtype="not-a-dtype"), r"dtype='not-a-dtype': must be one of 'float32', 'bfloat16', 'float16'$"),
        (dict(dtype=None), r"dtype=None: must be one of 'float32', 'bfloat16', 'float16'$"),
        (dict(dtype="float64"), r"dtype='float64': must be one of 'float32', 'bfloat16', 'float16'$"),
        (dict(param_dtype="float64"), r"param_dtype='float64': must be one of 'float32', 'bfloat16', 'float16'$"),
        (dict(param_dtype=None), r"param_dtype=None: must be one of"),
        (dict(matmul_dtype="bf16x"), r"matmul_dtype='bf16x': must be one of 'float32', 'bfloat16', 'float16' or None "),
        (dict(matmul_dtype="int8"), r"matmul_dtype='int8': must be one of .* or None "),
        (dict(matmul_dtype="auto"), r"matmul_dtype='auto': .* or None \(an experiment config's 'auto' is resolved"),
        (dict(dtype="bfloat16", matmul_dtype="float32"), r"matmul_dtype=dtype\('float32'\): must not be wider"),
    ],
)
def test_invalid_values_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        preset("tiny", **overrides)


def test_unknown_key_suggests_near_matches():
    with pytest.raises(ConfigError, match=r"unknown key 'num_head'.*did you mean num_heads"):
        TransformerConfig.from_dict({"preset": "tiny", "num_head": 4})
    with pytest.raises(ConfigError, match=r"unknown key 'dmodel'.*d_model"):
        preset("base").replace(dmodel=256)
    with pytest.raises(ConfigError, match=r"unknown preset 'huge'"):
        preset("huge")


@pytest.mark.parametrize("name", [["tiny"], {"name": "tiny"}, None], ids=["a list", "a dict", "None"])
def test_a_preset_name_that_is_no_string_is_refused_naming_it_and_the_choices(name):
    """A list or a dict failed in the name's lookup with "unhashable type", naming neither."""
    with pytest.raises(ConfigError) as error:
        preset(name)
    assert str(error.value) == f"unknown preset {name!r}; choose one of tiny, base, big"


def test_replace_validates_and_is_frozen():
    config = preset("tiny")
    evaluation = config.replace(deterministic=True)
    assert evaluation.deterministic and not config.deterministic
    with pytest.raises(ConfigError, match="d_model=30"):
        config.replace(d_model=30)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 64


def test_dtypes_are_normalised_and_round_trip():
    config = preset("tiny", dtype="bfloat16")
    assert config.dtype == jnp.bfloat16 and config.param_dtype == jnp.float32
    assert TransformerConfig(**config.to_dict()) == config
    assert TransformerConfig.from_dict({"preset": "tiny", **config.to_dict()}) == config
    assert hash(config) == hash(preset("tiny", dtype=jnp.bfloat16))
    assert config.matmul_dtype is None and config.matmul_operand_dtype == jnp.bfloat16
    mixed = preset("tiny", matmul_dtype="bfloat16")
    assert mixed.dtype == jnp.float32 and mixed.matmul_dtype == jnp.bfloat16
    assert mixed.to_dict()["matmul_dtype"] == "bfloat16"
    assert TransformerConfig.from_dict({"preset": "tiny", **mixed.to_dict()}) == mixed
    # Metadata written before the field existed has no such key: the float32 model it was.
    old = {key: value for key, value in preset("tiny").to_dict().items() if key != "matmul_dtype"}
    assert TransformerConfig.from_dict({"preset": "tiny", **old}).matmul_operand_dtype == jnp.float32


def test_every_dtype_the_model_runs_in_is_accepted():
    for name in ("float32", "bfloat16", "float16"):
        config = preset("tiny", dtype=name, param_dtype=name, matmul_dtype=name)
        assert config.dtype.name == config.param_dtype.name == config.matmul_dtype.name == name


def test_one_helper_turns_a_frozen_dataclass_numpy_scalars_into_pythons_and_leaves_the_rest():
    @dataclasses.dataclass(frozen=True)
    class Fields:
        count: object
        rate: object
        flag: object
        name: object = "beam"
        table: object = None
        missing: object = None

    table = np.arange(3)
    fields = Fields(np.int64(3), np.float32(0.5), np.bool_(False), np.str_("greedy"), table)
    set_python_scalar_fields(fields)
    assert [type(value) for value in (fields.count, fields.rate, fields.flag, fields.name)] == [int, float, bool, str]
    assert (fields.count, fields.rate, fields.flag, fields.name) == (3, 0.5, False, "greedy")
    assert fields.table is table and fields.missing is None  # arrays and None are not scalars


def test_numpy_scalars_become_pythons_and_the_config_is_the_plain_one():
    plain = preset("tiny", d_model=64, dropout_rate=0.2, scan_layers=True, layer_norm_epsilon=1e-5)
    from_numpy = preset(
        "tiny",
        d_model=np.int64(64),
        dropout_rate=np.float32(0.2),
        scan_layers=np.bool_(True),
        layer_norm_epsilon=np.float64(1e-5),
    )
    assert type(from_numpy.d_model) is int and type(from_numpy.scan_layers) is bool
    assert type(from_numpy.dropout_rate) is float and type(from_numpy.layer_norm_epsilon) is float
    assert from_numpy.d_model == 64 and from_numpy.dropout_rate == pytest.approx(0.2)
    assert plain.replace(dropout_rate=from_numpy.dropout_rate) == from_numpy
    assert hash(preset("tiny", num_heads=np.int32(8))) == hash(preset("tiny", num_heads=8))
    assert preset("tiny").replace(vocab_size=np.uint16(100)) == preset("tiny", vocab_size=100)
    with pytest.raises(ConfigError, match=r"dropout_rate=1.0: must lie in \[0, 1\)"):
        preset("tiny", dropout_rate=np.float32(1.0))


def test_an_unknown_key_without_a_near_match_ends_its_sentence():
    with pytest.raises(
        ConfigError, match=r"^unknown key 'xyz' in preset 'tiny' overrides\. Known keys: architecture, "
    ):
        preset("tiny", xyz=1)
