"""A tensorflow-datasets builder for Multi30k task 1, English-German (Elliott et al., 2016).

It reads the copy vendored in `jaxformer/data/raw/multi30k` (or any folder with the same
file names), or downloads the official files with `download=True`. It writes array_record
files, read back with random access through `builder.as_data_source(split)`; no TensorFlow
is involved.
"""

from __future__ import annotations

import pathlib

import tensorflow_datasets as tfds

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
CITATION = """@inproceedings{elliott-etal-2016-multi30k,
  title = {Multi30K: Multilingual English-German Image Descriptions},
  author = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  year = {2016},
  pages = {70--74},
}"""


class Multi30k(tfds.core.GeneratorBasedBuilder):
    """Multi30k task 1: 29,000 training pairs of English image descriptions and German translations."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Raw cased text of task 1, en-de, all six splits; empty pairs skipped."}

    def __init__(self, *, raw_dir: str | pathlib.Path | None = None, download: bool = False, **kwargs):
        """`raw_dir` holds `{prefix}.{en,de}.gz` (default: the vendored copy); `download=True`
        fetches the official files instead."""
        self._raw_dir = pathlib.Path(raw_dir) if raw_dir is not None else VENDORED_DIR
        self._download = download
        super().__init__(**kwargs)

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

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        files = {f"{prefix}.{language}": None for prefix in SPLIT_FILES.values() for language in LANGUAGES}
        if self._download:
            urls = {name: DOWNLOAD_URL.format(prefix=name.split(".")[0], language=name.split(".")[1]) for name in files}
            files = {name: pathlib.Path(path) for name, path in dl_manager.download(urls).items()}
        else:
            files = {name: self._raw_dir / f"{name}.gz" for name in files}
            missing = [str(path) for path in files.values() if not path.exists()]
            if missing:
                raise DataError(f"Multi30k files not found: {', '.join(missing)} (pass raw_dir= or download=True)")
        return {
            split: self._generate_examples(files[f"{prefix}.en"], files[f"{prefix}.de"])
            for split, prefix in SPLIT_FILES.items()
        }

    def _generate_examples(self, english_path: pathlib.Path, german_path: pathlib.Path):
        for number, english, german in read_parallel_lines(english_path, german_path):
            yield number, {"en": english, "de": german}
