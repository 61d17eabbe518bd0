"""``jaxshare convert SRC DST``: the routes between weight files and Orbax items.

- a PyTorch file (``.safetensors``/``.pt``/``.bin``) -> an Orbax item directory:
  ``bridge.to_flax``, then ``jaxshare.checkpoint.save``;
- an Orbax item -> ``.safetensors`` in Flax names:
  ``jaxshare.checkpoint.consolidate_to_safetensors``;
- an Orbax item -> ``.safetensors``/``.pt``/``.bin`` in PyTorch names: consolidate,
  then ``bridge.to_torch``.

Every route checks its paths first (the destination is no input; ``--force``
replaces only an output of the same kind) and writes through a temporary name.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

from jaxshare import ProgressFn
from jaxshare.cli._main import CLIError
from jaxshare.formats import TORCH_SUFFIXES, WEIGHT_SUFFIXES, looks_like_torch_file
from jaxshare.internal import OutputKind, atomic_output, cast_to, float_dtype

__all__ = ["TORCH_FILE", "bridge", "convert"]

#: A ``.pt``/``.bin`` output, for ``--force``.
TORCH_FILE = OutputKind("a PyTorch weights file", False, looks_like_torch_file)


def bridge() -> ModuleType:
    """The PyTorch bridge, or a usage error saying how to install it."""
    try:
        import bridge as module
    except ImportError as e:
        raise CLIError(
            f"PyTorch files need the PyTorch bridge ({e}); install it with "
            "`pip install 'jaxshare[torch]'`."
        ) from e
    return module


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    dtype: Any = None,
    names: str | None = None,
    force: bool = False,
    progress: ProgressFn | None = None,
) -> None:
    """Converts ``src`` to ``dst`` by the route their kinds select (module docstring).

    Raises:
      CLIError: no route between what ``src`` and ``dst`` are.
      FileNotFoundError, FileExistsError, ValueError: bad input or destination.
    """
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such file or directory.")
    float_dtype(dtype)  # A bad --dtype fails before anything is read.
    if src.is_dir():
        if dst.suffix not in WEIGHT_SUFFIXES:
            raise CLIError(
                f"{dst}: converting an Orbax checkpoint writes a weights file; give it "
                f"one of the suffixes {', '.join(WEIGHT_SUFFIXES)}."
            )
        names = names or ("torch" if dst.suffix in TORCH_SUFFIXES else "flax")
        if names == "flax":
            if dst.suffix != ".safetensors":
                raise CLIError(f"{dst}: Flax names are written to .safetensors only.")
            from jaxshare import checkpoint

            checkpoint.consolidate_to_safetensors(
                src, dst, dtype=dtype, force=force, progress=progress
            )
        else:
            _orbax_to_torch(src, dst, dtype=dtype, force=force, progress=progress)
    elif src.suffix in WEIGHT_SUFFIXES:
        _file_to_orbax(src, dst, dtype=dtype, force=force, progress=progress)
    else:
        raise CLIError(
            f"{src}: expected an Orbax checkpoint directory or a weights file "
            f"({', '.join(WEIGHT_SUFFIXES)})."
        )


def _file_to_orbax(
    src: Path, dst: Path, *, dtype: Any, force: bool, progress: ProgressFn | None
) -> None:
    """A PyTorch weights file -> an Orbax item in Flax names, ties as its alias map."""
    import jaxshare
    from jaxshare import checkpoint

    b = bridge()
    state = b.load_safetensors(src) if src.suffix == ".safetensors" else b.load_torch(src)
    variables, amap = b.to_flax(state)
    tied = jaxshare.tie(variables, amap)
    cast = float_dtype(dtype)
    import jax

    leaves = jax.tree_util.tree_leaves(tied.unique)
    done = 0

    def cast_leaf(x: Any) -> Any:
        nonlocal done
        target = cast_to(x.dtype, cast)
        y = x if x.dtype == target else x.astype(target)
        done += 1
        if progress is not None:
            progress(done, len(leaves), "", int(y.nbytes))
        return y

    unique = jax.tree.map(cast_leaf, tied.unique)
    checkpoint.save(dst, jaxshare.Tied(unique, amap), force=force, inputs=[src])


def _orbax_to_torch(
    src: Path, dst: Path, *, dtype: Any, force: bool, progress: ProgressFn | None
) -> None:
    """An Orbax item -> a PyTorch weights file, every tie one tensor again."""
    from jaxshare import checkpoint

    b = bridge()
    flat = checkpoint.consolidate(src, dtype=dtype)
    amap = checkpoint.read_alias_map(src)
    unique: dict[str, Any] = {}
    for path, array in flat.items():
        if path in amap:
            continue
        node = unique
        *parents, last = path.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = array
    state = b.to_torch(unique, amap)
    if progress is not None:
        for i, (name, t) in enumerate(state.items(), 1):
            progress(i, len(state), name, t.numel() * t.element_size())
    if dst.suffix == ".safetensors":
        b.save_safetensors(state, dst, force=force, inputs=[src])
        return
    import torch

    with atomic_output(dst, TORCH_FILE, force=force, inputs=[src]) as tmp:
        torch.save(state, tmp)
