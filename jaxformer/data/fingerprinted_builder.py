"""A tensorflow-datasets builder whose prepared data is keyed by a fingerprint of its source files.

The builder config is named after the fingerprint (`files-<12 hex digits>`), so other or edited
files (or other settings) get their own prepared copy under `<data_dir>/<name>/files-.../<version>`
and never reuse a cached one. A record of the fingerprint (`jaxformer.data.fingerprint`) is
written beside the data once it is complete and checked whenever the data is used; a missing or
disagreeing record makes the builder prepare the data again, with a warning naming the directory
and the file. Sources that are not known before preparation (a download) are fingerprinted once
fetched; their config is named by the subclass. What the preparation said of the data (a
subclass's notes: splits that share pairs) is recorded with it, outside the fingerprint, and said
again by each run that reuses it; where an older jaxformer's record lacks them, they are found
again from the files, and recorded once no other process holds the config's lock.

Subclasses (Multi30k, ParallelFiles) say where their files are and how to read them; this class
does the keying, the checks and the record.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import pathlib
from collections.abc import Mapping, Sequence

import tensorflow_datasets as tfds

from jaxformer.data import fingerprint as fp
from jaxformer.data.parallel_text import DataError

logger = logging.getLogger(__name__)


class LocalDatasetInfo(tfds.core.DatasetInfo):
    """The DatasetInfo of a dataset prepared here, never one of tfds's catalogue: tfds's lookup of
    pre-computed metadata on its bucket (`initialize_from_bucket`, run whenever a builder is made
    before its data is prepared) has nothing to find for it, and leaves an empty `tmp...tfds`
    folder in the system's temporary directory each time."""

    def initialize_from_bucket(self) -> None:
        return None


class FingerprintedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base of the builders whose prepared data is keyed by their source files; see the module."""

    DISPLAY_NAME = "dataset"  # the dataset's name in errors
    # The configs made so far, one per source key, per subclass: tfds warns about every config it does not know.
    _KNOWN_CONFIGS: dict[str, tfds.core.BuilderConfig] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._KNOWN_CONFIGS = {}

    def __init__(
        self,
        *,
        init_args: Mapping,
        config_name: str | None = None,
        description: str,
        missing: Sequence[str] = (),
        prepared_from: str | None = None,
        **kwargs,
    ):
        """Called by a subclass's `__init__` once it has called `_set_sources` (local files) or
        chosen `config_name` (sources known once fetched), or, where local files are `missing`,
        with the fingerprint of the data they were `prepared_from` (a run's): the copy prepared
        then is read instead, and each split's own files are checked against its record as the
        split is loaded (`check_split_sources`). `init_args` are the subclass's own keyword
        arguments, kept so that tfds can re-create the builder when unpickling it."""
        if "config" in kwargs:
            raise TypeError(f"{type(self).__name__} picks its config from its source files; do not pass config=")
        self._logged = False
        self._notes_said, self._reused_record, self._notes_found_again = False, None, None
        self._missing, self._prepared_from = list(missing), prepared_from
        if self._missing:
            config_name = "files-" + fp.short(prepared_from)
        if config_name is None:
            config_name = "files-" + fp.short(self._fingerprint)
        else:
            self._source_files, self._settings, self._fingerprint = None, None, None
        config = self._KNOWN_CONFIGS.setdefault(
            config_name, tfds.core.BuilderConfig(name=config_name, description=description)
        )
        super().__init__(config=config, **kwargs)
        self._original_state = {**kwargs, **init_args}

    def _set_sources(self, source_files: dict[str, dict], settings: dict | None = None) -> None:
        """The hashed source files (`fp.hash_files`) and the settings the data is prepared with."""
        self._source_files, self._settings = source_files, settings
        self._fingerprint = fp.fingerprint(source_files, settings)

    @classmethod
    def get_builder_config(cls, name, version=None):
        return cls._KNOWN_CONFIGS.get(name) or super().get_builder_config(name, version)

    @property
    def fingerprint(self) -> str | None:
        """`"sha256:<64 hex digits>"` of the source files' names, sizes and contents (and of the
        settings, where they change the prepared data). None for sources not fetched yet, until
        `download_and_prepare()` has fetched (or found) them."""
        return self._fingerprint

    @property
    def downloads(self) -> bool:
        """Whether preparing the data downloads its source files (into `<data_dir>/downloads/<name>/`)."""
        return False

    @property
    def source_files(self) -> dict[str, dict] | None:
        """File name -> {"size", "sha256"} of the source files (None like `fingerprint`)."""
        return None if self._source_files is None else {name: dict(v) for name, v in self._source_files.items()}

    def changes_since(self, fingerprint: str) -> list[str] | None:
        """One phrase per source file (and for the settings) that differs from what the data of
        `fingerprint` was prepared from, read from that preparation's record where data_dir still
        holds it; None where it does not, or while the sources are not known (a download)."""
        if self._source_files is None or not self.builder_config.name.startswith("files-"):
            return None
        then = self.data_path.parent.parent / f"files-{fp.short(fingerprint)}" / self.data_path.name
        record, problem = fp.read_record(then)
        if problem or record["fingerprint"] != fingerprint:
            return None
        old, new = record["files"], self._source_files
        phrases = []
        for name in sorted(set(old) | set(new)):
            named = fp.named_file(name)
            if name not in old:
                phrases.append(f"{named} is new")
            elif name not in new:
                phrases.append(f"{named} is no longer given")
            elif old[name]["size"] != new[name]["size"]:
                phrases.append(f"{named} has {new[name]['size']} bytes, {old[name]['size']} then")
            elif old[name]["sha256"] != new[name]["sha256"]:
                digests = f"sha256 {fp.short(new[name]['sha256'])}, then {fp.short(old[name]['sha256'])}"
                phrases.append(f"{named} has other bytes ({digests})")
        old_settings, new_settings = record.get("settings") or {}, self._settings or {}
        for key in sorted(set(old_settings) | set(new_settings)):
            if old_settings.get(key) != new_settings.get(key):
                value, then = (repr(s[key]) if key in s else "unset" for s in (new_settings, old_settings))
                phrases.append(f"the setting {key} is {value}, {then} then")
        return phrases

    def check_split_sources(self, split: str) -> None:
        """Where files were missing when the builder was made: a DataError unless `split`'s own
        files are there and, once the prepared copy's record is read (`download_and_prepare`),
        the files that copy was prepared from. Nothing to check otherwise: every file was hashed."""
        if not self._missing:
            return
        paths = self._split_paths(split)
        missing = [str(path) for path in paths.values() if not path.is_file()]
        if missing:
            raise DataError(f"{split}: {', '.join(missing)} not found")
        if self._source_files is not None:
            recorded = {name: self._source_files[name] for name in paths if name in self._source_files}
            changed = fp.file_differences(recorded, fp.hash_files(paths))
            if changed:
                raise DataError(
                    f"{split}: its files are not those {self.data_dir} was prepared from: {'; '.join(changed)}"
                )

    # -- what a subclass says about its sources -------------------------------------------------

    def _split_paths(self, split: str) -> dict[str, pathlib.Path]:
        """Fingerprint name -> path of the local files `split` is prepared from (where files can be missing)."""
        raise NotImplementedError

    @abc.abstractmethod
    def _current_source_files(self) -> dict[str, dict] | None:
        """The source files hashed again now; None where they are not local (a download)."""

    @abc.abstractmethod
    def _source_location(self) -> str:
        """Where the source files are, for errors: a folder, or the paths given."""

    @abc.abstractmethod
    def _source_description(self) -> str:
        """Completes "the files ...": e.g. "in /data/raw"."""

    @abc.abstractmethod
    def _sources_summary(self) -> str:
        """The files for the log line, e.g. "12 files {train,val}.{en,de}.gz in /data/raw"."""

    def _preparation_notes(self) -> dict:
        """What preparing the data said of it (JSON-able), recorded with it to be said again by each
        run that reuses it (`_say_again`); nothing by default. Not part of the fingerprint."""
        return {}

    def _say_again(self, notes: dict | None) -> dict | None:
        """Says again what the preparation of the data reused now said of it: `notes`, the
        record's `_preparation_notes`, or None where the record has none (an older jaxformer's).
        Returns the notes it found again from the source files instead, if it did."""
        return None

    def _unfetched_record_problem(self, record: dict) -> str | None:
        """For sources fingerprinted once fetched: what is wrong with a record of them, if anything."""
        return None

    # -- preparing and checking --------------------------------------------------------------------

    def download_and_prepare(self, **kwargs) -> None:
        """Prepares the data unless a complete copy made from the same files is there already.

        A prepared copy whose record is missing or disagrees (other source files, a prepared
        file missing or of another size) is prepared again, with a warning naming why."""
        if self._missing:  # the data cannot be prepared again: the copy prepared from all of them, or nothing
            problem = self._check_prepared() if self.data_path.exists() else f"{self.data_path} is missing"
            if problem is not None:
                raise DataError(
                    f"{', '.join(self._missing)} not found, and no usable copy of the data prepared from them "
                    f"is left ({problem}): restore the files"
                )
            super().download_and_prepare(**kwargs)  # reuses it
            self._say_notes_again_once()
            self._log_once()
            return
        download_config = kwargs.get("download_config") or tfds.download.DownloadConfig()
        mode = download_config.download_mode
        if mode == tfds.download.GenerateMode.UPDATE_DATASET_INFO:
            super().download_and_prepare(**kwargs)
            return
        if self.data_path.exists() and not mode.overwrite_dataset:
            problem = self._check_prepared()
            if problem is None:
                super().download_and_prepare(**kwargs)  # reuses it
                self._say_notes_again_once()
                self._log_once()
                return
            logger.warning(
                "%s: not using the prepared data in %s: %s; preparing it again", self.name, self.data_dir, problem
            )
            kwargs["download_config"] = dataclasses.replace(
                download_config, download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS
            )
        try:
            super().download_and_prepare(**kwargs)
        except FileExistsError:  # tfds's last step, renaming its copy into place, found another there
            self._use_a_copy_prepared_meanwhile()
            return
        current = self._current_source_files()
        if current is not None:  # the files must not have changed under the preparation
            changed = fp.file_differences(self._source_files, current)
            if changed:
                raise DataError(
                    f"{self._source_location()}: files changed while {self.DISPLAY_NAME} was prepared from them: "
                    f"{'; '.join(changed)}; run again"
                )
        record = {
            "dataset": self.name,
            "config": self.builder_config.name,
            "fingerprint": self._fingerprint,
            "source": self._source_description(),
            "files": self._source_files,
        }
        if self._settings is not None:
            record["settings"] = self._settings
        notes = self._preparation_notes()
        if notes:
            record["notes"] = notes
        fp.write_record(self.data_path, record)
        self._notes_said = True  # by the preparation, as it made them: not again by this builder
        self._log_once()

    def _use_a_copy_prepared_meanwhile(self) -> None:
        """After another process (a run on the same data_dir) prepared the same data while this
        one did: its copy where it is complete and from the same files, else a DataError."""
        problem = self._check_prepared()
        if problem is not None:
            raise DataError(
                f"another process prepared {self.data_dir} while this one did, and it is not usable ({problem}); "
                "run again"
            )
        logger.info("%s: another process prepared %s meanwhile; using its copy", self.name, self.data_dir)
        self._notes_said = True  # this one's preparation said them, from the same files
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
        if self._missing and record["fingerprint"] != self._prepared_from:
            return f"{record_path} records the fingerprint {record['fingerprint']}, not {self._prepared_from}"
        if self._source_files is not None:
            changed = fp.file_differences(record["files"], self._source_files)
            if changed:
                return (
                    f"{record_path} records other files than those {self._source_description()}: {'; '.join(changed)}"
                )
            if record.get("settings") != self._settings:
                return f"{record_path} records the settings {record.get('settings')}, not {self._settings}"
        else:
            problem = self._unfetched_record_problem(record)
            if problem:
                return f"{record_path} {problem}"
        changed = fp.prepared_differences(self.data_path, record)
        if changed:
            return "; ".join(changed)
        if self._source_files is None:
            self._source_files, self._fingerprint = record["files"], record["fingerprint"]
            self._settings = record.get("settings")
        self._reused_record = record
        return None

    def _say_notes_again_once(self) -> None:
        """`_say_again` with the notes of the record of the data reused, once per builder (each
        split loaded reuses the data anew), and not by the builder that prepared it."""
        if not self._notes_said:
            self._notes_said = True
            notes = self._reused_record.get("notes")
            found = self._say_again(notes if isinstance(notes, dict) else None)
            if found and "notes" not in self._reused_record:  # notes it has, whatever they hold, are its own
                self._notes_found_again = (self._reused_record, found)

    def record_notes_found_again(self, lock) -> None:
        """After `download_and_prepare` reused data whose record, an older jaxformer's, has no notes
        and found them again from the files: adds them to the record, so that later runs read them
        there. Only while `lock` (the config's PreparationLock, held shared) is this process's
        alone, so that no other prepares the data or writes its record meanwhile, and only where
        the record is still the one checked. A record that cannot be written (a read-only folder,
        a full disk) stays as it is: the notes are found again from the files at each start."""
        if self._notes_found_again is None:
            return
        (checked, notes), self._notes_found_again = self._notes_found_again, None
        with lock.alone_meanwhile() as alone:
            if not alone:  # another process reuses or prepares it: left for a later start
                return
            if fp.read_record(self.data_path)[0] != checked:
                return  # prepared again, or noted, since it was checked
            try:
                path = fp.add_notes(self.data_path, checked, notes)
            except OSError as error:
                logger.info(
                    "%s: cannot add to %s what its preparation now notes (%s): the files are read again for it "
                    "at each start",
                    self.name,
                    self.data_path / fp.RECORD_NAME,
                    error.strerror or error,
                )
                return
        logger.info(
            "%s: added to %s, an older jaxformer's record, what its preparation now notes (found again from "
            "the files): later starts read it there instead of the files",
            self.name,
            path,
        )

    def _log_once(self) -> None:
        if not self._logged:
            self._logged = True
            logger.info(
                "%s: fingerprint %s of %s; prepared data in %s",
                self.name,
                self._fingerprint,
                self._sources_summary(),
                self.data_dir,
            )
