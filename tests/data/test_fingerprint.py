import hashlib
import json

from jaxformer.data import fingerprint


def write(directory, files):
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return {name: directory / name for name in files}


def test_hash_file_is_size_and_sha256(tmp_path):
    data = b"x" * (3 << 20) + b"tail"  # more than one read chunk
    (tmp_path / "f").write_bytes(data)
    assert fingerprint.hash_file(tmp_path / "f") == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_fingerprint_follows_names_and_bytes_not_folders(tmp_path):
    files = {"a.gz": b"one", "b.gz": b"two"}
    here = fingerprint.fingerprint(fingerprint.hash_files(write(tmp_path / "here", files)))
    there = fingerprint.fingerprint(fingerprint.hash_files(write(tmp_path / "there", files)))
    assert here == there and here.startswith("sha256:") and len(here) == len("sha256:") + 64
    same_size = fingerprint.fingerprint(
        fingerprint.hash_files(write(tmp_path / "edit", {"a.gz": b"onE", "b.gz": b"two"}))
    )
    renamed = fingerprint.fingerprint(
        fingerprint.hash_files(write(tmp_path / "renamed", {"a.gz": b"one", "c.gz": b"two"}))
    )
    assert len({here, same_size, renamed}) == 3
    assert fingerprint.short(here) == here[7:19]


def test_file_differences_name_the_files(tmp_path):
    old = fingerprint.hash_files(write(tmp_path / "old", {"a": b"one", "b": b"two", "c": b"3"}))
    new = fingerprint.hash_files(write(tmp_path / "new", {"a": b"one", "b": b"twO", "d": b"4"}))
    phrases = fingerprint.file_differences(old, new)
    assert phrases == [
        f"b (sha256 {old['b']['sha256'][:12]} there, {new['b']['sha256'][:12]} here)",
        "c (recorded, not among the files now)",
        "d (not recorded)",
    ]
    new["a"] = {"size": 4, "sha256": old["a"]["sha256"]}
    assert fingerprint.file_differences(old, new)[0] == "a (3 bytes there, 4 here)"
    assert fingerprint.file_differences(old, old) == []


def test_file_differences_name_a_splits_file_once(tmp_path):
    """A data.files source's name in the fingerprint ("train.fr: train.fr", its role then its file)
    is said as its split, side and file, each once: "the train.fr file train.fr" read as two files."""
    old = {"train.fr: train.fr": {"size": 3, "sha256": "a" * 64}, "test: test.tsv": {"size": 5, "sha256": "b" * 64}}
    new = {"train.fr: train.fr": {"size": 3, "sha256": "c" * 64}, "validation: dev.tsv": {"size": 1, "sha256": "d"}}
    assert fingerprint.file_differences(old, new) == [
        "the test split's file test.tsv (recorded, not among the files now)",
        "the train split's fr file train.fr (sha256 aaaaaaaaaaaa there, cccccccccccc here)",
        "the validation split's file dev.tsv (not recorded)",
    ]


def test_record_round_trip_and_what_makes_it_unusable(tmp_path):
    prepared = tmp_path / "prepared"
    write(prepared, {"shard-0": b"12345", "dataset_info.json": b"{}"})
    files = {"a": {"size": 1, "sha256": "ab"}}
    path = fingerprint.write_record(
        prepared, {"config": "files-x", "fingerprint": fingerprint.fingerprint(files), "files": files}
    )
    assert path.name == fingerprint.RECORD_NAME and not path.with_name(path.name + ".tmp").exists()
    record, problem = fingerprint.read_record(prepared)
    assert problem is None
    assert record["prepared_files"] == {"dataset_info.json": 2, "shard-0": 5} and record["files"] == files
    assert fingerprint.prepared_differences(prepared, record) == []

    (prepared / "shard-0").write_bytes(b"123")
    assert fingerprint.prepared_differences(prepared, record) == [f"{prepared / 'shard-0'} has 3 bytes, recorded 5"]
    (prepared / "shard-0").unlink()
    assert fingerprint.prepared_differences(prepared, record) == [f"{prepared / 'shard-0'} is missing"]

    def problem_after(text):
        path.write_text(text)
        return fingerprint.read_record(prepared)

    assert problem_after("{not json")[0] is None and "cannot be read" in problem_after("{not json")[1]
    assert "format-1" in problem_after(json.dumps({"format": 2}))[1]
    assert "incomplete" in problem_after(json.dumps({"format": 1, "files": files}))[1]
    forged = {**record, "fingerprint": "sha256:" + "0" * 64}
    assert "does not match its own file list" in problem_after(json.dumps(forged))[1]
    path.unlink()
    assert fingerprint.read_record(prepared) == (
        None,
        f"{path} is missing (preparation unfinished, or made by an older jaxformer)",
    )
