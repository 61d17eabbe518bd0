"""One process of the two-process DCP loading test (see test_dcp.py).

Run as ``python _dcp_worker.py PROCESS_ID NUM_PROCESSES PORT FOLDER EXPECTED``: joins a
``jax.distributed`` job of 2 processes x 4 CPU devices, opens the 2-rank DCP folder
``FOLDER`` with :class:`jaxshare.formats.DCPFolder`, loads it with ``bridge.to_flax``
into a sharding of its own (:data:`SPECS`, over a ``("proc", "local")`` mesh) and prints
one JSON line: the folder's ``bytes_read``, every read (tensor, index), the index of
each addressable shard and whether its values equal ``EXPECTED`` (an ``.npz`` of the
full tensors in PyTorch layout, bfloat16 as its int16 bits). Torch is never imported.
Importing this module does nothing.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback

LOCAL_DEVICES = 4
#: Flax path -> (PyTorch name, transposed?, PartitionSpec axes; None: no sharding).
#: Rows of ``proj.weight`` (6, 7) are stored as rank 0's [0:3] and rank 1's [3:6]: its
#: kernel (7, 6) split over the processes on its last axis gives each process one
#: rank's chunk. ``fc`` and ``lm_head`` kernels split on their first axis (the
#: PyTorch columns) and ``wte`` on its columns need both ranks' chunks.
SPECS = {
    "wte/embedding": ("wte.weight", False, (None, "proc")),
    "ln/scale": ("ln.weight", False, ("proc",)),
    "ln/bias": ("ln.bias", False, ()),
    "fc/kernel": ("fc.weight", True, ("proc", None)),
    "fc/bias": ("fc.bias", False, ()),
    "proj/kernel": ("proj.weight", True, (None, "proc")),
    "lm_head/kernel": ("lm_head.weight", True, ("proc", None)),
    "gate": ("gate", False, ()),
    "calibration": ("calibration", False, ()),
    "rope_cache": ("rope_cache", False, (None, "proc")),
    "probe/colwise": ("probe.colwise", False, ()),
    "positions": ("positions", False, None),  # int64: a numpy array, read whole
    "tokens_seen": ("tokens_seen", False, None),
}


def _bounds(index, shape):
    return [list(s.indices(n)[:2]) for s, n in zip(index, shape, strict=True)]


def run(process_id: int, num_processes: int, port: int, folder: str, expected: str) -> dict:
    import jax
    import ml_dtypes
    import numpy as np
    from _jax_process import joined
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import bridge
    from jaxshare.formats import DCPFolder

    want = dict(np.load(expected))
    with joined(process_id, num_processes, port):
        devices = np.array(jax.devices()).reshape(num_processes, LOCAL_DEVICES)
        mesh = Mesh(devices, ("proc", "local"))
        rows_by_process = [sorted({d.process_index for d in row}) for row in devices]
        source = DCPFolder(folder)
        dtypes = {n: info.dtype for n, info in source.infos.items()}
        reads: list[list] = []
        depth = threading.local()
        for method in ("read_slice", "array", "read", "blocks"):  # (Recorded, then called.)
            inner = getattr(source, method)

            def recorded(name, *index, _inner=inner, _method=method):
                outer = not getattr(depth, "n", 0)  # (`read` calls `array`: one read.)
                if outer:
                    info = source.infos[name]
                    box = _bounds(index[0], info.shape) if index else [[0, n] for n in info.shape]
                    reads.append([_method, name, box])
                depth.n = getattr(depth, "n", 0) + 1
                try:
                    result = _inner(name, *index)
                    return list(result) if _method == "blocks" else result
                finally:
                    depth.n -= 1

            setattr(source, method, recorded)
        like: dict = {}
        for path, (name, transposed, spec) in SPECS.items():
            shape = source.infos[name].shape
            shape = shape[::-1] if transposed else shape
            dtype = ml_dtypes.bfloat16 if dtypes[name] == "bfloat16" else np.dtype(dtypes[name])
            sharding = None if spec is None else NamedSharding(mesh, P(*spec))
            node = like
            *parents, leaf = path.split("/")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
        variables, aliases = bridge.to_flax(source, like={"params": like})
        shards: dict[str, list] = {}
        shapes: dict[str, list] = {}
        equal: dict[str, bool] = {}
        for path, (name, transposed, _spec) in SPECS.items():
            value = variables["params"]
            for part in path.split("/"):
                value = value[part]
            full = want[name].T if transposed else want[name]
            ok, boxes = True, []
            pieces = (
                [(s.index, np.asarray(s.data)) for s in value.addressable_shards]
                if isinstance(value, jax.Array)
                else [((slice(None),) * value.ndim, np.asarray(value))]
            )
            for index, data in pieces:
                if data.dtype == ml_dtypes.bfloat16:
                    data = data.view(np.int16)
                ok &= data.dtype == full.dtype and np.array_equal(data, full[index])
                boxes.append(_bounds(index, full.shape))
            equal[path], shards[path], shapes[path] = bool(ok), boxes, list(full.shape)
        return {
            "process_index": jax.process_index(),
            "rows_by_process": rows_by_process,
            "bytes_read": source.bytes_read,
            "reads": reads,
            "shards": shards,
            "shapes": shapes,
            "values_equal": equal,
            "aliases": len(aliases),
            "torch_imported": "torch" in sys.modules,
        }


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={LOCAL_DEVICES}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    args = sys.argv[1:]
    try:
        result = run(int(args[0]), int(args[1]), int(args[2]), *args[3:])
    except BaseException:  # Report everything; the test shows it.
        result = {"crash": traceback.format_exc()}
    print(json.dumps(result), flush=True)
