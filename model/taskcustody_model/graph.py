"""Backward reachability over the edges a search stored: which states can still reach a done
state (the eventual-recovery property). No I/O; used by ``checker`` and ``parallel``."""

from __future__ import annotations

from array import array
from collections.abc import Iterable


def reaching(
    size: int,
    src: Iterable[int],
    dst: Iterable[int],
    targets: Iterable[int],
    good: bytearray | None = None,
) -> bytearray:
    """`good`, with good[j] set for every state j < size from which the edges src[k] -> dst[k]
    lead to one of `targets` (targets included): a backward search over the reverse adjacency,
    built in compressed form (the predecessors of v are pred[offset[v]:offset[v+1]]). The
    sequential search (``checker.py``) and the parallel one (``parallel.py``) both ask it."""
    src, dst = array("q", src), array("q", dst)
    offset = array("q", [0]) * (size + 1)
    for v in dst:
        offset[v + 1] += 1
    for v in range(size):
        offset[v + 1] += offset[v]
    fill = array("q", offset)
    pred = array("q", [0]) * len(dst)
    for u, v in zip(src, dst, strict=True):
        pred[fill[v]] = u
        fill[v] += 1
    good = bytearray(size) if good is None else good
    todo = list(targets)
    for j in todo:
        good[j] = 1
    while todo:
        v = todo.pop()
        for k in range(offset[v], offset[v + 1]):
            u = pred[k]
            if not good[u]:
                good[u] = 1
                todo.append(u)
    return good
