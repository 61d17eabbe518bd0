"""What every worker of a multi-process test does around its own work.

A worker is a script ``run_processes`` (``tests/conftest.py``) starts as ``python
WORKER PROCESS_ID NUM_PROCESSES PORT *ARGS``, with this folder on ``PYTHONPATH``
(not ``tests/``, whose ``bridge`` folder would shadow the package):

    if __name__ == "__main__":
        from _jax_process import serve

        serve(run)

:func:`serve` gives the process two CPU devices, calls ``run(process_id,
num_processes, port, *args)`` and prints its result as one JSON line
(``{"crash": traceback}`` if it raised); ``run`` joins the job with :func:`joined`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

LOCAL_DEVICES = 2


@contextlib.contextmanager
def joined(process_id: int, num_processes: int, port: int) -> Iterator[None]:
    """This process inside one ``jax.distributed`` job on localhost (gloo
    collectives), left again on exit."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"localhost:{port}",
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=60,
    )
    try:
        yield
    finally:
        jax.distributed.shutdown()


def serve(run: Callable[..., dict[str, Any]], argv: list[str] | None = None) -> None:
    """Runs one worker process: ``run(process_id, num_processes, port, *args)``."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={LOCAL_DEVICES}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    argv = sys.argv[1:] if argv is None else argv
    try:
        result = run(int(argv[0]), int(argv[1]), int(argv[2]), *argv[3:])
    except BaseException:  # Report everything; the test shows it.
        result = {"crash": traceback.format_exc()}
    print(json.dumps(result), flush=True)
