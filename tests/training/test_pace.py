"""pace.py: a config's train-step time against a reference's, timed in turn; programs that differ
only in constants are not timed; the random rows have the structure of the pipeline's batches."""

import numpy as np
import pytest

from jaxformer.data.pipeline import TokenizePair, train_dataset
from jaxformer.data.tokenizer import train_tokenizer
from jaxformer.training.config_file import apply_overrides, load_config
from jaxformer.training.pace import Pace, random_rows, relative_pace

pytestmark = pytest.mark.xdist_group("pace")  # timings: one worker at a time


def tiny(*overrides):
    config = load_config("tiny")
    config.data.batch_size = 8  # a row for each of the tests' 8 simulated devices
    apply_overrides(config, [tuple(item.split("=", 1)) for item in overrides])
    return config


def test_random_rows_have_the_structure_of_the_pipelines_batches():
    words = "a man woman dog runs sits red blue big small the in on with".split()
    rng = np.random.default_rng(0)
    records = [
        {"en": " ".join(rng.choice(words, int(rng.integers(1, 9)))).encode(), "de": b"ein hund rennt"}
        for _ in range(200)
    ]
    tokenizer = train_tokenizer([r[k].decode() for r in records for k in ("en", "de")], vocab_size=30)
    data = tiny("data.num_threads=0").data
    real = next(iter(train_dataset(records, TokenizePair.for_data(data, tokenizer), data)))
    rows = random_rows(data, (40, 50), ("inputs", "targets"))
    assert {key: (value.shape, value.dtype) for key, value in rows.items()} == {
        key: (value.shape, value.dtype) for key, value in real.items()
    }
    assert rows["inputs"].min() >= 4 and rows["inputs"].max() < 40 and rows["targets"].max() < 50
    assert (rows["targets_positions"][0] == np.arange(data.max_length)).all()
    assert set(random_rows(data, (40, 40), ("targets",))) == {"targets", "targets_segment_ids", "targets_positions"}


def test_configs_that_differ_only_in_constants_are_not_timed():
    changed = tiny("model.dropout_rate=0.3", "training.label_smoothing=0.2", "optimizer.warmup_steps=7")
    pace = relative_pace(changed, tiny())
    assert pace == Pace(1.0, 1.0, timed=False)
    assert pace.steps_for(1234) == 1234


def test_a_signal_held_while_the_steps_ran_stops_the_measurement_after_that_step(monkeypatch):
    """The steps run inside JAX's code, where RaiseOnSignal holds a signal: the sweep's pace
    measurement ran to its end before its check raised it. The check now runs between steps."""
    import signal
    import types

    from jaxformer.training import pace as pace_module
    from jaxformer.training.signals import RaiseOnSignal, Stopped

    steps = []

    def fake_step(self):
        steps.append(self)
        if len(steps) == 3:  # a SIGTERM during this step's XLA call: held
            frame = types.SimpleNamespace(f_globals={"__name__": "jax._src.pjit"}, f_back=None)
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, frame)

    monkeypatch.setattr(pace_module.ConfigTrainStep, "__call__", fake_step)
    monkeypatch.setattr(pace_module.ConfigTrainStep, "compile", lambda self, compiler_options=None: None)
    monkeypatch.setattr("jaxformer.training.signals._RETRY_SECONDS", 600.0)  # no re-send: the check alone
    with pytest.raises(Stopped), RaiseOnSignal() as signals:
        relative_pace(tiny("model.dropout_rate=0.0"), tiny(), signals.check)
    assert len(steps) == 3  # not the 2 x (warmup + rounds) of a whole measurement


# Two real programs timed (-m slow). The timed path's rounds, medians and shares stay in the default
# suite with a clock and steps faked: test_rdrop_start.py::test_a_switching_configs_pace_is_the_mix_of_its_two_programs.
@pytest.mark.slow
def test_a_config_without_dropout_is_another_program_and_is_timed():
    pace = relative_pace(tiny("model.dropout_rate=0.0"), tiny())
    assert pace.timed and pace.seconds_per_step > 0 and pace.reference_seconds_per_step > 0


@pytest.mark.slow  # two models timed
def test_a_larger_model_is_measured_slower_in_proportion():
    pace = relative_pace(tiny("model.d_model=128", "model.d_ff=512", "model.num_heads=4"), tiny())
    assert pace.timed
    assert pace.speed < 0.6  # over ten times the tiny model's matmul FLOPs a step
    assert pace.steps_for(1000) == round(1000 * pace.speed)
    assert Pace(10.0, 1.0, timed=True).steps_for(3) == 1  # never fewer than one step


def test_a_fine_tuning_sweep_times_the_model_with_its_starts_vocabulary(tmp_path, monkeypatch):
    """A variant fine-tuned from training.init_from trains with its start's vocabulary (the
    parent's 500 pieces), whatever tokenizer.vocab_size says (tiny: 1000): its pace, and so its
    step budget, was measured on a model with the config's embeddings. Both programs the sweep
    builds (the variant's, the reference's) now have the parent's; steps faked, no timing read."""
    from jaxformer.run.loading import load_checkpoint
    from jaxformer.training import pace as pace_module
    from jaxformer.training.sweep import make_variants, reference_config
    from jaxformer.training.sweep_pace import variant_pace
    from tests.conftest import make_workdir

    parent = make_workdir(tmp_path / "parent", steps=(10,))[0]
    pieces = load_checkpoint(parent, "latest", params=False)[1].model["vocab_size"]
    shared = [
        ("training.init_from", str(parent)),
        ("training.final_choice", "True"),
        ("training.average_last", "2"),
        ("data.batch_size", "8"),
    ]
    (variant,) = make_variants("tiny", {"no_dropout": ["model.dropout_rate=0.0"]}, shared)
    assert (pieces, variant.config.tokenizer.vocab_size) == (500, 1000)
    built = []

    class Recorded(pace_module.ConfigTrainStep):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(pace_module, "ConfigTrainStep", Recorded)
    monkeypatch.setattr(Recorded, "__call__", lambda self: None)
    monkeypatch.setattr(Recorded, "compile", lambda self, compiler_options=None: None)
    record = variant_pace(variant, reference_config("tiny", shared), 100, tmp_path / "pace.json", None)
    assert record["timed"] and len(built) == 2  # another program: timed
    for step in built:
        state, batch = step.lowered.args_info[0]
        assert state.params["shared_embedding"]["embedding"].shape == (pieces, variant.config.model.d_model)
        assert batch["inputs"].shape == (8, variant.config.data.max_length)
