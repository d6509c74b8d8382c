"""The policy served by the built-in engine: the weights it trains are the weights it samples from.

GRPO and SFT on one machine: the engine serves over HTTP behind a gateway that records every call into the
store, the agent gets an `LLM` resource pointing there, and an update changes the engine's weights in place
(`publish` makes them current between calls). Everything else is `Policy`'s (base.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad.policy.base import Policy
from agentgrad.serving import ServerThread

if TYPE_CHECKING:
    from agentgrad.gateway.replicas import ReplicaPool


class LocalPolicy(Policy):
    """The engine (or a new one loading `model`) with an engine server and a gateway on loopback.

    The gateway listens on `gateway_port` (the trainer's, known before `fit` starts, so agents that build
    `OpenAI()` with no arguments can be pointed at it; 0: any free port) and serves the policy under every model
    name, so an agent needs no change of model name either. With `lora_rank > 0` the engine samples from the
    adapted model directly.
    """

    calls: ReplicaPool | None = None  # the engine's one replica behind the gateway: held during a publish

    def start(self) -> None:
        from agentgrad.engine.server import create_engine_app
        from agentgrad.gateway import Backend, Gateway
        from agentgrad.gateway.replicas import ReplicaPool
        from agentgrad.gateway.upstreams import TRAINED_ENGINE_TIMEOUT_SECONDS as LIMIT

        engine_server = ServerThread(create_engine_app(self.engine)).start()
        self._servers.append(engine_server)
        backend = Backend(
            url=engine_server.url + "/v1",
            model=self.engine.name,
            system="agentgrad",
            first_byte_timeout_s=LIMIT,
            timeout_s=LIMIT,
        )
        self.calls = ReplicaPool(self.engine.name, [backend], version=self.engine.version)
        self.serve_gateway(
            Gateway(self.store, routers={self.engine.name: self.calls}, default=self.calls, token=self.listen.token)
        )

    def served_here(self) -> ReplicaPool | None:
        return self.calls

    def sync(self) -> float:
        """Nothing to move: the engine serves what `engine.publish()` made current."""
        return 0.0
