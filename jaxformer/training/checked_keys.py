"""Keys of default_config() that refuse a value of the wrong kind as it is set, before any rule of
config_rules reads it: a bool set on a float key, the model section's too (`_NumberKey`), which
ml_collections would cast to 1.0 or 0.0, past every check; and anything but a tuple set on a tuple
key (`_TupleKey`), in words saying what the key holds (`TUPLE_FORMS`)."""

from __future__ import annotations

from typing import Any

import ml_collections
import numpy as np

from jaxformer.model.config import ConfigError
from jaxformer.training.config_rules import VALUE_RULES
from jaxformer.training.sharding import DEFAULT_RULES

# What each tuple key holds, with an example: a value that is no tuple, from the command line
# (--config.training.final_alphas=1.0,abc) or a config file (`final_alphas = 1.0`), is refused in
# these words.
TUPLE_FORMS = {
    "mesh.shape": f"{VALUE_RULES['mesh.shape'][1]}, e.g. (-1, 1, 1)",
    "mesh.logical_axis_rules": f"a tuple of (logical name, mesh axes) pairs, e.g. {DEFAULT_RULES[:2]!r}",
    "training.final_alphas": f"{VALUE_RULES['training.final_alphas'][1]}, e.g. (1.0, 1.4)",
}


class _CheckedKey(ml_collections.FieldReference):
    """A key of default_config() that refuses, as it is set, a value of the wrong kind (`refuses`),
    saying it must be `allowed`: one that ml_collections would take past every check, or refuse in
    words naming neither the key's section nor what it holds."""

    def __init__(self, key: str, value: Any, allowed: str, field_type: type):
        self.key, self.allowed = key, allowed  # before FieldReference sets the value through set()
        super().__init__(value, field_type=field_type)

    def refuses(self, value: Any) -> bool:
        raise NotImplementedError

    def set(self, value, type_safe=True):
        if self.refuses(value):
            raise ConfigError(f"config {self.key}={value!r}: must be {self.allowed}")
        super().set(value, type_safe)

    def __setstate__(self, state):  # FieldReference's restores its own attributes alone (copies, pickles)
        super().__setstate__(state)
        self.key, self.allowed = state["key"], state["allowed"]


class _NumberKey(_CheckedKey):
    """A float key that refuses True and False. ml_collections casts an int set on a float key to
    float, bool included: `time_budget_minutes = True` in a config file became 1.0 and passed every
    check (the command line's --config.KEY=True is refused)."""

    def __init__(self, key: str, value: float, allowed: str):
        super().__init__(key, value, allowed, float)

    def refuses(self, value: Any) -> bool:
        return isinstance(value, (bool, np.bool_))


class _TupleKey(_CheckedKey):
    """A TUPLE_FORMS key that refuses anything but a tuple or a list (made a tuple). ml_collections
    refused `final_alphas = 1.0` in a config file as "Could not override field 'final_alphas'
    (reference). 1.0 is of original type <class 'float'> and cannot be casted to type <class
    'tuple'>", and took None."""

    def __init__(self, key: str, value: tuple):
        super().__init__(key, value, TUPLE_FORMS[key], tuple)

    def refuses(self, value: Any) -> bool:
        return not isinstance(value, (tuple, list, ml_collections.FieldReference))


def refuse_wrong_kinds(config: ml_collections.ConfigDict) -> None:
    """Makes each float key of `config` that VALUE_RULES checks refuse a bool, and each TUPLE_FORMS
    key anything but a tuple, when it is set."""
    for key, (_, allowed) in VALUE_RULES.items():
        section, leaf = _section_of(config, key)
        if isinstance(section[leaf], float):
            section[leaf] = _NumberKey(key, section[leaf], allowed)
    for key in TUPLE_FORMS:
        section, leaf = _section_of(config, key)
        section[leaf] = _TupleKey(key, section[leaf])


def _section_of(config: ml_collections.ConfigDict, key: str) -> tuple[ml_collections.ConfigDict, str]:
    *path, leaf = key.split(".")
    for part in path:
        config = config[part]
    return config, leaf


def model_number_keys(fields: dict[str, Any]) -> dict[str, Any]:
    """The model section's `fields` with each float one (the dropout rates, layer_norm_epsilon,
    position_base) a key that refuses a bool when it is set: `dropout_rate = False` in a config file
    was a model without dropout, `layer_norm_epsilon = True` an epsilon of 1.0, with no word. In the
    command line's words for --config.model.dropout_rate=True ("must be a number"): TransformerConfig
    says what else each field allows."""
    return {
        field: _NumberKey(f"model.{field}", value, "a number") if isinstance(value, float) else value
        for field, value in fields.items()
    }
