"""``Reader``: what a reader of one kind of input declares of itself.

Every kind of input jaxshare reads (a ``.safetensors`` file, a PyTorch file, a DCP
folder, an Orbax item, a Hugging Face directory, ...) has one reader, which says:

- :attr:`Reader.accepts`: whether a path is its kind, cheaply: from the path's name,
  whether it is a file or a folder, and the names of a few files in it (as torch
  DCP's storage readers answer ``validate_checkpoint_id``), never by reading it;
- :meth:`Reader.open`: the :class:`~jaxshare.stream.TensorSource` of the path,
  which tells, as typed members, what the input records: its tensors, the ties it
  records (applied or not: ``ties``, ``unapplied_ties``), the config it declares
  (``config``) and its manifest (``manifest()``);
- where the kind holds a training run's optimizer state too: whether a path does
  (:attr:`Reader.holds_training`) and the weights and that state
  (:attr:`Reader.open_training`, a :class:`~jaxshare.formats.TrainingState`).

The formats' own readers are listed in :data:`jaxshare.formats.READERS`; the one
opener, ``bridge.open_source``, walks them with the Orbax item's before them and
the Hugging Face directory's after them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxshare.io.source import TensorSource

if TYPE_CHECKING:
    from jaxshare.formats.optim import TrainingState

__all__ = ["Reader", "later"]


def later(module: str, name: str) -> Callable[..., Any]:
    """The callable ``module.name``, imported on its first call: a row of a readers'
    table names how to open its kind without importing the reading code, which a
    path of another kind never needs.

    >>> later("math", "sqrt")(9.0)
    3.0
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"{module}.{name}"
    return call


@dataclass(frozen=True)
class Reader:
    """One kind of input: how to tell it, open it, and (where it holds one) read its
    training state.

    Attributes:
      name: the kind, as its sources' ``kind`` says it (``"safetensors"``).
      what: how the opener's one error and the docs name it (``"a .safetensors
        file"``).
      accepts: whether a path is of this kind; cheap, and never raises.
      opener: opens a path it accepts (see :meth:`open`).
      options: the keyword options ``opener`` takes beside the path (a Hugging
        Face directory's ``rules``).
      ties_from_config: whether a config given with an input of this kind declares
        its ties (a DCP folder stores a tied pair twice and records no tie: the
        config's ties are held against the values) rather than being a Hugging
        Face output's config.
      holds_training: whether a path it accepts holds a training run's optimizer
        state; ``None`` where the kind never does.
      open_training: the weights and the optimizer state of a path it accepts.

    >>> reader = Reader("text", "a .txt file", lambda p: p.suffix == ".txt", None)
    >>> reader.accepts(Path("notes.txt")), reader.holds_training is None
    (True, True)
    """

    name: str
    what: str
    accepts: Callable[[Path], bool]
    opener: Callable[..., TensorSource] | None
    options: Collection[str] = ()
    ties_from_config: bool = False
    holds_training: Callable[[Path], bool] | None = None
    open_training: Callable[[Path], TrainingState] | None = None

    def open(self, path: Path, /, **options: Any) -> TensorSource:
        """The source of ``path``, given the options this reader takes (the others
        are for other readers).

        Raises:
          FileNotFoundError, ValueError: a missing or unreadable input (one line).
        """
        if self.opener is None:
            raise TypeError(f"the {self.name} reader opens nothing.")
        return self.opener(path, **{k: v for k, v in options.items() if k in self.options})

    def trains(self, path: Path) -> bool:
        """Whether ``path`` (of this kind) holds a training run's optimizer state."""
        return self.holds_training is not None and self.holds_training(path)
