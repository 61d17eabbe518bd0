"""``torch.save`` files, read and written with numpy only: one core for every reader
and writer that meets a ``torch.save`` record (PyTorch files, DCP folders, DeepSpeed
folders).

- :mod:`~jaxshare.formats.torch_save.tables`: torch's names for dtypes and storages;
- :mod:`~jaxshare.formats.torch_save.emit`: pickles of torch's objects, written by name;
- :mod:`~jaxshare.formats.torch_save.zip`: the zip archive, read over a mapped file and
  written with :mod:`zipfile`;
- :mod:`~jaxshare.formats.torch_save.unpickle`: the restricted unpickler, over a zip
  archive or a legacy (pre-1.6) file.

torch is never imported.
"""
