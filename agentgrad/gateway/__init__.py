"""The gateway: an OpenAI-compatible proxy that records every model call as a span in the store.

- `app.py`: the front end: the ASGI app, routing by path and headers, relaying answers, flush.
- `upstreams.py`: backends, what the gateway asks of them, retries and upstream errors.
- `recording.py`: requests and responses as span attributes; the span writer.
- `secrets.py`: known secrets out of relayed streams, even a key streamed in pieces.

Nothing outside this package imports it but the CLI, the policy and the public API: the runner
reaches a gateway only over HTTP (its flush endpoint, `semconv.FLUSH_ENDPOINT`).
"""

from agentgrad.gateway.app import Gateway
from agentgrad.gateway.upstreams import Backend, GatewayError, parse_backend

__all__ = ["Backend", "Gateway", "GatewayError", "parse_backend"]
