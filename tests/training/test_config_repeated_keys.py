"""A config key given twice in one list of overrides is one error naming the key and both values
(the last used to win unseen); a sweep variant's list still overrides the command line's."""

import pytest

from jaxformer.commands import sweep as sweep_command
from jaxformer.commands import train
from jaxformer.model.config import ConfigError
from jaxformer.training.config_file import refuse_repeated_keys, split_overrides
from jaxformer.training.sweep import make_variants


@pytest.mark.parametrize(
    "arguments",
    [
        ["--config.data.files.train=a.tsv", "--config.data.files.train=b.tsv"],
        ["--config.data.files.train", "a.tsv", "--workdir", "w", "--config.data.files.train=b.tsv"],
    ],
)
def test_split_overrides_refuses_a_key_given_twice(arguments):
    with pytest.raises(ConfigError) as raised:
        split_overrides(arguments)
    assert str(raised.value) == "config key 'data.files.train' is given twice, as 'a.tsv' and as 'b.tsv': keep one"


def test_the_same_value_twice_is_refused_too_and_other_keys_pass():
    with pytest.raises(ConfigError, match="'training.seed' is given twice, as '1' and as '1'"):
        split_overrides(["--config.training.seed=1", "--config.training.seed=1"])
    overrides, rest = split_overrides(["--config.training.seed=1", "--workdir", "w", "--config.data.seed=2"])
    assert overrides == [("training.seed", "1"), ("data.seed", "2")] and rest == ["--workdir", "w"]
    with pytest.raises(ConfigError, match=r"^variant 'x': config key 'a.b' is given twice, as '1' and as '2'"):
        refuse_repeated_keys([("a.b", "1"), ("a.b", "2")], "variant 'x': ")


def test_train_refuses_a_key_given_twice_before_any_work(tmp_path, capsys):
    workdir = tmp_path / "run"
    arguments = ["--config", "tiny", "--workdir", str(workdir)]
    code = train.main([*arguments, "--config.training.num_train_steps=5", "--config.training.num_train_steps=50"])
    error = capsys.readouterr().err
    assert code == 2 and error == (
        "error: config key 'training.num_train_steps' is given twice, as '5' and as '50': keep one\n"
    )
    assert not workdir.exists()


def test_a_sweeps_shared_flags_are_one_list(tmp_path, capsys):
    sweep_file = tmp_path / "sweep.py"
    sweep_file.write_text("def get_sweep():\n    return {'baseline': []}\n")
    workdir = tmp_path / "sweep"
    flags = ["--config.training.final_choice=True", "--config.training.seed=1", "--config.training.seed=2"]
    code = sweep_command.main(["--config", "tiny", "--sweep", str(sweep_file), "--workdir", str(workdir), *flags])
    error = capsys.readouterr().err
    assert code == 2 and error == "error: config key 'training.seed' is given twice, as '1' and as '2': keep one\n"
    assert not workdir.exists()


def test_a_sweep_variant_still_overrides_a_shared_flag():
    flags = [
        "--config.training.final_choice=True",
        "--config.training.average_last=2",
        "--config.model.dropout_rate=0.2",
    ]
    shared, _ = split_overrides(flags)
    (variant,) = make_variants("tiny", {"drop3": ["model.dropout_rate=0.3"]}, shared)
    assert variant.config.model.dropout_rate == 0.3
