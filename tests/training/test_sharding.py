"""Sharded training on 8 simulated CPU devices (see conftest.py): meshes agree with one device."""

import functools
import os
import pathlib
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec

from jaxformer.model.config import preset
from jaxformer.model.transformer import Transformer
from jaxformer.training import sharding
from jaxformer.training.experiment import default_config
from jaxformer.training.optimizer import make_optimizer
from jaxformer.training.parameter_ema import parameter_ema
from jaxformer.training.state import make_init_fn
from jaxformer.training.step import train_step

# One worker for the module: its tests share programs (and module fixtures) that a second
# worker would trace, lower and fetch again.
pytestmark = pytest.mark.xdist_group("sharding")

# Sizes divisible by every mesh axis below (8 heads for tensor=8, width 64 for fsdp).
# One layer per stack holds every kind of parameter and activation the mesh splits (a second
# layer repeats them, at about a third more compilation in each test).
CONFIG = preset("tiny", vocab_size=64, d_model=64, num_heads=8, d_ff=128, num_encoder_layers=1, num_decoder_layers=1)
LENGTH = 12


def batch_of_8():
    rng = np.random.default_rng(0)
    inputs = rng.integers(4, 64, (8, LENGTH)).astype(np.int32)
    targets = rng.integers(4, 64, (8, LENGTH)).astype(np.int32)
    inputs[::2, 9:] = 0  # some padding
    targets[1::2, 7:] = 0
    return {"inputs": inputs, "targets": targets}


def sharded_init(mesh_shape, devices, adam=False, ema_decay=0.0, weight_decay=0.0):
    """(mesh, model, optimizer, learning_rate, state shardings, initial state on the mesh).

    Plain SGD by default: Adam's first step is lr * g / (|g| + 1e-9), which turns the ~1e-9
    rounding noise of gradients that are zero in exact arithmetic (the key bias: softmax is
    shift-invariant) into full-size updates of either sign, on one device or eight.
    """
    mesh = sharding.make_mesh(mesh_shape, devices)
    rules = sharding.DEFAULT_RULES
    model = Transformer(CONFIG)
    if adam:
        optimizer_config = default_config().optimizer
        optimizer_config.warmup_steps = 10
        optimizer_config.ema_decay = ema_decay
        optimizer_config.weight_decay = weight_decay
        optimizer, learning_rate = make_optimizer(optimizer_config, CONFIG.d_model)
    else:
        optimizer, learning_rate = optax.sgd(1.0), lambda step, opt_state: jnp.float32(1.0)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(make_init_fn(model, optimizer, LENGTH, LENGTH, boxed=True), 0)
        state_shardings = sharding.logical_shardings(boxed, mesh, rules)
        state = jax.jit(make_init_fn(model, optimizer, LENGTH, LENGTH), out_shardings=state_shardings)(0)
    return mesh, model, optimizer, learning_rate, state_shardings, state


def one_step(mesh_shape, devices, rdrop_alpha=0.0, **optimizer_options):
    """(initial state, state after one step, loss) on a mesh over `devices`: a step of SGD, or of
    the optimizer that `optimizer_options` (`sharded_init`'s adam, ema_decay, weight_decay) choose."""
    mesh, model, optimizer, learning_rate, state_shardings, state = sharded_init(
        mesh_shape, devices, **optimizer_options
    )
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
        batch_sharding = sharding.batch_sharding(mesh, sharding.DEFAULT_RULES)
        step = jax.jit(
            functools.partial(
                train_step,
                model=model,
                optimizer=optimizer,
                learning_rate=learning_rate,
                label_smoothing=0.1,
                rdrop_alpha=rdrop_alpha,
            ),
            in_shardings=(state_shardings, batch_sharding),
            out_shardings=(state_shardings, sharding.replicated(mesh)),
        )
        initial = jax.device_get(state)
        new_state, metrics = step(state, sharding.global_batch(batch_of_8(), batch_sharding))
    return initial, new_state, float(metrics["loss_sum"] / metrics["weight"])


@pytest.fixture(scope="module")
def single_device():
    assert jax.device_count() == 8, "conftest.py sets 8 simulated devices"
    return one_step((1, 1, 1), jax.devices()[:1])


# Tensor parallelism alone over all 8 devices with -m slow: (2, 2, 2) splits the heads and the
# feed-forward too, alongside fsdp and data.
# slow: (8, 1, 1), the data axis alone (about 7 s); covered in the default suite by
# test_one_step_matches_one_device[mesh_shape1] (its data axis of 2) and
# test_an_rdrop_step_matches_one_device[mesh_shape0] (the same step over the data axis of 8).
@pytest.mark.parametrize(
    "mesh_shape",
    [pytest.param((8, 1, 1), marks=pytest.mark.slow), (2, 2, 2), pytest.param((1, 1, 8), marks=pytest.mark.slow)],
)
def test_one_step_matches_one_device(single_device, mesh_shape):
    initial_1, state_1, loss_1 = single_device
    initial_8, state_8, loss_8 = one_step(mesh_shape, jax.devices())
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), initial_1.params, initial_8.params)
    np.testing.assert_allclose(loss_8, loss_1, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-5),
        jax.device_get(state_1.params),
        jax.device_get(state_8.params),
    )


# Pairs split over the data axis; fsdp and tensor under R-Drop with -m slow (without it: above).
@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), pytest.param((2, 2, 2), marks=pytest.mark.slow)])
def test_an_rdrop_step_matches_one_device(single_device, mesh_shape):
    """R-Drop's pairs (rows 2i, 2i + 1 of the repeated batch) stay pairs on a batch-sharded mesh."""
    _, _, plain_loss = single_device
    _, state_1, loss_1 = one_step((1, 1, 1), jax.devices()[:1], rdrop_alpha=5.0)
    _, state_8, loss_8 = one_step(mesh_shape, jax.devices(), rdrop_alpha=5.0)
    assert abs(loss_1 - plain_loss) > 1e-3  # the divergence is in the loss
    np.testing.assert_allclose(loss_8, loss_1, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-5),
        jax.device_get(state_1.params),
        jax.device_get(state_8.params),
    )


@pytest.mark.parametrize("mesh_shape", [(2, 2, 2)])  # fsdp and tensor both at work
def test_parameters_and_optimizer_state_are_really_split(mesh_shape):
    # The train step keeps these shardings: its out_shardings are the same state_shardings.
    *_, state = sharded_init(mesh_shape, jax.devices(), adam=True)
    sizes = dict(zip(sharding.AXIS_NAMES, mesh_shape))
    embedding = state.params["shared_embedding"]["embedding"]  # [vocab, embed]
    query = state.params["encoder"]["layer_0"]["self_attention"]["query_kernel"]  # [embed, heads, kv]
    assert embedding.sharding.spec == PartitionSpec("tensor", "fsdp")
    assert query.sharding.spec == PartitionSpec("fsdp", "tensor", None)
    ways = sizes["fsdp"] * sizes["tensor"]
    assert ways > 1
    for array in (embedding, query):
        shard_shape = array.addressable_shards[0].data.shape
        assert np.prod(shard_shape) * ways == np.prod(array.shape), (array.shape, shard_shape)
    adam_mu = state.opt_state[1][0].mu["shared_embedding"]["embedding"]
    assert adam_mu.sharding.spec == embedding.sharding.spec  # Adam's moments follow their parameters
    assert adam_mu.addressable_shards[0].data.shape == embedding.addressable_shards[0].data.shape


def test_the_parameters_moving_average_is_split_as_the_parameters_are():
    *_, state = sharded_init((2, 2, 2), jax.devices(), adam=True, ema_decay=0.99)
    average = parameter_ema(state.opt_state)
    jax.tree.map(_same_split, average, state.params)
    assert average["shared_embedding"]["embedding"].sharding.spec == PartitionSpec("tensor", "fsdp")


@pytest.mark.slow  # to the slow set (about 15 s): the default suite ran 12 min 38 s on a 2-core Intel VM (2026-12-06)
def test_weight_decay_shrinks_the_sharded_kernels_and_embeddings_only():
    initial, plain, _ = one_step((2, 2, 2), jax.devices(), adam=True)
    _, decayed, _ = one_step((2, 2, 2), jax.devices(), adam=True, weight_decay=0.5)
    rate = 64**-0.5 * 10**-1.5  # the first update's rate: d_model 64, warmup 10

    decayed_names = set()

    def check(path, start, without, with_decay):
        name = path[-1].key
        if name.endswith("kernel") or name == "embedding":
            decayed_names.add(name)
            without = without - rate * 0.5 * np.asarray(start)
        np.testing.assert_allclose(np.asarray(with_decay), np.asarray(without), atol=1e-6, rtol=1e-6, err_msg=name)

    jax.tree_util.tree_map_with_path(
        check, initial.params, jax.device_get(plain.params), jax.device_get(decayed.params)
    )
    assert {"embedding", "query_kernel", "wi_kernel"} <= decayed_names
    embedding = initial.params["shared_embedding"]["embedding"]
    assert np.abs(rate * 0.5 * embedding).max() > 1e-4  # a shrink large enough for the check to see


def _same_split(ema, param):
    assert ema.sharding.spec == param.sharding.spec
    assert ema.addressable_shards[0].data.shape == param.addressable_shards[0].data.shape


def test_mesh_shape_errors():
    assert sharding.resolve_mesh_shape((-1, 2, 1), 8) == (4, 2, 1)
    with pytest.raises(sharding.MeshError, match=r"has 4 devices but 8 are available"):
        sharding.resolve_mesh_shape((2, 2, 1), 8)
    with pytest.raises(sharding.MeshError, match="not divisible by 3"):
        sharding.resolve_mesh_shape((-1, 3, 1), 8)
    with pytest.raises(sharding.MeshError, match="at most one -1"):
        sharding.resolve_mesh_shape((-1, -1, 1), 8)
    mesh = sharding.make_mesh((4, 2, 1))
    with pytest.raises(sharding.MeshError, match="batch_size=6 must be divisible by the 8 data-parallel shards"):
        sharding.check_batch_size(6, mesh, sharding.DEFAULT_RULES)
    with pytest.raises(sharding.MeshError, match="^data.eval_batch_size=4 must be divisible by the 8 data-parallel"):
        sharding.check_batch_size(4, mesh, sharding.DEFAULT_RULES, "data.eval_batch_size")


def test_a_mesh_axis_named_twice_in_one_rule_is_refused():
    """('batch', ('data', 'data')) was taken as 64 data-parallel shards of 8 devices, or failed in
    jax with a DuplicateSpecError traceback."""
    rules = (("batch", ("data", "data")), *sharding.DEFAULT_RULES[1:])
    with pytest.raises(
        sharding.MeshError,
        match=re.escape("mesh.logical_axis_rules: 'batch' -> ('data', 'data') names the mesh axis 'data' twice"),
    ):
        sharding.check_rules(rules)
    sharding.check_rules((("batch", ("data", "fsdp")), ("embed", "fsdp"), ("vocab", ("tensor",))))


def test_none_among_a_rules_mesh_axes_is_refused():
    """('heads', ('tensor', None)) passed the check, then failed in jax with a "Resource axis:
    None ... is not found in mesh" traceback."""
    rules = (("heads", ("tensor", None)), *sharding.DEFAULT_RULES)
    with pytest.raises(sharding.MeshError, match=re.escape("'heads' -> ('tensor', None) puts None among mesh axes")):
        sharding.check_rules(rules)
    sharding.check_rules((("heads", None), ("kv", ("tensor",))))


@pytest.mark.parametrize(
    ("shape", "rules", "warned"),
    [
        ((8, 1, 1), (), "do not split the batch over the mesh axis data (size 8 in mesh.shape=(8, 1, 1))"),
        (
            (2, 4, 1),
            (("batch", "data"),),
            "the mesh axis fsdp (size 4 in mesh.shape=(2, 4, 1))",
        ),
        ((2, 2, 2), (("batch", "tensor"),), "over the mesh axes data and fsdp (sizes 2 and 2 in mesh.shape=(2, 2, 2))"),
        ((1, 1, 8), (), None),  # tensor parallel only: no rows to split
        ((4, 2, 1), sharding.DEFAULT_RULES, None),
    ],
)
def test_rules_that_leave_the_batch_unsplit_are_warned_about(shape, rules, warned, caplog):
    sharding.warn_unsplit_batch(sharding.make_mesh(shape), rules)
    messages = [record.getMessage() for record in caplog.records]
    if warned is None:
        assert messages == []
    else:
        assert len(messages) == 1 and warned in messages[0], messages


EMBEDDING_LOOKUP_ON_A_2x2x2_MESH = """
import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.model.config import preset
from jaxformer.model.layers import Embed, constrain
from jaxformer.training import sharding

embed = Embed(preset("tiny", vocab_size=64, d_model=64))
mesh, rules = sharding.make_mesh((2, 2, 2)), sharding.DEFAULT_RULES
tokens = jnp.arange(96, dtype=jnp.int32).reshape(8, 12) % 64
with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    shardings = sharding.logical_shardings(jax.eval_shape(embed.init, jax.random.key(0), tokens), mesh, rules)
    params = jax.jit(embed.init, out_shardings=shardings)(jax.random.key(0), tokens)
    loss = lambda params, tokens: jnp.sum(constrain(embed.apply(params, tokens)) ** 2)
    batch = jax.device_put(tokens, sharding.batch_sharding(mesh, rules))
    jax.jit(jax.grad(loss)).lower(params, batch).compile()
print("compiled")
"""


def test_the_embedding_lookup_needs_no_replication_on_a_data_fsdp_tensor_mesh():
    """Rows of a table split along embed (fsdp) and vocab (tensor) went to batch-split activations
    only by replicating them: XLA printed 'Involuntary full rematerialization' (900 characters,
    12 times a run) and did the work of a replicated lookup. In a subprocess: XLA logs while it
    compiles, which a program in the persistent compilation cache would skip."""
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", EMBEDDING_LOOKUP_ON_A_2x2x2_MESH],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=pathlib.Path(__file__).parents[2],  # this checkout's jaxformer
    )
    assert result.returncode == 0 and result.stdout == "compiled\n", result.stderr[-2000:]
    assert "Involuntary full rematerialization" not in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize(
    ("shape", "processes", "spans"),
    [
        ((1, 1, 8), 2, True),  # one batch shard over both hosts: each would give it its own rows
        ((2, 1, 4), 4, True),  # two shards, four hosts
        ((2, 1, 4), 2, False),
        ((1, 2, 4), 2, False),
        ((2, 2, 2), 4, False),
        ((8, 1, 1), 8, False),
    ],
)
def test_a_batch_shard_on_devices_of_two_processes_is_refused(shape, processes, spans):
    """As the devices of `processes` hosts with 8 / processes devices each, in order."""
    mesh = sharding.make_mesh(shape)
    per_host = 8 // processes

    def check():
        sharding.check_rows_within_processes(mesh, sharding.DEFAULT_RULES, lambda device: device.id // per_host)

    if not spans:
        check()
        return
    with pytest.raises(sharding.MeshError, match=rf"^mesh.shape={re.escape(str(shape))}: \d+ of its \d+ data-parallel"):
        check()


# Rules that split the head size, or a scanned stack's layers, which the default rules leave whole.
KV_OVER_TENSOR = (("kv", "tensor"), *sharding.DEFAULT_RULES)
LAYERS_OVER_FSDP = (("layers", "fsdp"), *sharding.DEFAULT_RULES)
SCANNED = {"scan_layers": True, "num_encoder_layers": 3, "num_decoder_layers": 4}


@pytest.mark.parametrize(
    ("changes", "mesh_shape", "named", "rules"),
    [
        ({}, (1, 1, 8), None, None),  # 8 heads, d_ff 128, vocabulary 64 over tensor=8; d_model 64
        ({"num_heads": 4}, (1, 1, 8), r"model.num_heads=4 is not divisible by its mesh axes tensor \(8 ways\)", None),
        ({"d_ff": 130}, (2, 1, 4), r"model.d_ff=130 is not divisible by its mesh axes tensor \(4 ways\)", None),
        ({"d_model": 36, "num_heads": 4}, (1, 8, 1), r"model.d_model=36 is not divisible by its mesh axes fsdp", None),
        ({"vocab_size": 66}, (2, 1, 4), r"the vocabulary's size \(tokenizer.vocab_size.*\), 66, is not", None),
        ({"d_model": 48}, (2, 1, 4), r"the head size \(model.d_model / model.num_heads\), 6, is not", KV_OVER_TENSOR),
        # the decoder's 4 layers divide fsdp=4 (and its arrays come first): the encoder's 3 are named
        (SCANNED, (2, 4, 1), r"model.num_encoder_layers=3 is not divisible by its mesh axes fsdp", LAYERS_OVER_FSDP),
    ],
)
def test_a_mesh_that_does_not_divide_the_model_names_the_key_before_compiling(changes, mesh_shape, named, rules):
    config = CONFIG.replace(**changes)
    mesh, rules = sharding.make_mesh(mesh_shape), rules or sharding.DEFAULT_RULES
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(make_init_fn(Transformer(config), optax.sgd(1.0), LENGTH, LENGTH, boxed=True), 0)
        shardings = sharding.logical_shardings(boxed, mesh, rules)
    if named is None:
        sharding.check_divisible(boxed, shardings, mesh)
        return
    with pytest.raises(sharding.MeshError, match=rf"^mesh.shape={re.escape(str(mesh_shape))}: {named}.*, which split "):
        sharding.check_divisible(boxed, shardings, mesh)
