"""The agent side: what runs the agent and records what it does.

- `agent.py`: the agent API (`@rollout`, `LitAgent`), and loading an agent by `module:object`.
- `naming.py`: `agent("writer")`, the name each model call carries.
- `emit.py`: `emit_reward` and the other emitters, `operation`.
- `tracer.py`: OpenTelemetry spans bound to the current rollout and attempt.
- `instrument.py`: the `openai` client's calls tagged with rollout, attempt and agent.
- `gateway_env.py`: `GatewayEnvHook`, routing agents that build `OpenAI()` with no arguments.
- `runner.py`: the worker loop: dequeue, attempt, run the agent, reward, heartbeat.
- `venvs.py`: runners in an agent framework's own virtual environment.
"""
