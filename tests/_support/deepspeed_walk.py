"""DeepSpeed's ``_get_shared_params`` walk, restated to show where it goes wrong.

This is a faithful restatement of ``DeepSpeedEngine._get_shared_params``
(``deepspeed/runtime/engine.py``, DeepSpeed 0.19.8) for a module outside an
engine: parameters only, ``named_parameters(recurse=False)`` and
``named_children()`` (both skip duplicates), keyed by ``data_ptr()`` -- or
``ds_id`` when the model is partitioned by ZeRO-3. The tests set it
beside :func:`bridge.shared_params`; the benchmark measures the real one. (A
test oracle: it is no part of the package.)
"""

from __future__ import annotations

import torch

__all__ = ["deepspeed_shared_params"]


def deepspeed_shared_params(module: torch.nn.Module, *, zero3: bool = False) -> dict[str, str]:
    """What DeepSpeed records as ``shared_params`` for ``module``.

    >>> m = torch.nn.ParameterDict({"a": torch.nn.Parameter(torch.zeros(0)),
    ...                             "b": torch.nn.Parameter(torch.zeros(0, 3))})
    >>> deepspeed_shared_params(m)  # two unrelated zero-size parameters
    {'b': 'a'}
    """
    shared_index: dict[int, str] = {}
    shared: dict[str, str] = {}
    is_zero3_model = zero3 and any(hasattr(p, "ds_id") for p in module.parameters())

    def walk(mod: torch.nn.Module, prefix: str = "") -> None:
        for name, param in mod.named_parameters(recurse=False):
            if param is None or (is_zero3_model and not hasattr(param, "ds_id")):
                continue
            key = prefix + name
            param_id = param.ds_id if is_zero3_model else param.data_ptr()  # type: ignore[attr-defined]  # ZeRO-3 sets it
            if param_id in shared_index:
                shared[key] = shared_index[param_id]
            else:
                shared_index[param_id] = key
        for name, child in mod.named_children():
            if child is not None:
                walk(child, prefix + name + ".")

    walk(module)
    return shared
