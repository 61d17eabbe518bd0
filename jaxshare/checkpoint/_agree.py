"""Checks that every process of a multi-process job saves the same alias map.

Each process finds the ties of its own copy of the tree; one process writes the
alias map. If the processes disagree (a tree built differently on one host),
the checkpoint would silently hold one host's view. Before anything is
written, every process gathers a hash of every other process's alias map, and
all of them raise the same error on a mismatch.
"""

from __future__ import annotations

import hashlib

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxshare.core.alias import AliasMap

__all__ = ["check_same_on_all_processes"]


def check_same_on_all_processes(alias_map: AliasMap, /, *, where: str) -> None:
    """Raises on every process if any two processes hold different alias maps.

    A collective: every process must call it. A no-op in a single process.

    Raises:
      ValueError: the processes disagree; the message lists which processes
        hold which map hash, and this process's map.
    """
    if jax.process_count() == 1:
        return
    digest = hashlib.sha256(alias_map.to_json().encode()).digest()
    gathered = np.asarray(
        multihost_utils.process_allgather(np.frombuffer(digest, dtype=np.uint8))
    ).reshape(jax.process_count(), -1)
    hashes = [row.tobytes().hex()[:12] for row in gathered]
    if len(set(hashes)) > 1:
        groups: dict[str, list[int]] = {}
        for process, h in enumerate(hashes):
            groups.setdefault(h, []).append(process)
        listing = "; ".join(f"processes {ps} hold map {h}" for h, ps in groups.items())
        raise ValueError(
            f"{where}: the processes found different alias maps ({listing}). Process "
            f"{jax.process_index()} holds {alias_map!r}. Every process must save the "
            "same tree with the same ties: build the tree the same way on every host, "
            "or save a `jaxshare.Tied` made from one alias map."
        )
