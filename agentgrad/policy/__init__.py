"""The weights being trained and how they reach the servers that sample from them.

- `config.py`: `PolicyConfig` (engine kind, replicas, transport, LoRA) and `make_policy`.
- `local.py`: the built-in engine behind a gateway, trained in place.
- `vllm.py`: vLLM servers behind the gateway, synced after each update.
- `vllm_server.py`: starting and stopping a vLLM server in its own environment.
- `transports.py`: how new weights reach a vLLM server (NCCL, file or shared memory, LoRA).
- `checkpoints.py`: `step-N` folders, written atomically, resumed from, pruned.
"""
