"""Random-access translation splits from tensorflow-datasets: the vendored Multi30k builder, the
user's own files (parallel_files) or any tfds translate builder (wmt14_translate/de-en,
wmt17_translate/de-en, ...), prepared as array_record files and read with `as_data_source`,
without TensorFlow."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence

import ml_collections
import tensorflow_datasets as tfds

from jaxformer.data.download_errors import (
    NEEDS_TENSORFLOW,
    dataset_name,
    download_problem,
    installed,
    tensorflow_installed,
)
from jaxformer.data.fingerprinted_builder import FingerprintedBuilder
from jaxformer.data.multi30k import SPLIT_FILES, Multi30k
from jaxformer.data.parallel_files import ParallelFiles
from jaxformer.data.parallel_text import DataError
from jaxformer.data.preparation_attempt import preparation_attempt
from jaxformer.data.prepared_split import ReadableSplit, damaged, split_problem
from jaxformer.data.split_files import prepared_splits
from jaxformer.files import unwritable_folder_reason

logger = logging.getLogger(__name__)

tfds.disable_progress_bar()  # tqdm bars per split drown the training log


_CATALOGUE_NAME = re.compile(r"(?P<dataset>\w+)(?:/(?P<config>[\w.-]+))?(?::(?P<version>[\w.*-]+))?")
# The file systems tfds reaches through fsspec where TensorFlow is not installed, and their packages
# (hf:// holds datasets, not a place to prepare one).
_FILE_SYSTEMS = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs"}


def get_builder(data: ml_collections.ConfigDict, prepared_from: str | None = None, side: str | None = None):
    """The tfds builder of the `data` section (data.name: "multi30k", "parallel_files" or a tfds
    name), writing array_record files under data.data_dir. Keys a section lacks (one saved by an
    older jaxformer) take their defaults. Raises DataError for keys that do not apply to data.name,
    and (parallel_files) for data.files that are missing or not a TSV file or {lang} path, before
    anything is read. `prepared_from`, the fingerprint of a run's data: local files not found are
    no error until a split of theirs is read (`load_split`); the others' are read from the copy
    prepared from all of them, where data_dir still holds it. `side` ("source" or "target"): a
    language model's run, which reads that side's text alone (`text_sides.text_side`): parallel_files
    then needs, reads and fingerprints that language's files alone; the other datasets hold both."""
    name = data["name"]
    _check_file_system(data.get("data_dir"))
    files = {split: spec for split, spec in (data.get("files") or {}).items() if spec is not None}
    if files and name != "parallel_files":
        raise DataError(
            f"data.files.{sorted(files)[0]} is set, but data.files applies to data.name='parallel_files' only, "
            f"not {name!r}"
        )
    raw_dir, download = data.get("raw_dir"), data.get("download", False)
    if name != "multi30k" and (raw_dir is not None or download):
        raise DataError(f"data.raw_dir and data.download apply to multi30k only, not {name!r}")
    data_dir = data.get("data_dir")
    if name == "multi30k":
        return Multi30k(
            data_dir=data_dir,
            raw_dir=raw_dir,
            download=download,
            prepared_from=prepared_from,
            file_format="array_record",
        )
    if name == "parallel_files":
        return ParallelFiles(
            data_dir=data_dir,
            files=files,
            source_language=data["source_language"],
            target_language=data["target_language"],
            validation_holdout=data.get("validation_holdout", 1000),
            holdout_seed=data.get("shuffle_seed", 0),
            side=side,
            prepared_from=prepared_from,
            file_format="array_record",
        )
    _check_catalogue_name(name)
    with _scratch_temporary_folder():
        return tfds.builder(name, data_dir=data_dir, file_format="array_record")


def builder_for_run(data: ml_collections.ConfigDict, side: str | None, trained_on: str | None):
    """`get_builder(data, side=side)` for a run, resumed from data of fingerprint `trained_on`
    (None for a new run): a language model resumed on parallel_files prepared before it read its
    own side alone (both sides' files, pairs with an empty side skipped) gets the builder of those
    pairs while its files are the same, so that it resumes on the data it was trained on."""
    builder = get_builder(data, side=side)
    if (
        side is None
        or trained_on is None
        or not isinstance(builder, ParallelFiles)
        or builder.fingerprint == trained_on
    ):
        return builder
    try:
        pairs = get_builder(data)
    except DataError:  # the other side's files gone: not that run's data either
        return builder
    if pairs.fingerprint != trained_on:
        return builder
    logger.info("%s: resumed on both sides' pairs, as the run was prepared before it read one side alone", data.name)
    return pairs


@contextlib.contextmanager
def _scratch_temporary_folder():
    """Temporary files made meanwhile go to a folder removed afterwards: a tfds builder made before
    its data is prepared looks for its metadata on tfds's bucket (DatasetInfo.initialize_from_bucket),
    which leaves an empty `tmp...tfds` folder in the system's temporary directory every time."""
    saved = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="jaxformer-tfds-") as scratch:
        tempfile.tempdir = scratch
        try:
            yield
        finally:
            tempfile.tempdir = saved


def check_source(data: ml_collections.ConfigDict) -> None:
    """Raises DataError, before anything is prepared or written, when data.name names no dataset
    (nor a config of one, "wmt14_translate/de-en"), data.train_split or data.eval_split a split
    it has not (where its splits are known before it is prepared: `known_splits`), or
    data.data_dir cannot hold the prepared files."""
    name = data["name"]
    if name not in ("multi30k", "parallel_files"):
        _check_catalogue_name(name)
    for key in ("train_split", "eval_split"):
        check_known_split(data, data[key], f"config data.{key}={data[key]!r}")
    data_dir = data.get("data_dir")
    _check_file_system(data_dir)
    local = data_dir is not None and "://" not in data_dir  # gs://... : tfds writes it through its own file API
    reason = unwritable_folder_reason(data_dir) if local else None
    if reason:
        raise DataError(f"data.data_dir={data_dir!r}: {reason}")


def check_known_split(data: Mapping, split: str, given_as: str) -> None:
    """DataError when the `data` section's dataset has no `split`, where its splits are known before
    it is prepared (`known_splits`), naming what gave it (`given_as`: "--split x")."""
    _refuse_unknown_split(data["name"], split, known_splits(data) or [], given_as)


def known_splits(data: Mapping) -> list[str] | None:
    """The splits of the `data` section's dataset known before it is prepared, without its builder:
    multi30k's, and parallel_files' (its data.files', and validation); None for a tfds catalogue
    dataset, whose builder tells them (`splits_before_preparing`), and parallel_files with no
    data.files.train."""
    if data["name"] == "multi30k":
        return list(SPLIT_FILES)
    given = [split for split, spec in (data.get("files") or {}).items() if spec is not None]
    if data["name"] == "parallel_files" and "train" in given:  # (none given: get_builder's error, naming that)
        return prepared_splits(given)
    return None


def _check_catalogue_name(name: str) -> None:
    """DataError unless `name` names a tensorflow-datasets dataset and, where it has several, one of its configs."""
    import tensorflow_datasets.translate  # noqa: F401  registers the wmt*_translate builders, loaded lazily

    parts = _CATALOGUE_NAME.fullmatch(name)
    if parts is None:
        raise DataError(
            f"data.name={name!r} is not a tensorflow-datasets name: give <dataset>/<config>, optionally "
            "with :<version>, e.g. 'wmt14_translate/de-en' or 'wmt14_translate/de-en:1.0.0'"
        )
    dataset, builder_config, version = parts["dataset"], parts["config"] or "", parts["version"]
    try:
        builder_class = tfds.builder_cls(dataset)
        configs = builder_class.builder_configs
    except tfds.core.registered.DatasetNotFoundError:
        raise DataError(
            f"data.name={name!r} names no dataset: use 'multi30k', 'parallel_files' (your own files, "
            "data.files) or a tensorflow-datasets name such as 'wmt14_translate/de-en'"
        ) from None
    if builder_config and builder_config not in configs:
        raise DataError(
            f"data.name={name!r}: {dataset} has no config {builder_config!r}; it has {', '.join(sorted(configs))}"
        )
    if not builder_config and len(configs) > 1:  # tfds would pick its default (wmt*: cs-en) and download it
        raise DataError(
            f"data.name={name!r}: {dataset} has several configs; name one: "
            + ", ".join(f"{dataset}/{config}" for config in sorted(configs))
        )
    config = configs.get(builder_config) or next(iter(configs.values()), None)
    versions = _versions(builder_class, config)
    if version is not None and not any(_version_matches(known, version) for known in versions):
        raise DataError(
            f"data.name={name!r}: {name.partition(':')[0]} has no version {version!r}; it has "
            f"{', '.join(map(str, versions))} (or leave the version out)"
        )


def _versions(builder_class, config) -> list:
    """The versions tfds can prepare of `builder_class` with `config`, its canonical one first."""
    from tensorflow_datasets.core.dataset_builder import canonical_version_for_config

    supported = (config.supported_versions if config is not None else None) or builder_class.SUPPORTED_VERSIONS
    return [
        tfds.core.Version(str(version)) for version in [canonical_version_for_config(builder_class, config), *supported]
    ]


def _version_matches(known, requested: str) -> bool:
    try:
        return known.match(requested)
    except ValueError:  # not x.y.z (wildcards allowed)
        return False


def _check_file_system(data_dir: str | None) -> None:
    """DataError when data.data_dir is on a file system (gs://, s3://, ...) that needs a package
    not installed: tfds reaches those through TensorFlow, or else through fsspec's packages."""
    scheme = data_dir.split("://", 1)[0] if data_dir is not None and "://" in data_dir else None
    if scheme is not None and scheme not in _FILE_SYSTEMS:
        local = " (give the local path itself)" if scheme == "file" else ""
        raise DataError(
            f"data.data_dir={data_dir!r}: {scheme}:// is not a file system the prepared data can be written to; "
            f"use a local path or {', '.join(f'{name}://' for name in _FILE_SYSTEMS)}{local}"
        )
    package = _FILE_SYSTEMS.get(scheme)
    if package is not None and not installed(package) and not tensorflow_installed():
        raise DataError(
            f"data.data_dir={data_dir!r}: tensorflow-datasets reaches {scheme}:// through {package} (or TensorFlow), "
            f"which is not installed: pip install {package}"
        )


def data_fingerprint(builder) -> str | None:
    """What the prepared data was made from, for checkpoint metadata: `builder.fingerprint`
    ("sha256:<64 hex digits>" of the source files' names, sizes and contents) for multi30k and
    parallel_files, known after `load_split` / `download_and_prepare()`; None for the tfds
    catalogue builders (wmt*), whose downloads tfds checks itself."""
    return getattr(builder, "fingerprint", None)


def check_same_data(
    builder, trained_on: str | None, workdir, remedy: str, trained_files: Mapping[str, str | None] | None = None
) -> None:
    """A DataError when the run in `workdir`, trained on data of fingerprint `trained_on`, would
    now read other files through `builder`; `remedy` ends the message, which names what changed
    (`data_changes`; `trained_files`: the run's data.files). Local files are fingerprinted when the
    builder is made, so this is known before a copy of them is prepared; downloaded ones once they
    are fetched (None until then: check again after preparing)."""
    now = data_fingerprint(builder)
    if trained_on is not None and now is not None and now != trained_on:
        changes = data_changes(builder, trained_on, trained_files)
        raise DataError(
            f"{workdir} was trained on other data files (fingerprint {trained_on}) than {builder.name} has now "
            f"({now}){': ' + '; '.join(changes) if changes else ''}; {remedy}"
        )


def data_changes(builder, trained_on: str, trained_files: Mapping[str, str | None] | None) -> list[str]:
    """What differs from the data the run was trained on: each file, where data_dir still holds
    the record of that data's preparation; else (parallel_files) each split of data.files given
    otherwise than the run's `trained_files`; else nothing known."""
    changes = builder.changes_since(trained_on) if isinstance(builder, FingerprintedBuilder) else None
    if changes is None and isinstance(builder, ParallelFiles) and trained_files is not None:
        changes = builder.spec_changes(trained_files)
    return changes or []


def prepare(builder) -> None:
    """`builder.download_and_prepare()`, whose progress lines tfds prints to stdout, on stderr with the
    logs: stdout is where the commands write translations and scores. A tfds catalogue dataset
    (wmt*) not prepared yet is refused first where TensorFlow, which tfds extracts its downloads
    with, is not installed: before hours of downloading, not after. A download host that cannot be
    reached is refused in seconds, and a failed preparation leaves nothing behind but the files it
    downloaded in full (`preparation_attempt`). What data reused, prepared by an older jaxformer,
    had its files read again for is recorded with it (`record_notes_found_again`)."""
    if not isinstance(builder, FingerprintedBuilder) and not builder.data_path.exists() and not tensorflow_installed():
        raise DataError(
            f"preparing {dataset_name(builder)} needs TensorFlow (tensorflow-datasets extracts "
            f"the downloaded archives with it), and {NEEDS_TENSORFLOW}"
        )
    with contextlib.redirect_stdout(sys.stderr):
        try:
            with preparation_attempt(builder) as lock:  # a host that cannot be reached: an error in seconds
                builder.download_and_prepare()
                if isinstance(builder, FingerprintedBuilder) and lock is not None:
                    builder.record_notes_found_again(lock)
        except OSError as error:  # a download without network (requests' errors are OSErrors), a full disk
            raise DataError(f"preparing {builder.name} failed: {type(error).__name__}: {error}") from None
        except BaseException as error:  # bad input found while reading it (DataError), tfds's about its files, a signal
            problem = download_problem(builder, error) if isinstance(error, Exception) else None
            if problem is not None:
                raise DataError(f"preparing {builder.name} failed: {problem}") from None
            raise


def _refuse_unknown_split(dataset: str, split: str, available: list[str], given_as: str | None) -> None:
    """DataError unless `split` is one of `available` (an empty list: none known), naming what gave
    it (`given_as`: "config data.eval_split='x'", "--split x") first where there is one."""
    if available and split not in available:  # (tfds.testing.mock_data leaves no split list)
        hint = ""
        if split == "test" and dataset == "parallel_files":
            # evaluate reads a run's own data section: a data.files.test added to it would be other data, refused
            hint = " (no data.files.test was given): score a test file with jaxformer-evaluate --source and --reference"
        where = f"{given_as}: " if given_as else ""
        raise DataError(f"{where}dataset {dataset!r} has no split {split!r}; it has {', '.join(available)}{hint}")


def check_split(builder, split: str, given_as: str | None = None) -> None:
    """DataError when `builder`'s dataset has no `split`, where that is known before it is prepared
    (`splits_before_preparing`), naming what gave it (`given_as`: "config data.eval_split='x'")."""
    _refuse_unknown_split(builder.name, split, splits_before_preparing(builder), given_as)


def splits_before_preparing(builder) -> list[str]:
    """The splits `builder` has where its code tells them before it is prepared (jaxformer's own
    builders; tfds's wmt*_translate, by their subsets), else its prepared copy's (none before)."""
    if hasattr(builder, "split_names"):
        return builder.split_names()
    from tensorflow_datasets.translate import wmt

    if isinstance(builder, wmt.WmtTranslate):
        absl_logger = logging.getLogger("absl")  # tfds logs through absl's logger
        absl_logger.addFilter(_warnings_only)  # the subsets it lists and skips, a dozen lines above the error
        try:
            subsets = builder.subsets
        finally:
            absl_logger.removeFilter(_warnings_only)
        return [str(split) for split in subsets]
    return list(builder.info.splits)


def _warnings_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def check_languages(builder, languages: Sequence[str]) -> None:
    """DataError unless the dataset has each of `languages`: known from the builder's code (its
    features), so refused before anything is downloaded or prepared."""
    features = set(builder.info.features.keys())
    missing = [language for language in languages if language not in features]
    if missing:
        raise DataError(
            f"dataset {builder.name!r} has no language {', '.join(map(repr, missing))}; "
            f"it has {', '.join(sorted(features))}"
        )


def load_split(builder, split: str, languages: Sequence[str], given_as: str | None = None) -> Sequence:
    """Prepares the dataset if needed and returns a random-access source for `split`; a split it
    has not is refused before anything is prepared where the builder can tell its splits then
    (jaxformer's own builders, tfds's wmt*, a tfds dataset prepared before), after it otherwise, naming what
    gave the split (`given_as`: "config data.eval_split='x'", "--split x"). A damaged prepared copy
    is refused when the split is opened, or read (`prepared_split`)."""
    check_split(builder, split, given_as)
    check_languages(builder, languages)
    check_split_sources = getattr(builder, "check_split_sources", lambda split: None)  # tfds's own: no files
    check_split_sources(split)  # its own files there
    prepare(builder)
    check_split_sources(split)  # ... and those the prepared copy was made from
    problem = split_problem(builder, split)  # before the tokenizer or the pipeline read it
    if problem:
        raise damaged(builder, problem)
    _refuse_unknown_split(builder.name, split, list(builder.info.splits), given_as)
    source = ReadableSplit(builder.as_data_source(split=split), builder, split)
    # A language model reads one language of each example: its texts, as the rest of its log says.
    logger.info("%s[%s]: %d %s", builder.name, split, len(source), "pairs" if len(languages) == 2 else "texts")
    return source
