"""The audit: the peers' real workers -- RQ, Celery, dramatiq, saq, arq -- and ours,
under the same faults (a reply dropped inside redis-py after Redis ran the command, on each command
the worker sends; a worker process SIGKILLed mid-task; a worker stalled by SIGSTOP past the
system's own timeout; Redis killed and restarted with appendfsync always), counted Jepsen-style
from completion records kept outside Redis. Run: python -m bench.audit --help."""
