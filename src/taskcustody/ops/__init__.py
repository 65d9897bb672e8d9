"""What an operator reads and does around a running queue: its status, dead letters, task
results, Prometheus metrics, log set-up, and the events the protocol emits for them."""
