"""Parameter trees as safetensors files, with numpy alone.

The format: an 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype": "F32"|"BF16"|..., "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}
padded with spaces to a multiple of 8 bytes, then the tensors' raw little-endian bytes, back to
back (offsets count from the end of the header). Names are the parameter paths joined with "/".

The reader lives in export_files.py, because the serve.py of an export must read the file with
nothing but numpy; it is re-exported here.
"""

from __future__ import annotations

import json
import pathlib
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxformer.export.export_files import SAFETENSORS_DTYPES, read_safetensors, unflatten  # noqa: F401

_NAME_OF_DTYPE = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """{"a/b/c": array} from nested mappings of arrays."""
    flat: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        if not isinstance(key, str) or not key or "/" in key:
            raise ValueError(
                f"parameter name {prefix}{key!r} cannot be stored: names are non-empty strings without '/'"
            )
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}/"))
        else:
            flat[prefix + key] = np.asarray(value)
    return flat


def write_safetensors(path: str | pathlib.Path, tensors: Mapping[str, Any], metadata: Mapping[str, str] = ()) -> None:
    """Writes `tensors` {name: array} (numpy-convertible, dtypes of SAFETENSORS_DTYPES) to `path`."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    chunks, offset = [], 0
    for name, value in tensors.items():
        array = np.asarray(value)
        if array.dtype not in _NAME_OF_DTYPE:
            raise ValueError(f"tensor {name!r} has dtype {array.dtype}, which safetensors cannot store")
        width = array.dtype.itemsize
        raw = np.ascontiguousarray(array).view(f"u{width}")  # (0-d arrays come back 1-d: shape from `array`)
        data = raw.astype(f"<u{width}").tobytes()  # little-endian whatever the host
        header[name] = {
            "dtype": _NAME_OF_DTYPE[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the tensors start 8-byte aligned, as safetensors writes them
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for data in chunks:
            handle.write(data)
