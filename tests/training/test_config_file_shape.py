"""A config file's shape: every key of default_config() present (a missing one is refused when the
file loads, before overrides or any work), and any file name read as Python source."""

import ast
import json
import pathlib
import re
import shutil
import sys
import types
import typing

import numpy as np
import pytest

from jaxformer.commands import train
from jaxformer.errors import EXIT_USER_ERROR, UserError
from jaxformer.model.config import ConfigError, TransformerConfig
from jaxformer.training import config_file, experiment, loop
from jaxformer.training.checked_keys import TUPLE_FORMS
from jaxformer.training.config_file import load_config, load_config_file, packaged_config_names, with_python_values
from jaxformer.training.config_rules import VALUE_RULES
from jaxformer.training.sweep_file import load_sweep

ROOT = pathlib.Path(__file__).parents[2]
TINY = ROOT / "jaxformer" / "configs" / "tiny.py"
REMEDY = "start it from jaxformer.training.experiment.default_config() (as the shipped configs do)"


def tiny_changed_by(tmp_path, *lines, name="partial.py"):
    """A config file: tiny's config, then `lines` run on it (as `c`)."""
    path = tmp_path / name
    body = "".join(f"    {line}\n" for line in lines)
    header = "from jaxformer.configs.tiny import get_config as tiny\n\ndef get_config():\n    c = tiny()\n"
    path.write_text(f"{header}{body}    return c\n")
    return path


def one_error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_missing_key_is_refused_before_the_overrides_naming_the_file_and_key(tmp_path, capsys):
    path = tiny_changed_by(tmp_path, "del c.training['rdrop_start']")
    # the override names a key default_config() has: the file lacks it, the key is not unknown
    argv = ["--config", str(path), "--print_config", "--config.training.rdrop_start=0.4"]
    assert train.main(argv) == 2
    error = one_error_line(capsys)
    assert error.startswith(f"error: config file {path}: get_config() lacks 'training.rdrop_start'; "), error
    assert REMEDY in error and "unknown config key" not in error


def test_a_missing_section_is_refused_before_a_run_writes_anything(tmp_path, capsys):
    path = tiny_changed_by(tmp_path, "del c['decoding']")
    workdir = tmp_path / "run"
    assert train.main(["--config", str(path), "--workdir", str(workdir)]) == 2
    assert "get_config() lacks section 'decoding'; " in one_error_line(capsys)
    assert not workdir.exists()  # no data prepared, no tokenizer trained


def test_a_frozen_config_is_refused_as_the_file_loads(tmp_path, capsys):
    """A FrozenConfigDict is a ConfigDict that takes no setting: the first override, or the run's
    first settled value, was a traceback (AttributeError, exit 1) after the run took the workdir."""
    path = tiny_changed_by(tmp_path, "import ml_collections", "c = ml_collections.FrozenConfigDict(c)")
    workdir = tmp_path / "run"
    for overrides in ([], ["--config.training.num_train_steps=1"]):
        assert train.main(["--config", str(path), "--workdir", str(workdir), *overrides]) == EXIT_USER_ERROR
        assert one_error_line(capsys) == (
            f"error: config file {path}: get_config() returned a FrozenConfigDict, which takes no "
            "--config.KEY=VALUE override nor the values a run settles; return the ConfigDict itself"
        )
        assert not workdir.exists()


def test_a_replaced_section_names_the_first_keys_it_lacks(tmp_path):
    path = tiny_changed_by(
        tmp_path,
        "import ml_collections",
        "c.data.files = ml_collections.ConfigDict({'train': 'corpus.tsv'})",
        "del c.model['dropout_rate'], c.model['d_ff'], c.optimizer['b1']",
    )
    with pytest.raises(ConfigError) as error:
        load_config_file(path)
    assert str(error.value).startswith(  # ConfigDict keeps its keys sorted
        f"config file {path}: get_config() lacks 'data.files.test', 'data.files.validation', 'model.d_ff' and 2 more; "
    )


def test_a_value_in_place_of_a_section_is_that_section_missing(tmp_path):
    path = tiny_changed_by(tmp_path, "del c.data['files']", "c.data.files = 'corpus.tsv'")
    with pytest.raises(ConfigError, match=r"get_config\(\) lacks section 'data.files'; "):
        load_config_file(path)


@pytest.mark.parametrize("name", packaged_config_names())
def test_every_shipped_config_has_every_key(name):
    assert set(experiment.flatten(load_config(name))) >= set(experiment.flatten(experiment.default_config()))


@pytest.mark.parametrize(
    "setting",
    ["c.training.rdrop_begin = 0.4", "c['training']['rdrop_begin'] = 0.4", "c.training.update(rdrop_begin=0.4)"],
)
def test_an_extra_key_is_refused_as_unknown_naming_the_file_and_its_line(tmp_path, capsys, setting):
    """Was the key alone ("error: unknown config key 'training.rdrop_begin'; ..."), as a mistyped
    --config. flag is named: nothing sent the user to the file, nor to its line."""
    path = tiny_changed_by(tmp_path, "c.data.max_length = 40", setting)
    assert train.main(["--config", str(path), "--print_config"]) == 2
    assert one_error_line(capsys) == (
        f"error: config file {path}, line 6: unknown config key 'training.rdrop_begin'; did you mean "
        "training.rdrop_start, training.rdrop_decision_step, training.rdrop_alpha?"
    )


def test_a_bool_set_on_a_number_key_in_a_config_file_is_refused_in_one_line_naming_its_line(tmp_path, capsys):
    """ml_collections casts an int set on a float key to float, bool included: True became 1.0
    and passed every check, where --config.training.time_budget_minutes=True is refused."""
    path = tiny_changed_by(tmp_path, "c.training.time_budget_minutes = True")
    workdir = tmp_path / "run"
    assert train.main(["--config", str(path), "--workdir", str(workdir)]) == 2
    assert one_error_line(capsys) == (
        f"error: config file {path}, line 5: config training.time_budget_minutes=True: must be a finite number >= 0 "
        "(0: no time budget)"
    )
    assert not workdir.exists()


def test_every_number_key_refuses_a_bool_and_takes_an_int_as_a_float():
    defaults = experiment.flatten(experiment.default_config())
    numbers = [key for key in VALUE_RULES if isinstance(defaults[key], float)]
    assert {"training.time_budget_minutes", "optimizer.decay_floor", "decoding.alpha"} <= set(numbers)
    for key in numbers:
        section, leaf = key.split(".")
        config = experiment.default_config()
        for value in (True, False, np.bool_(True)):
            with pytest.raises(
                ConfigError, match=rf"^config {key}={value!r}: must be {re.escape(VALUE_RULES[key][1])}$"
            ):
                config[section][leaf] = value
        config[section][leaf] = 1  # an int is still a number
        assert config[section][leaf] == 1.0 and type(config[section][leaf]) is float


def test_a_bool_on_a_float_field_of_the_model_is_refused_in_a_config_file_as_on_the_command_line(tmp_path, capsys):
    """`c.model.dropout_rate = False` was a model without dropout and `layer_norm_epsilon = True` an
    epsilon of 1.0, with no word: ml_collections cast the bool to float before TransformerConfig saw it."""
    fields = typing.get_type_hints(TransformerConfig)
    floats = [field for field, kind in fields.items() if kind is float]
    assert {"dropout_rate", "target_word_dropout_rate", "layer_norm_epsilon", "position_base"} <= set(floats)
    for field in floats:
        for value in (True, False):
            path = tiny_changed_by(tmp_path, f"c.model.{field} = {value}")
            with pytest.raises(ConfigError) as refused:
                load_config_file(path)
            assert str(refused.value) == f"config file {path}, line 5: config model.{field}={value}: must be a number"
            with pytest.raises(ConfigError) as refused:
                config_file.apply_overrides(load_config_file(TINY), [(f"model.{field}", str(value))])
            assert str(refused.value) == f"--config.model.{field}={value}: must be a number"
        taken = load_config_file(tiny_changed_by(tmp_path, f"c.model.{field} = 3")).model[field]
        assert (taken, type(taken)) == (3.0, float)  # an int is still a number
    path, workdir = tiny_changed_by(tmp_path, "c.model.dropout_rate = False"), tmp_path / "run"
    assert train.main(["--config", str(path), "--workdir", str(workdir)]) == 2
    message = "config model.dropout_rate=False: must be a number"
    assert one_error_line(capsys) == f"error: config file {path}, line 5: {message}"
    assert not workdir.exists()


def test_a_bool_on_an_integer_field_of_the_model_is_refused_from_a_config_file_and_the_command_line(tmp_path):
    """ml_collections keeps a bool set on an int key as it is, and TransformerConfig refuses it
    (model.max_positions=True was refused as "config data.max_length=48 with model.max_positions=True",
    a length beyond the model's positions)."""
    fields = typing.get_type_hints(TransformerConfig)
    integers = [field for field in experiment.model_section("tiny") if fields.get(field) in (int, int | None)]
    assert {"d_model", "num_heads", "num_decoder_layers", "max_positions"} <= set(integers)
    for field in integers:
        config = load_config_file(tiny_changed_by(tmp_path, f"c.model.{field} = True"))
        with pytest.raises(ConfigError, match=rf"^config model\.{field}=True: must be "):
            experiment.validate(config)
        with pytest.raises(ConfigError) as refused:
            config_file.apply_overrides(load_config_file(TINY), [(f"model.{field}", "True")])
        assert str(refused.value) == f"--config.model.{field}=True: must be an integer"


def test_a_tuple_key_set_to_no_tuple_in_a_config_file_is_refused_naming_its_line_and_form(tmp_path, capsys):
    """`c.training.final_alphas = 1.0` was "get_config() raised TypeError: Could not override field
    'final_alphas' (reference). 1.0 is of original type <class 'float'> and cannot be casted to type
    <class 'tuple'>", and None was taken."""
    defaults = experiment.flatten(experiment.default_config())
    assert set(TUPLE_FORMS) == {key for key, value in defaults.items() if isinstance(value, (tuple, list))}
    for key, form in TUPLE_FORMS.items():
        for value in (1.0, "1.0, 1.4", None):
            path = tiny_changed_by(tmp_path, f"c.{key} = {value!r}")
            with pytest.raises(ConfigError) as refused:
                load_config_file(path)
            assert str(refused.value) == f"config file {path}, line 5: config {key}={value!r}: must be {form}"
        config = experiment.default_config()  # the example is one the key takes, given as a list too
        section, leaf = key.split(".")
        config[section][leaf] = list(ast.literal_eval(form.rpartition(", e.g. ")[2]))
        experiment.validate(config)
    path, workdir = tiny_changed_by(tmp_path, "c.training.final_alphas = 1.4"), tmp_path / "run"
    assert train.main(["--config", str(path), "--workdir", str(workdir)]) == 2
    assert one_error_line(capsys) == (
        f"error: config file {path}, line 5: config training.final_alphas=1.4: must be a tuple of length penalties "
        "(() keeps decoding.alpha), each a finite number from 0 to 4 (above it the length penalty overflows float32 "
        "on a hypothesis of up to 2**31 - 1 tokens, the longest the search counts, and every hypothesis ranks "
        "alike), e.g. (1.0, 1.4)"
    )
    assert not workdir.exists()


def test_a_path_not_ending_in_py_is_read_as_python(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "my_tiny.txt"
    shutil.copy(TINY, mine)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as Python runs by default (the tests' env sets it)
    assert load_config(str(mine)).to_dict() == load_config("tiny").to_dict()
    monkeypatch.chdir(tmp_path)
    assert train.main(["--config", "./my_tiny.txt", "--print_config"]) == 0
    assert "num_train_steps: 40" in capsys.readouterr().out
    assert sorted(path.name for path in tmp_path.iterdir()) == ["my_tiny.txt"]  # no __pycache__ beside it
    # a bare file name means a shipped config (README); the message says how to read the file
    with pytest.raises(ConfigError, match=r"no config named 'my_tiny.txt'; to read the file my_tiny.txt, give it as "):
        load_config("my_tiny.txt")


@pytest.mark.parametrize(
    "text, message",
    [
        ("def get_config(:\n", "config file {path}, line 1: "),
        ("x = 1\n", "config file {path} has no get_config() function"),
        ("import nothing_of_that_name\n", "config file {path} fails to load: ModuleNotFoundError: "),
    ],
)
def test_a_path_not_ending_in_py_keeps_the_one_line_errors(text, message, tmp_path):
    path = tmp_path / "mine.cfg"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(str(path))
    assert str(error.value).startswith(message.format(path=path)) and "\n" not in str(error.value)
    for missing, problem in ((tmp_path / "none.cfg", "does not exist"), (tmp_path, "is not a file")):
        with pytest.raises(ConfigError, match=f"^config file {missing} {problem}$"):
            load_config_file(missing)


def test_a_file_defining_a_dataclass_loads_as_python_runs_it(tmp_path):
    """dataclasses (and typing.get_type_hints, pickle) find a class's module in sys.modules: a file
    loaded without being put there failed with "'NoneType' object has no attribute '__dict__'"
    where its annotations are strings (`from __future__ import annotations`), as any module may have them."""
    helpers = (
        "from __future__ import annotations\nimport dataclasses, typing\n\n"
        "@dataclasses.dataclass\nclass Width:\n    d_model: int = 48\n\n"
        "assert typing.get_type_hints(Width) == {'d_model': int}\n"
    )
    config = tmp_path / "mine.py"
    config.write_text(
        helpers + "from jaxformer.configs.tiny import get_config as tiny\n\n"
        "def get_config():\n    c = tiny()\n    c.model.d_model = Width().d_model\n    return c\n"
    )
    assert load_config(str(config)).model.d_model == 48
    sweep = tmp_path / "sweep.py"
    sweep.write_text(helpers + "def get_sweep():\n    return {'wide': [f'model.d_model={Width().d_model}']}\n")
    assert load_sweep(str(sweep)) == {"wide": ["model.d_model=48"]}


def test_a_sweep_file_not_ending_in_py_is_read_as_python(tmp_path):
    path = tmp_path / "sweep.txt"
    path.write_text("def get_sweep():\n    return {'wide': ['model.d_ff=128'], 'base': []}\n")
    assert load_sweep(str(path)) == {"wide": ["model.d_ff=128"], "base": []}


def test_numpy_scalars_of_a_replaced_section_become_python_values(tmp_path, capsys):
    """Computed with numpy, they pass every check, but the first checkpoint writes the config as
    JSON (which has no numpy types) and a numpy-typed key refuses a Python value from the command line."""
    path = tiny_changed_by(
        tmp_path,
        "import ml_collections, numpy",
        "d = c.training.to_dict()",
        "d['num_train_steps'], d['keep_checkpoints'] = numpy.int64(20), numpy.int32(5)",
        "d['label_smoothing'] = numpy.float32(0.25)",
        "d['final_choice'], d['final_alphas'] = numpy.bool_(True), [numpy.float64(0.6), 1.0]",
        "c.training = ml_collections.ConfigDict(d)",
    )
    config = load_config_file(path)
    training = config.training
    assert (training.num_train_steps, training.label_smoothing, training.final_choice) == (20, 0.25, True)
    assert [type(training[key]) for key in ("num_train_steps", "label_smoothing", "final_choice")] == [int, float, bool]
    assert [type(alpha) for alpha in training.final_alphas] == [float, float]
    json.dumps(config.to_dict())  # as each checkpoint's metadata does
    experiment.validate(config)

    assert train.main(["--config", str(path), "--print_config", "--config.training.num_train_steps=30"]) == 0
    printed = capsys.readouterr().out
    assert "num_train_steps: 30" in printed and "numpy" not in printed


def test_a_library_callers_numpy_scalars_become_python_values():
    config = experiment.default_config()
    with config.unlocked():
        del config.training["seed"]
        config.training["seed"] = np.int64(3)
    plain = with_python_values(config)
    assert type(plain.training.seed) is int and plain.training.seed == 3
    assert type(config.training.seed) is np.int64  # the caller's config is left as it was


def test_a_checked_key_a_config_file_sets_with_numpy_scalars_goes_on_refusing_a_wrong_kind(tmp_path, capsys):
    """Made Python's through the key's own reference: a float or tuple key set after the file (a
    library caller's config) still refuses a bool or a non-tuple, where the plain value that replaced
    the reference took True as 1.0 and None."""
    path = tiny_changed_by(
        tmp_path,
        "import numpy",
        "c.optimizer.weight_decay = numpy.float64(0.3)",
        "c.training.final_alphas = (numpy.float64(1.0), 1.4)",
    )
    config = load_config_file(path)
    assert (config.optimizer.weight_decay, config.training.final_alphas) == (0.3, (1.0, 1.4))
    assert [type(value) for value in (config.optimizer.weight_decay, *config.training.final_alphas)] == [float] * 3
    for key, value in (
        ("optimizer.weight_decay", True),
        ("training.final_alphas", 1.4),
        ("training.final_alphas", None),
    ):
        section, leaf = key.split(".")
        with pytest.raises(ConfigError) as refused:
            config[section][leaf] = value
        assert str(refused.value).startswith(f"config {key}={value!r}: must be "), refused.value
    # The command line's own reading refuses them with or without the reference.
    arguments = ["--config", str(path), "--print_config", "--config.optimizer.weight_decay=True"]
    assert train.main(arguments) == EXIT_USER_ERROR
    assert one_error_line(capsys) == "error: --config.optimizer.weight_decay=True: must be a number"


def test_a_value_ml_collections_refuses_in_a_config_file_names_the_files_line(tmp_path, capsys):
    """A numpy.int64 set on an int key is refused by ml_collections itself as the file sets it
    (only a numpy float on a float key, a subclass of float, is taken and made Python's): the
    error names the file's line, as the project's own refusals do."""
    path = tiny_changed_by(tmp_path, "import numpy", "c.training.num_train_steps = numpy.int64(20)")
    assert train.main(["--config", str(path), "--print_config"]) == EXIT_USER_ERROR
    error = one_error_line(capsys)
    assert error.startswith(f"error: config file {path}, line 6: get_config() raised TypeError: "), error
    assert "num_train_steps" in error


class _StopBeforeTheRun(UserError):
    pass


@pytest.fixture
def runs(monkeypatch):
    """Each train_and_evaluate stops, a UserError, where it would first look at the data, and leaves
    in runs.configs the config it would have run; runs.conversions counts `with_python_values`."""
    runs = types.SimpleNamespace(configs=[], conversions=0)
    convert = config_file.with_python_values

    def counted(config):
        runs.conversions += 1
        return convert(config)

    def stop(config):
        runs.configs.append(config)
        raise _StopBeforeTheRun("stopped before the run")

    for module in (config_file, loop):  # load_config_file's and train_and_evaluate's
        monkeypatch.setattr(module, "with_python_values", counted)
    monkeypatch.setattr(loop, "with_absolute_paths", stop)
    return runs


def test_a_config_files_numpy_scalars_are_converted_once_on_the_command_path(tmp_path, capsys, runs):
    path = tiny_changed_by(
        tmp_path,
        "import ml_collections, numpy",
        "c.training = ml_collections.ConfigDict({**c.training.to_dict(), 'seed': numpy.int64(7)})",
    )
    assert train.main(["--config", str(path), "--workdir", str(tmp_path / "run")]) == EXIT_USER_ERROR
    assert one_error_line(capsys) == "error: stopped before the run"
    assert runs.conversions == 1  # as the file loaded, not again in train_and_evaluate
    [config] = runs.configs
    assert type(config.training.seed) is int and config.training.seed == 7


def test_train_and_evaluate_converts_a_library_callers_numpy_scalars(tmp_path, runs):
    config = load_config("tiny")
    with config.unlocked():
        del config.training["seed"]
        config.training["seed"] = np.int64(3)
    runs.conversions = 0  # load_config's
    with pytest.raises(_StopBeforeTheRun):
        loop.train_and_evaluate(config, tmp_path / "run")
    [ran] = runs.configs
    assert type(ran.training.seed) is int and ran.training.seed == 3 and runs.conversions == 1
    assert type(config.training.seed) is np.int64  # the caller's config is left as it was
