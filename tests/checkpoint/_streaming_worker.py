"""One process of the two-process ``write_item`` test (see test_streaming.py).

Run as ``python _streaming_worker.py PROCESS_ID NUM_PROCESSES PORT WORKDIR``: every
process of one ``jax.distributed`` job calls ``checkpoint.write_item`` on the same
item, and prints one JSON line: how many arrays it read, and what it reads back
(``{"crash": traceback}`` if it failed). Importing this module does nothing.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path


def run(process_id: int, num_processes: int, port: int, workdir: Path) -> dict:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"localhost:{port}",
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=60,
    )
    try:
        return _write(process_id, workdir)
    finally:
        jax.distributed.shutdown()


def _write(process_id: int, workdir: Path) -> dict:
    import numpy as np
    from jax.experimental import multihost_utils
    from safetensors.numpy import save_file

    from jaxshare import AliasMap, Plan, checkpoint
    from jaxshare.formats import SafetensorsFile

    arrays = {f"layer_{i}/kernel": np.full((64, 32), i, np.float32) for i in range(5)}
    src = workdir / f"in{process_id}.safetensors"  # The same tensors, one file each.
    tie = AliasMap({"head/kernel": "layer_0/kernel"}, transforms={"head/kernel": (1, 0)})
    save_file(arrays, src, metadata={"jaxshare.alias_map": tie.to_json()})
    multihost_utils.sync_global_devices("sources written")

    class Counting(SafetensorsFile):
        reads = 0

        def array(self, name: str) -> np.ndarray:
            Counting.reads += 1
            return super().array(name)

    with Counting(src) as source:
        checkpoint.write_item(workdir / "ckpt", Plan.identity(source), source)
    flat = checkpoint.consolidate(workdir / "ckpt")
    return {
        "reads": Counting.reads,
        "alias_map": dict(checkpoint.read_alias_map(workdir / "ckpt")),
        "values_equal": all(np.array_equal(flat[k], v) for k, v in arrays.items())
        and np.array_equal(flat["head/kernel"], arrays["layer_0/kernel"].T),
    }


def main(argv: list[str]) -> None:
    process_id, num_processes, port = int(argv[0]), int(argv[1]), int(argv[2])
    try:
        result = run(process_id, num_processes, port, Path(argv[3]))
    except BaseException:  # Report everything; the test shows it.
        result = {"crash": traceback.format_exc()}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
    main(sys.argv[1:])
