"""Writes the DCP training checkpoints of test_dcp_optim.py with real FSDP2 and DCP.

Run as ``python _dcp_optim_worker.py RANK PORT FOLDER``, once per rank (0 and 1, at
the same time): two gloo ranks on CPU wrap a tiny tied
model (``out.weight`` is ``emb.weight``; odd sizes, so FSDP2's shards are uneven) with
``fully_shard``, train it 3 steps with AdamW in two groups (decay / no decay), and save
``get_state_dict(model, optimizer)`` with ``dcp.save`` twice: as ``{"model", "optim"}``
(``FOLDER/optim``) and as ``{"model", "optimizer"}`` (``FOLDER/optimizer``, torchtitan's
key). Rank 0 then saves the reference, the full state dicts gathered with
``StateDictOptions(full_state_dict=True)``, by ``torch.save`` (``FOLDER/full.pt``).
Importing this module does nothing.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

WORLD = 2
VOCAB, DIM, HIDDEN = 11, 6, 7


def _rank(rank: int, port: int, folder: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.fsdp import fully_shard

    class TiedLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, DIM)
            self.fc = nn.Linear(DIM, HIDDEN)
            self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
            self.out = nn.Linear(DIM, VOCAB, bias=False)
            self.out.weight = self.emb.weight  # the tie

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.emb(ids)
            return self.out(x) + self.head(torch.tanh(self.fc(x)))

    support = Path(__file__).resolve().parents[1] / "_support"
    gloo_rank = runpy.run_path(str(support / "gloo_rank.py"))["gloo_rank"]
    with gloo_rank(rank, port, WORLD) as mesh:
        torch.manual_seed(0)  # the same initial weights on every rank
        model = TiedLM()
        fully_shard(model, mesh=mesh)
        named = list(model.named_parameters())
        optimizer = torch.optim.AdamW(
            [
                {"params": [p for n, p in named if n.endswith("weight")], "weight_decay": 0.1},
                {"params": [p for n, p in named if not n.endswith("weight")], "weight_decay": 0.0},
            ],
            lr=1e-2,
        )
        for step in range(3):
            ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(step))
            loss = nn.functional.cross_entropy(model(ids).reshape(-1, VOCAB), ids.reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=f"{folder}/optim")
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=f"{folder}/optimizer")
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_full, optim_full = get_state_dict(model, optimizer, options=full)
        if rank == 0:
            torch.save({"model": model_full, "optim": optim_full}, f"{folder}/full.pt")
        dist.barrier()


if __name__ == "__main__":
    _rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    # Its files are written and closed. gloo's threads can abort the interpreter's
    # own exit ("terminate called without an active exception", seen under a full
    # parallel suite), which would fail a run whose work is done: leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
