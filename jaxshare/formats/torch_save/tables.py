"""The tables of ``torch.save``: torch's names for dtypes and storages, and numpy's.

The unpickler reads a pickle's storages and dtypes through them, the emitter names
a tensor's storage and dtype by them, and DCP's metadata reader and writer name
dtypes by them: one home for each table.

>>> STORAGES["HalfStorage"], DTYPES["half"], STORAGE_OF["bfloat16"]
('float16', 'float16', 'BFloat16Storage')
"""

import numpy as np

__all__ = ["DCP_DTYPES", "DTYPES", "STORAGES", "STORAGE_OF", "UINTS", "UNTYPED"]

#: ``torch.<Kind>Storage`` -> the dtype of its elements.
STORAGES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "UntypedStorage": "uint8",
}  # fmt: skip
#: ``torch.<dtype>`` names a pickle may hold (a tensor's dtype, a loss scaler's) ->
#: numpy's name for the same bits.
DTYPES = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32",
    "int16": "int16", "short": "int16", "int8": "int8", "uint8": "uint8",
    "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool",
    "complex64": "complex64", "cfloat": "complex64", "complex128": "complex128",
    "cdouble": "complex128",
}  # fmt: skip
#: Unsigned integers by width, to stride any dtype's bits.
UINTS = {n: np.dtype(f"u{n}") for n in (1, 2, 4, 8)}

#: numpy dtype name -> the typed storage ``torch.save`` pickles (``torch.FloatStorage``...).
STORAGE_OF = {dtype: kind for kind, dtype in STORAGES.items() if kind != "UntypedStorage"}
#: The dtypes without a typed storage, pickled as torch does: an untyped storage of
#: bytes, and ``_rebuild_tensor_v3`` given the dtype.
UNTYPED = ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")
#: The dtypes a ``torch.save`` record written here, and so a DCP folder, can hold (as
#: numpy names them; torch's names agree).
DCP_DTYPES = (*STORAGE_OF, *UNTYPED)
