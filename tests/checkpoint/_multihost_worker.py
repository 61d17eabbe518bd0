"""One process of the two-process checkpoint test (see test_multihost.py).

Run as ``python _multihost_worker.py PROCESS_ID NUM_PROCESSES PORT WORKDIR SCENARIO...``;
runs each scenario in turn in one ``jax.distributed`` job, each under
``WORKDIR/<scenario>``, and prints one JSON line: what it observed, by scenario
(``{"crash": traceback}`` if it failed). Importing this module does nothing (pytest
collects it for doctests).
"""

from __future__ import annotations

from pathlib import Path


def run(process_id: int, num_processes: int, port: int, workdir: str, *scenarios: str) -> dict:
    from _jax_process import joined

    with joined(process_id, num_processes, port):
        return {s: _scenario(process_id, Path(workdir) / s, s) for s in scenarios}


def _scenario(process_id: int, workdir: Path, scenario: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxshare import checkpoint

    devices = jax.devices()
    saved_mesh = Mesh(np.array(devices), ("x",))
    values = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    embed = jax.make_array_from_callback(
        values.shape, NamedSharding(saved_mesh, P("x")), lambda index: values[index]
    )
    head = embed
    if scenario == "mismatch" and process_id == 1:  # This host breaks the tie.
        head = jax.make_array_from_callback(
            values.shape, NamedSharding(saved_mesh, P("x")), lambda index: values[index]
        )
    bias = jax.device_put(jnp.ones(6), NamedSharding(saved_mesh, P()))
    tree = {"embed": embed, "lm_head": head, "bias": bias}
    out: dict = {
        "process_count": jax.process_count(),
        "global_devices": len(devices),
        "fully_addressable": embed.is_fully_addressable,
    }
    if scenario == "mismatch":
        try:
            checkpoint.save(workdir / "ckpt", tree)
            out["error"] = None
        except ValueError as e:
            out["error"] = str(e)
        return out

    checkpoint.save(workdir / "ckpt", tree)
    # Restore onto another mesh: 2-D, devices in reverse order.
    other_mesh = Mesh(np.array(devices[::-1]).reshape(2, -1), ("a", "b"))
    target = {
        "embed": jax.ShapeDtypeStruct(
            (8, 6), jnp.float32, sharding=NamedSharding(other_mesh, P("a", "b"))
        ),
        "lm_head": jax.ShapeDtypeStruct(
            (8, 6), jnp.float32, sharding=NamedSharding(other_mesh, P("a", "b"))
        ),
        "bias": jax.ShapeDtypeStruct((6,), jnp.float32, sharding=NamedSharding(other_mesh, P())),
    }
    restored = checkpoint.restore(workdir / "ckpt", target)
    gathered = multihost_utils.process_allgather(restored["lm_head"], tiled=True)
    out.update(
        alias_map=dict(checkpoint.read_alias_map(workdir / "ckpt")),
        tie_is_identity=restored["lm_head"] is restored["embed"],
        sharding_as_asked=restored["embed"].sharding == target["embed"].sharding,
        restored_fully_addressable=restored["embed"].is_fully_addressable,
        values_equal=bool(np.array_equal(np.asarray(gathered), values)),
    )
    # The same through an async CheckpointManager.
    with ocp.CheckpointManager(workdir / "manager") as manager:
        manager.save(7, args=checkpoint.SharedSave(tree))
        manager.wait_until_finished()
        again = manager.restore(7, args=checkpoint.SharedRestore(target))
        out["manager_steps"] = manager.all_steps()
    out["manager_tie_is_identity"] = again["lm_head"] is again["embed"]
    return out


if __name__ == "__main__":
    from _jax_process import serve

    serve(run)
