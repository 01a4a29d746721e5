"""The keyword options `Translator.from_workdir` and `LanguageModel.from_workdir` pass on to their
constructor, checked by name before anything is read: a misspelled one, or a search setting given
where `settings=DecodeSettings(...)` takes it (`beam_size=8`), failed only once the constructor ran,
after the whole checkpoint had been read."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Iterable
from typing import Any

from jaxformer.decoding.generate import DecodeSettings

# What a decoding command's flag is called where the Python API names it otherwise.
_SETTING_OF_FLAG = {"max_new_tokens": "max_extra_length"}


def check_option_names(options: dict[str, Any], owner: type, caller: str, set_by_caller: Iterable[str] = ()) -> None:
    """A TypeError naming the first of `options` that `owner`'s constructor takes by keyword only
    but `set_by_caller` (what `caller` sets itself), with the search setting it is where it is one
    and the near names otherwise."""
    keywords = inspect.signature(owner.__init__).parameters.values()
    accepted = [parameter.name for parameter in keywords if parameter.kind is parameter.KEYWORD_ONLY]
    accepted = [name for name in accepted if name not in set(set_by_caller)]
    settings = {field.name for field in dataclasses.fields(DecodeSettings)}
    for name in options:
        if name in accepted:
            continue
        setting = _SETTING_OF_FLAG.get(name, name)
        if setting in settings:
            whole = f"settings=DecodeSettings(method=..., {setting}=...)"
            hint = f"; {setting} is a search setting: give the whole search, {whole}"
        else:
            near = difflib.get_close_matches(name, accepted, n=2, cutoff=0.6)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise TypeError(f"{caller} got an unexpected keyword argument {name!r}: it takes {', '.join(accepted)}{hint}")
