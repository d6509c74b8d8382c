"""What every server of agentgrad runs on (the store server, the gateway, the engine server).

- `server.py`: uvicorn in a thread (`ServerThread`) or in the foreground (`run`), behind the guard, with a read
  timeout; `free_port`.
- `guard.py`: the checks every request passes first (host, cross-site, bearer token off loopback, body size).
- `metrics.py`: each server's `/metrics` in Prometheus's text format (requests by route and status, process).
"""

from agentgrad.serving.server import OneSendPerTurn, ServerThread, free_port, run

__all__ = ["OneSendPerTurn", "ServerThread", "free_port", "run"]
