"""``inspect``: what a checkpoint, directory or weights file holds, and its ties.

Every input is opened by its reader (:func:`bridge.open_source`) and described
from its metadata alone: an Orbax item from its metadata and alias map, a
``.safetensors`` file from its header (checked against the file size), a PyTorch
file from its pickle (read by the restricted unpickler), a Hugging Face directory
from its index, headers and ``config.json``, a DeepSpeed folder from its model
states, a DCP folder from its ``.metadata``. An input that holds a training run's
optimizer state (a run file, a DeepSpeed or DCP folder) is opened as such, and its
report ends with that state's lines. No tensor is read.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from bridge.hf.config import config_dict
from bridge.hf.experts import describe_experts
from bridge.layouts.layout import Layout, as_layout
from bridge.sources.registry import open_training, opened, reader_of
from jaxshare import formats
from jaxshare.stream import TensorSource, TieReport

__all__ = ["inspect"]


def inspect(
    path: str | os.PathLike | TensorSource,
    /,
    *,
    layout: str | os.PathLike[str] | Layout | None = None,
    config: Any = None,
) -> TieReport:
    """The tie report of the checkpoint, directory or weights file at ``path``: what
    ``jaxshare inspect PATH`` prints (``--json``: :meth:`TieReport.to_json`).

    With a ``layout`` made of tables (``"tunix"``, a layout file), the report's
    notes say, for each tensor, the leaf it goes to (or comes from) and the entry
    that places it: ``placed: model.norm.weight -> final_norm/w (entry 9 ...)``.
    ``config`` (a path or a dict) is the model's ``config.json`` where the input
    holds none. A PEFT adapter directory is described as one: its rank, scaling,
    modules, and the sides of its base's ties it changes (the base's ``config``).

    Raises:
      UsageError, FileNotFoundError, ValueError: ``path`` is of no kind jaxshare
        reads, missing or unreadable (one line).

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> folder = tempfile.mkdtemp()
    >>> save_file({"wte.weight": np.zeros((4, 2), np.float32)}, f"{folder}/m.safetensors",
    ...           metadata={"lm_head.weight": "wte.weight"})  # safetensors' save_model's record
    >>> report = inspect(f"{folder}/m.safetensors")
    >>> report.kind, report.bytes_stored, report.bytes_saved, dict(report.alias_map)
    ('safetensors', 32, 32, {'lm_head.weight': 'wte.weight'})
    """
    if isinstance(path, (str, os.PathLike)) and formats.is_adapter_directory(Path(path)):
        from bridge.adapters.describe import inspect_adapter  # (A PEFT adapter directory.)

        return inspect_adapter(path, config=config)
    if isinstance(path, (str, os.PathLike)) and reader_of(path).trains(Path(path)):
        training = open_training(path)
        with training.params as params:
            report = params.report()
        return dataclasses.replace(report, notes=(*report.notes, *training.optimizer.describe()))
    with opened(path, arg="path") as source:
        report = source.report()
        experts = describe_experts(source)  # (A mixture of experts: each layer's.)
        if experts:
            report = dataclasses.replace(report, notes=(*report.notes, *experts))
        if layout is None:
            return report
        chosen = as_layout(layout)
        if chosen.view is None or not chosen.tables:
            raise ValueError(
                f"{source.where}: inspect --layout shows the entries of a layout made of "
                f"tables (tunix, or a layout file); {chosen.name} has none."
            )
        cfg = config_dict(config) if config is not None else None
        view = chosen.view(source, cfg)
        placed = [
            f"placed: {name} -> {path_} ({entry})"
            for name, (path_, entry) in getattr(view, "placed_by", {}).items()
        ]
        implicit = [
            f"implicit tie: {alias} is computed from {canonical} (no leaf)"
            for alias, canonical in getattr(view, "implicit", {}).items()
        ]
        return dataclasses.replace(report, notes=(*report.notes, *placed, *implicit))
