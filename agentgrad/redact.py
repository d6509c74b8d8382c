"""Secrets out of text: what an upstream, a URL or an exception says is redacted before it is stored,
relayed to a client or logged.

`redact(text)` replaces anything shaped like an API key (`sk-...`), a bearer token, the password in
a `scheme://user:password@host` URL, a `key=` query parameter, and every secret this process was
told about (`remember_secret`: the gateway's backend keys, read from their environment variables)
with `[redacted]`: for errors and log lines. `redact_known(text)` / `redact_known_bytes(data)` replace
only the remembered secrets: for successful answers, where a pattern would garble what a model
legitimately wrote; they cost one substring search per secret. `redact_logs()` puts every log line of
the process through `redact` (the CLI calls it); `RedactingConsole` does the same for what is printed.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from rich.console import Console

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 6
"""Shorter "secrets" (a test's `x`) would redact ordinary words; keys are far longer."""

_PATTERNS = [
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"), REDACTED),  # OpenAI-style keys, sk-proj-..., sk-ant-...
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{6,}"), r"\1 " + REDACTED),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s:@]*:[^/\s@]*@"), r"\1" + REDACTED + "@"),
    (re.compile(r"(?i)([?&](?:api[_-]?)?key=)[^&\s\"']+"), r"\1" + REDACTED),
    (re.compile(r"(?i)(\"?(?:api[_-]?key|x-api-key|authorization)\"?\s*[:=]\s*\"?)[^\s\",}]{6,}"), r"\1" + REDACTED),
]
_known: set[str] = set()
_longest_first: tuple[str, ...] = ()
_longest_first_bytes: tuple[bytes, ...] = ()
_lock = threading.Lock()
_REDACTED_BYTES = REDACTED.encode()


def remember_secret(secret: str | None) -> None:
    """Have `redact` remove `secret` wherever it appears, whatever its shape."""
    global _longest_first, _longest_first_bytes
    if secret and len(secret) >= MIN_SECRET_CHARS:
        with _lock:
            _known.add(secret)
            _longest_first = tuple(sorted(_known, key=len, reverse=True))
            _longest_first_bytes = tuple(known.encode() for known in _longest_first)


def redact(text: str) -> str:
    """`text` without the secrets it may carry (see the module docstring)."""
    text = redact_known(text)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def known_secrets() -> tuple[str, ...]:
    """The remembered secrets, longest first."""
    return _longest_first


def redact_known(text: str) -> str:
    """`text` without the remembered secrets (no pattern: safe on what a model wrote)."""
    for secret in _longest_first:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_known_bytes(data: bytes) -> bytes:
    """`data` (UTF-8, JSON or SSE) without the remembered secrets."""
    for secret in _longest_first_bytes:
        if secret in data:
            data = data.replace(secret, _REDACTED_BYTES)
    return data


def _redacted_record(record: logging.LogRecord) -> logging.LogRecord:
    """A record whose message and traceback went through `redact` (done once, before any handler sees it)."""
    message = record.getMessage()
    clean = redact(message)
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_info and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        clean = redact(text)
        if clean != text:
            record.exc_text = clean
    return record


def redact_logs() -> None:
    """Put every log record this process emits through `redact`, whichever handler writes it, configured
    now or later (it wraps the log record factory; records below a logger's level cost nothing)."""
    factory = logging.getLogRecordFactory()
    if getattr(factory, "redacts", False):
        return

    def redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return _redacted_record(factory(*args, **kwargs))

    redacting_factory.redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(redacting_factory)


class RedactingConsole(Console):
    """A rich `Console` whose printed strings go through `redact` (the CLI's and the algorithms' console)."""

    def print(self, *objects: Any, **options: Any) -> None:
        markup = options.get("markup", self._markup)
        super().print(*(self._clean(o, markup) if isinstance(o, str) else o for o in objects), **options)

    @staticmethod
    def _clean(text: str, markup: bool | None) -> str:
        clean = redact(text)
        if clean == text or not markup:
            return clean
        return clean.replace(REDACTED, "\\" + REDACTED)  # shown, not read as a markup tag
