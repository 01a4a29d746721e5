"""Every benchmark runs at --smoke size and reports rows of positive, finite numbers."""

import importlib
import json
import math

import pytest

# Columns that must be positive in every row that has them (others may be absent or 0).
POSITIVE = {
    "train_step": (
        "batch",
        "step_ms",
        "tokens_per_s",
        "model_gflop",
        "achieved_gflops",
        "peak_gflops",
        "mfu_pct",
        "params_M",
    ),
    "step_options": ("batch", "step_ms", "tokens_per_s", "speedup", "loss_chunk_tokens"),
    "xla_options": ("devices", "batch", "length", "step_ms", "tokens_per_s", "speedup"),
    "input_pipeline": ("pairs", "batch_cpu_ms", "batch_wall_ms", "step_ms", "steps_per_s", "speedup"),
    "real_data": ("steps", "pairs", "target_tokens", "step_ms", "tokens_per_s", "pairs_per_s"),
    "decoding": ("batch", "out_len", "sentences_per_s", "tokens_per_s", "call_ms"),
    "step_profile": ("step_ms", "jax_ops_over_wall"),
    "compile_time": ("programs", "compile_s", "speedup"),
    "memory_options": ("layers", "batch", "length", "compile_s", "step_ms", "temp_MB", "total_MB", "temp_x"),
    "precision": ("batches", "rows", "length", "max_abs_logit", "logit_diff", "logprob_diff"),
    "scaling": (
        "length",
        "batch",
        "compile_s",
        "step_ms",
        "tokens_per_s",
        "total_MB",
        "predicted_ratio",
        "measured_ratio",
    ),
}


def run_smoke(name, tmp_path, capsys, *extra):
    return smoke_output(name, tmp_path, capsys, *extra)[0]


def smoke_output(name, tmp_path, capsys, *extra):
    """(the JSON rows printed, checked against those returned and written; the whole output)."""
    json_path = tmp_path / f"{name}.jsonl"
    rows = importlib.import_module(f"benchmarks.{name}").main(["--smoke", "--json", str(json_path), *extra])
    output = capsys.readouterr().out
    printed = [json.loads(line[len("JSON ") :]) for line in output.splitlines() if line.startswith("JSON ")]
    written = [json.loads(line) for line in json_path.read_text().splitlines()]
    assert rows and len(printed) == len(rows) and written == printed
    for row in printed:
        assert row["benchmark"] == name
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert math.isfinite(value) and value >= 0, (key, row)
        for key in POSITIVE[name]:
            if key in row and row[key] is not None:
                assert row[key] > 0, (key, row)
    return printed, output


# These take the longest; they run with -m slow. memory_options: 11 compilations, 90 s; precision:
# three forward passes compiled, about 15 s of CPU; compile_time: 9 compilations, and it clears
# jax's in-memory caches, which the worker's other tests would compile again.
SLOW_SMOKE = ("decoding", "real_data", "scaling", "memory_options", "precision", "compile_time")


# step_options, xla_options, step_profile and input_pipeline run their smokes in tests of their
# own, which check the rows further.
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.slow) if name in SLOW_SMOKE else name
        for name in sorted(POSITIVE)
        if name not in ("step_options", "xla_options", "step_profile", "input_pipeline")
    ],
)
def test_smoke(name, tmp_path, capsys):
    rows = run_smoke(name, tmp_path, capsys)
    assert all(row.get("impl", "jaxformer") != "torch" for row in rows)  # torch only with --torch


@pytest.mark.slow
@pytest.mark.parametrize("name", ["train_step", "real_data", "decoding"])
def test_smoke_with_torch(name, tmp_path, capsys):
    pytest.importorskip("torch")
    rows = run_smoke(name, tmp_path, capsys, "--torch", "--torch-threads", "1")
    assert any(row["impl"] == "torch" for row in rows)


@pytest.mark.slow  # ten step variants compiled and timed: about a minute
def test_step_options_are_timed_against_flax_dropout(tmp_path, capsys):
    rows = run_smoke("step_options", tmp_path, capsys)
    assert [row["variant"] for row in rows] == [
        "flax_dropout",
        "fused_dropout",
        "loss_chunk_256",
        "loss_chunk_128",
        "no_dropout",
        "rbg_dropout",
        "unsafe_rbg_dropout",
        "vd_embedding_grad",
        "rdrop",
        "rdrop_exp",
    ]  # and, beyond the smoke's tiny model, bfloat16, bfloat16_matmuls and bfloat16_autodiff
    assert rows[0]["speedup"] == 1.0
    for row in rows:
        assert row["speedup"] == pytest.approx(rows[0]["step_ms"] / row["step_ms"])


def table_rows(output, count):
    """The header's column names and the first `count` rows of the printed table, split into cells."""
    lines = output.split("\n== ", 1)[1].splitlines()  # the title line, the header, the rows
    return lines[1].split(), [line.split() for line in lines[2 : 2 + count]]


def check_language_model(rows, output, impls):
    assert [(row["architecture"], row["impl"]) for row in rows] == [("decoder_only", impl) for impl in impls]
    header, cells = table_rows(output, len(rows))
    assert {"impl", "tokens_per_s", "jax_over_torch"} <= set(header)
    assert [line[:2] for line in cells] == [["smoke", impl] for impl in impls]
    for row in rows:
        assert row["src_len"] is None and row["tgt_len"] > 0  # no source side
        assert row["tokens_per_s"] == pytest.approx(row["batch"] * row["tgt_len"] / row["step_ms"] * 1e3)


def test_decoder_only_smoke(tmp_path, capsys):
    rows, output = smoke_output("train_step", tmp_path, capsys, "--architecture", "decoder_only")
    check_language_model(rows, output, ["jaxformer"])


def test_decoder_only_against_torch(tmp_path, capsys):
    pytest.importorskip("torch")
    extra = ("--architecture", "decoder_only", "--torch", "--torch-threads", "1")
    rows, output = smoke_output("train_step", tmp_path, capsys, *extra)
    check_language_model(rows, output, ["jaxformer", "torch"])
    jaxformer, torch = rows
    assert jaxformer["jax_over_torch"] == pytest.approx(jaxformer["tokens_per_s"] / torch["tokens_per_s"])
    assert jaxformer["params"] == torch["params"]  # the same model: nn.TransformerEncoder under a causal mask
    assert "parameters jaxformer" in output and "(equal)" in output and "torch: TorchLanguageModel" in output


def test_autodiff_projections_stand_in_for_project_in_the_model():
    """step_options' bfloat16_autodiff row swaps the model's `project` for a plain einsum; the
    swap takes project's arguments (the operand dtype included) and, in float32, gives the same
    logits (that row's bf16 model itself cannot run at the smoke's tiny size on a CPU)."""
    import jax
    import numpy as np

    from benchmarks.step_options import autodiff_projections
    from jaxformer.model.config import preset
    from jaxformer.model.transformer import Transformer

    model = Transformer(preset("tiny", deterministic=True))
    tokens = jax.numpy.ones((2, 5), jax.numpy.int32) * 7
    params = model.init(jax.random.key(0), tokens, tokens)

    def logits():
        return model.apply(params, tokens, tokens)

    with autodiff_projections():
        swapped = logits()
    np.testing.assert_allclose(swapped, logits(), rtol=1e-6, atol=1e-6)


def test_exponentiated_pair_probs_stand_in_for_the_softmax_in_r_drops_loss():
    """step_options' rdrop_exp row: the same R-Drop sums and gradients, the probabilities
    exponentiated from the log-probabilities."""
    import jax
    import numpy as np

    from benchmarks.step_options import exponentiated_pair_probs
    from jaxformer.training.output_loss import projected_token_losses

    keys = jax.random.split(jax.random.key(0), 3)
    hidden, embedding = jax.random.normal(keys[0], (4, 6, 8)), jax.random.normal(keys[1], (29, 8))
    targets, weights = jax.random.randint(keys[2], (4, 6), 0, 29), jax.numpy.ones((4, 6))

    def loss_and_grads():
        def loss(h, e):
            return projected_token_losses(h, e, targets, weights, 0.1, 12, rdrop_alpha=5.0)["loss_sum"]

        return jax.value_and_grad(loss, argnums=(0, 1))(hidden, embedding)

    with exponentiated_pair_probs():
        swapped = loss_and_grads()
    for got, want in zip(jax.tree.leaves(swapped), jax.tree.leaves(loss_and_grads())):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_prng_impl_draws_the_models_dropout_from_another_generator(impl):
    """step_options' rbg rows: inside the context the train state's key is of the other generator
    and dropout falls back to `jax.random.bernoulli` on it (other masks than Threefry's); outside,
    Threefry again."""
    import jax
    import numpy as np

    from benchmarks.step_options import prng_impl
    from jaxformer.model.dropout import keep_mask

    threefry_mask = keep_mask(jax.random.PRNGKey(0), 0.8, (64, 64))
    with prng_impl(impl):
        key = jax.random.PRNGKey(0)
        assert key.shape == (4,)  # RngBitGenerator's key; Threefry's is 2 words
        mask = keep_mask(key, 0.8, (64, 64))
        np.testing.assert_array_equal(mask, jax.random.bernoulli(key, 0.8, (64, 64)))
    assert jax.config.jax_default_prng_impl == "threefry2x32"
    assert jax.random.PRNGKey(0).shape == (2,)
    assert not np.array_equal(mask, threefry_mask)
    assert 0.7 < float(np.mean(mask)) < 0.9


@pytest.mark.slow  # about 14 s: the default suite is near its 10-minute limit
def test_memory_options_put_plain_first_and_scanned_remat_keeps_less(tmp_path, capsys):
    """`plain` is the reference whatever the order asked; the scanned stack recomputed in the
    backward pass holds fewer temporaries than the scanned stack that keeps its activations."""
    rows = run_smoke("memory_options", tmp_path, capsys, "--options", "scan_remat_full,scan")
    assert [row["option"] for row in rows] == ["plain", "scan_remat_full", "scan"]
    assert rows[0]["temp_x"] == 1.0
    by_option = {row["option"]: row for row in rows}
    assert by_option["scan_remat_full"]["temp_MB"] < by_option["scan"]["temp_MB"]
