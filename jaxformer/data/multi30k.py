"""A tensorflow-datasets builder for Multi30k task 1, English-German (Elliott et al., 2016).

It reads the copy vendored in `jaxformer/data/raw/multi30k` (or any folder with the same
file names), or downloads the official files with `download=True`. It writes array_record
files, read back with random access through `builder.as_data_source(split)`; no TensorFlow
is involved.

Prepared data is keyed by its source files. Local files are fingerprinted (names, sizes,
SHA-256 of the bytes; see `jaxformer.data.fingerprint`) when the builder is made, and the
prepared data lives under a builder config named after the fingerprint,
`<data_dir>/multi30k/files-<12 hex digits>/1.0.0`: other or edited files get their own copy and
never reuse a cached one. With `download=True` the key is the download URLs
(`download-<12 hex digits>`) and the downloaded files are fingerprinted once fetched. The record
of the fingerprint kept beside the data, and its checks, are `FingerprintedBuilder`'s.
"""

from __future__ import annotations

import hashlib
import json
import pathlib

import tensorflow_datasets as tfds

from jaxformer.data import fingerprint as fp
from jaxformer.data.fingerprinted_builder import FingerprintedBuilder, LocalDatasetInfo
from jaxformer.data.parallel_text import DataError, SkipCounter, read_lines, read_parallel_lines

VENDORED_DIR = pathlib.Path(__file__).parent / "raw" / "multi30k"
DOWNLOAD_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{prefix}.{language}.gz"
LANGUAGES = ("en", "de")
# tfds split name -> file prefix.
SPLIT_FILES = {
    "train": "train",
    "validation": "val",
    "test_2016_flickr": "test_2016_flickr",
    "test_2017_flickr": "test_2017_flickr",
    "test_2017_mscoco": "test_2017_mscoco",
    "test_2018_flickr": "test_2018_flickr",
}
FILE_NAMES = tuple(f"{prefix}.{language}.gz" for prefix in SPLIT_FILES.values() for language in LANGUAGES)
_FILES_PATTERN = "{" + ",".join(SPLIT_FILES.values()) + "}.{" + ",".join(LANGUAGES) + "}.gz"
CITATION = """@inproceedings{elliott-etal-2016-multi30k,
  title = {Multi30K: Multilingual English-German Image Descriptions},
  author = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  year = {2016},
  pages = {70--74},
}"""


class Multi30k(FingerprintedBuilder):
    """Multi30k task 1: 29,000 training pairs of English image descriptions and German translations.

    `fingerprint` names the exact files the data comes from; see the module's docstring.
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Raw cased text of task 1, en-de, all six splits; empty pairs skipped."}
    DISPLAY_NAME = "Multi30k"

    def __init__(
        self,
        *,
        raw_dir: str | pathlib.Path | None = None,
        download: bool = False,
        prepared_from: str | None = None,
        **kwargs,
    ):
        """`raw_dir` holds `{prefix}.{en,de}.gz` (default: the vendored copy); `download=True`
        fetches the official files instead. Local files are hashed here (a few MB). With
        `prepared_from`, the fingerprint of a run's data, files not found are no error until a
        split is read: the copy prepared from them is read instead (see `FingerprintedBuilder`)."""
        self._raw_dir = pathlib.Path(raw_dir) if raw_dir is not None else VENDORED_DIR
        self._download = download
        missing = []
        if prepared_from is not None and not download:
            missing = [str(self._raw_dir / name) for name in FILE_NAMES if not (self._raw_dir / name).is_file()]
        if download:  # fingerprinted once downloaded; keyed by the URLs until then
            urls = json.dumps(sorted(_urls().values())).encode()
            config_name = "download-" + fp.short(hashlib.sha256(urls).hexdigest())
            description = "Multi30k from the official files (download=True)"
        else:
            if not missing:
                self._set_sources(fp.hash_files(self._local_paths()))
            config_name = None  # named after the fingerprint (`prepared_from`'s where files are missing)
            description = "Multi30k from local files; jaxformer_sources.json names them"
        super().__init__(
            init_args={"raw_dir": raw_dir, "download": download, "prepared_from": prepared_from},
            config_name=config_name,
            description=description,
            missing=missing,
            prepared_from=prepared_from,
            **kwargs,
        )

    def _local_paths(self) -> dict[str, pathlib.Path]:
        paths = {name: self._raw_dir / name for name in FILE_NAMES}
        missing = [str(path) for path in paths.values() if not path.is_file()]
        if missing:
            raise DataError(
                f"Multi30k files not found: {', '.join(missing)} (set data.raw_dir to the folder that holds "
                "them, or data.download=True)"
            )
        return paths

    def file_lines(self, split: str) -> tuple[list[int], int] | None:
        """(the 1-based line of each pair of `split` in its files, the files' line count): where a
        split's outputs go to line up with the files; None for downloaded files (the official ones
        have no empty side). Its caller (evaluate) reports the lines left out, with those it leaves
        out itself: nothing is logged here."""
        if self._download:
            return None
        english, german = self._split_paths(split).values()
        pairs = read_parallel_lines(english, german, SkipCounter(report=False))
        return [number for number, _, _ in pairs], len(read_lines(english))

    def _split_paths(self, split: str) -> dict[str, pathlib.Path]:
        names = [f"{SPLIT_FILES[split]}.{language}.gz" for language in LANGUAGES]
        return {name: self._raw_dir / name for name in names}

    @property
    def downloads(self) -> bool:
        return self._download

    def _current_source_files(self) -> dict[str, dict] | None:
        return None if self._download else fp.hash_files(self._local_paths())

    def _source_location(self) -> str:
        return str(self._raw_dir)

    def _source_description(self) -> str:
        if self._download:
            return "downloaded from " + DOWNLOAD_URL.rsplit("/", 1)[0] + "/"
        return f"in {self._raw_dir}"

    def _sources_summary(self) -> str:
        return f"{len(FILE_NAMES)} files {_FILES_PATTERN} {self._source_description()}"

    def offline_remedy(self) -> str:
        """What to do where the official files cannot be downloaded (tfds's folder for files placed by
        hand does not serve them: they have no registered checksums)."""
        return (
            f"without network, set data.raw_dir to a folder with the {len(FILE_NAMES)} files {_FILES_PATTERN} "
            "(or leave data.download off to use the copy that comes with jaxformer)"
        )

    def _unfetched_record_problem(self, record: dict) -> str | None:
        if set(record["files"]) != set(FILE_NAMES):
            return f"does not list the {len(FILE_NAMES)} Multi30k files"
        return None

    def split_names(self) -> list[str]:
        """The splits it prepares, known before it prepares them."""
        return list(SPLIT_FILES)

    def _info(self) -> tfds.core.DatasetInfo:
        return LocalDatasetInfo(
            builder=self,
            description="Multi30k task 1: English descriptions of Flickr30k images with German translations.",
            features=tfds.features.FeaturesDict({language: tfds.features.Text() for language in LANGUAGES}),
            supervised_keys=LANGUAGES,
            disable_shuffling=True,  # keep file order, so test outputs line up with the references
            homepage="https://github.com/multi30k/dataset",
            citation=CITATION,
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        if self._download:
            paths = {name: pathlib.Path(path) for name, path in dl_manager.download(_urls()).items()}
            self._set_sources(fp.hash_files(paths))
        else:
            paths = self._local_paths()
        return {
            split: self._generate_examples(paths[f"{prefix}.en.gz"], paths[f"{prefix}.de.gz"])
            for split, prefix in SPLIT_FILES.items()
        }

    def _generate_examples(self, english_path: pathlib.Path, german_path: pathlib.Path):
        for number, english, german in read_parallel_lines(english_path, german_path):
            yield number, {"en": english, "de": german}


def _urls() -> dict[str, str]:
    """File name -> official download URL."""
    return {name: DOWNLOAD_URL.format(prefix=name.split(".")[0], language=name.split(".")[1]) for name in FILE_NAMES}
