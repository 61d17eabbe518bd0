"""Builds the PyTorch Distributed Checkpoint (DCP) fixtures with the real
``torch.distributed.checkpoint.save``.

Run from the repository root (torch is in the test venv; about 10 s)::

    .venv/bin/python tests/data/dcp/make_fixtures.py

It writes, beside this script:

- ``flat/``: one process (``no_dist=True``), the ``state_dict()`` of ``TinyLM``
  below: ``lm_head.weight`` tied to ``wte.weight`` (DCP stores both names, each
  as its own record), Linear and LayerNorm weights, a bfloat16 buffer, an int64
  buffer and a 0-d int64 buffer;
- ``sharded/``: two ranks on gloo (CPU), ``TinyLM`` wrapped with FSDP2
  ``fully_shard`` on a 1-D ``DeviceMesh``, after one Adam step, saved as
  ``{"model": ..., "optimizer": ..., "train_state": {"step": 3}}`` (the
  torchtitan layout) from ``get_state_dict``; ``fc.weight`` has 7 rows over
  2 ranks (4 + 3), ``gate`` 1 row over 2 (rank 1's shard is empty), and the
  model part has two DTensors of ours beside the model's: ``rope_cache``
  (``Replicate()``, stored once) and ``probe.colwise`` (``Shard(1)``: chunks at
  column offsets);
- ``flat.pt`` and ``sharded.pt``: ``dcp_to_torch_save`` of each folder, the
  reference the tests compare with bit for bit;
- ``manifest.json``: what each folder holds (names, shapes, dtypes, chunks,
  files and their sizes), for people; the tests read the folders themselves.

Deterministic: fixed seeds, relative checkpoint ids and a fixed ``save_id`` (DCP
would write a random uuid), so a rerun rewrites the same bytes.
"""

from __future__ import annotations

import json
import os
import pickle
import runpy
import shutil
import socket
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.filesystem as dcp_filesystem
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

HERE = Path(__file__).resolve().parent
WORLD = 2
SAVE_ID = "jaxshare-dcp-fixture"
VOCAB, DIM, HIDDEN = 11, 6, 7


class TinyLM(nn.Module):
    """A tiny tied language model; odd sizes, so FSDP2's shards are uneven."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.ln = nn.LayerNorm(DIM)
        self.fc = nn.Linear(DIM, HIDDEN)
        self.proj = nn.Linear(HIDDEN, DIM, bias=False)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # the tie
        self.gate = nn.Parameter(torch.full((1,), 0.5))
        self.register_buffer("calibration", torch.randn(5).to(torch.bfloat16))
        self.register_buffer("positions", torch.arange(7, dtype=torch.int64))
        self.register_buffer("tokens_seen", torch.tensor(0, dtype=torch.int64))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids)
        h = self.proj(torch.nn.functional.gelu(self.fc(self.ln(x)))) + x
        return self.lm_head(h) * self.gate


def _fixed_ids() -> None:
    dcp_filesystem._generate_uuid = lambda: SAVE_ID  # (the save_id DCP writes)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def build_flat() -> None:
    torch.manual_seed(0)
    model = TinyLM()
    model.tokens_seen += 14
    dcp.save(model.state_dict(), checkpoint_id="flat", no_dist=True)


def _rank(rank: int, port: int) -> None:
    """One rank of the FSDP2 run; writes ``sharded/``."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    gloo_rank = runpy.run_path(str(HERE.parents[1] / "_support" / "gloo_rank.py"))["gloo_rank"]
    _fixed_ids()
    with gloo_rank(rank, port, WORLD) as mesh:
        torch.manual_seed(0)  # the same initial weights on every rank
        model = TinyLM()
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        _step(model, optimizer)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        model_sd["rope_cache"] = distribute_tensor(
            torch.arange(12.0).reshape(3, 4), mesh, [Replicate()]
        )
        model_sd["probe.colwise"] = distribute_tensor(
            torch.arange(15.0).reshape(3, 5), mesh, [Shard(1)]
        )
        state = {"model": model_sd, "optimizer": optim_sd, "train_state": {"step": 3}}
        dcp.save(state, checkpoint_id="sharded")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _manifest(folder: Path) -> dict:
    with open(folder / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # (our own fixture, written just now)
    tensors, other = {}, []
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            tensors[fqn] = {
                "shape": list(item.size),
                "dtype": str(item.properties.dtype).removeprefix("torch."),
                "chunks": [[list(c.offsets), list(c.sizes)] for c in item.chunks],
            }
        else:
            other.append(fqn)
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
    return {"tensors": tensors, "other_items": other, "files": files, "bytes": sum(files.values())}


def main() -> None:
    os.chdir(HERE)  # relative checkpoint ids: no absolute path in the metadata
    for name in ("flat", "sharded"):
        shutil.rmtree(name, ignore_errors=True)
    _fixed_ids()
    build_flat()
    mp.spawn(_rank, args=(_free_port(),), nprocs=WORLD, join=True)
    manifest = {
        "torch": torch.__version__,
        "command": "python tests/data/dcp/make_fixtures.py",
        "folders": {},
    }
    for name in ("flat", "sharded"):
        dcp_to_torch_save(name, f"{name}.pt")
        manifest["folders"][name] = _manifest(Path(name))
        print(f"{name}/: {manifest['folders'][name]['bytes']} bytes", file=sys.stderr)
    Path("manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
