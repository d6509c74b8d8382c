"""One server-sent event of a relayed stream (`event:` and `data:` lines): its JSON read, and written back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass
class Event:
    """An event's lines, which one is `data:`, and that line's JSON (None when absent or not JSON)."""

    lines: list[bytes]
    at: int | None
    data: Any

    @classmethod
    def parse(cls, event: bytes) -> Event:
        lines = event.rstrip(b"\n").split(b"\n")
        at = next((i for i, line in enumerate(lines) if line.startswith(b"data:")), None)
        try:
            data = orjson.loads(lines[at][5:]) if at is not None else None
        except orjson.JSONDecodeError:
            data = None
        return cls(lines, at, data)

    def encode(self) -> bytes:
        """The event with its `data:` line written from `data` again, ending in the blank line."""
        if self.at is not None:
            self.lines[self.at] = b"data: " + orjson.dumps(self.data)
        return b"\n".join(self.lines) + b"\n\n"
