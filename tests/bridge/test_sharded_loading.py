"""Loading straight into sharded arrays: each device's block is read as the matching
slice of the file (a transposed layout reads the transposed slice), a tie is built
from its canonical on device and never read twice, and each process of a
multi-process job reads only what its devices hold."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import bridge
from jaxshare.stream import TensorSource


class Counting(TensorSource):
    """A source that records every read: ``(name, bytes)`` per call."""

    def __init__(self, inner: TensorSource) -> None:
        self.inner = inner
        self.path, self.kind, self.infos = inner.path, inner.kind, inner.infos
        self.ties, self.origins, self.layers = inner.ties, inner.origins, inner.layers
        self.reads: list[tuple[str, int]] = []

    def read(self, name):
        value = self.inner.read(name)
        self.reads.append((name, int(np.asarray(value).nbytes)))
        return value

    def read_slice(self, name, index):
        block = self.inner.read_slice(name, index)
        self.reads.append((name, int(block.nbytes)))
        return block


V, D = 64, 16


@pytest.fixture(params=[".safetensors", ".bin"])
def weights(request, tmp_path) -> Path:
    torch.manual_seed(0)
    emb = torch.randn(V, D)
    state = {"wte.weight": emb, "proj.weight": torch.randn(2 * D, D), "lm_head.weight": emb}
    path = tmp_path / f"model{request.param}"
    if request.param == ".safetensors":
        bridge.save_safetensors(state, path)
    else:
        torch.save(state, path)
    return path


def test_each_device_reads_its_block_and_a_tie_is_read_once(weights):
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
    target = {
        "params": {
            "wte": {
                "embedding": jax.ShapeDtypeStruct(
                    (V, D), np.float32, sharding=NamedSharding(mesh, P("x", "y"))
                )
            },
            # A Linear weight (2D, D) becomes kernel (D, 2D): its blocks are
            # transposed slices of the file's tensor.
            "proj": {
                "kernel": jax.ShapeDtypeStruct(
                    (D, 2 * D), np.float32, sharding=NamedSharding(mesh, P("y", "x"))
                )
            },
            "lm_head": {
                "kernel": jax.ShapeDtypeStruct(
                    (D, V), np.float32, sharding=NamedSharding(mesh, P(None, "x"))
                )
            },
        }
    }
    source = Counting(bridge.open_source(weights))
    variables, aliases = bridge.to_flax(source, like=target)
    state = (
        bridge.load_torch(weights) if weights.suffix == ".bin" else bridge.load_safetensors(weights)
    )
    p = variables["params"]
    np.testing.assert_array_equal(p["wte"]["embedding"], state["wte.weight"].numpy())
    np.testing.assert_array_equal(p["proj"]["kernel"], state["proj.weight"].numpy().T)
    np.testing.assert_array_equal(p["lm_head"]["kernel"], state["wte.weight"].numpy().T)
    for path, leaf in (
        ("wte/embedding", p["wte"]["embedding"]),
        ("proj/kernel", p["proj"]["kernel"]),
    ):
        assert leaf.sharding == target["params"][path.split("/")[0]][path.split("/")[1]].sharding
    # Every read is one device's block: 8 blocks of 1/8 each, never the whole tensor.
    by_name: dict[str, list[int]] = {}
    for name, nbytes in source.reads:
        by_name.setdefault(name, []).append(nbytes)
    assert by_name["wte.weight"] == [V * D * 4 // 8] * 8
    assert by_name["proj.weight"] == [2 * D * D * 4 // 8] * 8
    assert "lm_head.weight" not in by_name  # The alias is its canonical, on device.
    assert aliases.transform("params/lm_head/kernel") == (1, 0)


def test_replicated_blocks_are_read_once_per_process(weights):
    mesh = Mesh(np.array(jax.devices()), ("x",))
    target = {
        "params": {
            "wte": {
                "embedding": jax.ShapeDtypeStruct(
                    (V, D), np.float32, sharding=NamedSharding(mesh, P())
                )
            },
            "proj": {
                "kernel": jax.ShapeDtypeStruct(
                    (D, 2 * D), np.float32, sharding=NamedSharding(mesh, P())
                )
            },
        }
    }
    source = Counting(bridge.open_source(weights))
    bridge.to_flax(source, like=target)
    assert sorted(source.reads) == [("proj.weight", 2 * D * D * 4), ("wte.weight", V * D * 4)]


@pytest.mark.subprocess
def test_two_processes_each_read_only_their_half(tmp_path, run_processes):
    torch.manual_seed(0)
    emb = torch.randn(256, 32)
    state = {"wte.weight": emb, "proj.weight": torch.randn(128, 32), "lm_head.weight": emb}
    path = tmp_path / "model.safetensors"
    bridge.save_safetensors(state, path)
    results = []
    for status, output in run_processes(Path(__file__).with_name("_sharded_worker.py"), str(path)):
        assert status == 0, output[-3000:]
        results.append(json.loads(output.strip().splitlines()[-1]))
    total = sum(t.numel() * 4 for k, t in state.items() if k != "lm_head.weight")
    for result in results:
        assert result["values_equal"]
        assert result["bytes_read"] <= 0.55 * total, result
        assert "lm_head.weight" not in result["names_read"]
    assert sum(r["bytes_read"] for r in results) == total  # Each byte read by one process.
