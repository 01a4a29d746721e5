"""A tfds builder's `download_and_prepare`, made to fail in seconds where a download host cannot be
reached, and to leave nothing behind when it fails but the files it downloaded in full.

tfds retries a connection that fails ten times, pausing up to 102 s between tries (about 3.5
minutes for each file), and leaves each file's temporary download folder (`<name>.tmp.<uuid hex>`)
behind when it gives up. Here the host of a file (or the proxy that requests reaches it through)
is first probed with one TCP connection, once per host: a DownloadError naming it, in seconds,
when it does not answer. After a failed preparation, its temporary downloads and the folders it
made that hold nothing are removed (the data_dir too, if it made it), and tfds's note of the
dataset's default config if it made it; completed downloads stay
(tfds reuses them: a rerun fetches only the rest), and nothing that was there before is touched.
Meanwhile it holds the lock on the preparation of the builder's config, and on its downloads where
it downloads (`preparation_lock`): the incomplete copies and downloads of preparations killed
before are removed first where no other one runs, and a failed one leaves another's live downloads.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import socket
import threading
import urllib.parse
from collections.abc import Iterator

import requests.utils
from tensorflow_datasets.core.download import util as download_util

from jaxformer.data.fingerprinted_builder import FingerprintedBuilder
from jaxformer.data.preparation_lock import TEMPORARY_DOWNLOAD, PreparationLock

PROBE_SECONDS = 10.0
_DEFAULT_PORTS = {"http": 80, "https": 443, "ftp": 21}


def unreachable(url: str) -> str | None:
    """Why the host of `url`, or the proxy requests would reach it through, does not accept a
    connection within PROBE_SECONDS, naming it; None when it does, or when `url` is not fetched
    over the network (gs://, a local path)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in _DEFAULT_PORTS:
        return None
    proxy = requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url))
    target = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}") if proxy else parts
    host, port = target.hostname, target.port or _DEFAULT_PORTS.get(target.scheme, 80)
    outcome: list[str | None] = []
    # getaddrinfo takes no timeout: the probe runs aside, and is given up on after PROBE_SECONDS.
    probe = threading.Thread(target=lambda: outcome.append(_connection_problem(host, port)), daemon=True)
    probe.start()
    probe.join(PROBE_SECONDS)
    problem = outcome[0] if outcome else f"no answer from {host}:{port} in {PROBE_SECONDS:g} s"
    if problem is None:
        return None
    return f"{problem} (the proxy {proxy})" if proxy else problem


def _connection_problem(host: str, port: int) -> str | None:
    try:
        socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
    except socket.gaierror as error:
        return f"the name {host} does not resolve ({error.strerror or error})"
    except TimeoutError:
        return f"no answer from {host}:{port} in {PROBE_SECONDS:g} s"
    except OSError as error:
        return f"{host}:{port} cannot be reached ({error.strerror or error})"
    return None


@contextlib.contextmanager
def preparation_attempt(builder) -> Iterator[PreparationLock | None]:
    """Meanwhile `builder`'s downloads probe each host before the first file from it (a DownloadError
    naming the host when it does not answer); if the body fails, what it left is removed: its
    temporary downloads and the folders it made that are empty. Gives the lock on the builder's
    config held meanwhile (None for a data_dir that is not local)."""
    root = _local_data_dir(builder)
    root_existed = root is not None and root.exists()
    downloads = root / "downloads" if root is not None else None
    before = _downloads_entries(downloads)
    config_record = _default_config_record(builder)
    config_recorded = config_record is not None and config_record.exists()
    own = isinstance(builder, FingerprintedBuilder)
    config_lock = (
        PreparationLock(pathlib.Path(builder.data_path).parent, builder.name, own) if root is not None else None
    )
    downloads_lock = (  # tfds downloads a dataset's files into downloads/<name>/
        PreparationLock(downloads / builder.name, builder.name, own, TEMPORARY_DOWNLOAD)
        if root is not None and own and builder.downloads
        else None
    )
    probing = hasattr(type(builder), "_make_download_manager")  # tfds's, where it makes its DownloadManager
    if probing:
        builder._make_download_manager = _probing(builder._make_download_manager)
    try:
        for lock in (downloads_lock, config_lock):  # always in this order: no two preparations wait on each other
            if lock is not None:
                lock.acquire()  # (made its folder: removed below if the preparation fails)
        yield config_lock
    except BaseException:
        if downloads_lock is None or downloads_lock.alone():  # another preparation's live downloads stay
            _remove_downloads_leftovers(downloads, before)
        if config_record is not None and not config_recorded:
            config_record.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                config_record.parent.rmdir()  # only if empty
        # Another preparation's folder stays, though it may hold nothing yet.
        if config_lock is None or config_lock.alone():
            _remove_empty_builder_folders(builder)
            if root is not None and not root_existed:
                with contextlib.suppress(OSError):
                    root.rmdir()  # only if empty
        raise
    finally:
        for lock in (config_lock, downloads_lock):
            if lock is not None:
                lock.release()
        if probing:
            del builder._make_download_manager


def _probing(make_download_manager):
    """`make_download_manager`, whose managers probe the host of each file they are about to
    download (not those cached or placed by hand), the first time they meet it."""

    def make(*args, **kwargs):
        manager = make_download_manager(*args, **kwargs)
        download, reachable = manager._download, set()

        def probed_download(resource):
            host = urllib.parse.urlsplit(resource.url).netloc
            if host not in reachable:
                problem = unreachable(resource.url)
                if problem is not None:
                    raise download_util.DownloadError(f"cannot download {resource.url}: {problem}; check the network")
                reachable.add(host)
            return download(resource)

        manager._download = probed_download
        return manager

    return make


def _local_data_dir(builder) -> pathlib.Path | None:
    root = str(builder.data_dir_root)
    return None if "://" in root else pathlib.Path(root)


def _default_config_record(builder) -> pathlib.Path | None:
    """`<data_dir>/<name>/.config/metadata.json`, where tfds notes a dataset's default config each
    time it prepares one of its configs (wmt*_translate); None for a dataset without configs."""
    root = _local_data_dir(builder)
    if root is None or not builder.BUILDER_CONFIGS:
        return None
    return root / builder.name / ".config" / "metadata.json"


def _downloads_entries(downloads: pathlib.Path | None) -> set[pathlib.Path]:
    """The downloads folder, what it holds, and what its folders hold (tfds's temporary downloads
    are in one or the other)."""
    if downloads is None or not downloads.is_dir():
        return set()
    entries = {downloads, *downloads.iterdir()}
    for folder in [entry for entry in entries if entry != downloads and entry.is_dir()]:
        entries.update(folder.iterdir())
    return entries


def _remove_downloads_leftovers(downloads: pathlib.Path | None, before: set[pathlib.Path]) -> None:
    made = _downloads_entries(downloads) - before
    for entry in made:
        if TEMPORARY_DOWNLOAD.fullmatch(entry.name) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
    for folder in sorted(made, key=lambda path: len(path.parts), reverse=True):  # the downloads folder last
        if folder.is_dir():
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty


def _remove_empty_builder_folders(builder) -> None:
    """The builder's own folders under the data_dir (`<name>/<config>/<version>`) that tfds left
    empty: a corrected rerun must not find a `files-<fingerprint>` folder that holds nothing.
    Folders with anything in them stay."""
    root = pathlib.Path(builder.data_dir_root).resolve()
    folder = pathlib.Path(builder.data_dir).resolve()
    while folder != root and root in folder.parents:
        if folder.exists():
            try:
                folder.rmdir()  # only if empty
            except OSError:
                return
        folder = folder.parent
