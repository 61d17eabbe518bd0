"""Pickles of ``torch.save``'s objects, written opcode by opcode without torch.

A pickle names the classes it rebuilds (``torch.Size``, ``torch.float32``, DCP's
dataclasses) by module and name, and torch's unpickler resolves them; nothing here
imports torch to name them. :func:`torch_pickle` writes a tree of plain values and
the nodes below (:class:`Global`, :class:`Reduce`, :class:`NewObject`,
:class:`PersistentId`); :func:`tensor_pickle` is the ``data.pkl`` of a ``torch.save``
archive of one tensor.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from jaxshare.core.report import ArrayInfo
from jaxshare.formats.torch_save.tables import STORAGE_OF

__all__ = ["Global", "NewObject", "PersistentId", "Reduce", "tensor_pickle", "torch_pickle"]


@dataclass(frozen=True)
class Global:
    """The global ``module.name``, pickled by name (never imported here)."""

    module: str
    name: str


@dataclass(frozen=True, eq=False)  # (Compared and hashed by identity: dict keys may be nodes.)
class Reduce:
    """``func(*args)`` when unpickled."""

    func: Global
    args: tuple[object, ...]


@dataclass(frozen=True, eq=False)
class NewObject:
    """``cls.__new__(cls)`` given ``state`` (``__setstate__(state)``, or the
    ``__dict__`` updated from a dict), as pickle stores a dataclass."""

    cls: Global
    state: object


@dataclass(frozen=True)
class PersistentId:
    """What the unpickler's ``persistent_load(pid)`` returns (``torch.save``: a storage)."""

    pid: tuple[object, ...]


class _Emitter:
    """Writes the pickle opcodes of one object tree: ``None``, bools, ints, strings,
    tuples, lists, dicts, and the nodes above. Globals and strings are memoized
    at protocol 4 (a name stored once, referenced after); protocol 2 writes them
    as ``torch.save`` writes its ``data.pkl``."""

    def __init__(self, protocol: int) -> None:
        if protocol not in (2, 4):
            raise ValueError(f"`protocol` must be 2 or 4, got {protocol}.")
        self.protocol = protocol
        self.out = bytearray(b"\x80" + bytes([protocol]))
        self.memo: dict[object, int] = {}

    def _get(self, key: object) -> bool:
        index = self.memo.get(key)
        if index is None:
            return False
        self.out += b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)
        return True

    def _memoize(self, key: object) -> None:
        if self.protocol == 4:
            self.memo[key] = len(self.memo)
            self.out += b"\x94"  # MEMOIZE

    def _str(self, text: str) -> None:
        if self._get(("str", text)):
            return
        data = text.encode("utf-8", "surrogatepass")
        if self.protocol == 4 and len(data) < 256:
            self.out += b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE
        elif len(data) < 1 << 32:
            self.out += b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE
        else:
            self.out += b"\x8d" + struct.pack("<Q", len(data)) + data  # BINUNICODE8
        self._memoize(("str", text))

    def _int(self, value: int) -> None:
        if 0 <= value < 256:
            self.out += b"K" + bytes([value])  # BININT1
        elif 0 <= value < 65536:
            self.out += b"M" + struct.pack("<H", value)  # BININT2
        elif -(1 << 31) <= value < 1 << 31:
            self.out += b"J" + struct.pack("<i", value)  # BININT
        else:
            data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.out += b"\x8a" + bytes([len(data)]) + data  # LONG1

    def _global(self, g: Global) -> None:
        if self._get(g):
            return
        if self.protocol == 4:
            self._str(g.module)
            self._str(g.name)
            self.out += b"\x93"  # STACK_GLOBAL
        else:
            self.out += b"c" + f"{g.module}\n{g.name}\n".encode()  # GLOBAL
        self._memoize(g)

    def _tuple(self, items: tuple[object, ...]) -> None:
        if len(items) <= 3:
            for item in items:
                self.save(item)
            self.out += (b")", b"\x85", b"\x86", b"\x87")[len(items)]  # EMPTY_TUPLE, TUPLE1-3
            return
        self.out += b"("  # MARK
        for item in items:
            self.save(item)
        self.out += b"t"  # TUPLE

    def save(self, obj: object) -> None:
        if obj is None:
            self.out += b"N"
        elif obj is True or obj is False:
            self.out += b"\x88" if obj else b"\x89"
        elif type(obj) is int:
            self._int(obj)
        elif type(obj) is str:
            self._str(obj)
        elif type(obj) is tuple:
            self._tuple(obj)
        elif type(obj) is list:
            self.out += b"]"  # EMPTY_LIST
            if obj:
                self.out += b"("
                for item in obj:
                    self.save(item)
                self.out += b"e"  # APPENDS
        elif type(obj) is dict:
            self.out += b"}"  # EMPTY_DICT
            items = list(obj.items())
            for start in range(0, len(items), 1000):  # SETITEMS in batches, as pickle does.
                self.out += b"("
                for key, value in items[start : start + 1000]:
                    self.save(key)
                    self.save(value)
                self.out += b"u"
        elif isinstance(obj, Global):
            self._global(obj)
        elif isinstance(obj, Reduce):
            self._global(obj.func)
            self._tuple(obj.args)
            self.out += b"R"  # REDUCE
        elif isinstance(obj, NewObject):
            self._global(obj.cls)
            self.out += b")\x81"  # EMPTY_TUPLE, NEWOBJ
            self.save(obj.state)
            self.out += b"b"  # BUILD
        elif isinstance(obj, PersistentId):
            self._tuple(obj.pid)
            self.out += b"Q"  # BINPERSID
        else:
            raise TypeError(f"cannot pickle {type(obj).__name__} objects: {obj!r:.80}")


def torch_pickle(obj: object, *, protocol: int = 4) -> bytes:
    """The pickle of ``obj``, a tree of ``None``, bools, ints, strings, tuples,
    lists, dicts (in their order) and :class:`Global`, :class:`Reduce`,
    :class:`NewObject` and :class:`PersistentId` nodes: a pickle that names
    classes of a package (torch) this process need not have.

    >>> import pickle
    >>> size = Reduce(Global("collections", "Counter"), ({"a": 2},))
    >>> pickle.loads(torch_pickle({"n": size, "t": (1, None, True)}))
    {'n': Counter({'a': 2}), 't': (1, None, True)}
    """
    emitter = _Emitter(protocol)
    emitter.save(obj)
    emitter.out += b"."  # STOP
    return bytes(emitter.out)


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides torch gives a contiguous tensor of ``shape`` (a size-0 axis counts as 1)."""
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def tensor_pickle(info: ArrayInfo) -> bytes:
    """``archive/data.pkl`` of a ``torch.save`` archive of one tensor: the tensor over
    storage ``"0"``, contiguous, as ``torch.save`` writes it (a typed storage where
    torch has one, else an untyped storage and ``_rebuild_tensor_v3``).

    >>> import io, numpy as np
    >>> from jaxshare.formats.torch_save.unpickle import Storage, Unpickler
    >>> pickled = io.BytesIO(tensor_pickle(ArrayInfo((2, 3), "float32")))
    >>> Unpickler(pickled, lambda pid: Storage(np.arange(6, dtype=np.float32)), {}).load()
    array([[0., 1., 2.],
           [3., 4., 5.]], dtype=float32)
    """
    shape, strides = tuple(info.shape), _contiguous_strides(info.shape)
    count = math.prod(shape)
    no_hooks = Reduce(Global("collections", "OrderedDict"), ())
    kind = STORAGE_OF.get(info.dtype)
    if kind is not None:
        storage = PersistentId(("storage", Global("torch", kind), "0", "cpu", count))
        args: tuple[object, ...] = (storage, 0, shape, strides, False, no_hooks)
        return torch_pickle(Reduce(Global("torch._utils", "_rebuild_tensor_v2"), args), protocol=2)
    untyped = Global("torch.storage", "UntypedStorage")  # Counted in bytes.
    storage = PersistentId(("storage", untyped, "0", "cpu", info.nbytes))
    args = (storage, 0, shape, strides, False, no_hooks, Global("torch", info.dtype))
    return torch_pickle(Reduce(Global("torch._utils", "_rebuild_tensor_v3"), args), protocol=2)
