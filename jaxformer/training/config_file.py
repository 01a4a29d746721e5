"""Experiment config files (`get_config()` returning an ml_collections.ConfigDict) and
command-line overrides of their keys (`--config.training.num_train_steps=500`).

Errors name the file or the key, with near matches for a misspelled key, in one line.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
from collections.abc import Sequence
from typing import Any

import ml_collections

from jaxformer.model.config import ConfigError
from jaxformer.training.experiment import unknown_key_error

OVERRIDE_PREFIX = "--config."


def load_config_file(path: str | pathlib.Path) -> ml_collections.ConfigDict:
    """The ConfigDict that `get_config()` of the Python file at `path` returns."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(
            f"config file {path} does not exist" if not path.exists() else f"config file {path} is not a file"
        )
    spec = importlib.util.spec_from_file_location(f"jaxformer_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise ConfigError(f"config file {path}, line {error.lineno}: {error.msg}") from error
    except Exception as error:
        raise ConfigError(f"config file {path} fails to load: {type(error).__name__}: {error}") from error
    if not callable(getattr(module, "get_config", None)):
        raise ConfigError(f"config file {path} has no get_config() function")
    try:
        config = module.get_config()
    except Exception as error:
        raise ConfigError(f"config file {path}: get_config() raised {type(error).__name__}: {error}") from error
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"config file {path}: get_config() returned {type(config).__name__}, not a ConfigDict")
    return config


def split_overrides(arguments: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """([(key, text)] of `--config.KEY=VALUE` / `--config.KEY VALUE`, the other arguments)."""
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
    return overrides, rest


def _keys(section: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in section.items():
        keys.append(prefix + key)
        if isinstance(value, ml_collections.ConfigDict):
            keys.extend(_keys(value, f"{prefix}{key}."))
    return keys


_TYPE_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    tuple: "a tuple",
    list: "a list",
    bool: "True or False",
}


def _parse(key: str, text: str, current: Any, field_type: type | None) -> Any:
    """`text` as a value of the type the key has now (a string stays a string)."""
    kind = field_type if current is None else type(current)
    if current is None and text.strip() == "None":
        return None
    if kind is str:
        return text
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigError(f"--config.{key}={text}: must be True or False")
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        if kind is None:
            return text  # a key with no type yet takes the text
        raise ConfigError(f"--config.{key}={text}: must be {_TYPE_NAMES.get(kind, kind.__name__)}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (tuple, list) and isinstance(value, (tuple, list)):
        return kind(value)
    if kind is not None and not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"--config.{key}={text}: must be {_TYPE_NAMES.get(kind, kind.__name__)}")
    return value


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[tuple[str, str]]) -> None:
    """Sets each (dotted key, text) on `config`; only existing keys can be set."""
    for key, text in overrides:
        *path, leaf = key.split(".")
        section = config
        for part in path:
            if part not in section or not isinstance(section[part], ml_collections.ConfigDict):
                raise unknown_key_error(key, _keys(config))
            section = section[part]
        if leaf not in section or isinstance(section[leaf], ml_collections.ConfigDict):
            raise unknown_key_error(key, _keys(config))
        reference = section.get_ref(leaf)
        value = _parse(key, text, section[leaf], reference.get_type())
        try:
            section[leaf] = value
        except (TypeError, ValueError) as error:
            raise ConfigError(f"--config.{key}={text}: {error}") from None
