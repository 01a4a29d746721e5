"""Fingerprints of the raw files a dataset is prepared from, and the record of them kept with the
prepared data.

A fingerprint is `"sha256:<64 hex digits>"`, the SHA-256 of a canonical JSON list of
`[name, size, sha256 of the bytes]` for every file, sorted by name. File names count, the folder
they lie in does not: the same files copied elsewhere give the same fingerprint (and share one
prepared copy), while any changed byte gives another one. Settings that change what is prepared
from the same files (languages, a held-out slice and its seed) can be fingerprinted with them.

The record (`RECORD_NAME`, JSON, in the prepared data's directory) is written last, after the data,
so it also marks a finished preparation: a directory without one is unfinished. It holds the
fingerprint, each source file's size and hash, the settings (if any), and the size and hash of
every prepared file: a prepared file cut short or with other bytes (a disk's damage) is found
before it is read. Records written before the hashes were kept check the sizes alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Mapping

from jaxformer.files import write_text_atomically

RECORD_NAME = "jaxformer_sources.json"
RECORD_FORMAT = 1
_CHUNK = 1 << 20


def hash_file(path: str | os.PathLike) -> dict:
    """{"size": bytes, "sha256": hex digest} of a file's bytes."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def hash_files(paths: Mapping[str, str | os.PathLike]) -> dict[str, dict]:
    """name -> {"size", "sha256"} for each named file."""
    return {name: hash_file(path) for name, path in sorted(paths.items())}


def fingerprint(files: Mapping[str, Mapping], settings: Mapping | None = None) -> str:
    """`"sha256:<hex>"` of the files' names, sizes and hashes (as `hash_files` gives them) and of
    the JSON-able `settings` the data is prepared with (None: the files alone)."""
    canonical: list | dict = [[name, int(files[name]["size"]), str(files[name]["sha256"])] for name in sorted(files)]
    if settings is not None:
        canonical = {"files": canonical, "settings": settings}
    text = json.dumps(canonical, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


def short(value: str, length: int = 12) -> str:
    """The first `length` hex digits of a fingerprint or digest: a name for a directory."""
    return value.split(":", 1)[-1][:length]


def named_file(name: str) -> str:
    """A source file's name in the fingerprint as a phrase naming its split and file once:
    "train.fr: train.fr.gz" (the file of train's fr side) -> "the train split's fr file
    train.fr.gz", "test: test.tsv" -> "the test split's file test.tsv"; a name without a role
    (a downloaded file's) as it is."""
    role, _, file = name.rpartition(": ")
    if not role:
        return name
    split, _, language = role.partition(".")
    return f"the {split} split's {language + ' ' if language else ''}file {file}"


def file_differences(recorded: Mapping[str, Mapping], current: Mapping[str, Mapping]) -> list[str]:
    """One phrase per file that differs between two `hash_files` results, e.g.
    "the train split's en file train.en.gz (sha256 1a2b3c4d5e6f there, 0f9e8d7c6b5a here)"."""
    phrases = []
    for key in sorted(set(recorded) | set(current)):
        old, new, name = recorded.get(key), current.get(key), named_file(key)
        if old is None:
            phrases.append(f"{name} (not recorded)")
        elif new is None:
            phrases.append(f"{name} (recorded, not among the files now)")
        elif old.get("size") != new["size"]:
            phrases.append(f"{name} ({old.get('size')} bytes there, {new['size']} here)")
        elif old.get("sha256") != new["sha256"]:
            phrases.append(f"{name} (sha256 {short(str(old.get('sha256')))} there, {short(new['sha256'])} here)")
    return phrases


def directory_sizes(directory: str | os.PathLike) -> dict[str, int]:
    """Relative path -> size of every file under `directory`, the record (and its temporary) left out."""
    directory = pathlib.Path(directory)
    return {
        path.relative_to(directory).as_posix(): path.stat().st_size
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.name.startswith(RECORD_NAME)
    }


def write_record(directory: str | os.PathLike, record: Mapping) -> pathlib.Path:
    """Writes `record` (plus the sizes and SHA-256 of the files now in `directory`) atomically as RECORD_NAME."""
    directory = pathlib.Path(directory)
    sizes = directory_sizes(directory)
    hashes = {name: hash_file(directory / name)["sha256"] for name in sizes}
    payload = {"format": RECORD_FORMAT, **record, "prepared_files": sizes, "prepared_sha256": hashes}
    path = directory / RECORD_NAME
    write_text_atomically(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return path


def add_notes(directory: str | os.PathLike, record: Mapping, notes: Mapping) -> pathlib.Path:
    """Writes `record`, as `read_record` read it from `directory`, again with `notes` (what its
    preparation said of the data, outside the fingerprint) added, atomically as RECORD_NAME: the
    sizes and hashes of the prepared files are those recorded, not taken again."""
    path = pathlib.Path(directory) / RECORD_NAME
    write_text_atomically(path, json.dumps({**record, "notes": dict(notes)}, indent=1, sort_keys=True) + "\n")
    return path


def read_record(directory: str | os.PathLike) -> tuple[dict | None, str | None]:
    """(record, None), or (None, why not) when RECORD_NAME is missing, unreadable or malformed."""
    path = pathlib.Path(directory) / RECORD_NAME
    if not path.exists():
        return None, f"{path} is missing (preparation unfinished, or made by an older jaxformer)"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"{path} cannot be read ({error})"
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        return None, f"{path} is not a format-{RECORD_FORMAT} record"
    files, prepared = record.get("files"), record.get("prepared_files")
    if (
        not isinstance(files, dict)
        or not all(isinstance(v, dict) and {"size", "sha256"} <= set(v) for v in files.values())
        or not isinstance(prepared, dict)
        or not isinstance(record.get("prepared_sha256", {}), dict)
        or not isinstance(record.get("fingerprint"), str)
        or not isinstance(record.get("settings"), (dict, type(None)))
    ):
        return None, f"{path} is incomplete"
    if fingerprint(files, record.get("settings")) != record["fingerprint"]:
        return None, f"{path}: its fingerprint does not match its own file list"
    return record, None


def prepared_differences(directory: str | os.PathLike, record: Mapping) -> list[str]:
    """One phrase per prepared file named in `record` that is missing, or has another size or
    (where the record keeps them) other bytes now."""
    directory = pathlib.Path(directory)
    hashes = record.get("prepared_sha256")
    if hashes is None:  # a record of an older jaxformer, sizes only: its files' bytes cannot be checked
        return [f"{directory / RECORD_NAME} records no SHA-256 of the prepared files (an older jaxformer's)"]
    phrases = []
    for name, size in sorted(record["prepared_files"].items()):
        path = directory / name
        if not path.is_file():
            phrases.append(f"{path} is missing")
        elif path.stat().st_size != size:
            phrases.append(f"{path} has {path.stat().st_size} bytes, recorded {size}")
        elif name in hashes and (now := hash_file(path)["sha256"]) != hashes[name]:
            phrases.append(
                f"{path} has other bytes than recorded (sha256 {short(now)}, recorded {short(hashes[name])})"
            )
    return phrases
