"""One process of the two-process ``write_item`` test (see test_streaming.py).

Run as ``python _streaming_worker.py PROCESS_ID NUM_PROCESSES PORT WORKDIR``: every
process of one ``jax.distributed`` job calls ``checkpoint.write_item`` on the same
item, and prints one JSON line: how many arrays it read, and what it reads back
(``{"crash": traceback}`` if it failed). Importing this module does nothing.
"""

from __future__ import annotations

from pathlib import Path


def run(process_id: int, num_processes: int, port: int, workdir: str) -> dict:
    from _jax_process import joined

    with joined(process_id, num_processes, port):
        return _write(process_id, Path(workdir))


def _write(process_id: int, workdir: Path) -> dict:
    import numpy as np
    from jax.experimental import multihost_utils
    from safetensors.numpy import save_file

    from jaxshare import AliasMap, checkpoint
    from jaxshare.formats import SafetensorsFile
    from jaxshare.stream import Plan

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


if __name__ == "__main__":
    from _jax_process import serve

    serve(run)
