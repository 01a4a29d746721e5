"""A command-line override's text (`--config.KEY=TEXT`) read as the value of the config key it
sets: its type from the key's current value, bools in several spellings, tuples as Python literals,
each refusal one line naming the key, the text and what the key accepts."""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from typing import Any

from jaxformer.model.config import FLOAT_FIELD_RULES, ConfigError
from jaxformer.training.checked_keys import TUPLE_FORMS
from jaxformer.training.config_rules import VALUE_RULES
from jaxformer.training.experiment import nullable_keys

_TYPE_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    tuple: "a tuple",
    list: "a list",
    bool: "True or False",
}


# What a bool key reads as True and as False (stripped, in any case).
_TRUE_TEXTS = ("true", "yes", "1")
_FALSE_TEXTS = ("false", "no", "0")


def _listed(texts: Sequence[str]) -> str:
    return ", ".join(texts[:-1]) + f" or {texts[-1]}"


def _kind_text(key: str, kind: type) -> str:
    """What a value of `key`, whose values are of type `kind`, must be: for a tuple key, what it
    holds and an example (TUPLE_FORMS), where "a tuple" left `1.0,abc` unexplained."""
    if kind in (tuple, list) and key in TUPLE_FORMS:
        return TUPLE_FORMS[key]
    return _TYPE_NAMES.get(kind, kind.__name__)


def parse_override(key: str, text: str, current: Any, field_type: type | None, written_as: str = "--config.") -> Any:
    """`text` as a value of the type the key has now (a string stays a string); "None" for a key
    that is None now or by default (e.g. model.matmul_dtype, "auto" in multi30k) is None. A refusal
    quotes the override as the user wrote it: `written_as` before the key ("" in a sweep file)."""
    kind = field_type if current is None else type(current)
    if text.strip() == "None" and (current is None or key in nullable_keys()):
        return None
    if kind is str:
        return text
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in _TRUE_TEXTS:
            return True
        if lowered in _FALSE_TEXTS:
            return False
        values = "True, False or None" if current is None or key in nullable_keys() else "True or False"
        raise ConfigError(
            f"{written_as}{key}={text}: must be {values} ({_listed(_TRUE_TEXTS)}; {_listed(_FALSE_TEXTS)}; in any case)"
        )
    try:
        value = _literal(text.strip(), floats_by_name=kind in (tuple, list))
    except (ValueError, SyntaxError):
        if kind is None:
            return text  # a key with no type yet takes the text
        if kind is float and _non_finite(text):  # nan, inf: Python's names, no literals
            raise ConfigError(f"{written_as}{key}={text}: {_float_rule(key)}") from None
        unreadable = _unreadable_item(text.strip()) if kind in (tuple, list) else ""
        raise ConfigError(f"{written_as}{key}={text}: must be {_kind_text(key, kind)}{unreadable}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (tuple, list) and isinstance(value, (tuple, list)):
        return kind(value)
    if kind is not None and not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"{written_as}{key}={text}: must be {_kind_text(key, kind)}")
    return value


def _non_finite(text: str) -> bool:
    """Whether `text` names a float that is no finite number (nan, inf, -Infinity)."""
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


def _float_rule(key: str) -> str:
    """What the float key `key` takes, as its rule states it: none takes nan or infinity."""
    if key in VALUE_RULES:
        return f"must be {VALUE_RULES[key][1]}"
    section, _, field = key.partition(".")
    if section == "model" and field in FLOAT_FIELD_RULES:
        return FLOAT_FIELD_RULES[field]
    return "must be a finite number"


_FLOAT_NAMES = {"nan": float("nan"), "inf": float("inf")}


def _literal(text: str, floats_by_name: bool = False) -> Any:
    """`ast.literal_eval(text)`; with `floats_by_name`, nan and inf among its items are those floats,
    so that a tuple holding one is refused by its key's rule, naming the value, rather than as no
    tuple."""
    if not floats_by_name:
        return ast.literal_eval(text)

    class FloatNames(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return ast.Constant(_FLOAT_NAMES[node.id]) if node.id in _FLOAT_NAMES else node

    return ast.literal_eval(FloatNames().visit(ast.parse(text, mode="eval")))


def _unreadable_item(text: str) -> str:
    """ "; <item> is no value ..." for the first item of the tuple or list `text` that is none; ""
    when there is none to name (`text` does not parse)."""
    try:
        items = getattr(ast.parse(text, mode="eval").body, "elts", ())
    except SyntaxError:
        return ""
    for item in items:
        try:
            ast.literal_eval(item)
        except ValueError:
            return f"; {ast.unparse(item)} is no value (a number, a quoted string, True, False or None)"
    return ""
