"""A preparation killed outright leaves tfds's incomplete copy of the dataset: the next preparation
removes it, with a warning, where no other preparation of the same data runs, and leaves a live
one's alone; where the file system takes no lock, it names the folder instead."""

import errno
import fcntl
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.utils import file_utils

from jaxformer.data import fingerprint, preparation_lock, sources
from jaxformer.data.parallel_text import DataError
from jaxformer.data.pipeline import read_records
from jaxformer.data.preparation_lock import PreparationLock
from jaxformer.data.sources import get_builder, load_split
from tests.data.test_sources import section


def parallel_files(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"sentence {i}\tSatz {i}\n" for i in range(50)))
    return section(
        "parallel_files", data_dir=str(tmp_path / "tfds"), files={"train": str(pairs)}, validation_holdout=10
    )


def killed_preparation(builder) -> pathlib.Path:
    """The folder tfds would be writing the copy in (named by tfds's own function), with a shard
    begun, as a preparation killed part-way leaves it."""
    folder = pathlib.Path(file_utils._get_incomplete_dir(builder.data_dir))
    folder.mkdir(parents=True)
    (folder / f"{builder.name}-train.array_record-00000-of-00001").write_bytes(b"\0" * 100)
    return folder


def incomplete_folders(builder):
    return sorted(path.name for path in pathlib.Path(builder.data_dir).parent.glob("incomplete.*"))


def test_a_killed_preparations_folder_is_removed_and_a_live_ones_left(tmp_path, caplog):
    data = parallel_files(tmp_path)
    builder = get_builder(data)
    live_lock = PreparationLock(
        pathlib.Path(builder.data_dir).parent, builder.name, own=True
    )  # another run's, meanwhile
    live_lock.acquire()
    stale, live = killed_preparation(builder), killed_preparation(builder)
    with caplog.at_level(logging.WARNING):
        assert len(load_split(builder, "train", ("en", "de"))) == 40
    assert incomplete_folders(builder) == sorted([stale.name, live.name])  # which is which cannot be told
    assert "incomplete." not in caplog.text

    live_lock.release()  # ... and once it is over (this one killed too), the next one removes both
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        source = load_split(get_builder(data), "train", ("en", "de"))
        assert len(list(read_records(source))) == 40
    assert incomplete_folders(builder) == []
    assert sorted(path.name for path in stale.parent.iterdir()) == ["1.0.0"]
    removed = [record.getMessage() for record in caplog.records if record.name == preparation_lock.__name__]
    assert removed == [
        f"removed {path}, left by a preparation of parallel_files that was killed before it was complete"
        for path in sorted([stale, live])
    ]


def test_a_killed_preparations_folder_is_removed_before_the_data_is_prepared_again(tmp_path, caplog):
    data = parallel_files(tmp_path)
    builder = get_builder(data)
    stale = killed_preparation(builder)
    with caplog.at_level(logging.WARNING):
        load_split(builder, "train", ("en", "de"))
    assert f"removed {stale}, left by a preparation of parallel_files that was killed" in caplog.text
    assert sorted(path.name for path in stale.parent.iterdir()) == ["1.0.0"]
    assert fingerprint.read_record(builder.data_path)[1] is None  # complete, its record written


def test_without_locks_a_killed_preparations_folder_is_named_not_removed(tmp_path, caplog, monkeypatch):
    def no_locks(descriptor, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(preparation_lock.fcntl, "flock", no_locks)
    data = parallel_files(tmp_path)
    builder = get_builder(data)
    stale = killed_preparation(builder)
    with caplog.at_level(logging.WARNING):
        assert len(load_split(builder, "train", ("en", "de"))) == 40
    assert stale.is_dir()
    assert [record.getMessage() for record in caplog.records if record.name == preparation_lock.__name__] == [
        f"{stale} may be left by a preparation of parallel_files that was killed; cannot lock {stale.parent} "
        f"({os.strerror(errno.ENOLCK)}) to tell whether another process is preparing it: delete it if none is"
    ]


class SmallTranslate(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A tfds catalogue dataset's builder (a WMT's features), in a data_dir other programs may use."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(languages=("de", "en")))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(5):
            yield i, {"de": f"Satz {i}", "en": f"sentence {i}"}


def test_a_catalogue_datasets_folder_is_named_not_removed(tmp_path, caplog):
    """Other programs may prepare a tfds catalogue dataset in the same data_dir, without the lock."""
    builder = SmallTranslate(data_dir=str(tmp_path / "tfds"), file_format="array_record")
    builder.download_and_prepare()
    stale = killed_preparation(builder)
    with caplog.at_level(logging.WARNING):
        sources.prepare(builder)
    assert stale.is_dir()
    assert [record.getMessage() for record in caplog.records if record.name == preparation_lock.__name__] == [
        f"{stale} may be left by a preparation of small_translate that was killed; no jaxformer run is preparing "
        "it now, but another program may be: delete it if none is"
    ]


def test_a_failed_preparation_beside_a_live_one_leaves_its_folder(tmp_path):
    """A failed preparation removes the folders it left empty, but not the config's folder that
    another preparation holds: that one's lock stays on the folder it writes in."""
    data = parallel_files(tmp_path)
    pathlib.Path(data.files["train"]).write_text("no tab\n")
    builder = get_builder(data)
    config_folder = pathlib.Path(builder.data_dir).parent
    live_lock = PreparationLock(config_folder, builder.name, own=True)
    live_lock.acquire()
    with pytest.raises(DataError, match="line 1 has 0 tabs"):
        load_split(get_builder(data), "train", ("en", "de"))
    assert config_folder.is_dir()
    live_lock.release()
    with pytest.raises(DataError, match="line 1 has 0 tabs"):
        load_split(get_builder(data), "train", ("en", "de"))
    assert list((tmp_path / "tfds").iterdir()) == []  # made by the first one, which could not tell it was empty


KILLED_WHILE_WRITING = textwrap.dedent(
    """
    import pathlib, sys, time
    from jaxformer.data import parallel_files
    from jaxformer.data.sources import get_builder, load_split
    from tests.data.test_preparation_lock import parallel_files as data_section

    real = parallel_files.ParallelFiles._generate_examples

    def stalls(self, split_pairs):
        for i, example in enumerate(real(self, split_pairs)):
            if i == 20:  # 20 of a split's pairs handed to tfds's writer: killed here
                pathlib.Path(sys.argv[2]).write_text("writing")
                time.sleep(600)
            yield example

    parallel_files.ParallelFiles._generate_examples = stalls
    load_split(get_builder(data_section(pathlib.Path(sys.argv[1]))), "train", ("en", "de"))
    """
)


@pytest.mark.slow
def test_a_preparation_killed_while_writing_is_prepared_again_the_same(tmp_path, caplog):
    """kill -9 while tfds writes the copy: the next run removes the folder and prepares the same files
    as a preparation never killed, byte for byte."""
    killed_dir = tmp_path / "killed"
    killed_dir.mkdir()
    marker = tmp_path / "marker"
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_WHILE_WRITING, str(killed_dir), str(marker)],
        env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[2])},
    )
    try:
        for _ in range(1200):
            if marker.exists() or process.poll() is not None:
                break
            time.sleep(0.1)
        assert marker.exists(), "the preparation did not reach its write"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    builder = get_builder(parallel_files(killed_dir))
    left = incomplete_folders(builder)
    assert len(left) == 1
    with caplog.at_level(logging.WARNING):
        load_split(builder, "train", ("en", "de"))
    assert f"removed {pathlib.Path(builder.data_dir).parent / left[0]}" in caplog.text
    assert incomplete_folders(builder) == []

    recovered, fingerprint_then = files_of(builder), builder.fingerprint
    shutil.rmtree(tmp_path / "killed" / "tfds")  # and prepared again, never killed
    reference = get_builder(parallel_files(killed_dir))
    load_split(reference, "train", ("en", "de"))
    assert reference.fingerprint == fingerprint_then
    assert recovered == files_of(reference)
    assert any(name.endswith("array_record-00000-of-00001") for name in recovered)


def files_of(builder):
    """The prepared files' bytes, by name."""
    return {path.name: path.read_bytes() for path in sorted(pathlib.Path(builder.data_dir).iterdir()) if path.is_file()}


def test_a_held_lock_is_alone_meanwhile_only_where_no_other_holds_it_and_stays_held(tmp_path):
    folder = tmp_path / "config"
    ours, other = PreparationLock(folder, "parallel_files", own=True), PreparationLock(folder, "parallel_files", True)
    ours.acquire()
    other.acquire()  # another run's, reusing or preparing the same data
    try:
        with ours.alone_meanwhile() as alone:
            assert not alone
    finally:
        other.release()
    third = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # a process that comes to the data now
    try:
        assert_held_shared(third)  # ... though the conversion that failed let it go
        with ours.alone_meanwhile() as alone:
            assert alone
            with pytest.raises(BlockingIOError):
                fcntl.flock(third, fcntl.LOCK_SH | fcntl.LOCK_NB)
        assert_held_shared(third)
    finally:
        os.close(third)
        ours.release()


def assert_held_shared(descriptor: int) -> None:
    """That the lock on the folder open as `descriptor` is held shared by another: `descriptor`'s
    exclusive lock refused, its shared one granted (then let go)."""
    with pytest.raises(BlockingIOError):
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    fcntl.flock(descriptor, fcntl.LOCK_UN)
