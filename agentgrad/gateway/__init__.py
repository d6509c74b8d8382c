"""The gateway: an OpenAI-compatible proxy that records every model call as a span in the store.

- `app.py`: the front end: the ASGI app, routing by path and headers, flush.
- `relay.py`: answers and errors back to the agent, whole or streamed, and the call recorded once they are out.
- `upstreams.py`: backends, what the gateway asks of them, retries and upstream errors.
- `recording.py`: requests and responses as span attributes; the span writer.
- `messages.py`: Anthropic's Messages API (`/v1/messages`): recorded as a chat, errors in its shape.
- `routing.py`: model patterns and a routing file, per-upstream rate limits, the response cache.
- `sampling.py`: the trainer's sampling per rollout mode, applied to each call (`RolloutSampling`: each
  rollout's mode, read once, and each call's seed).
- `table.py`: the route table, and the one serving now, swapped live (`LiveRoutes`).
- `secrets.py`: known secrets out of relayed streams, even a key streamed in pieces.
- `admin.py`: `/admin/routes` (the table serving, a new one put live) and its client.
- The rest, one concern each: `checks.py` (what it refuses before relaying), `responses.py` (the Responses API as
  chat messages), `tool_runs.py` (a plain agent's tool runs read from the conversation), `tool_parsers.py`,
  `replicas.py`, `ab.py`, `sse.py`, `metrics.py`.

Nothing outside this package imports it but the CLI, the policy, the public API and the algorithms that
set a sampling plan (`SamplingPlan`): the runner
reaches a gateway only over HTTP (its flush endpoint, `semconv.FLUSH_ENDPOINT`).
"""

from agentgrad.gateway.app import Gateway
from agentgrad.gateway.routing import load_routes
from agentgrad.gateway.sampling import SamplingPlan
from agentgrad.gateway.upstreams import Backend, GatewayError, RateLimit, parse_backend

__all__ = ["Backend", "Gateway", "GatewayError", "RateLimit", "SamplingPlan", "load_routes", "parse_backend"]
