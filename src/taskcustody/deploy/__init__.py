"""What a real Redis deployment adds to the protocol: connecting and checking the server, Redis
Cluster routing and redirects, replication (WAIT), eviction policies, out-of-memory waits, releases
Redis refuses, and redis-py's errors named as ours."""
