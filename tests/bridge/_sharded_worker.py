"""One process of the two-process sharded-loading test (see test_sharded_loading.py).

Run as ``python _sharded_worker.py PROCESS_ID NUM_PROCESSES PORT WEIGHTS``; prints one
JSON line: the bytes this process read, the names it read, and whether its shards
hold the right values. Importing this module does nothing.
"""

from __future__ import annotations


def run(process_id: int, num_processes: int, port: int, weights: str) -> dict:
    import jax
    import numpy as np
    from _jax_process import joined
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from safetensors.numpy import load_file

    import bridge

    with joined(process_id, num_processes, port):
        mesh = Mesh(np.array(jax.devices()), ("x",))  # 2 processes x 2 devices
        target = {
            "params": {
                "wte": {
                    "embedding": jax.ShapeDtypeStruct(
                        (256, 32), np.float32, sharding=NamedSharding(mesh, P("x"))
                    )
                },
                "proj": {
                    "kernel": jax.ShapeDtypeStruct(
                        (32, 128), np.float32, sharding=NamedSharding(mesh, P(None, "x"))
                    )
                },
                "lm_head": {
                    "kernel": jax.ShapeDtypeStruct(
                        (32, 256), np.float32, sharding=NamedSharding(mesh, P(None, "x"))
                    )
                },
            }
        }
        reads: list[tuple[str, int]] = []
        source = bridge.open_source(weights)

        inner = source.slice_view

        def counted(name, index):
            block = inner(name, index)
            reads.append((name, int(block.nbytes)))
            return block

        # Each device's block is read as a slice (a view of the mapped file, or a copy).
        source.slice_view = counted
        variables, _ = bridge.to_flax(source, like=target)
        full = load_file(weights)
        expected = {
            "wte/embedding": full["wte.weight"],
            "proj/kernel": full["proj.weight"].T,
            "lm_head/kernel": full["wte.weight"].T,
        }
        equal = True
        for path, want in expected.items():
            a, b = path.split("/")
            for shard in variables["params"][a][b].addressable_shards:
                equal &= bool(np.array_equal(np.asarray(shard.data), want[shard.index]))
        return {
            "bytes_read": sum(n for _, n in reads),
            "names_read": sorted({k for k, _ in reads}),
            "values_equal": equal,
        }


if __name__ == "__main__":
    from _jax_process import serve

    serve(run)
