"""jaxformer installed from its wheel, as a user takes it: the wheel holds the configs and the
vendored Multi30k corpus, and in a fresh venv, from a folder outside the source tree,
`jaxformer-train --config tiny` -> the translate command its summary prints -> `jaxformer-export`
all work, with the installed package (tests/install_env.py)."""

import gzip
import pathlib
import shlex
import zipfile

import pytest

from tests.install_env import ROOT

pytestmark = pytest.mark.xdist_group("install")

SENTENCES = ["A man is riding a bicycle.", "Two dogs are playing in the snow."]
SCRIPTS = ("jaxformer-train", "jaxformer-translate", "jaxformer-evaluate", "jaxformer-average-checkpoints")


def entry_points(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [name for name in archive.namelist() if name.endswith(".dist-info/entry_points.txt")]
        return archive.read(name).decode()


def test_wheel_holds_the_configs_and_the_corpus(install_build):
    shipped = {
        path.relative_to(ROOT).as_posix()
        for folder in ("jaxformer/configs", "jaxformer/data/raw/multi30k")
        for path in (ROOT / folder).iterdir()
        if path.is_file() and path.suffix != ".pyc"
    }
    assert {"jaxformer/configs/tiny.py", "jaxformer/data/raw/multi30k/train.en.gz"} <= shipped
    with zipfile.ZipFile(install_build.wheel) as archive:
        names = set(archive.namelist())
        assert shipped <= names, sorted(shipped - names)
        for name in shipped:  # the same bytes as the checkout's
            assert archive.read(name) == (ROOT / name).read_bytes(), name
        assert gzip.decompress(archive.read("jaxformer/data/raw/multi30k/train.en.gz")).count(b"\n") == 29000
    assert not any(name.startswith(("tests/", "configs/", "notebooks/", "benchmarks/")) for name in names)
    for script in SCRIPTS:
        assert f"{script} = jaxformer.commands." in entry_points(install_build.wheel)


def test_the_installed_package_is_the_wheel(installed_venv):
    result = installed_venv.run(
        [str(installed_venv.python), "-c", "import jaxformer; print(jaxformer.__file__)"], cwd=installed_venv.path
    )
    assert result.returncode == 0, result.stderr
    installed = pathlib.Path(result.stdout.strip())
    assert installed.is_relative_to(installed_venv.path) and not installed.is_relative_to(ROOT), installed
    for script in SCRIPTS:
        assert (installed_venv.bin / script).is_file(), script


# Session-scoped, not module-scoped: with pytest-xdist a worker may run other modules' tests between
# these, and a module fixture would then train again.
@pytest.fixture(scope="session")
def user_folder(tmp_path_factory):
    """Where the user runs the commands: outside the source tree."""
    folder = tmp_path_factory.mktemp("user")
    assert not folder.resolve().is_relative_to(ROOT.resolve())
    return folder


@pytest.fixture(scope="session")
def trained(installed_venv, user_folder):
    """A tiny run trained by the installed `jaxformer-train`; (workdir, the log)."""
    workdir = user_folder / "run"
    command = [
        "jaxformer-train",
        "--config",
        "tiny",
        "--workdir",
        "run",
        f"--config.data.data_dir={user_folder / 'tfds'}",
    ]
    command += ["--config.training.num_train_steps=4", "--config.training.eval_every_steps=4"]
    command += ["--config.training.checkpoint_every_steps=4", "--config.training.bleu_every_steps=4"]
    command += ["--config.training.bleu_examples=4", "--config.decoding.method=greedy"]
    result = installed_venv.run(command, cwd=user_folder)
    assert result.returncode == 0, result.stderr[-4000:]
    return workdir, result.stderr


def test_train_then_translate_with_the_command_it_prints(installed_venv, user_folder, trained):
    workdir, log = trained
    assert "run finished: 4 steps (0 -> 4 of 4)" in log
    assert (workdir / "checkpoints" / "4").is_dir() and (workdir / "best" / "4").is_dir()
    (translate,) = [line.split("translate: ", 1)[1] for line in log.splitlines() if "translate: " in line]
    assert shlex.split(translate)[:3] == ["jaxformer-translate", "--workdir", str(workdir.absolute())]

    (user_folder / "input.en").write_text("".join(sentence + "\n" for sentence in SENTENCES))
    result = installed_venv.run(["bash", "-c", translate], cwd=user_folder)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (user_folder / "output.de").read_text().count("\n") == len(SENTENCES)  # one line per sentence


def test_export_the_trained_run(installed_venv, install_build, user_folder, trained):
    if "jaxformer-export = " not in entry_points(install_build.wheel):
        pytest.skip("this wheel has no jaxformer-export command yet")
    workdir, _ = trained
    output = user_folder / "exported"
    result = installed_venv.run(["jaxformer-export", "--workdir", str(workdir), "--output", str(output)], user_folder)
    assert result.returncode == 0, result.stderr[-4000:]
    assert output.is_dir() and any(path.is_file() for path in output.rglob("*")), "jaxformer-export wrote nothing"
