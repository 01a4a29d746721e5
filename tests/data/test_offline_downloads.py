"""Downloads where the network cannot be reached: a one-line error naming the host, in seconds
(tfds alone retries for minutes), and the data_dir left as it was. Nothing goes beyond this
machine: hosts are 127.0.0.1, or the connection is refused by a stand-in."""

import functools
import http.server
import logging
import os
import re
import socket
import threading
import time

import pytest
from tensorflow_datasets.core.download import downloader

from jaxformer.data import multi30k, preparation_attempt, sources
from jaxformer.data.parallel_text import DataError
from jaxformer.data.preparation_lock import TEMPORARY_DOWNLOAD, PreparationLock
from jaxformer.data.sources import get_builder, load_split
from tests.data.test_sources import section, write_raw_corpus

PROXY_VARIABLES = ("http_proxy", "https_proxy", "ftp_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    """Hosts reached directly, whatever proxy this machine's environment names."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
def download_attempts(monkeypatch):
    """The URLs tfds tried to download (with no retries, where it gets to try); only from 127.0.0.1."""
    tried = []
    real = downloader._Downloader._sync_download

    def download(self, url, *args, **kwargs):
        tried.append(url)
        if not url.startswith("http://127.0.0.1:"):
            pytest.fail(f"tfds tried to download {url}")  # beyond this machine
        return real(self, url, *args, **kwargs)

    monkeypatch.setattr(downloader._Downloader, "_sync_download", download)
    monkeypatch.setattr(downloader, "MAX_RETRIES", 0)  # else minutes of retries, where no probe stops it first
    return tried


def closed_port() -> int:
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        return bound.getsockname()[1]  # closed once returned: a connection to it is refused


def tree(folder):
    """Every path under `folder`, with the bytes of each file."""
    return {
        os.path.relpath(os.path.join(parent, name), folder): open(os.path.join(parent, name), "rb").read()
        if name in files
        else None
        for parent, folders, files in os.walk(folder)
        for name in folders + files
    }


def users_data_dir(path):
    """A data_dir with what a user (or an earlier run) put there, none of it to be removed."""
    manual = path / "downloads" / "manual"
    manual.mkdir(parents=True)
    (manual / "mine.txt").write_text("placed by hand")
    # Not this attempt's: another dataset's download (one of multi30k's own, killed, would be removed).
    (path / "downloads" / "wmt14_translate" / f"train.en.gz.tmp.{'0' * 32}").mkdir(parents=True)
    (path / "notes.txt").write_text("kept")
    return path


def test_an_unreachable_download_host_is_one_line_in_seconds_and_leaves_the_data_dir_as_it_was(
    tmp_path, monkeypatch, download_attempts
):
    port = closed_port()
    monkeypatch.setattr(multi30k, "DOWNLOAD_URL", f"http://127.0.0.1:{port}/{{prefix}}.{{language}}.gz")
    for data_dir, before in [(tmp_path / "new", None), (users_data_dir(tmp_path / "used"), tree(tmp_path / "used"))]:
        builder = get_builder(section("multi30k", data_dir=str(data_dir), download=True))
        start = time.monotonic()
        with pytest.raises(DataError) as raised:
            load_split(builder, "train", ("en", "de"))
        assert time.monotonic() - start < 30
        assert download_attempts == []  # refused before tfds's first try, and its retries
        assert re.fullmatch(
            rf"preparing multi30k failed: cannot download http://127\.0\.0\.1:{port}/\S+\.gz: "
            rf"127\.0\.0\.1:{port} cannot be reached \(Connection refused\); check the network; without network, "
            r"set data\.raw_dir to a folder with the 12 files \{train,val,.*\}\.\{en,de\}\.gz "
            r"\(or leave data\.download off to use the copy that comes with jaxformer\)",
            str(raised.value),
        ), raised.value
        assert (tree(data_dir) if data_dir.exists() else None) == before


def test_a_download_cut_short_leaves_no_temporary_files(tmp_path, monkeypatch):
    monkeypatch.setattr(preparation_attempt, "unreachable", lambda url: None)  # the host answered
    calls = []

    def cut_short(self, url, destination, verify=True):
        calls.append(url)
        if len(calls) == 1:
            (destination / url.rsplit("/", 1)[1]).write_bytes(b"the first bytes")
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(downloader._Downloader, "_sync_download", cut_short)
    data_dir = users_data_dir(tmp_path / "tfds")
    before = tree(data_dir)
    with pytest.raises(DataError, match=r"^preparing multi30k failed: ConnectionResetError: .*reset by peer$"):
        load_split(get_builder(section("multi30k", data_dir=str(data_dir), download=True)), "train", ("en", "de"))
    assert calls and tree(data_dir) == before


@pytest.fixture
def file_server(tmp_path):
    """http://127.0.0.1:<port>/ serving a small Multi30k corpus."""
    corpus = write_raw_corpus(tmp_path / "served")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(corpus))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", corpus
    server.shutdown()
    server.server_close()


def test_a_reachable_host_is_downloaded_from(tmp_path, monkeypatch, file_server, download_attempts):
    url, corpus = file_server
    monkeypatch.setattr(multi30k, "DOWNLOAD_URL", url + "{prefix}.{language}.gz")
    builder = get_builder(section("multi30k", data_dir=str(tmp_path / "tfds"), download=True))
    source = load_split(builder, "validation", ("en", "de"))
    assert [source[i]["en"] for i in range(len(source))] == [f"val en sentence {i}".encode() for i in range(3)]
    assert (
        len(download_attempts) == 12
        and builder.fingerprint
        == get_builder(section("multi30k", data_dir=str(tmp_path / "local"), raw_dir=str(corpus))).fingerprint
    )
    assert not [path for path in (tmp_path / "tfds" / "downloads").rglob("*.tmp.*")]


def test_a_download_killed_before_is_removed_and_a_live_ones_left(tmp_path, monkeypatch, file_server, caplog):
    """A download killed outright (kill -9) leaves its temporary folder: the next preparation removes
    it, with a warning, where no other preparation of the dataset runs; one that fails beside a
    running one leaves that one's downloads (and its own, to the next preparation alone)."""
    url, _ = file_server
    monkeypatch.setattr(multi30k, "DOWNLOAD_URL", url + "{prefix}.{language}.gz")
    data = section("multi30k", data_dir=str(tmp_path / "tfds"), download=True)
    downloads = tmp_path / "tfds" / "downloads" / "multi30k"
    other_running = PreparationLock(downloads, "multi30k", True, TEMPORARY_DOWNLOAD)
    other_running.acquire()
    killed = downloads / f"127.0.0.1_train.en.gz.tmp.{'1' * 32}"
    killed.mkdir()
    (killed / "train.en.gz").write_bytes(b"the first bytes")
    live = downloads / f"127.0.0.1_val.en.gz.tmp.{'2' * 32}"
    real = downloader._Downloader._sync_download

    def fails_beside_a_live_download(self, *args, **kwargs):
        live.mkdir(exist_ok=True)  # the other preparation's, begun meanwhile
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(downloader._Downloader, "_sync_download", fails_beside_a_live_download)
    with pytest.raises(DataError, match="ConnectionResetError"):
        load_split(get_builder(data), "train", ("en", "de"))
    assert killed.is_dir() and live.is_dir()

    other_running.release()  # ... and once it is over, the next one removes every temporary folder
    live.rmdir()
    monkeypatch.setattr(downloader._Downloader, "_sync_download", real)
    with caplog.at_level(logging.WARNING):
        assert len(load_split(get_builder(data), "validation", ("en", "de"))) == 3
    assert f"removed {killed}, left by a preparation of multi30k that was killed before it was complete" in caplog.text
    assert not list((tmp_path / "tfds").rglob("*.tmp.*"))


def test_a_catalogue_dataset_whose_host_cannot_be_reached_is_one_line(tmp_path, monkeypatch, download_attempts):
    def no_name(address, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(preparation_attempt.socket, "create_connection", no_name)
    monkeypatch.setattr(sources, "tensorflow_installed", lambda: True)  # refused before downloading otherwise
    builder = get_builder(section("wmt14_translate/de-en", data_dir=str(tmp_path / "tfds")))
    with pytest.raises(DataError) as raised:
        load_split(builder, "train", ("de", "en"))
    assert re.fullmatch(
        r"preparing wmt14_translate failed: cannot download http\S+: the name (\S+) does not resolve "
        r"\(Name or service not known\); check the network; without network, place the files in "
        rf"{tmp_path / 'tfds' / 'downloads' / 'manual'} \(see the README\)",
        str(raised.value),
    ), raised.value
    assert download_attempts == [] and not (tmp_path / "tfds").exists()


def test_the_probe_gives_up_on_a_host_that_does_not_answer(monkeypatch):
    released = threading.Event()

    def no_answer(address, timeout):  # as a name server that does not answer (getaddrinfo has no timeout)
        released.wait()
        raise TimeoutError("timed out")

    monkeypatch.setattr(preparation_attempt, "PROBE_SECONDS", 0.2)
    monkeypatch.setattr(preparation_attempt.socket, "create_connection", no_answer)
    start = time.monotonic()
    try:
        assert (
            preparation_attempt.unreachable("https://example.org/file.gz") == "no answer from example.org:443 in 0.2 s"
        )
        assert time.monotonic() - start < 2
    finally:
        released.set()


def test_the_probe_reaches_a_host_through_its_proxy(monkeypatch):
    port = closed_port()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    assert preparation_attempt.unreachable("https://example.org/file.gz") == (
        f"127.0.0.1:{port} cannot be reached (Connection refused) (the proxy http://127.0.0.1:{port})"
    )
    monkeypatch.setenv("NO_PROXY", "example.org")  # direct, then: refused by the stand-in
    monkeypatch.setattr(
        preparation_attempt.socket,
        "create_connection",
        lambda address, *args, **kwargs: (_ for _ in ()).throw(ConnectionRefusedError(111, "Connection refused")),
    )
    assert preparation_attempt.unreachable("https://example.org/file.gz") == (
        "example.org:443 cannot be reached (Connection refused)"
    )
    assert preparation_attempt.unreachable("gs://bucket/file.gz") is None  # tfds copies it, with no connection
