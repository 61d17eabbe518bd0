"""One rank of a ``torch.distributed`` group on this machine (gloo, CPU), for the scripts
that shard a model with FSDP2 and save it with DCP: ``tests/data/dcp/make_fixtures.py``
and ``tests/formats/_dcp_optim_worker.py``. They run as scripts, so each loads this file
by its path (``runpy.run_path``) and enters :func:`gloo_rank` in every rank.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def gloo_rank(rank: int, port: int, world: int) -> Iterator[Any]:
    """This process as rank ``rank`` of ``world`` on gloo, at 127.0.0.1:``port`` (the
    environment set as ``torchrun`` sets it); yields the ranks' 1-D CPU ``DeviceMesh``
    and destroys the group on the way out."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield init_device_mesh("cpu", (world,))
    finally:
        dist.destroy_process_group()
