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
(`download-<12 hex digits>`) and the downloaded files are fingerprinted once fetched. A record
of the fingerprint is written beside the data once it is complete and checked whenever the
data is used; a missing or disagreeing record makes the builder prepare the data again, with a
warning naming the directory and the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib

import tensorflow_datasets as tfds

from jaxformer.data import fingerprint as fp
from jaxformer.data.parallel_text import DataError, read_parallel_lines

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


class Multi30k(tfds.core.GeneratorBasedBuilder):
    """Multi30k task 1: 29,000 training pairs of English image descriptions and German translations.

    `fingerprint` names the exact files the data comes from; see the module's docstring.
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Raw cased text of task 1, en-de, all six splits; empty pairs skipped."}
    # The configs made so far, one per source key: tfds warns about every config it does not know.
    _KNOWN_CONFIGS: dict[str, tfds.core.BuilderConfig] = {}

    def __init__(self, *, raw_dir: str | pathlib.Path | None = None, download: bool = False, **kwargs):
        """`raw_dir` holds `{prefix}.{en,de}.gz` (default: the vendored copy); `download=True`
        fetches the official files instead. Local files are hashed here (a few MB)."""
        if "config" in kwargs:
            raise TypeError("Multi30k picks its config from its source files; do not pass config=")
        self._raw_dir = pathlib.Path(raw_dir) if raw_dir is not None else VENDORED_DIR
        self._download = download
        self._logged = False
        if download:
            self._source_files: dict[str, dict] | None = None  # known once downloaded
            self._fingerprint: str | None = None
            urls = json.dumps(sorted(_urls().values())).encode()
            key = "download-" + fp.short(hashlib.sha256(urls).hexdigest())
            description = "Multi30k from the official files (download=True)"
        else:
            self._source_files = fp.hash_files(self._local_paths())
            self._fingerprint = fp.fingerprint(self._source_files)
            key = "files-" + fp.short(self._fingerprint)
            description = "Multi30k from local files; jaxformer_sources.json names them"
        config = self._KNOWN_CONFIGS.setdefault(key, tfds.core.BuilderConfig(name=key, description=description))
        super().__init__(config=config, **kwargs)
        # tfds re-creates a builder from this when unpickling it.
        self._original_state = {**kwargs, "raw_dir": raw_dir, "download": download}

    @classmethod
    def get_builder_config(cls, name, version=None):
        return cls._KNOWN_CONFIGS.get(name) or super().get_builder_config(name, version)

    @property
    def fingerprint(self) -> str | None:
        """`"sha256:<64 hex digits>"` of the source files' names, sizes and contents; the same for
        the same twelve files wherever they lie. With `download=True` it is None until
        `download_and_prepare()` has fetched (or found) the data."""
        return self._fingerprint

    @property
    def source_files(self) -> dict[str, dict] | None:
        """File name -> {"size", "sha256"} of the source files (None like `fingerprint`)."""
        return None if self._source_files is None else {name: dict(v) for name, v in self._source_files.items()}

    def _local_paths(self) -> dict[str, pathlib.Path]:
        paths = {name: self._raw_dir / name for name in FILE_NAMES}
        missing = [str(path) for path in paths.values() if not path.is_file()]
        if missing:
            raise DataError(f"Multi30k files not found: {', '.join(missing)} (pass raw_dir= or download=True)")
        return paths

    def _source_description(self) -> str:
        if self._download:
            return "downloaded from " + DOWNLOAD_URL.rsplit("/", 1)[0] + "/"
        return f"in {self._raw_dir}"

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Multi30k task 1: English descriptions of Flickr30k images with German translations.",
            features=tfds.features.FeaturesDict({language: tfds.features.Text() for language in LANGUAGES}),
            supervised_keys=LANGUAGES,
            disable_shuffling=True,  # keep file order, so test outputs line up with the references
            homepage="https://github.com/multi30k/dataset",
            citation=CITATION,
        )

    def download_and_prepare(self, **kwargs) -> None:
        """Prepares the data unless a complete copy made from the same files is there already.

        A prepared copy whose record is missing or disagrees (other source files, a prepared
        file missing or of another size) is prepared again, with a warning naming why."""
        download_config = kwargs.get("download_config") or tfds.download.DownloadConfig()
        mode = download_config.download_mode
        if mode == tfds.download.GenerateMode.UPDATE_DATASET_INFO:
            super().download_and_prepare(**kwargs)
            return
        if self.data_path.exists() and not mode.overwrite_dataset:
            problem = self._check_prepared()
            if problem is None:
                super().download_and_prepare(**kwargs)  # reuses it
                self._log_once()
                return
            logging.warning(
                "multi30k: not using the prepared data in %s: %s; preparing it again", self.data_dir, problem
            )
            kwargs["download_config"] = dataclasses.replace(
                download_config, download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS
            )
        super().download_and_prepare(**kwargs)
        if not self._download:  # the files must not have changed under the preparation
            changed = fp.file_differences(self._source_files, fp.hash_files(self._local_paths()))
            if changed:
                raise DataError(
                    f"{self._raw_dir}: files changed while Multi30k was prepared from them: "
                    f"{'; '.join(changed)}; run again"
                )
        fp.write_record(
            self.data_path,
            {
                "dataset": self.name,
                "config": self.builder_config.name,
                "fingerprint": self._fingerprint,
                "source": self._source_description(),
                "files": self._source_files,
            },
        )
        self._log_once()

    def _check_prepared(self) -> str | None:
        """None if the prepared data's record matches the source files and the prepared files;
        else what is wrong, naming the file."""
        record, problem = fp.read_record(self.data_path)
        if problem:
            return problem
        record_path = self.data_path / fp.RECORD_NAME
        if record.get("config") != self.builder_config.name:
            return f"{record_path} was written for {record.get('config')!r}, not {self.builder_config.name!r}"
        if not self._download:
            changed = fp.file_differences(record["files"], self._source_files)
            if changed:
                return (
                    f"{record_path} records other files than those {self._source_description()}: {'; '.join(changed)}"
                )
        elif set(record["files"]) != set(FILE_NAMES):
            return f"{record_path} does not list the {len(FILE_NAMES)} Multi30k files"
        changed = fp.prepared_differences(self.data_path, record)
        if changed:
            return "; ".join(changed)
        if self._download:
            self._source_files, self._fingerprint = record["files"], record["fingerprint"]
        return None

    def _log_once(self) -> None:
        if not self._logged:
            self._logged = True
            logging.info(
                "multi30k: fingerprint %s of %d files %s %s; prepared data in %s",
                self._fingerprint,
                len(FILE_NAMES),
                _FILES_PATTERN,
                self._source_description(),
                self.data_dir,
            )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        if self._download:
            paths = {name: pathlib.Path(path) for name, path in dl_manager.download(_urls()).items()}
            self._source_files = fp.hash_files(paths)
            self._fingerprint = fp.fingerprint(self._source_files)
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
