"""Training: the `Trainer` and the layouts it runs in.

- `trainer.py`: `Trainer(algorithm, ...).fit(agent, train_data, val_data)`.
- `processes.py`: the store server in this process, runners in their own processes.
- `ray_cluster.py`: runners and trainer ranks as Ray actors.
"""
