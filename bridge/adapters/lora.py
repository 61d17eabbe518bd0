"""The merge's arithmetic: ``W + scale * (B @ A)``, one weight at a time, and which
base tensors an adapter changes.

The rounding, stated once (``docs/adapters.md`` says it too):

1. ``B @ A`` is accumulated in float32: for each element, ``acc = fma(B[i, k],
   A[k, j], acc)`` for ``k = 0 .. r-1`` in order, each step one fused multiply-add
   rounded once to float32 -- what a BLAS matrix-product kernel does for a rank up
   to its block of ``k`` (torch's on this project's machines for ranks to 128: the
   tests hold it against PEFT), emulated here exactly with float64 and numpy, so the
   result does not depend on the machine. Factors stored in bfloat16 or float16 are
   widened to float32 first (exactly), as PEFT does on a CPU;
2. multiplied by the scaling rounded to float32 (as torch multiplies by a Python
   float), rounded to float32;
3. added to the weight in float32 (float64 for a float64 weight), rounded to
   float32, then rounded to the weight's dtype (to nearest, ties to even) to be
   stored.

That is PEFT's ``merge_and_unload`` exactly, but where PEFT rounds the delta to
the weight's dtype before adding it -- an ``Embedding``'s delta with a bfloat16 or
float16 base, or factors stored in those dtypes -- and so rounds twice where this
rounds once.

The weight is worked through in bands of rows, on the cores' threads, so the
float32 temporaries stay small beside the weight itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bridge.adapters.peft import Adapter, LoraPair
from jaxshare.internal import parallel_map

__all__ = ["BAND_BYTES", "Change", "changes", "delta", "fma_product", "merged"]

#: The float64 bytes of one band of rows worked on at a time, a band on each core (1 MiB:
#: a 2048 x 2048 weight's rank-16 merge took 0.24 s in bands of 128 KiB, 0.17 s in bands
#: of 1 MiB, 0.13 s with those on the two cores here).
BAND_BYTES = 1 << 20


_LOW = np.uint64((1 << 29) - 1)  # The float64 bits a float32 rounding drops,
_HALF = np.uint64(1 << 28)  # and their pattern at a float32 midpoint.


def fma_product(b: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``b @ a`` accumulated in float32, one fused multiply-add per ``k`` in order:
    ``acc = fma(b[:, k], a[k], acc)``, exactly.

    Each product of two float32 numbers is exact in float64, and so is its sum with
    the float32 accumulator but where the two are far apart in magnitude; there the
    float64 sum is rounded, which changes its float32 rounding only when it lands on
    a float32 midpoint: those (rare) elements are settled by the exact error of the
    sum (TwoSum).

    >>> b = np.array([[1.0, 2.0**-24]], np.float32); a = np.array([[1.0], [1.0]], np.float32)
    >>> float(fma_product(b, a)[0, 0]) == 1.0  # 1 + 2**-24 ties to even
    True
    """
    b64 = np.asarray(b, np.float32).astype(np.float64)
    a64 = np.asarray(a, np.float32).astype(np.float64)
    shape = (b64.shape[0], a64.shape[1])
    acc, wide, total = np.zeros(shape, np.float32), np.zeros(shape), np.empty(shape)
    low, tied = np.empty(shape, np.uint64), np.empty(shape, bool)
    for k in range(b64.shape[1]):
        np.multiply(b64[:, k : k + 1], a64[k], out=total)
        total += wide
        np.bitwise_and(total.view(np.uint64), _LOW, out=low)
        if np.equal(low, _HALF, out=tied).any():
            ties = np.nonzero(tied)
            product = b64[ties[0], k] * a64[k, ties[1]]
            s, other = total[ties], wide[ties]
            back = s - product
            error = (product - (s - back)) + (other - back)
            toward = np.where(error > 0, np.inf, -np.inf)  # (Off the midpoint, its way.)
            total[ties] = np.where(error == 0, s, np.nextafter(s, toward))
        acc[...] = total
        wide[...] = acc
    return acc


def delta(
    pair: LoraPair,
    scale: float,
    *,
    fan_in_fan_out: bool = False,
    rows: slice = slice(None),
) -> np.ndarray:
    """``scale * (B @ A)`` (transposed for an embedding or a ``fan_in_fan_out``
    layer) in float32, rounded as the module docstring says; ``rows``: only those
    rows of the weight's delta.

    >>> pair = LoraPair(np.ones((2, 3), np.float32), np.full((4, 2), 0.5, np.float32))
    >>> delta(pair, 2.0).tolist()[0]
    [2.0, 2.0, 2.0]
    """
    a, b = np.asarray(pair.A), np.asarray(pair.B)
    if pair.transposed(fan_in_fan_out):  # (B @ A).T, the same sums: A.T @ B.T
        product = fma_product(a[:, rows].T, b.T)
    else:
        product = fma_product(b[rows], a)
    return product * np.float32(scale)


def merged(
    weight: np.ndarray, pair: LoraPair, scale: float, *, fan_in_fan_out: bool = False
) -> np.ndarray:
    """``weight + scale * (B @ A)``, added in float32 (float64 for a float64 weight)
    and stored in ``weight``'s dtype: a new array, ``weight`` untouched.

    >>> w = np.zeros((4, 3), np.float32)
    >>> pair = LoraPair(np.ones((2, 3), np.float32), np.full((4, 2), 0.5, np.float32))
    >>> merged(w, pair, 2.0)[3].tolist()
    [2.0, 2.0, 2.0]
    """
    shape = pair.weight_shape(fan_in_fan_out)
    if weight.ndim != 2 or tuple(weight.shape) != shape:
        raise ValueError(f"a weight of shape {shape} was expected, got {tuple(weight.shape)}.")
    work = np.result_type(weight.dtype, np.float32)
    out = np.empty(weight.shape, weight.dtype)
    step = max(1, BAND_BYTES // max(1, 8 * weight.shape[1]))

    def band(start: int) -> None:  # (Bands of rows apart: on the cores' threads.)
        rows = slice(start, start + step)
        made = weight[rows].astype(work) + delta(
            pair, scale, fan_in_fan_out=fan_in_fan_out, rows=rows
        )
        out[rows] = made.astype(weight.dtype)

    for _ in parallel_map(band, range(0, weight.shape[0], step)):
        pass
    return out


@dataclass(frozen=True)
class Change:
    """How an adapter changes one base tensor.

    Attributes:
      replacement: the whole tensor that replaces the base's (``modules_to_save``,
        an embedding layer PEFT saves beside its adapter), or ``None``.
      pair: the LoRA factors whose delta is added (to the replacement, if any, as
        PEFT adds it to the layer it loaded), or ``None``.
      scale: the pair's scaling.
      fan_in_fan_out: whether the weight is stored ``(in, out)``.
    """

    replacement: Any = None
    pair: LoraPair | None = None
    scale: float = 1.0
    fan_in_fan_out: bool = False

    @property
    def how(self) -> str:
        """``"LoRA"``, ``"replaced"`` or ``"replaced + LoRA"``, for messages."""
        parts = ["replaced"] * (self.replacement is not None) + ["LoRA"] * (self.pair is not None)
        return " + ".join(parts)

    def apply(self, weight: np.ndarray) -> np.ndarray:
        """The merged tensor, in ``weight``'s dtype (a new array)."""
        if self.replacement is not None:
            weight = np.asarray(self.replacement).astype(weight.dtype)
        if self.pair is None:
            return weight
        return merged(weight, self.pair, self.scale, fan_in_fan_out=self.fan_in_fan_out)


def changes(adapter: Adapter) -> dict[str, Change]:
    """``{base tensor name: Change}`` of every tensor ``adapter`` changes, sorted.

    >>> import tempfile
    >>> from bridge.adapters.peft import LoraConfig, read_adapter, save_adapter
    >>> pair = LoraPair(np.ones((2, 4), np.float32), np.zeros((3, 2), np.float32))
    >>> out = save_adapter(tempfile.mkdtemp() + "/a", LoraConfig(r=2, lora_alpha=4), {"q": pair},
    ...                    {"head.weight": np.ones((5, 4), np.float32)})
    >>> {name: c.how for name, c in changes(read_adapter(out)).items()}
    {'head.weight': 'replaced', 'q.weight': 'LoRA'}
    """
    config = adapter.config
    out = {name: Change(replacement=value) for name, value in adapter.saved().items()}
    for module, pair in adapter.modules().items():
        name = f"{module}.weight"
        out[name] = Change(
            out[name].replacement if name in out else None,
            pair,
            config.scaling_of(module),
            config.fan_in_fan_out,
        )
    return dict(sorted(out.items()))
