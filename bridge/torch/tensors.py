"""Moving one array between PyTorch and JAX, bit for bit.

Values never take a float32 detour: every dtype crosses as itself (bfloat16 and
float16 included), through DLPack where both sides can share the memory and
through a numpy view of the raw bits otherwise. A tensor whose axis order needs no
permutation is shared, not copied.

JAX cannot hold 64-bit values unless ``jax_enable_x64`` is on; it would silently
narrow an ``int64`` step counter to ``int32``. Such arrays stay numpy arrays
(sharing the tensor's memory), which Flax and Orbax take as they are.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from jaxshare.internal import Perm

if TYPE_CHECKING:
    import jax

__all__ = [
    "arrays_sharing_memory",
    "as_numpy",
    "numpy_dtype",
    "numpy_view",
    "permuted_copy",
    "shares_memory_as_array",
    "tensor_of",
    "tensor_over",
    "to_array",
    "to_tensor",
]

# torch dtype -> numpy dtype of the same bits. Types numpy lacks come from ml_dtypes,
# imported (slowly: about a second) only when a tensor of such a type is met.
_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
_ML_DTYPES = {
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
}
_TO_TORCH: dict[str, torch.dtype] = {
    **{v.name: k for k, v in _TO_NUMPY.items()},
    **{v: k for k, v in _ML_DTYPES.items()},
}
# Same-width integer types, to move the bits of dtypes torch.from_numpy does not know.
_BITS = {1: (np.uint8, torch.uint8), 2: (np.int16, torch.int16)}
_EXOTIC = frozenset(_ML_DTYPES.values())
_WIDE = frozenset({torch.int64, torch.uint64, torch.float64, torch.complex128})


def _torch_dtype(dtype: np.dtype) -> torch.dtype | None:
    """The torch dtype with the same bits as numpy ``dtype``; ``None`` if none has."""
    return _TO_TORCH.get(dtype.name) if dtype.isnative else None


def numpy_dtype(dtype: torch.dtype, key: str = "?") -> np.dtype:
    """The numpy dtype with the same bits as ``dtype``.

    >>> numpy_dtype(torch.bfloat16).name
    'bfloat16'
    """
    found = _TO_NUMPY.get(dtype)
    if found is not None:
        return found
    if dtype in _ML_DTYPES:
        import ml_dtypes

        found = _TO_NUMPY[dtype] = np.dtype(getattr(ml_dtypes, _ML_DTYPES[dtype]))
        return found
    supported = sorted({str(d).removeprefix("torch.") for d in [*_TO_NUMPY, *_ML_DTYPES]})
    raise TypeError(
        f"{key!r} has dtype {dtype}, which jaxshare cannot carry to JAX bit-exactly; "
        f"supported: {supported}. Cast it first (e.g. `tensor.float()`)."
    )


def numpy_view(t: torch.Tensor, key: str) -> np.ndarray:
    """A numpy array over the memory of CPU tensor ``t`` (no copy)."""
    dtype = numpy_dtype(t.dtype, key)
    if dtype.name in _EXOTIC:  # bfloat16, float8: move the bits as integers of the same width.
        return t.view(_BITS[dtype.itemsize][1]).numpy().view(dtype)
    return t.numpy()


def as_numpy(t: torch.Tensor, key: str = "?") -> np.ndarray:
    """A C-contiguous numpy array of ``t``'s values: a view of its memory where
    it is a contiguous CPU tensor already, else one copy.

    >>> as_numpy(torch.arange(6.0).reshape(2, 3).t()).tolist()
    [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return numpy_view(t.contiguous(), key)


def tensor_over(a: np.ndarray, key: str = "?") -> torch.Tensor:
    """A tensor over the memory of the writable numpy array ``a``, any strides
    (a permuted view stays a view: one memory, as ``torch.load`` gives a tied
    tensor's names).

    >>> w = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> t = tensor_over(w.T)
    >>> t.shape, t.data_ptr() == w.ctypes.data
    (torch.Size([3, 2]), True)
    """
    torch_dtype = _torch_dtype(a.dtype)
    if torch_dtype is None:
        raise TypeError(
            f"{key!r} has dtype {a.dtype}, which has no PyTorch equivalent; cast it first."
        )
    if a.dtype.name in _EXOTIC:
        return torch.from_numpy(a.view(_BITS[a.dtype.itemsize][0])).view(torch_dtype)
    return torch.from_numpy(a)


def to_array(
    tensor: torch.Tensor | np.ndarray,
    perm: Perm | None = None,
    *,
    key: str = "?",
    sharding: Any = None,
) -> jax.Array | np.ndarray:
    """``tensor`` permuted by ``perm`` (torch -> Flax axis order), as a JAX array.

    A numpy array is copied once, permuted on the way.

    The array shares the tensor's memory when no permutation is needed, the
    tensor is contiguous and on the CPU, and no ``sharding`` asks to place it
    elsewhere. 64-bit dtypes stay numpy arrays unless ``jax_enable_x64`` is on.

    >>> a = to_array(torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), (1, 0))
    >>> a.shape, a.dtype
    ((3, 2), dtype(bfloat16))
    """
    if isinstance(tensor, np.ndarray):  # e.g. a view of a mapped file: one copy, permuted
        tensor, perm = tensor_of(tensor, perm, key=key), None
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{key!r} must be a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.layout != torch.strided:
        raise TypeError(f"{key!r} is a {tensor.layout} tensor; convert it with `.to_dense()`.")
    if tensor.device.type == "meta":
        raise ValueError(
            f"{key!r} is on the meta device and holds no values; load real weights first "
            "(e.g. `module.to_empty(device='cpu')` then `load_state_dict`)."
        )
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    import jax  # Here: reading PyTorch files into numpy needs no JAX.

    if perm is not None and sharding is None and t.dtype not in _WIDE:
        # XLA transposes: the tensor is taken as it is (a host buffer JAX shares)
        # and one transposed copy made, on XLA's threads, blocked for the caches.
        shared = jax.device_put(numpy_view(t.contiguous(), key))
        return jax.numpy.transpose(shared, perm)
    t = t.contiguous() if perm is None else permuted_copy(t, perm)
    if t.dtype in _WIDE and not jax.config.read("jax_enable_x64"):
        return numpy_view(t, key)
    if sharding is not None:
        return jax.device_put(numpy_view(t, key), sharding)
    numpy_dtype(t.dtype, key)  # Refuse what JAX would silently convert.
    return jax.dlpack.from_dlpack(t)


def shares_memory_as_array(tensor: Any, perm: Perm | None) -> bool:
    """Whether :func:`to_array` of ``tensor`` needs no copy: a contiguous, dense
    CPU tensor of a dtype JAX holds, in Flax axis order already."""
    return (
        perm is None
        and isinstance(tensor, torch.Tensor)
        and tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and tensor.is_contiguous()
        and tensor.dtype not in _WIDE
        and (tensor.dtype in _TO_NUMPY or tensor.dtype in _ML_DTYPES)
    )


def arrays_sharing_memory(tensors: Sequence[torch.Tensor], keys: Sequence[str]) -> list[Any]:
    """``[to_array(t) for t in tensors]`` for tensors that :func:`shares_memory_as_array`,
    in one ``jax.device_put`` call: each array shares its tensor's memory (JAX
    takes an aligned host buffer as is), and one call costs far less than one
    per tensor."""
    import jax

    views = [numpy_view(t.detach(), key) for t, key in zip(tensors, keys, strict=True)]
    return list(jax.device_put(views)) if views else []


def to_tensor(array: Any, perm: Perm | None = None, *, key: str = "?") -> torch.Tensor:
    """A JAX or numpy ``array`` permuted by ``perm`` (Flax -> torch axis order), as a
    contiguous tensor; it shares the array's memory when no permutation is needed
    and the array lives on one CPU device.

    >>> import jax.numpy as jnp
    >>> to_tensor(jnp.arange(6, dtype=jnp.bfloat16).reshape(3, 2), (1, 0)).shape
    torch.Size([2, 3])
    """
    if isinstance(array, torch.Tensor):
        t = array.detach()
    elif (jax := sys.modules.get("jax")) is not None and isinstance(array, jax.Array):
        if isinstance(array, jax.core.Tracer):
            raise TypeError(f"{key!r} is a tracer; call `to_torch` outside `jax.jit`.")
        if array.is_deleted():
            raise ValueError(f"{key!r} has been deleted (donated to a jitted call?).")
        devices = array.devices()
        on_cpu = len(devices) == 1 and next(iter(devices)).platform == "cpu"
        t = torch.from_dlpack(array) if on_cpu and array.size else _from_numpy(np.array(array), key)
    elif isinstance(array, (np.ndarray, np.generic)):
        a = np.asarray(array)
        t = _from_numpy(a if a.flags.writeable else a.copy(), key)
    else:
        raise TypeError(
            f"{key!r} holds a {type(array).__name__}; expected a jax.Array or numpy array."
        )
    return t if perm is None else permuted_copy(t, perm)


#: Bytes of the output's last axis each block of :func:`permuted_copy` writes at once.
_BLOCK_BYTES = 256
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def permuted_copy(t: torch.Tensor, perm: Perm) -> torch.Tensor:
    """``t.permute(perm).contiguous()``, fast and steady for large transposes.

    A transpose read row by row writes its output a column at a time, one cache
    line per element. Copying blocks of the input axis that becomes the output's
    last axis writes runs of ``_BLOCK_BYTES`` instead: two to three times faster
    on a GPT-2 kernel. The blocks are copied by numpy, as raw bits, on one thread:
    many small multi-threaded torch copies stall whenever the machine is busy.

    >>> w = torch.arange(6.0).reshape(2, 3)
    >>> torch.equal(permuted_copy(w, (1, 0)), w.t())
    True
    """
    ints = _INTS.get(t.element_size())
    if t.device.type != "cpu" or ints is None:
        return t.permute(perm).contiguous()
    return _copy_bits(t.contiguous().view(ints).numpy(), perm).view(t.dtype)


def _copy_bits(src: np.ndarray, perm: Perm | None) -> torch.Tensor:
    """``src`` (an integer view of the bits) transposed by ``perm``, in new memory
    that torch allocates: 64-byte aligned, so JAX takes it without a copy (numpy's
    is not; and numpy's huge pages for large arrays fault in slower, and unevenly)."""
    ints = _INTS[src.dtype.itemsize]
    shape = src.shape if perm is None else tuple(src.shape[p] for p in perm)
    result = torch.empty(shape, dtype=ints)
    out = result.numpy()
    if perm is None:
        np.copyto(out, src)
        return result
    last = perm[-1]
    step = max(1, _BLOCK_BYTES // src.dtype.itemsize)
    for start in range(0, src.shape[last], step):
        block = [slice(None)] * src.ndim
        block[last] = slice(start, start + step)
        out[..., start : start + step] = src[tuple(block)].transpose(perm)
    return result


def tensor_of(array: np.ndarray, perm: Perm | None = None, *, key: str = "?") -> torch.Tensor:
    """A new contiguous tensor holding ``array`` (e.g. a read-only view of a mapped
    file) transposed by ``perm``: one copy, made as :func:`permuted_copy` makes it.

    >>> tensor_of(np.arange(6, dtype=np.float32).reshape(2, 3), (1, 0)).shape
    torch.Size([3, 2])
    """
    dtype = array.dtype
    torch_dtype = _torch_dtype(dtype)
    if torch_dtype is None:
        raise TypeError(
            f"{key!r} has dtype {dtype}, which has no PyTorch equivalent; cast it first."
        )
    ints = _INTS.get(dtype.itemsize)
    if ints is None:  # complex128: no integer of its width.
        t = torch.from_numpy(np.array(array, order="C"))
        return t if perm is None else t.permute(perm).contiguous()
    bits = array.view(np.dtype(f"u{dtype.itemsize}") if dtype.itemsize > 1 else np.uint8)
    return _copy_bits(bits, perm).view(torch_dtype)


def _from_numpy(a: np.ndarray, key: str) -> torch.Tensor:
    """A contiguous tensor over ``a`` (a C-ordered copy of it first, if it is not)."""
    if not a.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d.)
        a = a.copy(order="C")
    return tensor_over(a, key)
