"""Writing an output never destroys a file it was not asked to write, keeps a symbolic link a link,
writes into a pipe or a device instead of replacing it, and leaves no temporary behind; and an
input that is a pipe (`--input <(...)`, /dev/stdin) is accepted and read once."""

import os
import pathlib
import socket
import stat
import subprocess
import sys

import pytest

from jaxformer.commands import evaluate, translate
from jaxformer.commands.common import FlagError
from jaxformer.commands.path_checks import check_readable_file, check_writable_file
from jaxformer.files import open_descriptor, write_text_atomically

ROOT = pathlib.Path(__file__).parents[1]


@pytest.fixture
def pipe():
    """(read end, write end) of an OS pipe, as a shell's process substitution hands one over."""
    ends = os.pipe()
    yield ends
    for end in ends:
        try:
            os.close(end)
        except OSError:  # closed by the test already
            pass


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_users_file_named_like_a_temporary_is_never_touched(tmp_path):
    precious = tmp_path / "precious.de.tmp"
    precious.write_text("the user's own\n")
    write_text_atomically(tmp_path / "precious.de", "translated\n")
    assert precious.read_text() == "the user's own\n"
    assert (tmp_path / "precious.de").read_text() == "translated\n"
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["precious.de", "precious.de.tmp"]


@pytest.mark.parametrize("interruption", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(interruption, tmp_path, monkeypatch):
    output = tmp_path / "out.de"
    output.write_text("old\n")

    def fail(*args, **kwargs):
        raise interruption

    monkeypatch.setattr(os, "replace", fail)
    monkeypatch.setattr(pathlib.Path, "replace", fail)
    with pytest.raises(type(interruption)):
        write_text_atomically(output, "new\n")
    assert output.read_text() == "old\n"
    assert [entry.name for entry in tmp_path.iterdir()] == ["out.de"]


def test_a_replaced_file_keeps_its_permissions_and_a_new_one_gets_the_umasks(tmp_path):
    shared = tmp_path / "shared.de"
    shared.write_text("old\n")
    shared.chmod(0o640)
    write_text_atomically(shared, "new\n")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o640
    write_text_atomically(tmp_path / "fresh.de", "new\n")
    assert stat.S_IMODE((tmp_path / "fresh.de").stat().st_mode) == 0o666 & ~current_umask()


def test_a_symbolic_link_stays_a_link_and_its_target_gets_the_text(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere" / "real.de"
    target.write_text("old\n")
    link = tmp_path / "link.de"
    link.symlink_to(target)
    check_writable_file(str(link), "--output", overwrite=True)
    write_text_atomically(link, "new\n")
    assert link.is_symlink() and link.resolve() == target
    assert target.read_text() == "new\n"
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["elsewhere", "link.de"]
    assert [entry.name for entry in target.parent.iterdir()] == ["real.de"]


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "named.pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader waits, so the writer does not block
    try:
        check_writable_file(str(fifo), "--output", overwrite=True)
        write_text_atomically(fifo, "through the pipe\n")
        try:
            received = os.read(reader, 1000)
        except BlockingIOError:  # nothing was written into the FIFO
            received = b""
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert received == b"through the pipe\n"
    assert [entry.name for entry in tmp_path.iterdir()] == ["named.pipe"]


def test_dev_stdout_as_a_pipe_is_accepted_and_written_into(pipe):
    """`--output /dev/stdout --overwrite` with stdout a pipe: /dev/fd/N stands for it (a link to
    "pipe:[...]" in /proc, a folder no file can be created in, even by root)."""
    read_end, write_end = pipe
    check_writable_file(f"/dev/fd/{write_end}", "--output", overwrite=True)
    write_text_atomically(f"/dev/fd/{write_end}", "to stdout\n")
    os.close(write_end)
    assert os.read(read_end, 1000) == b"to stdout\n"


def test_a_character_device_is_written_into_not_replaced(tmp_path):
    # Through a link of our own: were /dev/null replaced by a file, the damage stays in tmp_path.
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    write_text_atomically(link, "discarded\n")
    assert link.is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert [entry.name for entry in tmp_path.iterdir()] == ["null"]


def test_a_fifo_or_device_needs_no_overwrite_a_file_does_and_a_socket_is_refused(tmp_path):
    fifo = tmp_path / "named.pipe"
    os.mkfifo(fifo)
    check_writable_file(str(fifo), "--output")  # written into, as the shell's `>` does: nothing replaced
    check_writable_file("/dev/null", "--output")
    (tmp_path / "kept.txt").write_text("mine\n")
    with pytest.raises(FlagError, match=r"kept.txt: already exists; pass --overwrite to replace it$"):
        check_writable_file(str(tmp_path / "kept.txt"), "--output")
    (tmp_path / "link.txt").symlink_to(tmp_path / "kept.txt")  # a link to a file: that file would be replaced
    with pytest.raises(FlagError, match=r"link.txt: already exists; pass --overwrite to replace it$"):
        check_writable_file(str(tmp_path / "link.txt"), "--output")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "sock"))
        with pytest.raises(FlagError, match=r"sock: is a socket, which cannot be written as a file$"):
            check_writable_file(str(tmp_path / "sock"), "--output", overwrite=True)


def test_pipes_and_fifos_are_readable_inputs(tmp_path, pipe):
    read_end, _ = pipe
    check_readable_file(f"/dev/fd/{read_end}", "--input")  # what bash's <(...) hands over
    check_readable_file("/dev/stdin", "--input")
    os.mkfifo(tmp_path / "named.pipe")
    check_readable_file(str(tmp_path / "named.pipe"), "--input")


def test_unreadable_inputs_are_still_named(tmp_path):
    with pytest.raises(FlagError, match=r"^--input .*missing: no such file$"):
        check_readable_file(str(tmp_path / "missing"), "--input")
    with pytest.raises(FlagError, match=r"^--input .*: is a directory, not a file$"):
        check_readable_file(str(tmp_path), "--input")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(FlagError, match=r"^--input .*dangling: a symbolic link to .*gone, which does not exist$"):
        check_readable_file(str(tmp_path / "dangling"), "--input")


class UpperCaseTranslator:
    def translate(self, sentences, progress):
        return [sentence.upper() for sentence in sentences]


def test_translate_reads_a_process_substitution_once(tmp_path, pipe, monkeypatch, capsys):
    read_end, write_end = pipe
    os.write(write_end, b"a dog.\na cat.\n")
    os.close(write_end)
    monkeypatch.setattr(translate, "translator_from_flags", lambda args: UpperCaseTranslator())
    output = tmp_path / "out.de"
    flags = ["--workdir", str(tmp_path), "--input", f"/dev/fd/{read_end}", "--output", str(output)]
    assert translate.main(flags) == 0, capsys.readouterr().err
    assert output.read_text() == "A DOG.\nA CAT.\n"


class ReachedTranslation(Exception):
    """Raised where evaluate would load its model: it read both inputs without an error."""


def test_evaluate_reads_process_substitutions(decoding_workdir, monkeypatch):
    # A real run's workdir: evaluate encodes the pairs with its tokenizers before translating.
    sources, references = os.pipe(), os.pipe()
    try:
        for (_, write_end), text in ((sources, b"a dog.\n"), (references, b"ein Hund.\n")):
            os.write(write_end, text)
            os.close(write_end)

        def reached(*args, **kwargs):
            raise ReachedTranslation

        monkeypatch.setattr(evaluate, "translator_from_flags", reached)
        flags = ["--workdir", str(decoding_workdir), "--source", f"/dev/fd/{sources[0]}"]
        with pytest.raises(ReachedTranslation):
            evaluate.main([*flags, "--reference", f"/dev/fd/{references[0]}"])
    finally:
        os.close(sources[0])
        os.close(references[0])


def test_dev_stdout_redirected_to_a_file_is_written_through_the_descriptor(tmp_path):
    """`cmd --output /dev/stdout >> log`: the log keeps what was in it and what the process
    printed first; opened by name the file would be truncated, or renamed over."""
    log = tmp_path / "log.txt"
    log.write_text("header\n")
    program = (
        "import sys; from jaxformer.files import write_text_atomically; "
        "print('printed first'); write_text_atomically('/dev/stdout', 'written\\n'); print('printed after')"
    )
    with open(log, "a") as appended:
        subprocess.run([sys.executable, "-c", program], stdout=appended, check=True, cwd=ROOT)
    assert log.read_text() == "header\nprinted first\nwritten\nprinted after\n"
    assert open_descriptor("/dev/stdout") == 1 and open_descriptor("/dev/fd/7") == 7
    assert open_descriptor(tmp_path / "out.txt") is None
    check_writable_file("/dev/stdout", "--output")  # no --overwrite: nothing is replaced
