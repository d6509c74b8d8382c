"""Read an offline W&B run file (`run-<id>.wandb`) back: W&B's LevelDB-style log of `Record` protocol buffers.

wandb 0.31 ships no reader of its own in Python (its Go core writes the file), so the tests read the
documented framing: a 7-byte header (`:W&B`, magic, version), then 32 KiB blocks of records, each with a
7-byte header (crc32, length, type: full, first, middle, last) and its bytes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every `Record` of the run file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B", f"{path} is not a W&B run file"
    out: list[Any] = []
    offset, pending = HEADER, b""
    while offset + HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER:  # the block's tail is padding
            offset += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset : offset + HEADER])
        if length == 0 and kind == 0:
            offset += room  # zero padding to the end of the block
            continue
        chunk = data[offset + HEADER : offset + HEADER + length]
        offset += HEADER + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """The rows logged with `run.log`, as {key: value}."""
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
        for r in records(path)
        if r.WhichOneof("record_type") == "history"
    ]


def summary(path: Path) -> dict[str, Any]:
    """The run's summary, its last update of each key winning."""
    values: dict[str, Any] = {}
    for r in records(path):
        if r.WhichOneof("record_type") == "summary":
            for item in r.summary.update:
                values[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return values


def config(path: Path) -> dict[str, Any]:
    """The run's configuration as recorded (the run record's, then config updates)."""
    values: dict[str, Any] = {}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        items = r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
        for item in items:
            values[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return values
