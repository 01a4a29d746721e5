"""The files jaxformer ships by name (configs for `--config`, sweeps for `--sweep`): a name is a file
of a shipped folder, anything else a path, and a name or path that is not there is one line with
the hint that fits (a near name, the shipped one a missing path means, `./` for a local file)."""

from __future__ import annotations

import difflib
import os
import pathlib

from jaxformer.files import home_expanded
from jaxformer.model.config import ConfigError


def is_shipped_name(text: str) -> bool:
    """A name (`multi30k`) rather than a path: no folder separator and no `.py` ending."""
    return "/" not in text and os.sep not in text and not text.endswith(".py")


def shipped_names(directory: pathlib.Path) -> list[str]:
    """The names a shipped folder's files are given by: its `.py` files without `.py`."""
    return sorted(path.stem for path in directory.glob("*.py") if not path.stem.startswith("_"))


def shipped_file_path(name_or_path: str, directory: pathlib.Path, kind: str, flag: str) -> pathlib.Path:
    """The file `flag` (--config, with `kind` "config") means: DIRECTORY/NAME.py for a name, else
    the path as given, "~" expanded as in the config's path keys (`--config=~/mine.py`, which the
    shell leaves as it is). A name not shipped, or a missing path whose file name a shipped one has
    (configs/multi30k.py of an older clone, or the wrong folder), is a ConfigError."""
    names = shipped_names(directory)
    if not is_shipped_name(name_or_path):
        path = pathlib.Path(home_expanded(name_or_path))
        if not path.exists() and path.stem in names:
            raise ConfigError(
                f"{kind} file {path} does not exist; jaxformer ships a {kind} of that name: {flag} {path.stem}"
            )
        return path
    if name_or_path not in names:
        near = difflib.get_close_matches(name_or_path, names, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}? " if near else ""
        if pathlib.Path(name_or_path).is_file():  # a bare file name reads as a shipped name (README)
            hint = f"to read the file {name_or_path}, give it as {flag} ./{name_or_path}; "
        raise ConfigError(
            f"no {kind} named {name_or_path!r}; {hint}jaxformer ships {', '.join(names)} "
            f"(or give the path of a .py {kind} file)"
        )
    return directory / f"{name_or_path}.py"
