"""A damaged prepared dataset (a file cut short or with zeroed bytes, a deleted dataset_info.json)
is one line naming the file and the folder to remove, found when the split is opened (or, for
bytes damaged mid-file, read); jaxformer's own builders prepare such a copy again, with a warning."""

import logging
import pathlib
import shutil
import types

import pytest
import tensorflow_datasets as tfds

from jaxformer.data import fingerprint
from jaxformer.data.parallel_text import DataError
from jaxformer.data.pipeline import read_records
from jaxformer.data.prepared_split import ReadableSplit
from jaxformer.data.sources import get_builder, load_split
from tests.data.test_sources import section

PAIRS = 20_000  # a train file of a few hundred KB: array_record files under 64 KB are refused outright


class TinyTranslate(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A tfds catalogue-like translation builder (WMT's features), prepared in a second."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(languages=("de", "en")))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(PAIRS), "validation": self._generate_examples(10)}

    def _generate_examples(self, count):
        for i in range(count):
            yield i, {"de": f"Satz {i} mit {i * 7919 % 10007} Worten", "en": f"sentence {i} of {i * 104729 % 7} words"}


# One worker runs this file: its module fixture is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("damaged-data")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    TinyTranslate(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return data_dir


@pytest.fixture
def builder(prepared, tmp_path):
    shutil.copytree(prepared, tmp_path / "tfds")
    return TinyTranslate(data_dir=str(tmp_path / "tfds"), file_format="array_record")


def train_file(builder):
    return pathlib.Path(builder.data_dir) / "tiny_translate-train.array_record-00000-of-00001"


def expected_message(builder, problem):
    return (
        f"the prepared tiny_translate data in {builder.data_dir} is damaged: {problem}; "
        f"remove {builder.data_dir} so that it is prepared again"
    )


def test_a_sound_copy_is_read(builder):
    source = load_split(builder, "train", ("de", "en"))
    assert len(source) == PAIRS and len(list(read_records(source))) == PAIRS
    assert source[3]["en"].startswith(b"sentence ")


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (
            lambda path: path.write_bytes(path.read_bytes()[:-1000]),
            r"cannot be read \(Corrupted Riegeli/records file: ",
        ),
        (lambda path: path.write_bytes(path.read_bytes()[:30_000]), r"cannot be read \(ArrayRecord file should be at "),
        (lambda path: path.unlink(), "is missing"),
    ],
)
def test_a_damaged_file_is_refused_when_the_split_is_opened(builder, damage, problem):
    path = train_file(builder)
    damage(path)
    with pytest.raises(DataError) as raised:
        load_split(builder, "train", ("de", "en"))
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"the prepared tiny_translate data in {builder.data_dir} is")
    assert f"damaged: {path} " in message and problem.replace("\\", "") in message
    assert message.endswith(f"; remove {builder.data_dir} so that it is prepared again")
    assert pathlib.Path(builder.data_dir).is_dir()  # a catalogue dataset's hours of preparation: the user's to remove


def test_a_deleted_dataset_info_is_refused_when_the_split_is_opened(builder):
    info = pathlib.Path(builder.data_dir) / "dataset_info.json"
    info.unlink()
    again = TinyTranslate(data_dir=str(pathlib.Path(builder.data_dir).parents[1]), file_format="array_record")
    with pytest.raises(DataError) as raised:
        load_split(again, "train", ("de", "en"))
    assert str(raised.value) == expected_message(again, f"{info} is missing")


def test_bytes_zeroed_mid_file_are_refused_when_read(builder):
    path = train_file(builder)
    damaged = bytearray(path.read_bytes())
    middle = len(damaged) // 2
    damaged[middle : middle + 100] = bytes(100)
    path.write_bytes(bytes(damaged))
    source = load_split(builder, "train", ("de", "en"))  # its first and last records are sound
    with pytest.raises(DataError) as raised:
        list(read_records(source))
    assert str(raised.value).startswith(
        f"the prepared tiny_translate data in {builder.data_dir} is damaged: {path} cannot be read "
        "(Corrupted Riegeli/records file: "
    )
    assert str(raised.value).endswith(f"remove {builder.data_dir} so that it is prepared again")
    with pytest.raises(DataError, match=f"damaged: {path} cannot be read"):  # one at a time, around the damage
        [source[i] for i in range(len(source) * 2 // 5, len(source) * 3 // 5)]


class ShardedSplit:
    """A split of three files of 10 records each, the second one damaged (what array_record raises)."""

    def __len__(self):
        return 30

    def __getitem__(self, key):
        if 10 <= key < 20:
            raise RuntimeError("Corrupted Riegeli/records file: chunk header hash mismatch")
        return {"en": b"a", "de": b"b"}

    def __getitems__(self, keys):
        return [self[key] for key in keys]


def test_the_file_of_a_record_that_cannot_be_read_is_named(tmp_path):
    files = [tmp_path / f"tiny-train.array_record-0000{i}-of-00003" for i in range(3)]
    instructions = [types.SimpleNamespace(filename=str(path), skip=0, take=10, examples_in_shard=10) for path in files]
    splits = {"train": types.SimpleNamespace(file_instructions=instructions)}
    builder = types.SimpleNamespace(name="tiny", data_dir=str(tmp_path), info=types.SimpleNamespace(splits=splits))
    source = ReadableSplit(ShardedSplit(), builder, "train")
    problem = f"{files[1]} cannot be read (Corrupted Riegeli/records file: chunk header hash mismatch)"
    message = (
        f"the prepared tiny data in {tmp_path} is damaged: {problem}; remove {tmp_path} so that it is prepared again"
    )
    for read in (lambda: source[14], lambda: source.__getitems__([3, 27, 12, 5]), lambda: list(read_records(source))):
        with pytest.raises(DataError) as raised:
            read()
        assert str(raised.value) == message
    assert source.__getitems__([0, 29]) == [{"en": b"a", "de": b"b"}] * 2


def test_jaxformers_own_builders_prepare_a_copy_with_zeroed_bytes_again(tmp_path, caplog):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"sentence {i} of a few words\tSatz {i} aus ein paar Worten\n" for i in range(2000)))
    data = section("parallel_files", data_dir=str(tmp_path / "tfds"), files={"train": str(pairs)})
    builder = get_builder(data)
    load_split(builder, "train", ("en", "de"))
    path = pathlib.Path(builder.data_dir) / "parallel_files-train.array_record-00000-of-00001"
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2 : len(damaged) // 2 + 100] = bytes(100)  # the same size: the record's sizes agree
    path.write_bytes(bytes(damaged))
    with caplog.at_level(logging.WARNING):
        source = load_split(get_builder(data), "train", ("en", "de"))
        assert len(list(read_records(source))) == len(source) == 1000  # and 1,000 held out for validation
    assert f"{path} has other bytes than recorded (sha256 " in caplog.text and "preparing it again" in caplog.text


def test_data_prepared_by_another_process_meanwhile_is_used(tmp_path, monkeypatch, caplog):
    from jaxformer.data import parallel_files

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"sentence {i}\tSatz {i}\n" for i in range(50)))
    data = section(
        "parallel_files", data_dir=str(tmp_path / "tfds"), files={"train": str(pairs)}, validation_holdout=10
    )
    real = parallel_files.ParallelFiles._generate_examples
    other_run = []

    def prepared_elsewhere_meanwhile(self, split_pairs):  # the other run finishes first
        if not other_run:
            other_run.append(get_builder(data))
            other_run[0].download_and_prepare()
        yield from real(self, split_pairs)

    monkeypatch.setattr(parallel_files.ParallelFiles, "_generate_examples", prepared_elsewhere_meanwhile)
    builder = get_builder(data)
    with caplog.at_level(logging.INFO):
        source = load_split(builder, "train", ("en", "de"))
    assert len(list(read_records(source))) == 40  # 10 held out for validation
    assert f"another process prepared {builder.data_dir} meanwhile; using its copy" in caplog.text
    assert sorted(path.name for path in pathlib.Path(builder.data_dir).parent.iterdir()) == ["1.0.0"]

    other_run.clear()  # and one that is not usable: run again
    shutil.rmtree(builder.data_dir)
    monkeypatch.setattr(fingerprint, "write_record", lambda *args: None)  # the other run's copy: no record
    with pytest.raises(DataError, match=r"^another process prepared \S+ while this one did, and it is not usable \("):
        load_split(get_builder(data), "train", ("en", "de"))
