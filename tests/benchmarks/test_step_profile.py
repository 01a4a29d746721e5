"""benchmarks.step_profile: its rows against torch, and how it charges each operation."""

import pytest

from benchmarks import step_profile
from tests.benchmarks.test_smoke import smoke_output


def test_each_event_is_charged_its_time_less_the_events_nested_in_it():
    events = [
        ("while", 100, 50),  # holds a and b
        ("a", 110, 10),
        ("b", 130, 15),  # holds c
        ("c", 132, 5),
        ("d", 160, 7),  # after the loop
        ("a", 170, 3),
    ]
    assert step_profile.exclusive_times(events) == {"while": 25, "a": 13, "b": 10, "c": 5, "d": 7}
    # The order the events come in does not matter.
    assert step_profile.exclusive_times(events[::-1]) == step_profile.exclusive_times(events)


def test_xla_operations_are_charged_by_their_traced_path():
    model = (
        "jit(train_step)/transpose(jvp(Transformer.hidden_states))/Transformer/decoder/stack/layer_0/layer_0._sublayers"
    )
    cases = {
        f"{model}/self_attention/self_attention.attend/attention_core/BTNH,BSNH->BNTS/dot_general": "attention_core",
        f"{model}/cross_attention/cross_attention.attend/attention_core/jit(_where)/select_n": "attention_core",
        # The query and output projections are traced inside attend, beside its core.
        f"{model}/self_attention/self_attention.attend/BLD,DNH->BLNH/dot_general": "matmuls",
        f"{model}/self_attention/self_attention.attend/BLNH,NHD->BLD/dot_general": "matmuls",
        f"{model}/self_attention/self_attention._heads/BLD,DNH->BLNH/dot_general": "matmuls",
        f"{model}/feed_forward/BLD,DF->BLF/dot_general": "matmuls",
        "jit(train_step)/jvp()/while/body/closed_call/BTD,VD->BTV/dot_general": "matmuls",
        "jit(train_step)/jvp()/while/body/closed_call/exp": "output_loss",
        f"{model}/self_attention_norm/reduce_sum": "layer_norm",
        "jit(train_step)/jvp(Transformer.hidden_states)/Transformer/decoder/input_dropout/add": "dropout",
        f"{model}/feed_forward/max": "other",
        "jit(train_step)/sqrt": "optimizer",
        "jit(train_step)/mul": "optimizer",
    }
    for op_name, component in cases.items():
        assert step_profile.jax_component(op_name) == component, op_name


def test_the_compiled_steps_attention_products_are_the_core_and_its_projections_are_matmuls():
    from benchmarks.common import SMOKE, compile_timed, make_train, random_batch

    config, batch, source_length, target_length = SMOKE
    state, train_fn = make_train(config, source_length, target_length)
    compiled, _ = compile_timed(train_fn, state, random_batch(0, config, batch, source_length, target_length))
    op_names = set(dict(step_profile._INSTRUCTION.findall(compiled.as_text())).values())
    products = {name for name in op_names if name.endswith("/dot_general") and "jvp(" in name}
    charged = {name: step_profile.jax_component(name) for name in products}
    assert "attention_core" in charged.values() and "matmuls" in charged.values()
    for name, component in charged.items():
        spec = name.split("/")[-2]  # the einsum's, e.g. BLD,DNH->BLNH: a product with a weight reads D
        assert component == ("matmuls" if "D" in spec else "attention_core"), name


def test_torch_operators_are_charged_by_name_and_range():
    pytest.importorskip("torch")
    from benchmarks.torch_reference import OPTIMIZER_RANGE

    cases = {
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", ()): "attention_core",
        ("aten::bmm", ("aten::matmul",)): "attention_core",
        ("aten::mm", ()): "matmuls",
        ("aten::addmm", ("aten::linear",)): "matmuls",
        ("aten::_log_softmax_backward_data", ()): "output_loss",
        ("aten::nll_loss_forward", ()): "output_loss",
        ("aten::native_layer_norm_backward", ()): "layer_norm",
        ("aten::bernoulli_", ()): "dropout",
        ("aten::mul", ()): "other",
        ("aten::mul", ("aten::_foreach_mul_", OPTIMIZER_RANGE)): "optimizer",
        ("aten::mm", (OPTIMIZER_RANGE,)): "optimizer",
        (OPTIMIZER_RANGE, ()): "optimizer",  # the range's own self time, outside its operators
    }
    for (operator, ranges), component in cases.items():
        assert step_profile.torch_component(operator, ranges) == component, operator


@pytest.mark.slow  # to the slow set (about 17 s): the default suite ran 12 min 38 s on a 2-core Intel VM (2026-12-06)
def test_smoke_splits_both_steps_into_components(tmp_path, capsys):
    pytest.importorskip("torch")
    rows, output = smoke_output("step_profile", tmp_path, capsys, "--torch", "--torch-threads", "1")
    assert [row["component"] for row in rows] == [*step_profile.COMPONENTS, "step"]
    *components, step = rows
    for side in ("jax", "torch"):
        assert sum(row[f"{side}_pct"] for row in components) == pytest.approx(100.0)
        assert sum(row[f"{side}_ms"] for row in components) == pytest.approx(step[f"{side}_ms"])
        by_name = {row["component"]: row[f"{side}_ms"] for row in components}
        # Every step attends, multiplies by weights, and updates: none of these may go uncharged.
        assert by_name["attention_core"] > 0 and by_name["matmuls"] > 0 and by_name["optimizer"] > 0, side
    assert step["jax_ms"] == step["step_ms"]
    for row in rows:
        assert row["torch_over_jax"] == pytest.approx(row["torch_ms"] / row["jax_ms"])
    assert "torch_over_jax" in output.split("\n== ", 1)[1].splitlines()[1]
