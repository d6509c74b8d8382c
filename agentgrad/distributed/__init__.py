"""Past one machine: the policy update sharded with FSDP2 over N processes (torchrun, spawned, or Ray actors)."""
