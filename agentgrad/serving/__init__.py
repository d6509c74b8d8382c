"""What every server of agentgrad runs on (the store server, the gateway, the engine server).

- `server.py`: uvicorn in a thread (`ServerThread`) or in the foreground (`run`), behind the guard, with a read
  timeout; `free_port`; `Listen`, where a run's servers bind and the address other hosts reach them by.
- `guard.py`: the checks every request passes first (host, cross-site, bearer token off loopback, body size).
- `metrics.py`: each server's `/metrics` in Prometheus's text format (requests by route and status, process).
"""

from agentgrad.serving.server import (
    WILDCARDS,
    Listen,
    OneSendPerTurn,
    ServerThread,
    free_port,
    http_url,
    outward_address,
    run,
)

__all__ = ["WILDCARDS", "Listen", "OneSendPerTurn", "ServerThread", "free_port", "http_url", "outward_address", "run"]
