"""The protocol: the key schema, the task envelope, time, the worker's custody steps, producers,
servers, recovery, retries, the suspect slot and the sweep lease -- what the model checks.

Nothing here knows about clusters, replicas, memory limits or operators beyond the calls it makes
into `taskcustody.deploy` (routing, WAIT, OOM waits) and `taskcustody.ops.events`.
"""
