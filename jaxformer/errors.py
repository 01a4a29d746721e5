"""The errors a user can cause (bad config, flags, data, files or workdir) and the exit codes.

Every command catches `UserError`, prints its message on one line and exits with
`EXIT_USER_ERROR`; `--verbose` prints the traceback too, with the same exit code. Anything else is a bug and keeps its
traceback. A run stopped by a signal exits with 128 + the signal's number, as shells report it,
so a scheduler can tell a preempted run (requeue it) from a finished one (exit 0); a full disk
exits with EXIT_NO_SPACE, in one line; a file-size limit (`ulimit -f`) with EXIT_USER_ERROR, in one line.
"""

from __future__ import annotations

import errno

# 75, a full disk's: argument_parser.py's, stdlib-only, whose --help (every command's, serve.py's) exits with it too
from jaxformer.argument_parser import EXIT_NO_SPACE as EXIT_NO_SPACE

EXIT_USER_ERROR = 2


def no_space_error(error: BaseException) -> OSError | None:
    """The OSError "no space left on device" (or "disk quota exceeded") that `error` is or was
    raised from (orbax and logging wrap it), else None."""
    return _os_error_in_chain(error, (errno.ENOSPC, errno.EDQUOT), "No space left on device")


def file_size_limit_error(error: BaseException) -> OSError | None:
    """The OSError "file too large" (a file-size limit: `ulimit -f`, or the file system's own)
    that `error` is or was raised from, else None."""
    return _os_error_in_chain(error, (errno.EFBIG,), "File too large")


def _os_error_in_chain(error: BaseException, numbers: tuple[int, ...], text: str) -> OSError | None:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in numbers:
            return error
        if text in str(error):  # tensorstore's own errors carry the OS's text only
            return OSError(numbers[0], " ".join(str(error).split()))
        error = error.__cause__ or error.__context__
    return None


def exit_code_for_signal(signum: int) -> int:
    """128 + signum: 143 for SIGTERM, 130 for SIGINT."""
    return 128 + int(signum)


def with_article(word: str) -> str:
    """A word of a message (quoted or not) with its indefinite article: "an encoder_only", "a 'decoder_only'"."""
    return f"{'an' if word.lstrip(chr(34) + chr(39))[:1].lower() in tuple('aeiou') else 'a'} {word}"


class UserError(Exception):
    """A problem in what the user gave (config, flags, files, workdir); the message names it."""


class CheckpointError(UserError, RuntimeError):
    """No usable checkpoint, or one that does not belong to this configuration."""


def first_line(error: BaseException) -> str:
    """`error` in one line for a message: its type and the first line of its text."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
