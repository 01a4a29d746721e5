"""Every command checks its flags and output paths first: one line naming the flag, exit 2,
nothing decoded or written (jaxformer-train's config values and launch flags: test_train_flags.py)."""

import os
import pathlib
import sys

import pytest

from jaxformer.commands import average_checkpoints, evaluate, generate, translate


@pytest.fixture
def no_decoding(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the command started decoding before checking its flags")

    monkeypatch.setattr(translate, "translator_from_flags", refuse)
    monkeypatch.setattr(evaluate, "translator_from_flags", refuse)
    monkeypatch.setattr(evaluate, "split_pairs", refuse)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max_source_tokens", "0"], "argument --max_source_tokens: must be an integer from 2 to 4096, got 0"),
        # Not one long line searched over its whole length: the sinusoidal positions have no last one.
        (
            ["--max_source_tokens", "100000000000000000000"],
            "argument --max_source_tokens: must be an integer from 2 to 4096, got 100000000000000000000",
        ),
        (["--batch_size", "0"], "argument --batch_size: must be an integer >= 1, got 0"),
        (["--batch_size", "many"], "argument --batch_size: must be an integer >= 1, got 'many'"),
        (["--beam_size", "-1"], "argument --beam_size: must be an integer >= 1, got -1"),
        (["--max_extra_length", "0"], "argument --max_extra_length: must be an integer from 1 to 4096, got 0"),
        # Not the late out-of-memory error of a position table and token buffers of 10**9 rows.
        (
            ["--max_extra_length", "1000000000"],
            "argument --max_extra_length: must be an integer from 1 to 4096, got 1000000000",
        ),
        (["--temperature", "0"], "argument --temperature: must be a finite number > 0 that float32 holds"),
        (  # finite, but cast to float32's inf (with numpy's overflow warning) it samples every token alike
            ["--temperature", "1e39"],
            "argument --temperature: must be a finite number > 0 that float32 holds (at most 3.4028235e+38), got 1e39",
        ),
        (["--alpha", "nan"], "argument --alpha: must be a finite number from 0 to 4 (above it the length penalty"),
        (  # finite, but its float32 length penalty would be inf and every hypothesis rank alike
            ["--alpha", "1e39"],
            "argument --alpha: must be a finite number from 0 to 4 (above it the length penalty overflows float32 on a "
            "hypothesis of up to 2**31 - 1 tokens, the longest the search counts, and every hypothesis ranks alike), "
            "got 1e39;",
        ),
        (["--alpha", "4.0001"], "argument --alpha: must be a finite number from 0 to 4 (above it"),
        (["--top_k", "-3"], "argument --top_k: must be an integer >= 0, got -3"),
        (
            ["--checkpoint", "newest"],
            "argument --checkpoint: must be latest, best, averaged, final or a step number, got 'newest'",
        ),
        (["--method", "beams"], "argument --method: invalid choice: 'beams'"),
        (
            ["--renormalize_after_bans", "yes"],
            "argument --renormalize_after_bans: must be true or false, got 'yes'",
        ),
    ],
)
@pytest.mark.parametrize("command", [translate, evaluate])
def test_bad_decoding_flags_are_one_line(command, flags, message, tmp_path, capsys, no_decoding):
    extra = ["--split", "validation"] if command is evaluate else []
    with pytest.raises(SystemExit) as stopped:
        command.main(["--workdir", str(tmp_path), *extra, *flags])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {message}") and error.count("\n") == 1, error


def test_exports_max_source_tokens_has_translates_bound(tmp_path, capsys):
    """The longest source an export's program takes: 10**20 was taken, and its program would be
    lowered for rows of that many tokens."""
    from jaxformer.commands import export

    with pytest.raises(SystemExit) as stopped:
        export.main(["--workdir", str(tmp_path), "--output", str(tmp_path / "out"), "--max_source_tokens", "10" * 10])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("error: argument --max_source_tokens: must be an integer from 2 to 4096, got 1010101010")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [translate, evaluate])
def test_one_search_flags_under_another_search_are_refused(command, tmp_path, capsys, no_decoding):
    extra = ["--split", "validation"] if command is evaluate else []
    for flags, message in (
        (["--top_k", "5"], "--top_k 5 applies to --method sample, not beam"),
        (["--method", "greedy", "--temperature", "0.5"], "--temperature 0.5 applies to --method sample, not greedy"),
        (["--method", "greedy", "--beam_size", "8"], "--beam_size 8 applies to --method beam, not greedy"),
        (["--method", "sample", "--alpha", "2"], "--alpha 2.0 applies to --method beam, not sample"),
        (["--method", "greedy", "--stop", "exact"], "--stop exact applies to --method beam, not greedy"),
        (
            ["--method", "sample", "--length_penalty", "transformers"],
            "--length_penalty transformers applies to --method beam, not sample",
        ),
    ):
        assert command.main(["--workdir", str(tmp_path), *extra, *flags]) == 2
        assert capsys.readouterr().err == f"error: {message}\n"


def test_paths_are_never_empty(capsys):
    from jaxformer.commands import convert

    for command, argv in (
        (average_checkpoints, ["--workdir", ""]),
        (convert, ["--from_hf", "hf", "--output", ""]),
        (convert, ["--to_hf", "", "--output", "out"]),
    ):
        with pytest.raises(SystemExit) as stopped:
            command.main(argv)
        assert stopped.value.code == 2
        assert "must be a path, got an empty one" in capsys.readouterr().err, argv


def test_an_empty_split_is_refused_as_such(tmp_path, capsys, no_decoding):
    """`--split ''` said "give either --split, or both --source and --reference", and beside them
    was ignored: evaluate scored the files."""
    pathlib.Path(tmp_path / "in.en").write_text("A dog.\n")
    files = ["--source", str(tmp_path / "in.en"), "--reference", str(tmp_path / "in.en")]
    for flags in ([], files):
        with pytest.raises(SystemExit) as stopped:
            evaluate.main(["--workdir", str(tmp_path), "--split", "", *flags])
        assert stopped.value.code == 2
        assert capsys.readouterr().err.startswith("error: argument --split: must be a split's name, got an empty one")


# Each command that reads and writes files: its file flags ({flag: a file in the test's folder}),
# the flags it writes and those it reads.
FILE_COMMANDS = (
    (translate, {"--input": "in.en"}, ("--output",), ("--input",)),
    (generate, {"--input": "in.en"}, ("--output",), ("--input",)),
    (evaluate, {"--source": "in.en", "--reference": "in.en"}, ("--output", "--json"), ("--source", "--reference")),
)


@pytest.fixture
def in_a_folder_with_a_file(tmp_path, monkeypatch):
    """The test's folder, current, holding in.en and the file f."""
    monkeypatch.chdir(tmp_path)
    pathlib.Path("in.en").write_text("A dog.\n")
    pathlib.Path("f").write_text("kept\n")
    return tmp_path


def argv(folder, files: dict[str, str], *extra: str) -> list[str]:
    return ["--workdir", str(folder), *[part for flag in files.items() for part in flag], *extra]


def test_output_paths_that_cannot_be_files_say_why(in_a_folder_with_a_file, capsys, no_decoding):
    """`--output ""` said "--output : is a directory", and `--output f/x.de`, with f a file, that
    the folder f does not exist."""
    folder = in_a_folder_with_a_file
    for command, files, outputs, inputs in FILE_COMMANDS:
        for flag in (*outputs, *inputs):
            with pytest.raises(SystemExit) as stopped:
                command.main(argv(folder, files | {flag: ""}))
            assert stopped.value.code == 2
            assert capsys.readouterr().err.startswith(f"error: argument {flag}: must be a path, got an empty one")
        for flag in outputs:
            assert command.main(argv(folder, files, flag, "f/x.de")) == 2
            assert capsys.readouterr().err == f"error: {flag} f/x.de: {folder / 'f'} is a file, not a folder\n"


def test_a_path_ending_as_a_folders_is_refused_not_written_or_read_as_the_file_before_it(
    in_a_folder_with_a_file, capsys, no_decoding
):
    """`--output out/` wrote a file named out, and `--output f/ --overwrite`, with f a file, replaced
    f, where the shell's `> f/` refuses: pathlib drops a trailing separator (and a last `.`)."""
    folder = in_a_folder_with_a_file
    for command, files, outputs, inputs in FILE_COMMANDS:
        for flag in (*outputs, *inputs):  # an input "f/" was "no such file", f being there
            for path, ending in (("out/", "/"), ("f/", "/"), ("out/.", "/."), ("/dev/stdout/", "/")):
                assert command.main(argv(folder, files | {flag: path}, "--overwrite")) == 2, (flag, path)
                message = f"error: {flag} {path}: ends in {ending!r}, as a folder's path does; give a file's path\n"
                assert capsys.readouterr().err == message
    assert sorted(entry.name for entry in folder.iterdir()) == ["f", "in.en"]
    assert pathlib.Path("f").read_text() == "kept\n"


def test_a_dash_is_refused_as_a_path_not_read_or_written_as_a_file_named_dash(
    in_a_folder_with_a_file, capsys, no_decoding
):
    """`--output -` wrote a file named - into the current folder, nothing on stdout, and `--input -`
    said "no such file" (or read a file named -): many programs take - for stdin or stdout."""
    folder = in_a_folder_with_a_file
    for command, files, outputs, inputs in FILE_COMMANDS:
        for flag, stream in [*((flag, "stdout") for flag in outputs), *((flag, "stdin") for flag in inputs)]:
            assert command.main(argv(folder, files | {flag: "-"}, "--overwrite")) == 2
            expected = (
                f"error: {flag} -: is no {stream} here; give /dev/{stream} for {stream}, or ./- for a file named -\n"
            )
            assert capsys.readouterr().err == expected
    assert sorted(entry.name for entry in folder.iterdir()) == ["f", "in.en"]


def test_a_loop_of_symbolic_links_is_refused_before_any_work(in_a_folder_with_a_file, capsys, no_decoding):
    """An --output through links that lead back to themselves passed the checks, and its write
    failed after the decoding in a traceback (OSError: [Errno 40] Too many levels of symbolic
    links); an --input said it linked to a file that does not exist."""
    folder = in_a_folder_with_a_file
    pathlib.Path("loop1").symlink_to("loop2")
    pathlib.Path("loop2").symlink_to("loop1")
    for command, files, outputs, inputs in FILE_COMMANDS:
        for flag in (*outputs, *inputs):
            for path in ("loop1", "loop2/x"):
                assert command.main(argv(folder, files | {flag: path}, "--overwrite")) == 2, (flag, path)
                message = f"error: {flag} {path}: its symbolic links form a loop, so it names no file\n"
                assert capsys.readouterr().err == message


def test_a_name_longer_than_the_file_system_takes_is_refused_in_one_line(in_a_folder_with_a_file, capsys, no_decoding):
    """An --output of 256 bytes (most file systems take 255) was a traceback (OSError: [Errno 36]
    File name too long), and one of 245 "cannot write in .": the name fits, its temporary does not."""
    folder = in_a_folder_with_a_file
    for command, files, outputs, inputs in FILE_COMMANDS:
        for flag in (*outputs, *inputs):
            path = "a" * 256
            assert command.main(argv(folder, files | {flag: path}, "--overwrite")) == 2, flag
            assert (
                capsys.readouterr().err
                == f"error: {flag} {path}: longer than its file system takes (File name too long)\n"
            )
        for flag in outputs:
            path = "a" * 245
            assert command.main(argv(folder, files | {flag: path}, "--overwrite")) == 2, flag
            assert capsys.readouterr().err == (
                f"error: {flag} {path}: its name is too long to write: it is written as .<name>.<8 characters>.tmp "
                "first, longer than its file system takes (File name too long); give a shorter name\n"
            )
    assert sorted(entry.name for entry in folder.iterdir()) == ["f", "in.en"]


def test_generate_refuses_one_search_flags_under_another(tmp_path, capsys, no_decoding):
    for flags, message in (
        (["--seed", "3"], "--seed 3 applies to --method sample, not greedy"),
        (["--beam_size", "8"], "--beam_size 8 applies to --method beam, not greedy"),
        (["--method", "beam", "--top_k", "5"], "--top_k 5 applies to --method sample, not beam"),
    ):
        assert generate.main(["--workdir", str(tmp_path), *flags]) == 2
        assert capsys.readouterr().err == f"error: {message}\n"


def test_generate_bounds_the_tokens_it_adds(tmp_path, capsys, no_decoding):
    with pytest.raises(SystemExit) as stopped:
        generate.main(["--workdir", str(tmp_path), "--max_new_tokens", "1000000000"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith(
        "error: argument --max_new_tokens: must be an integer from 1 to 4096, got 1000000000; see "
    )


def test_seeds_that_jax_would_take_for_others_or_overflow_on_are_refused(tmp_path, capsys, no_decoding):
    import jax

    # Why: jax.random.key keeps a seed's low 32 bits, and a seed of 64 bits or more overflows.
    assert (jax.random.key_data(jax.random.key(2**32)) == jax.random.key_data(jax.random.key(0))).all()
    with pytest.raises(OverflowError):
        jax.random.key(2**64)
    largest = 2**32 - 1
    assert (jax.random.key_data(jax.random.key(largest)) != jax.random.key_data(jax.random.key(0))).any()
    for command, extra in ((translate, []), (evaluate, ["--split", "validation"]), (generate, [])):
        assert command.build_parser().parse_args(["--workdir", "w", "--seed", str(largest)]).seed == largest
        for seed in (2**32, 2**64):
            with pytest.raises(SystemExit) as stopped:
                command.main(["--workdir", str(tmp_path), *extra, "--method", "sample", "--seed", str(seed)])
            assert stopped.value.code == 2
            assert capsys.readouterr().err.startswith(
                f"error: argument --seed: must be an integer from 0 to {largest}, got {seed}; see "
            )


@pytest.mark.parametrize("kind", ["missing folder", "a directory", "under a file", "unwritable place"])
def test_unwritable_outputs_fail_before_decoding(kind, decoding_workdir, tmp_path, capsys, no_decoding):
    (tmp_path / "a file").write_text("x")
    (tmp_path / "in.en").write_text("A dog.\n")
    path = {
        "missing folder": tmp_path / "nowhere" / "out.de",
        "a directory": tmp_path,
        "under a file": tmp_path / "a file" / "out.de",
        "unwritable place": pathlib.Path("/proc/jaxformer-out.de"),  # even root cannot create files there
    }[kind]
    workdir = str(decoding_workdir)
    assert translate.main(["--workdir", workdir, "--input", str(tmp_path / "in.en"), "--output", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --output {path}: ")
    for flag in ("--output", "--json"):
        assert (
            evaluate.main(
                [
                    "--workdir",
                    workdir,
                    "--source",
                    str(tmp_path / "in.en"),
                    "--reference",
                    str(tmp_path / "in.en"),
                    flag,
                    str(path),
                ]
            )
            == 2
        )
        error = capsys.readouterr().err
        assert error.startswith(f"error: {flag} {path}: ") and error.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a file", "in.en"]  # no probe or partial file left


def test_an_existing_output_needs_overwrite_and_an_input_is_never_overwritten(
    decoding_workdir, tmp_path, capsys, no_decoding
):
    workdir = str(decoding_workdir)
    source, reference, output = tmp_path / "in.en", tmp_path / "ref.de", tmp_path / "out.de"
    for path, text in ((source, "A dog.\n"), (reference, "Ein Hund.\n"), (output, "kept\n")):
        path.write_text(text)
    translating = ["--workdir", workdir, "--input", str(source)]
    evaluating = ["--workdir", workdir, "--source", str(source), "--reference", str(reference)]
    refusals = [
        (translate, [*translating, "--output", str(output)], f"--output {output}: already exists; pass --overwrite"),
        (evaluate, [*evaluating, "--output", str(output)], f"--output {output}: already exists; pass --overwrite"),
        (evaluate, [*evaluating, "--json", str(output)], f"--json {output}: already exists; pass --overwrite"),
        (translate, [*translating, "--output", str(source), "--overwrite"], f"--output {source}: is the --input file"),
        (evaluate, [*evaluating, "--output", str(source), "--overwrite"], f"--output {source}: is the --source file"),
        (evaluate, [*evaluating, "--json", str(reference), "--overwrite"], f"--json {reference}: is the --reference"),
        (
            evaluate,
            [*evaluating, "--output", str(tmp_path / "new"), "--json", str(tmp_path / "new")],
            f"--output {tmp_path / 'new'} and --json {tmp_path / 'new'} are the same file",
        ),
    ]
    link = tmp_path / "link.en"  # another name for the input is the input
    link.symlink_to(source)
    refusals.append(
        (translate, [*translating, "--output", str(link), "--overwrite"], f"--output {link}: is the --input")
    )
    # The scores written through another name for the translations' file replaced them: a link to a
    # file not made yet, a link to the existing output, and a hard link to it.
    (tmp_path / "to-new").symlink_to(tmp_path / "new")
    (tmp_path / "to-output").symlink_to(output)
    os.link(output, tmp_path / "hard")
    for other, existing in (("to-new", tmp_path / "new"), ("to-output", output), ("hard", output)):
        flags = [*evaluating, "--output", str(tmp_path / other), "--json", str(existing), "--overwrite"]
        refusals.append((evaluate, flags, f"--output {tmp_path / other} and --json {existing} are the same file"))
    for command, flags, message in refusals:
        assert command.main(flags) == 2, flags
        error = capsys.readouterr().err
        assert error.startswith(f"error: {message}") and error.count("\n") == 1, error
    assert (source.read_text(), reference.read_text(), output.read_text()) == ("A dog.\n", "Ein Hund.\n", "kept\n")
    with pytest.raises(AssertionError, match="started decoding"):  # --overwrite lets the command go on
        translate.main([*translating, "--output", str(output), "--overwrite"])


def test_evaluate_with_stdout_closed_is_refused_before_any_work_unless_json_keeps_the_scores(
    decoding_workdir, tmp_path, capsys, monkeypatch, no_decoding
):
    """`jaxformer-evaluate ... >&-` decoded everything, printed its scores nowhere and exited 0."""
    (tmp_path / "in.en").write_text("A dog.\n")
    files = ["--source", str(tmp_path / "in.en"), "--reference", str(tmp_path / "in.en")]
    monkeypatch.setattr(sys, "stdout", None)  # what Python sets when started with fd 1 closed
    assert evaluate.main(["--workdir", str(decoding_workdir), *files]) == 2
    assert capsys.readouterr().err == "error: stdout is closed: give --json, or run without closing it\n"
    with pytest.raises(AssertionError, match="started decoding"):  # --json keeps them: the command goes on
        evaluate.main(["--workdir", str(decoding_workdir), *files, "--json", str(tmp_path / "scores.json")])


def test_a_closed_stdin_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, no_decoding):
    """`jaxformer-translate ... <&-` ended in "AttributeError: 'NoneType' object has no attribute 'buffer'"."""
    monkeypatch.setattr(sys, "stdin", None)  # what Python sets when started with fd 0 closed
    for command in (translate, generate):
        assert command.main(["--workdir", str(tmp_path)]) == 2
        assert capsys.readouterr().err == "error: stdin is closed: give --input, or run without closing it\n"


def test_missing_inputs_and_workdirs_are_named(tmp_path, capsys, no_decoding):
    assert translate.main(["--workdir", str(tmp_path / "run"), "--input", str(tmp_path / "in.en")]) == 2
    assert capsys.readouterr().err == f"error: --workdir {tmp_path / 'run'}: no such directory\n"
    assert translate.main(["--workdir", str(tmp_path), "--input", str(tmp_path / "in.en")]) == 2
    assert capsys.readouterr().err == f"error: --input {tmp_path / 'in.en'}: no such file\n"
    assert translate.main(["--workdir", str(tmp_path), "--input", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: --input {tmp_path}: is a directory, not a file\n"
    assert evaluate.main(["--workdir", str(tmp_path), "--split", "x", "--source", "a", "--reference", "b"]) == 2
    assert capsys.readouterr().err == "error: give either --split, or both --source and --reference\n"
    with pytest.raises(SystemExit) as stopped:
        average_checkpoints.main(["--workdir", str(tmp_path), "--last", "0"])
    assert stopped.value.code == 2
