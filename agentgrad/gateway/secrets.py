"""Known secrets out of a relayed stream, even when the upstream sends one in pieces.

A plain answer, and a stream event, are cleaned whole (`redact.redact_known_bytes`). A key an
upstream streams token by token is in no single event: `StreamRedactor` holds events back while the
text they carry ends with the beginning of a known secret, and when the secret completes, the held
events carry `[redacted]` in its place. It exists only on gateways that know a secret (a backend
key): the local engine's streams pass untouched. Token ids and logprobs are relayed as they came.
"""

from __future__ import annotations

from typing import Any

from agentgrad.gateway.sse import Event
from agentgrad.redact import known_secrets, redact_known
from agentgrad.semconv import CHAT_COMPLETIONS_API, MESSAGES_API, RESPONSES_API


def _text_fields(api: str, data: dict[str, Any]) -> list[tuple[dict[str, Any], str, int]]:
    """Where an event's generated text is: (the object holding it, its key, which choice or output)."""
    if api == RESPONSES_API:
        if data.get("type") == "response.output_text.delta" and isinstance(data.get("delta"), str):
            return [(data, "delta", int(data.get("output_index") or 0))]
        return []
    if api == MESSAGES_API:
        delta = data.get("delta")
        if data.get("type") == "content_block_delta" and isinstance(delta, dict) and isinstance(delta.get("text"), str):
            return [(delta, "text", 0)]
        return []
    fields = []
    for choice in data.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        index = choice.get("index", 0)
        holder = choice.get("delta") if api == CHAT_COMPLETIONS_API else choice
        key = "content" if api == CHAT_COMPLETIONS_API else "text"
        if isinstance(holder, dict) and isinstance(holder.get(key), str) and holder[key]:
            fields.append((holder, key, index if isinstance(index, int) else 0))
    return fields


class _Held:
    """One held event: its lines, the parsed `data:` line, and where its text is."""

    def __init__(self, event: bytes, api: str) -> None:
        self.parsed = Event.parse(event)
        self.data: Any = self.parsed.data
        self.fields = _text_fields(api, self.data) if isinstance(self.data, dict) else []
        self.event, self.changed = event, False

    def bytes(self) -> bytes:
        return self.parsed.encode() if self.changed else self.event


class StreamRedactor:
    """Relays stream events (each ending with a blank line), holding back those that may begin a secret."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.held: list[_Held] = []

    @staticmethod
    def needed() -> bool:
        return bool(known_secrets())

    def push(self, event: bytes) -> bytes:
        """What may go to the client now (possibly nothing, possibly earlier held events too)."""
        if not event:
            return b""
        held = _Held(event, self.api)
        if not held.fields and not self.held:
            return event
        self.held.append(held)
        texts = self._texts()
        if any(secret in text for text in texts.values() for secret in known_secrets()):
            self._redact(texts)
            texts = self._texts()
        if any(_ends_with_a_secrets_start(text) for text in texts.values()):
            return b""
        return self.flush()

    def flush(self) -> bytes:
        """Every held event (at the end of the stream, or once they can no longer begin a secret)."""
        out = b"".join(h.bytes() for h in self.held)
        self.held = []
        return out

    def _texts(self) -> dict[int, str]:
        texts: dict[int, str] = {}
        for h in self.held:
            for holder, key, index in h.fields:
                texts[index] = texts.get(index, "") + holder[key]
        return texts

    def _redact(self, texts: dict[int, str]) -> None:
        """Put each choice's redacted held text in its first held piece; empty the others."""
        placed: set[int] = set()
        for h in self.held:
            for holder, key, index in h.fields:
                holder[key] = "" if index in placed else redact_known(texts[index])
                placed.add(index)
                h.changed = True


def _ends_with_a_secrets_start(text: str) -> bool:
    for secret in known_secrets():
        for k in range(min(len(secret) - 1, len(text)), 0, -1):
            if text.endswith(secret[:k]):
                return True
    return False
