"""Training: the `Trainer` and the layouts it runs in.

- `trainer.py`: `Trainer(algorithm, ...).fit(agent, train_data, val_data)`, and `STRATEGIES`, the table
  of the three strategies below, each `(algorithm, agent, ctx, layout, train_data, val_data) -> result`.
- `threads.py`: the algorithm and the runners in this process, runners in threads.
- `processes.py`: the store server in this process, runners in their own processes.
- `ray_cluster.py`: runners and trainer ranks as Ray actors.
- `layout.py`: `Layout`, what a strategy is told about the runners (how many, hooks, gateway).
"""
