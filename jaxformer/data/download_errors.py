"""tensorflow-datasets' errors about the files it downloads, extracts or is given by hand, as one
line naming the file and what to do: they are about the user's network and files, not bugs.

tfds raises plain Exceptions for them (NonMatchingChecksumError, ExtractError, DownloadError) and
an AssertionError for a dataset's files that must be downloaded by hand; each carries only its
message, which is read here.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

from tensorflow_datasets.core.download import download_manager, extractor
from tensorflow_datasets.core.download import util as download_util

_CHECKSUM = re.compile(
    r"Artifact (?P<url>\S+), downloaded to (?P<path>.+?), has wrong checksum: "
    r"\* Expected: UrlInfo\(size=(?P<expected_size>[^,]+), checksum='(?P<expected>[0-9a-f]+)'.*?"
    r"\* Got: UrlInfo\(size=(?P<got_size>[^,]+), checksum='(?P<got>[0-9a-f]+)'"
)
NEEDS_TENSORFLOW = (
    "it is not installed: pip install tensorflow (only to prepare the data: reading it needs none), "
    "or give the corpus as text files with data.name='parallel_files'"
)
_EMPTY_MANUAL_FOLDER = re.compile(r"(Manual directory \S+ does not exist or is empty)\.")
_EXTRACTION = re.compile(r"Error while extracting (?P<path>.+?) to (?P<to>.+?): (?P<reason>.*)")


def installed(package: str) -> bool:
    """Whether `package` can be imported (found, not imported)."""
    return importlib.util.find_spec(package) is not None


def tensorflow_installed() -> bool:
    """Whether TensorFlow can be imported, which tfds needs to extract archives (not to read prepared data)."""
    return installed("tensorflow")


def dataset_name(builder) -> str:
    """The dataset's name with its config, as data.name gives it: "wmt14_translate/de-en"."""
    config = builder.builder_config
    return builder.name if config is None else f"{builder.name}/{config.name}"


def manual_folder(builder) -> pathlib.Path:
    """Where tfds looks for a dataset's files placed by hand: `<data_dir>/downloads/manual`."""
    return pathlib.Path(builder.data_dir_root) / "downloads" / "manual"


def offline_remedy(builder) -> str:
    """What to do where the files cannot be downloaded: the builder's own word (its `offline_remedy()`),
    or tfds's folder for files placed by hand."""
    own = getattr(builder, "offline_remedy", None)
    if own is not None:
        return own()
    return f"without network, place the files in {manual_folder(builder)} (see the README)"


def download_problem(builder, error: BaseException) -> str | None:
    """`error`, raised while `builder` fetched or extracted its files, as one line with its remedy;
    None for an error that is not about the downloaded or placed files."""
    text = " ".join(str(error).split())
    if isinstance(error, download_manager.NonMatchingChecksumError):
        return _checksum_problem(builder, text)
    if isinstance(error, extractor.ExtractError):
        cause = error.__cause__
        if isinstance(cause, ImportError):  # tfds reads every archive through TensorFlow's file API
            return f"tensorflow-datasets extracts downloaded archives with TensorFlow: {NEEDS_TENSORFLOW}"
        if isinstance(cause, OSError) and cause.errno is not None:  # a full disk, not a damaged archive
            return f"{type(cause).__name__}: {cause}"
        return _extraction_problem(builder, text)
    if isinstance(error, download_util.DownloadError):
        return f"{text}; {offline_remedy(builder)}"
    if isinstance(error, AssertionError):  # tfds's word for files to be placed by hand
        empty = _EMPTY_MANUAL_FOLDER.match(text)
        if empty:
            return f"{dataset_name(builder)} needs files placed by hand: {empty[1]}"
        if "manually download" in text:  # which files, from where, to where
            return text
    return None


def _is_placed_by_hand(builder, path: str) -> bool:
    manual = manual_folder(builder).resolve()
    return manual in pathlib.Path(path).resolve().parents


def _checksum_problem(builder, text: str) -> str:
    match = _CHECKSUM.search(text)
    if match is None:
        return text
    url, path = match["url"], match["path"]
    got, expected = match["got"][:12], match["expected"][:12]
    found = f"{match['got_size']}, sha256 {got}, not {match['expected_size']}, sha256 {expected}"
    if _is_placed_by_hand(builder, path):
        remedy = "replace it with that file, or remove it to download it"
        return f"{path} is not the file tfds expects from {url} ({found}): {remedy}"
    return f"{path}, downloaded from {url}, is not the file tfds expects ({found}): remove it and run again"


def _extraction_problem(builder, text: str) -> str:
    match = _EXTRACTION.search(text)
    if match is None:
        return text
    path, reason = match["path"], match["reason"]
    if _is_placed_by_hand(builder, path):
        return f"{path} cannot be extracted ({reason}): replace it with the file tfds expects, or remove it"
    return f"{path} cannot be extracted ({reason}): remove it and run again to download it again"
