"""Experiment config files (`get_config()` returning an ml_collections.ConfigDict), the ones
shipped in jaxformer/configs/ by name, and command-line overrides of their keys
(`--config.training.num_train_steps=500`).

Errors name the file, the config name or the key, with near matches for a misspelling, in one line.
"""

from __future__ import annotations

import ast
import copy
import importlib.machinery
import importlib.resources
import importlib.util
import logging
import pathlib
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from jaxformer.model.config import PRESETS, ConfigError
from jaxformer.training.experiment import default_config, flatten, known_keys, unknown_key_error
from jaxformer.training.override_values import parse_override
from jaxformer.training.shipped_names import shipped_file_path, shipped_names

logger = logging.getLogger(__name__)

OVERRIDE_PREFIX = "--config."


def call_file_function(path: str | pathlib.Path, function: str, kind: str = "config file") -> Any:
    """What `function()` of the Python file at `path` returns; a missing file, a syntax error or a
    failing function is a ConfigError naming the `kind` of file and its path."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"{kind} {path} does not exist" if not path.exists() else f"{kind} {path} is not a file")
    name = f"jaxformer_{kind.split()[0]}_{path.stem}"
    # An explicit loader: importlib finds none for a name not ending in .py (my_config.txt), and
    # the README promises that any path is read as a config file.
    spec = importlib.util.spec_from_file_location(name, path, loader=_UncachedSourceLoader(name, str(path)))
    module = importlib.util.module_from_spec(spec)
    # Registered as an import registers a module (and ml_collections' loader did): dataclasses,
    # typing.get_type_hints and pickle look a class's module up in sys.modules.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise ConfigError(f"{kind} {path}, line {error.lineno}: {error.msg}") from error
    except Exception as error:
        raise ConfigError(f"{kind} {path} fails to load: {type(error).__name__}: {error}") from error
    if not callable(getattr(module, function, None)):
        raise ConfigError(f"{kind} {path} has no {function}() function")
    try:
        return getattr(module, function)()
    except ConfigError as error:  # a value the config refused as the file set it: the file's line
        raise ConfigError(f"{kind} {path}{_line_in(path, error)}: {error}") from error
    except Exception as error:  # ml_collections' own refusals too (a numpy.int64 set on an int key)
        raise ConfigError(
            f"{kind} {path}{_line_in(path, error)}: {function}() raised {type(error).__name__}: {error}"
        ) from error


def _line_in(path: pathlib.Path, error: Exception) -> str:
    """ ", line N": the line of the file at `path` that `error` was raised from, where its traceback has one."""
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__) if frame.filename == str(path)]
    return f", line {lines[-1]}" if lines else ""


class _UncachedSourceLoader(importlib.machinery.SourceFileLoader):
    """Compiles the file each time, without __pycache__: my_config.txt and my_config.py beside it
    would share one cached bytecode file, each run overwriting the other's."""

    def get_code(self, fullname: str):
        return self.source_to_code(self.get_data(self.path), self.path)


def load_config_file(path: str | pathlib.Path) -> ml_collections.ConfigDict:
    """The ConfigDict that `get_config()` of the Python file at `path` returns, with every key of
    `default_config()`."""
    config = call_file_function(path, "get_config")
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"config file {path}: get_config() returned {type(config).__name__}, not a ConfigDict")
    if isinstance(config, ml_collections.FrozenConfigDict):  # a ConfigDict that takes no setting: a traceback later
        raise ConfigError(
            f"config file {path}: get_config() returned a FrozenConfigDict, which takes no --config.KEY=VALUE "
            "override nor the values a run settles; return the ConfigDict itself"
        )
    refuse_missing_keys(config, path)
    refuse_unknown_keys(config, path)
    return with_python_values(config)


def refuse_unknown_keys(config: ml_collections.ConfigDict, path: str | pathlib.Path) -> None:
    """A ConfigError naming the file, the line that sets it where one can be found, and the first
    key no config has (a misspelt one, which a ConfigDict takes without a word): validate() would
    refuse it too, but naming the key alone, as if a --config. flag had given it."""
    known = known_keys()
    unknown = next((key for key in flatten(config) if key not in known), None)
    if unknown is not None:
        raise ConfigError(f"config file {path}{_line_setting(path, unknown)}: {unknown_key_error(unknown, known)}")


def _line_setting(path: str | pathlib.Path, key: str) -> str:
    """ ", line N": the first line of the file that sets the dotted `key`'s last part, as an attribute
    (`config.training.num_train_step = 10`), an item (`config["num_train_step"]`) or a keyword;
    "" where none does (the name built at run time)."""
    name = key.rsplit(".", 1)[-1]
    lines = []
    for node in ast.walk(ast.parse(pathlib.Path(path).read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr == name:
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            if isinstance(node.slice, ast.Constant) and node.slice.value == name:
                lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == name:
            lines.append(node.lineno)
    return f", line {min(lines)}" if lines else ""


def with_python_values(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of `config` whose numpy scalars (`numpy.int64(20)`, in lists and tuples too) are
    Python's int, float and bool: a value computed with numpy passes every check, but would fail
    where the config is written as JSON (the first checkpoint) and refuse `--config.KEY=` overrides."""
    config = copy.deepcopy(config)
    _replace_numpy_scalars(config)
    return config


def holds_numpy_scalars(config: ml_collections.ConfigDict) -> bool:
    """Whether any value of `config` (in its sections, lists and tuples too) is a numpy scalar:
    what `with_python_values` would change. A config file's were replaced as it loaded."""
    return any(
        holds_numpy_scalars(value) if isinstance(value, ml_collections.ConfigDict) else _holds_numpy_scalars(value)
        for value in config.values()
    )


def _replace_numpy_scalars(section: ml_collections.ConfigDict) -> None:
    for key, field in list(section.items(preserve_field_references=True)):
        value = section[key]
        if isinstance(value, ml_collections.ConfigDict):
            _replace_numpy_scalars(value)
        elif not _holds_numpy_scalars(value):
            continue
        elif isinstance(field, ml_collections.FieldReference) and not issubclass(field.get_type(), np.generic):
            # Set through the key's own reference: a checked key (checked_keys' _NumberKey, _TupleKey)
            # goes on refusing a bool or a non-tuple set after the file (was a plain field, which took them).
            field.set(_python_value(value))
        else:
            with section.unlocked():  # a numpy-typed field takes no Python value: made anew
                del section[key]
                section[key] = _python_value(value)


def _holds_numpy_scalars(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_numpy_scalars(item) for item in value)
    return isinstance(value, np.generic)


def _python_value(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_python_value(item) for item in value)
    return value.item() if isinstance(value, np.generic) else value


def missing_keys(
    config: ml_collections.ConfigDict, reference: ml_collections.ConfigDict, prefix: str = ""
) -> list[str]:
    """The dotted keys and sections of `reference` that `config` lacks, a missing section named
    once (not each of its keys); a value where `reference` has a section counts as that section
    missing. Extra keys are validate()'s to refuse."""
    missing = []
    for key, value in reference.items():
        if key not in config:
            missing.append(f"{prefix}{key}")
        elif isinstance(value, ml_collections.ConfigDict):
            if isinstance(config[key], ml_collections.ConfigDict):
                missing.extend(missing_keys(config[key], value, f"{prefix}{key}."))
            else:
                missing.append(f"{prefix}{key}")
    return missing


def refuse_missing_keys(config: ml_collections.ConfigDict, path: str | pathlib.Path) -> None:
    """A ConfigError naming the file and the first keys or sections of `default_config()` its
    config lacks: each is read somewhere (a missing one fails as a traceback, possibly after the
    data is prepared and a tokenizer trained), and none can be set from the command line."""
    reference = default_config()
    missing = missing_keys(config, reference)
    if not missing:
        return
    named = [f"section {key!r}" if _is_section(reference, key) else repr(key) for key in missing[:3]]
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    raise ConfigError(
        f"config file {path}: get_config() lacks {', '.join(named)}{more}; start it from "
        "jaxformer.training.experiment.default_config() (as the shipped configs do) and change only "
        "what differs, instead of deleting or replacing keys"
    )


def _is_section(reference: ml_collections.ConfigDict, key: str) -> bool:
    value = reference
    for part in key.split("."):
        value = value[part]
    return isinstance(value, ml_collections.ConfigDict)


def packaged_config_directory() -> pathlib.Path:
    """jaxformer/configs/ of the installed package (wheel or clone): found, not imported."""
    return pathlib.Path(str(importlib.resources.files("jaxformer") / "configs"))


def packaged_config_names() -> list[str]:
    """The names `--config` takes: the shipped config files without `.py`."""
    return shipped_names(packaged_config_directory())


def config_summary(path: str | pathlib.Path) -> str:
    """The first paragraph of a config file's docstring, on one line, read without running the file."""
    try:
        docstring = ast.get_docstring(ast.parse(pathlib.Path(path).read_text(encoding="utf-8")))
    except (OSError, SyntaxError, ValueError):
        return ""
    return " ".join((docstring or "").strip().split("\n\n")[0].split())


def config_path(name_or_path: str) -> pathlib.Path:
    """The file `--config` means: jaxformer/configs/NAME.py for a name, else the path as given."""
    return shipped_file_path(name_or_path, packaged_config_directory(), "config", "--config")


def load_config(name_or_path: str) -> ml_collections.ConfigDict:
    """The ConfigDict of a shipped config's name (`multi30k`) or of a config file's path."""
    return load_config_file(config_path(name_or_path))


def split_overrides(arguments: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """([(key, text)] of `--config.KEY=VALUE` / `--config.KEY VALUE`, the other arguments); a key
    given twice is a ConfigError (`refuse_repeated_keys`)."""
    overrides, rest = [], []
    arguments = list(arguments)
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        if argument.startswith(OVERRIDE_PREFIX):
            key, equals, text = argument[len(OVERRIDE_PREFIX) :].partition("=")
            if not equals:
                if index + 1 >= len(arguments):
                    raise ConfigError(f"{argument} has no value (write {argument}=VALUE)")
                index += 1
                text = arguments[index]
            overrides.append((key, text))
        else:
            rest.append(argument)
        index += 1
    refuse_repeated_keys(overrides)
    return overrides, rest


def refuse_repeated_keys(overrides: Sequence[tuple[str, str]], where: str = "") -> None:
    """A ConfigError naming the first key that one list of (key, text) overrides sets twice and
    both values: the last would win unseen. Lists layered on another (a sweep variant's on the
    command line's) are each checked alone; `where` begins the message ("variant 'x': ")."""
    first: dict[str, str] = {}
    for key, text in overrides:
        if key in first:
            raise ConfigError(f"{where}config key {key!r} is given twice, as {first[key]!r} and as {text!r}: keep one")
        first[key] = text


def _keys(section: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in section.items():
        keys.append(prefix + key)
        if isinstance(value, ml_collections.ConfigDict):
            keys.extend(_keys(value, f"{prefix}{key}."))
    return keys


def apply_overrides(
    config: ml_collections.ConfigDict, overrides: Sequence[tuple[str, str]], written_as: str = OVERRIDE_PREFIX
) -> None:
    """Sets each (dotted key, text) on `config`; only existing keys can be set. `model.preset`
    comes first, whatever its place: it sets the preset's sizes and dropout (the model section
    holds every field, so the name alone would change nothing), which the other keys then override.
    Refusals quote an override as it was written: `written_as` before its key ("" in a sweep file)."""
    overrides = sorted(overrides, key=lambda override: override[0] != "model.preset")  # stable otherwise
    for key, text in overrides:
        if key == "model.preset" and "model" in config and "preset" in config.model:
            _set_preset(config.model, text, written_as)
            continue
        *path, leaf = key.split(".")
        section = config
        for part in path:
            if part not in section or not isinstance(section[part], ml_collections.ConfigDict):
                raise unknown_key_error(key, _keys(config))
            section = section[part]
        if leaf in section and isinstance(section[leaf], ml_collections.ConfigDict):
            names = [f"{key}.{name}" for name in section[leaf]]
            keys = ", ".join(names[:4]) + (f", ... ({len(names)} keys: --print_config)" if len(names) > 4 else "")
            raise ConfigError(f"{written_as}{key} is a section, not a value: set one of its keys ({keys})")
        if leaf not in section:
            raise unknown_key_error(key, _keys(config))
        reference = section.get_ref(leaf)
        value = parse_override(key, text, section[leaf], reference.get_type(), written_as)
        try:
            section[leaf] = value
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{written_as}{key}={text}: {error}") from None


def _set_preset(model: ml_collections.ConfigDict, name: str, written_as: str) -> None:
    if name not in PRESETS:
        raise ConfigError(f"{written_as}model.preset={name}: must be one of {', '.join(PRESETS)}")
    sizes = {field: value for field, value in PRESETS[name].items() if field in model}  # vocab_size: the tokenizer's
    model.preset = name
    model.update(sizes)
    logger.info("model preset %r: %s", name, ", ".join(f"{field}={value}" for field, value in sizes.items()))
