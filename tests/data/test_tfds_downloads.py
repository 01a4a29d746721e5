"""tensorflow-datasets' catalogue builders (WMT) without network: its errors about the files it
downloads, extracts or is given by hand are one line naming the file and what to do, and a run
that meets one leaves no workdir behind. tfds's downloader is replaced: nothing goes on the network."""

import contextlib
import gzip
import importlib.util
import pathlib
import re

import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums, downloader, extractor
from tensorflow_datasets.core.download import util as download_util

from jaxformer.data import preparation_attempt, sources
from jaxformer.data.parallel_text import DataError
from jaxformer.data.sources import get_builder, load_split, prepare
from tests.data.test_sources import section

WMT14 = pathlib.Path(tfds.__file__).parent / "url_checksums" / "wmt14_translate.txt"


def expected_files():
    """url -> UrlInfo of what tfds expects for wmt14_translate."""
    return checksums.load_url_infos(WMT14)


@pytest.fixture
def fake_network(monkeypatch):
    """tfds's downloads, answered by `serve(url, folder) -> DownloadResult` (default: none allowed)."""
    served = {"serve": None}

    def download(self, url, destination, verify=True):
        if served["serve"] is None:
            pytest.fail(f"tfds tried to download {url}")
        return served["serve"](url, pathlib.Path(destination))

    monkeypatch.setattr(downloader._Downloader, "_sync_download", download)
    monkeypatch.setattr(preparation_attempt, "unreachable", lambda url: None)  # its probe of the host
    monkeypatch.setattr(sources, "tensorflow_installed", lambda: True)  # refused before anything otherwise
    return served


def place_by_hand(data_dir, content=b"not the corpus"):
    manual = data_dir / "downloads" / "manual"
    manual.mkdir(parents=True)
    for info in expected_files().values():
        (manual / info.filename).write_bytes(content)
    return manual


def test_a_file_placed_by_hand_with_another_checksum_is_one_line(tmp_path, fake_network):
    manual = place_by_hand(tmp_path)  # every file: tfds reads them from there, and downloads nothing
    builder = get_builder(section("wmt14_translate/de-en", data_dir=str(tmp_path)))
    with pytest.raises(DataError) as raised:
        load_split(builder, "train", ("de", "en"))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"preparing wmt14_translate failed: {manual}/")
    assert "is not the file tfds expects from http" in message and "(14 bytes, sha256 " in message
    assert message.endswith("replace it with that file, or remove it to download it")
    assert not builder.data_path.exists()


def _served(url, folder, content, url_info=None):
    """A DownloadResult of `content` as the file of `url`; `url_info`: what tfds is told it is."""
    path = folder / url.rsplit("/", 1)[1]
    path.write_bytes(content)
    return downloader.DownloadResult(path=path, url_info=url_info or checksums.compute_url_info(path))


def _prepare(data_dir, name="wmt14_translate/de-en"):
    load_split(get_builder(section(name, data_dir=str(data_dir))), "train", tuple(name[-5:].split("-")))


def test_a_downloaded_file_with_another_checksum_is_one_line(tmp_path, fake_network):
    fake_network["serve"] = lambda url, folder: _served(url, folder, b"an error page")
    with pytest.raises(DataError) as raised:
        _prepare(tmp_path)
    message = str(raised.value)
    assert re.fullmatch(
        r"preparing wmt14_translate failed: \S+/downloads/\S+, downloaded from http\S+, is not the file tfds "
        r"expects \(13 bytes, sha256 [0-9a-f]{12}, not [^,]+, sha256 [0-9a-f]{12}\): remove it and run again",
        message,
    ), message


def test_a_downloaded_archive_that_cannot_be_extracted_is_one_line(tmp_path, fake_network, monkeypatch):
    # What tfds takes for the expected bytes (a cached download), cut short.
    cut_short = gzip.compress(b"x" * 1000)[:20]
    fake_network["serve"] = lambda url, folder: _served(url, folder, cut_short, expected_files()[url])

    @contextlib.contextmanager
    def open_without_tensorflow(path_or_file):  # tfds opens archives with TensorFlow, not installed here
        with open(path_or_file, "rb") as handle:
            yield handle

    monkeypatch.setattr(extractor, "_open_or_pass", open_without_tensorflow)
    with pytest.raises(DataError) as raised:
        _prepare(tmp_path)
    assert re.fullmatch(
        r"preparing wmt14_translate failed: \S+/downloads/\S+\.tgz cannot be extracted \(.+\): "
        r"remove it and run again to download it again",
        str(raised.value),
    ), raised.value


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None, reason="TensorFlow is installed")
def test_extracting_without_tensorflow_is_one_line(tmp_path, fake_network):  # (if the check before missed it)
    fake_network["serve"] = lambda url, folder: _served(url, folder, b"archive", expected_files()[url])
    with pytest.raises(DataError, match=r"extracts downloaded archives with TensorFlow: it is not installed: pip"):
        _prepare(tmp_path)


def test_a_refused_download_and_files_needed_by_hand_are_one_line(tmp_path, fake_network, monkeypatch):
    def refused(url, folder):
        raise download_util.DownloadError(f"Failed to get url {url}. HTTP code: 503.")

    fake_network["serve"] = refused
    with pytest.raises(DataError, match=r"HTTP code: 503\.; without network, place the files in \S+/downloads/manual"):
        _prepare(tmp_path)

    def fetched(self, urls):  # every corpus but those given by hand only (cs-en's CzEng)
        if isinstance(urls, dict):
            return {key: fetched(self, value) for key, value in urls.items()}
        return [fetched(self, url) for url in urls] if isinstance(urls, list) else str(tmp_path / "extracted")

    monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract", fetched)
    manual = tmp_path / "c.s" / "downloads" / "manual"  # a dot in the path
    with pytest.raises(DataError) as raised:
        _prepare(tmp_path / "c.s", "wmt14_translate/cs-en")
    assert str(raised.value) == (
        f"preparing wmt14_translate failed: wmt14_translate/cs-en needs files placed by hand: "
        f"Manual directory {manual} does not exist or is empty"
    )
    manual.mkdir(parents=True)
    (manual / "some other corpus.tgz").write_bytes(b"")
    with pytest.raises(DataError) as raised:
        _prepare(tmp_path / "c.s", "wmt14_translate/cs-en")
    assert re.fullmatch(
        rf"preparing wmt14_translate failed: For czeng_10, you must manually download the following file\(s\) from "
        rf"\S+ and place them in {manual}: data-plaintext-format\.0\.tar, .*",
        str(raised.value),
    ), raised.value


def test_a_catalogue_dataset_is_refused_before_downloading_where_tensorflow_is_missing(
    tmp_path, fake_network, monkeypatch
):
    monkeypatch.setattr(sources, "tensorflow_installed", lambda: False)
    place_by_hand(tmp_path)
    builder = get_builder(section("wmt14_translate/de-en", data_dir=str(tmp_path)))
    with pytest.raises(DataError) as raised:
        load_split(builder, "train", ("de", "en"))
    assert str(raised.value) == (
        "preparing wmt14_translate/de-en needs TensorFlow (tensorflow-datasets extracts the downloaded archives with "
        "it), and it is not installed: pip install tensorflow (only to prepare the data: reading it needs none), "
        "or give the corpus as text files with data.name='parallel_files'"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["downloads"]  # nothing read, extracted or made
    builder.data_path.mkdir(parents=True)  # prepared (elsewhere, or before): read without TensorFlow
    prepare(builder)


def test_a_run_that_meets_a_bad_file_placed_by_hand_leaves_no_workdir(tmp_path, fake_network, capsys):
    from jaxformer.commands import train

    place_by_hand(tmp_path / "tfds")
    workdir = tmp_path / "run"
    flags = ["--config", "tiny", "--workdir", str(workdir), "--config.data.name=wmt14_translate/de-en"]
    flags += ["--config.data.source_language=de", "--config.data.target_language=en"]
    flags += [f"--config.data.data_dir={tmp_path / 'tfds'}", "--config.data.batch_size=8"]  # a row per device
    assert train.main(flags) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(f"error: preparing wmt14_translate failed: {tmp_path / 'tfds' / 'downloads' / 'manual'}/")
    assert not workdir.exists()


def test_a_language_the_dataset_has_not_is_refused_before_anything_is_downloaded(tmp_path, fake_network):
    builder = get_builder(section("wmt14_translate/de-en", data_dir=str(tmp_path)))  # downloads fail the test
    with pytest.raises(DataError, match=r"^dataset 'wmt14_translate' has no language 'fr'; it has de, en$"):
        load_split(builder, "train", ("fr", "en"))
    assert list(tmp_path.iterdir()) == []
