"""An export stopped midway: a signal during it (its staging folder removed, or, once the export is
in place, nothing ended early) and a killed export's staging folder, removed by the next export."""

import json
import os
import pathlib
import shutil
import signal
import tempfile

import pytest

from jaxformer import staged_folder, staging_leftovers
from jaxformer.commands import export
from jaxformer.export import exporter, output_folder
from jaxformer.training.signals import RaiseOnSignal, Stopped
from tests.child_processes import child_that_wrote
from tests.export.exports import FLAGS

pytestmark = pytest.mark.xdist_group("export")  # the export fixture of conftest.py, made once


# jaxformer-export as its console script runs it (launch.export), its program lowered again and again
# once the export is staged, until a signal stops it (one held inside jax's lowering is raised
# after it, as the exporter's own check before the move does): the test's SIGTERM comes while the
# export is staged, however late a loaded machine lets the test send it. (It waited for the staging
# folder, then signalled: the export, in place 1 s later, had at times finished first: exit 0.)
STAGED_EXPORT = """
import pathlib, sys, time
from jaxformer import staged_folder
from jaxformer.commands.launch import export
from jaxformer.export import exporter
real, staged = exporter.export_search, pathlib.Path(sys.argv[1])
def lower_until_stopped(*args, **kwargs):
    staged.write_text("staged")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        lowered = real(*args, **kwargs)
        staged_folder.raise_held_signal()
    return lowered
exporter.export_search = lower_until_stopped
sys.argv = ["jaxformer-export", *sys.argv[2:]]
sys.exit(export())
"""


def test_sigterm_during_an_export_removes_its_staging_directory(workdir, tmp_path):
    folder, staged = tmp_path / "out", tmp_path / "staged"
    output = folder / "export"
    flags = ["--workdir", str(workdir), "--output", str(output), "--platforms", "cpu", *FLAGS]
    with child_that_wrote(staged, STAGED_EXPORT, staged, *flags, timeout=300) as process:
        assert [name for name in os.listdir(folder) if name.endswith(".partial")]  # the signal comes mid-export
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=300)
    assert process.returncode == 143, stderr[-3000:]
    assert stderr.splitlines()[-1] == (
        f"error: {output}: stopped by SIGTERM; an export is put in place whole or not at all; exiting with 143"
    )
    assert os.listdir(folder) == []


def _stage(output):
    with staged_folder.staging_directory(output, output_folder.EXPORT):
        raise AssertionError("the export went on after the signal")


def _probe(output):
    staged_folder.check_placeable(output, output_folder.EXPORT)


@pytest.mark.parametrize("make", [_stage, _probe], ids=["staging", "probe"])
def test_a_signal_as_a_folder_is_made_beside_the_output_removes_it(make, tmp_path, monkeypatch):
    """SIGTERM right after mkdtemp made a folder beside --output, before it is returned: the staging
    directory, or the probe of whether that folder takes new entries (check_placeable, again once
    the export is staged; was: a `.jaxformer-probe-*` folder left there). Stopped, and removed."""
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp_then_signal(*args, **kwargs):
        path = real_mkdtemp(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_signal)
    with pytest.raises(Stopped), RaiseOnSignal():
        make(tmp_path / "export")
    assert os.listdir(tmp_path) == []


def test_a_signal_while_an_export_replaces_another_waits_for_both_renames(tmp_path, monkeypatch):
    output, staging = tmp_path / "export", tmp_path / ".export.x.partial"
    for directory, text in ((output, "old"), (staging, "new")):
        directory.mkdir()
        (directory / "config.json").write_text(text)
    real_replace = os.replace

    def replace_then_signal(source, destination):  # SIGTERM right after the first rename
        real_replace(source, destination)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(staged_folder.os, "replace", replace_then_signal)
    with pytest.raises(Stopped), RaiseOnSignal():
        staged_folder.move_into_place(staging, output, output_folder.EXPORT)
    assert (output / "config.json").read_text() == "new" and os.listdir(tmp_path) == ["export"]


def test_a_signal_once_the_export_is_in_place_ends_nothing_early(
    exported, workdir, tmp_path, capsys, monkeypatch, symbolic_shapes_unchecked
):
    """SIGTERM as the new export replaces the old one: it is in place and complete, so the command
    says so and exits with 0, not 143 after its success line."""
    output = tmp_path / "served"
    shutil.copytree(exported, output)
    real_replace = os.replace

    def replace_then_signal(source, destination):  # SIGTERM with each rename of the final move
        real_replace(source, destination)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(staged_folder.os, "replace", replace_then_signal)
    flags = ["--workdir", str(workdir), "--output", str(output), "--overwrite", "--platforms", "cpu", *FLAGS]
    assert export.main(flags) == 0
    captured = capsys.readouterr()
    assert f"to {output} for cpu" in captured.out
    assert captured.err.splitlines()[-1] == "SIGTERM came once the export was in place: it is complete; exiting with 0"
    assert json.loads((output / "config.json").read_text())["platforms"] == ["cpu"]
    assert os.listdir(tmp_path) == ["served"]


def test_a_killed_exports_staging_folder_is_removed_by_the_next_export_and_a_live_ones_kept(
    workdir, tmp_path, capsys, monkeypatch
):
    """A SIGKILLed export leaves its hidden `.<output>.*.partial` beside --output; the next export
    to that output removes it, with a warning, before its checks, but not the folder of an export
    still running (it holds a lock on its own), nor a killed export's to another output."""
    output = tmp_path / "export"
    dead, other = tmp_path / ".export.killed.partial", tmp_path / ".other.killed.partial"
    for folder in (dead, other):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")

    def no_work(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(exporter, "load_checkpoint", no_work)
    with staged_folder.staging_directory(output, output_folder.EXPORT) as live:
        output.mkdir()
        (output / "kept.txt").write_text("x")  # refused as not empty: the check after the clean-up
        assert export.main(["--workdir", str(workdir), "--output", str(output)]) == 2
        error = capsys.readouterr().err
        assert live.is_dir() and other.is_dir() and not dead.exists()
    assert f"removed {dead}, left by an export to {output} that was killed before it was in place" in error
    assert str(live) not in error and str(other) not in error
    assert error.endswith(
        f"error: --output {output}: holds something other than a jaxformer export (no readable "
        "config.json); not replacing it, even with --overwrite: give a new or empty folder\n"
    )


def test_the_old_export_a_killed_export_was_replacing_is_put_back_or_removed_by_the_next_export(
    workdir, tmp_path, capsys, monkeypatch
):
    """`--overwrite` moves the old export aside to a hidden `.<output>.*.old`, then renames the new
    one into place, then removes the old one. Killed (SIGKILL) between the renames it left no
    output, the old export hidden; killed as it removed the old one, that one beside the new. The
    next export puts the old one back where no output is (an export is in place whole or not at
    all), and removes it beside a new one, each with a warning; an export running now holds its
    own (was: both left as they were, unnamed, and an export without --overwrite went on)."""
    output = tmp_path / "export"
    between, after = tmp_path / ".export.between.old", tmp_path / ".export.after.old"
    between.mkdir()
    (between / "config.json").write_text("old")

    def no_work(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(exporter, "load_checkpoint", no_work)
    assert export.main(["--workdir", str(workdir), "--output", str(output)]) == 2
    error = capsys.readouterr().err
    assert (output / "config.json").read_text() == "old" and not between.exists()
    assert f"put back the previous export in {output} from {between}: the export replacing it was killed" in error
    assert error.endswith(  # the put-back stand-in's config.json is no export's, so not even --overwrite
        f"error: --output {output}: holds something other than a jaxformer export (no readable "
        "config.json); not replacing it, even with --overwrite: give a new or empty folder\n"
    )

    # Beside an export in place, the old one is removed; the one an export running now moved aside is held.
    after.mkdir()
    (after / "config.json").write_text("older")
    staging_leftovers.remove_dead(tmp_path, output, "export")
    assert not after.exists() and (output / "config.json").read_text() == "old"
    assert f"removed {after}, the previous export in {output}, left by an export killed once its own was in place" in (
        capsys.readouterr().err
    )
    real_replace, held = os.replace, []

    def replace_then_look(source, destination):  # as the next export would, once the old one is moved aside
        real_replace(source, destination)
        if str(destination).endswith(".old"):
            with staging_leftovers._of_a_dead_writer(pathlib.Path(destination)) as dead:
                held.append(not dead)

    monkeypatch.setattr(staged_folder.os, "replace", replace_then_look)
    with staged_folder.staging_directory(output, output_folder.EXPORT) as staging:
        (staging / "config.json").write_text("newest")
        staged_folder.move_into_place(staging, output, output_folder.EXPORT)
    assert held == [True] and (output / "config.json").read_text() == "newest"
    assert os.listdir(tmp_path) == ["export"]
