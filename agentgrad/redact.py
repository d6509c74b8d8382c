"""Secrets out of text: what an upstream, a URL or an exception says is redacted before it is stored,
relayed to a client or logged.

`redact(text)` replaces anything shaped like an API key (`sk-...`), a bearer token, the password in
a `scheme://user:password@host` URL, a `key=` query parameter, and every secret this process was
told about (`remember_secret`: the gateway's backend keys, read from their environment variables)
with `[redacted]`. It is cheap enough to run on every error message, never on successful calls.
"""

from __future__ import annotations

import re
import threading

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
_lock = threading.Lock()


def remember_secret(secret: str | None) -> None:
    """Have `redact` remove `secret` wherever it appears, whatever its shape."""
    if secret and len(secret) >= MIN_SECRET_CHARS:
        with _lock:
            _known.add(secret)


def redact(text: str) -> str:
    """`text` without the secrets it may carry (see the module docstring)."""
    for secret in sorted(_known, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text
