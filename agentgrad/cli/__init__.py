"""The command line (`agentgrad ...`).

- `main.py`: the commands: serve, gateway, engine, runner, demo, rollouts and spans.
- `demo.py`: `agentgrad demo`, the main job: train the example agent on this CPU.
- `views.py`: the tables the commands print.
"""
