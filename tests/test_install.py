"""jaxformer installed from its wheel, as a user takes it: the wheel holds the configs and the
vendored Multi30k corpus, and in a fresh venv, from a folder outside the source tree,
`jaxformer-train --config tiny` -> the translate command its summary prints -> `jaxformer-export`
all work, with the installed package (tests/install_env.py)."""

import gzip
import pathlib
import re
import shlex
import tarfile
import zipfile

import pytest

from tests.install_env import ROOT, build_sdist, tracked_files

pytestmark = pytest.mark.xdist_group("install")

SENTENCES = ["A man is riding a bicycle.", "Two dogs are playing in the snow."]
SCRIPTS = (  # the README's list ("Installing jaxformer as a package")
    "jaxformer-train",
    "jaxformer-translate",
    "jaxformer-evaluate",
    "jaxformer-average-checkpoints",
    "jaxformer-export",
    "jaxformer-generate",
    "jaxformer-convert",
    "jaxformer-sweep",
)


def entry_points(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [name for name in archive.namelist() if name.endswith(".dist-info/entry_points.txt")]
        return archive.read(name).decode()


def test_wheel_holds_every_file_of_the_package_and_nothing_else(install_build):
    """Every file git tracks under jaxformer/ (modules, configs, sweeps, the vendored corpus and its
    README), byte for byte: a module or data file that pyproject.toml's package finding or
    package-data left out would fail only where a command imports or reads it."""
    shipped = set(tracked_files("jaxformer"))
    assert {"jaxformer/configs/tiny.py", "jaxformer/configs/sweeps/multi30k_hour.py"} <= shipped
    assert {"jaxformer/data/raw/multi30k/train.en.gz", "jaxformer/data/raw/multi30k/README.md"} <= shipped
    assert "jaxformer/export/standalone.py" in shipped  # the loader an export copies beside serve.py
    with zipfile.ZipFile(install_build.wheel) as archive:
        names = set(archive.namelist())
        assert shipped <= names, sorted(shipped - names)
        for name in shipped:  # the same bytes as the checkout's
            assert archive.read(name) == (ROOT / name).read_bytes(), name
        assert gzip.decompress(archive.read("jaxformer/data/raw/multi30k/train.en.gz")).count(b"\n") == 29000
    # Nothing beside the package and its metadata: no tests/, notebooks/, benchmarks/, nor a clone's train.py.
    outside = sorted(name for name in names if not re.match(r"(jaxformer|jaxformer-[^/]+\.dist-info)/", name))
    assert outside == [], outside
    scripts = [line.split(" = ")[0] for line in entry_points(install_build.wheel).splitlines() if " = " in line]
    assert sorted(scripts) == sorted(SCRIPTS)
    assert all(f"{script} = jaxformer.commands." in entry_points(install_build.wheel) for script in SCRIPTS)
    readme = (ROOT / "README.md").read_text()
    listed = readme.split("### Installing jaxformer as a package", 1)[1].split("The configs and", 1)[0]
    assert [name.strip("`,. \n") for name in listed.split("console scripts:", 1)[1].split()] == list(SCRIPTS)


def test_the_wheels_version_is_jaxformer_version(install_build):
    """pyproject.toml's version (pip's, the wheel's name) and jaxformer.__version__ (what the notebook
    prints) are written apart: a release that bumps one must bump the other."""
    import jaxformer

    with zipfile.ZipFile(install_build.wheel) as archive:
        (name,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        (version,) = re.findall(r"^Version: (\S+)$", archive.read(name).decode(), flags=re.MULTILINE)
    assert version == jaxformer.__version__, (
        f"pyproject.toml says {version}, jaxformer/__init__.py {jaxformer.__version__}"
    )


def test_the_sdist_holds_the_package_and_not_the_test_suite(tmp_path):
    sdist = build_sdist(tmp_path)
    with tarfile.open(sdist) as archive:
        names = [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]
    assert {"pyproject.toml", "README.md", "jaxformer/configs/multi30k.py", "jaxformer/export/serve_streams.py"} <= set(
        names
    )
    assert "jaxformer/data/raw/multi30k/train.en.gz" in names
    assert not [name for name in names if name.startswith(("tests/", "benchmarks/", "notebooks/", "runs/"))]


@pytest.mark.slow  # a fresh venv, then train -> translate -> export through the installed scripts (-m slow)
def test_installed_commands_from_outside_the_source_tree(installed_venv, tmp_path):
    """One test, not one per command: with pytest-xdist the steps could land on different workers."""
    result = installed_venv.run(
        [str(installed_venv.python), "-c", "import jaxformer; print(jaxformer.__file__)"], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    installed = pathlib.Path(result.stdout.strip())
    assert installed.is_relative_to(installed_venv.path) and not installed.is_relative_to(ROOT), installed
    assert not tmp_path.resolve().is_relative_to(ROOT.resolve())
    for script in SCRIPTS:
        assert (installed_venv.bin / script).is_file(), script

    # Train: the config by name, the corpus vendored in the wheel, the data prepared afresh.
    train = ["jaxformer-train", "--config", "tiny", "--workdir", "run", f"--config.data.data_dir={tmp_path / 'tfds'}"]
    train += ["--config.training.num_train_steps=4", "--config.training.eval_every_steps=4"]
    train += ["--config.training.checkpoint_every_steps=4", "--config.training.bleu_every_steps=4"]
    train += ["--config.training.bleu_examples=4", "--config.decoding.method=greedy"]
    result = installed_venv.run(train, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    workdir = tmp_path / "run"
    assert "run finished: 4 steps (0 -> 4 of 4)" in result.stderr
    assert str(installed.parent / "data" / "raw" / "multi30k") in result.stderr  # the wheel's copy of the corpus
    assert (workdir / "checkpoints" / "4").is_dir() and (workdir / "best" / "4").is_dir()

    # Translate: the command the summary printed, as printed.
    (translate,) = [line.split("translate: ", 1)[1] for line in result.stderr.splitlines() if "translate: " in line]
    assert shlex.split(translate)[:3] == ["jaxformer-translate", "--workdir", str(workdir)]
    (tmp_path / "input.en").write_text("".join(sentence + "\n" for sentence in SENTENCES))
    result = installed_venv.run(["bash", "-c", translate], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "output.de").read_text().count("\n") == len(SENTENCES)  # one line per sentence

    # Export.
    export = ["jaxformer-export", "--workdir", "run", "--checkpoint", "best", "--output", "exported"]
    result = installed_venv.run(export, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    exported = [path for path in (tmp_path / "exported").rglob("*") if path.is_file()]
    assert exported and all(path.stat().st_size > 0 for path in exported), exported
