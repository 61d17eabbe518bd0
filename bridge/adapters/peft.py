"""PEFT LoRA adapter directories, read and written with numpy only.

An adapter directory is what PEFT's ``save_pretrained`` writes:
``adapter_config.json`` (:class:`LoraConfig`: rank, alpha, rsLoRA, target modules,
modules to save, the base model) and ``adapter_model.safetensors``, whose tensors
are named after the base model's modules under PEFT's prefix ``base_model.model.``:

- ``{module}.lora_A.weight`` ``(r, in)`` and ``{module}.lora_B.weight`` ``(out, r)``
  for a ``Linear``; ``{module}.lora_embedding_A`` ``(r, num_embeddings)`` and
  ``{module}.lora_embedding_B`` ``(embedding_dim, r)`` for an ``Embedding`` (its
  delta is ``(B @ A).T``): one :class:`LoraPair` per module;
- whole tensors that replace the base's: ``modules_to_save`` (``{module}.weight``)
  and the embedding layers PEFT saves beside their adapter
  (``{module}.base_layer.weight``), both read as the base tensor's name.

:func:`read_adapter` refuses, in one line naming the file and the key, what is not
plain LoRA: another PEFT type (IA3, AdaLoRA, ...), a LoRA variant (DoRA, a LoRA
bias, ...), an initialisation that changes the base weights (PiSSA, OLoRA, ...).
:func:`save_adapter` writes a directory that ``PeftModel.from_pretrained`` loads.
Neither imports torch: the tensors are mapped from the file
(:class:`jaxshare.formats.SafetensorsFile`) and written by jaxshare's streaming
writer.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from jaxshare.formats import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    SafetensorsFile,
    TensorSpec,
    is_adapter_directory,
    write_safetensors,
)
from jaxshare.internal import OutputKind, atomic_output, numpy_dtype

__all__ = [
    "PEFT_PREFIX",
    "Adapter",
    "LoraConfig",
    "LoraPair",
    "read_adapter",
    "save_adapter",
]

#: The prefix PEFT puts before the base model's names (``PeftModel.base_model.model``).
PEFT_PREFIX = "base_model.model."

#: PEFT's names of a LoRA pair's tensors: suffix -> (which, whether an embedding's).
_PAIR_SUFFIXES: Mapping[str, tuple[str, bool]] = MappingProxyType(
    {
        ".lora_A.weight": ("A", False),
        ".lora_B.weight": ("B", False),
        ".lora_embedding_A": ("A", True),
        ".lora_embedding_B": ("B", True),
    }
)
#: The base layer's own weight, saved beside its adapter (PEFT's ``save_embedding_layers``).
_BASE_LAYER = ".base_layer.weight"
#: Tensor suffixes of LoRA variants jaxshare does not merge: suffix -> the variant.
_VARIANT_TENSORS: Mapping[str, str] = MappingProxyType(
    {
        ".lora_B.bias": "a LoRA bias (lora_bias)",
        ".lora_magnitude_vector": "DoRA",
        ".trainable_tokens_delta": "trainable tokens (trainable_token_indices)",
    }
)
#: Config keys of LoRA variants jaxshare does not merge, refused when set: key -> the variant.
VARIANTS: Mapping[str, str] = MappingProxyType(
    {
        "use_dora": "DoRA",
        "use_qalora": "QALoRA",
        "lora_bias": "a LoRA bias",
        "layer_replication": "layer replication",
        "trainable_token_indices": "trainable tokens",
        "target_parameters": "LoRA on parameters (target_parameters)",
        "alora_invocation_tokens": "aLoRA",
        "use_bdlora": "BD-LoRA",
        "velora_config": "VeLoRA",
        "kasa_config": "KaSA",
        "monteclora_config": "MonteCLoRA",
        "arrow_config": "Arrow",
        "megatron_config": "Megatron LoRA",
    }
)
#: Initialisations that change the base weights: the adapter fits only the changed base.
_BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")


def _where(path: Path, what: str = ADAPTER_CONFIG) -> str:
    return f"{path / what}"


def _pattern_value(pattern: Mapping[str, Any], module: str, default: Any) -> Any:
    """PEFT's ``get_pattern_key``: the value of the first key of ``pattern`` that
    matches the end of ``module`` at a dot (a regex), else ``default``.

    >>> _pattern_value({"q_proj": 2}, "model.layers.0.self_attn.q_proj", 8)
    2
    >>> _pattern_value({"layers.1.self_attn.q_proj": 2}, "model.layers.0.self_attn.q_proj", 8)
    8
    """
    for key in pattern:
        if re.match(rf"(.*\.)?({key})$", module):
            return pattern[key]
    return default


@dataclass(frozen=True)
class LoraConfig:
    """``adapter_config.json`` of a LoRA adapter, in PEFT's keys.

    Attributes:
      r: the rank (``rank_pattern`` may give a module another).
      lora_alpha: alpha (``alpha_pattern`` may give a module another).
      use_rslora: rank-stabilised scaling, ``alpha / sqrt(r)`` instead of ``alpha / r``.
      target_modules: the module names (or a regex string, PEFT's alternative) LoRA
        was applied to; ``()`` where the config names none.
      modules_to_save: modules whose whole tensors the adapter replaces.
      base_model_name_or_path: the base model, as PEFT recorded it.
      raw: the whole document as read, kept for writing back; the fields above
        take precedence over it on writing (:meth:`document`).

    >>> config = LoraConfig(r=8, lora_alpha=16, target_modules=("q_proj", "v_proj"))
    >>> config.scaling, config.document()["peft_type"]
    (2.0, 'LORA')
    """

    r: int
    lora_alpha: float
    use_rslora: bool = False
    target_modules: tuple[str, ...] | str = ()
    modules_to_save: tuple[str, ...] = ()
    base_model_name_or_path: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def scaling(self) -> float:
        """``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA, as PEFT computes
        it (per module where patterns say otherwise: :meth:`scaling_of`)."""
        return self._scale(self.lora_alpha, self.r)

    def _scale(self, alpha: float, r: int) -> float:
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r

    @property
    def rank_pattern(self) -> Mapping[str, int]:
        return self.raw.get("rank_pattern") or {}

    @property
    def alpha_pattern(self) -> Mapping[str, float]:
        return self.raw.get("alpha_pattern") or {}

    @property
    def fan_in_fan_out(self) -> bool:
        """Whether the base's ``Linear`` weights are stored ``(in, out)`` (GPT-2's
        ``Conv1D``): their delta is ``(B @ A).T``."""
        return bool(self.raw.get("fan_in_fan_out", False))

    def rank_of(self, module: str) -> int:
        """The rank of ``module``: ``rank_pattern``'s where one of its keys matches."""
        return int(_pattern_value(self.rank_pattern, module, self.r))

    def alpha_of(self, module: str) -> float:
        """The alpha of ``module``: ``alpha_pattern``'s where one of its keys matches."""
        return float(_pattern_value(self.alpha_pattern, module, self.lora_alpha))

    def scaling_of(self, module: str) -> float:
        """The scaling of ``module`` (a base model name), its patterns applied.

        >>> c = LoraConfig(r=8, lora_alpha=16, raw={"rank_pattern": {"v_proj": 4}})
        >>> c.scaling_of("model.layers.0.self_attn.v_proj"), c.scaling_of("x.q_proj")
        (4.0, 2.0)
        """
        return self._scale(self.alpha_of(module), self.rank_of(module))

    def document(self) -> dict[str, Any]:
        """The ``adapter_config.json`` to write: :attr:`raw` with the fields over it."""
        targets = self.target_modules
        return {
            **self.raw,
            "peft_type": "LORA",
            "r": self.r,
            "lora_alpha": self.lora_alpha,
            "use_rslora": self.use_rslora,
            "target_modules": targets if isinstance(targets, str) else list(targets) or None,
            "modules_to_save": list(self.modules_to_save) or None,
            "base_model_name_or_path": self.base_model_name_or_path,
        }

    @classmethod
    def from_document(cls, doc: Any, where: str) -> LoraConfig:
        """The config of an ``adapter_config.json`` document; ``where`` names it.

        Raises:
          ValueError: not a plain LoRA config (another PEFT type, a variant, a base
            changing initialisation) or a key of the wrong type; one line naming
            ``where`` and the key.
        """
        if not isinstance(doc, dict):
            raise ValueError(f"{where}: expected a JSON object, found a {type(doc).__name__}.")
        kind = doc.get("peft_type")
        if kind != "LORA":
            raise ValueError(
                f"{where}: key 'peft_type' is {kind!r}; jaxshare reads LoRA adapters ('LORA') only."
            )
        for key, variant in VARIANTS.items():
            if doc.get(key) not in (None, False, [], {}, ()):
                raise ValueError(
                    f"{where}: key {key!r} is {doc[key]!r}: {variant}, a LoRA variant jaxshare "
                    "does not read; plain LoRA (the key unset) only."
                )
        init = doc.get("init_lora_weights")
        if isinstance(init, str) and init.lower().startswith(_BASE_CHANGING_INITS):
            raise ValueError(
                f"{where}: key 'init_lora_weights' is {init!r}, which changes the base "
                "weights, so the adapter fits only that changed base; convert it to a plain "
                "LoRA first (PEFT's save_pretrained(path_initial_model_for_weight_conversion=...))."
            )
        r, alpha, rslora = doc.get("r"), doc.get("lora_alpha"), doc.get("use_rslora", False)
        if type(r) is not int or r < 1:
            raise ValueError(f"{where}: key 'r' must be a rank >= 1, found {r!r}.")
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
            raise ValueError(f"{where}: key 'lora_alpha' must be a number, found {alpha!r}.")
        if type(rslora) is not bool:
            raise ValueError(f"{where}: key 'use_rslora' must be true or false, found {rslora!r}.")
        targets = doc.get("target_modules")
        if targets is None:
            targets = ()
        elif isinstance(targets, list) and all(isinstance(t, str) for t in targets):
            targets = tuple(targets)
        elif not isinstance(targets, str):
            raise ValueError(
                f"{where}: key 'target_modules' must be a list of names or a regex string, "
                f"found {targets!r}."
            )
        saved = doc.get("modules_to_save") or []
        if not isinstance(saved, list) or not all(isinstance(m, str) for m in saved):
            raise ValueError(
                f"{where}: key 'modules_to_save' must be a list of names, found {saved!r}."
            )
        for key in ("rank_pattern", "alpha_pattern"):
            pattern = doc.get(key) or {}
            if not isinstance(pattern, dict) or not all(
                type(v) in ((int,) if key == "rank_pattern" else (int, float))
                for v in pattern.values()
            ):
                raise ValueError(
                    f"{where}: key {key!r} must map module patterns to numbers, found {pattern!r}."
                )
        base = doc.get("base_model_name_or_path")
        if base is not None and not isinstance(base, str):
            raise ValueError(
                f"{where}: key 'base_model_name_or_path' must be a string, found {base!r}."
            )
        return cls(r, alpha, rslora, targets, tuple(saved), base, MappingProxyType(dict(doc)))


@dataclass(frozen=True)
class LoraPair:
    """One module's LoRA factors: ``A`` ``(r, in)`` and ``B`` ``(out, r)``.

    Attributes:
      A: the down projection, ``(r, in)`` (an embedding's: ``(r, num_embeddings)``).
      B: the up projection, ``(out, r)`` (an embedding's: ``(embedding_dim, r)``).
      embedding: whether the module is an ``Embedding`` (PEFT's ``lora_embedding_A``/
        ``_B``), whose weight is ``(num_embeddings, embedding_dim)``: its delta is
        ``(B @ A).T``.

    >>> pair = LoraPair(np.zeros((2, 5), np.float32), np.zeros((3, 2), np.float32))
    >>> pair.rank, pair.weight_shape()
    (2, (3, 5))
    """

    A: Any
    B: Any
    embedding: bool = False

    @property
    def rank(self) -> int:
        return int(self.A.shape[0])

    def transposed(self, fan_in_fan_out: bool = False) -> bool:
        """Whether the delta is ``(B @ A).T`` (an embedding's, or a ``fan_in_fan_out``
        ``Linear``'s)."""
        return self.embedding or fan_in_fan_out

    def weight_shape(self, fan_in_fan_out: bool = False) -> tuple[int, int]:
        """The shape of the base weight this pair changes."""
        out, inn = int(self.B.shape[0]), int(self.A.shape[1])
        return (inn, out) if self.transposed(fan_in_fan_out) else (out, inn)

    def names(self, module: str) -> tuple[str, str]:
        """PEFT's names of ``A`` and ``B`` for ``module`` (a base model name)."""
        if self.embedding:
            return f"{module}.lora_embedding_A", f"{module}.lora_embedding_B"
        return f"{module}.lora_A.weight", f"{module}.lora_B.weight"


def _check_pair(where: str, module: str, a: tuple[int, ...], b: tuple[int, ...], rank: int) -> None:
    """One line where the shapes ``a`` and ``b`` of a pair are not two matrices of
    rank ``rank``."""
    if len(a) != 2 or len(b) != 2:
        raise ValueError(
            f"{where}: {module!r} has LoRA factors of shapes {a} and {b}; jaxshare reads "
            "LoRA of Linear and Embedding layers (2-D factors) only."
        )
    if a[0] != rank or b[1] != rank:
        raise ValueError(
            f"{where}: {module!r} has A {a} and B {b}, expected rank {rank} "
            f"(A (r, in), B (out, r)) as the config says."
        )


class Adapter:
    """A PEFT LoRA adapter directory (see :func:`read_adapter`).

    Attributes:
      path: the directory.
      config: its ``adapter_config.json``.
    """

    def __init__(self, path: Path, config: LoraConfig) -> None:
        self.path, self.config = path, config

    def __repr__(self) -> str:
        return f"Adapter({str(self.path)!r}, r={self.config.r})"

    @cached_property
    def _file(self) -> SafetensorsFile:
        return SafetensorsFile(self.path / ADAPTER_WEIGHTS)

    @cached_property
    def _names(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """``({module: {"A": key, "B": key, "embedding": bool}}, {base name: key})``,
        from the file's header alone, checked."""
        where = _where(self.path, ADAPTER_WEIGHTS)
        pairs: dict[str, dict[str, Any]] = {}
        saved: dict[str, str] = {}
        for key in self._file.infos:
            if not key.startswith(PEFT_PREFIX):
                raise ValueError(
                    f"{where}: tensor {key!r} does not start with {PEFT_PREFIX!r}, as PEFT "
                    "names a LoRA adapter's tensors."
                )
            name = key.removeprefix(PEFT_PREFIX)
            for suffix, variant in _VARIANT_TENSORS.items():
                if name.endswith(suffix):
                    raise ValueError(
                        f"{where}: tensor {key!r} is {variant}, a LoRA variant jaxshare does "
                        "not read."
                    )
            for suffix, (which, embedding) in _PAIR_SUFFIXES.items():
                if name.endswith(suffix):
                    module = name.removesuffix(suffix)
                    entry = pairs.setdefault(module, {"embedding": embedding})
                    if entry["embedding"] != embedding:
                        raise ValueError(
                            f"{where}: {module!r} has both Linear (lora_A/lora_B) and "
                            "Embedding (lora_embedding_A/_B) factors."
                        )
                    entry[which] = key
                    break
            else:
                base = name[: -len(_BASE_LAYER)] + ".weight" if name.endswith(_BASE_LAYER) else name
                saved[base] = key
        for module, entry in pairs.items():
            missing = [w for w in ("A", "B") if w not in entry]
            if missing:
                raise ValueError(f"{where}: {module!r} has no LoRA {missing[0]} tensor.")
            a, b = (self._file.infos[entry[w]].shape for w in ("A", "B"))
            _check_pair(where, module, a, b, self.config.rank_of(module))
        return pairs, saved

    def modules(self) -> dict[str, LoraPair]:
        """``{base module name: LoraPair}``, PEFT's prefix stripped
        (``model.layers.0.self_attn.q_proj``); the factors are read-only views of the
        mapped file, read when touched."""
        pairs, _ = self._names
        f = self._file
        return {
            module: LoraPair(f.array(e["A"]), f.array(e["B"]), e["embedding"])
            for module, e in sorted(pairs.items())
        }

    def saved(self) -> dict[str, Any]:
        """``{base tensor name: array}`` of the whole tensors the adapter replaces
        (``modules_to_save``, and embedding layers PEFT saves beside their adapter)."""
        _, saved = self._names
        return {name: self._file.array(key) for name, key in sorted(saved.items())}

    def scaling_of(self, module: str) -> float:
        """The scaling of ``module``'s delta (:meth:`LoraConfig.scaling_of`)."""
        return self.config.scaling_of(module)

    def tensor_names(self) -> dict[str, str]:
        """``{PEFT's tensor name: base name}``: each pair's factors under their module
        (``.lora_A``, ...), each saved tensor under the tensor it replaces."""
        pairs, saved = self._names
        out = {e[w]: m for m, e in pairs.items() for w in ("A", "B")}
        return {**out, **{key: name for name, key in saved.items()}}


def read_adapter(path: str | os.PathLike) -> Adapter:
    """The PEFT LoRA adapter in the directory ``path``; its config read and checked,
    its file's header checked (names, ranks); no tensor read.

    Raises:
      FileNotFoundError: no such directory, or no ``adapter_config.json`` or
        ``adapter_model.safetensors`` in it.
      ValueError: not a plain LoRA adapter, or a file that does not fit its config:
        one line naming the file and the key.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: expected a PEFT adapter directory ({ADAPTER_CONFIG} and "
            f"{ADAPTER_WEIGHTS}), found {'a file' if path.exists() else 'nothing'}."
        )
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (path / name).is_file():
            bin_file = name == ADAPTER_WEIGHTS and (path / "adapter_model.bin").exists()
            older = " (an older adapter_model.bin: load it in PEFT and save it again)"
            raise FileNotFoundError(
                f"{path}: expected a PEFT adapter directory, found no {name}"
                + (older if bin_file else "")
                + "."
            )
    where = _where(path)
    try:
        doc = json.loads((path / ADAPTER_CONFIG).read_text("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: not valid JSON ({e}).") from None
    adapter = Adapter(path, LoraConfig.from_document(doc, where))
    adapter.tensor_names()  # The header checked now: one line, before any use.
    return adapter


#: A PEFT adapter directory output, for :func:`jaxshare.internal.atomic_output`.
ADAPTER_DIRECTORY = OutputKind("a PEFT adapter directory", True, is_adapter_directory)


def save_adapter(
    out: str | os.PathLike,
    config: LoraConfig,
    modules: Mapping[str, LoraPair],
    saved: Mapping[str, Any] = MappingProxyType({}),
    *,
    force: bool = False,
) -> Path:
    """Writes a PEFT adapter directory that ``PeftModel.from_pretrained`` loads:
    ``adapter_config.json`` (:meth:`LoraConfig.document`) and
    ``adapter_model.safetensors`` in PEFT's names, written aside and renamed into
    place.

    Args:
      out: the directory.
      config: the adapter's config.
      modules: ``{base module name: LoraPair}`` (numpy or JAX arrays).
      saved: ``{base tensor name: array}`` of whole tensors the adapter replaces
        (``modules_to_save``; a LoRA module's own weight is written as PEFT's
        ``base_layer.weight``).
      force: replace an existing adapter directory at ``out``.

    Raises:
      ValueError: a pair whose rank is not the config's for its module, or not 2-D.
      FileExistsError: ``out`` exists and ``force`` is false.

    >>> import tempfile
    >>> out = tempfile.mkdtemp() + "/adapter"
    >>> pair = LoraPair(np.ones((2, 4), np.float32), np.zeros((3, 2), np.float32))
    >>> config = LoraConfig(r=2, lora_alpha=4, target_modules=("q_proj",))
    >>> adapter = read_adapter(save_adapter(out, config, {"layers.0.q_proj": pair}))
    >>> adapter.modules()["layers.0.q_proj"].A.shape, adapter.scaling_of("layers.0.q_proj")
    ((2, 4), 2.0)
    """
    out = Path(out)
    arrays: dict[str, np.ndarray] = {}
    for module, pair in modules.items():
        pair = LoraPair(np.asarray(pair.A), np.asarray(pair.B), pair.embedding)
        _check_pair(f"{out}", module, pair.A.shape, pair.B.shape, config.rank_of(module))
        name_a, name_b = pair.names(module)
        arrays[name_a], arrays[name_b] = pair.A, pair.B
    for name, value in saved.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module in modules:
            name = module + _BASE_LAYER
        arrays[name] = np.asarray(value)
    specs = [
        TensorSpec(PEFT_PREFIX + name, tuple(a.shape), numpy_dtype(a.dtype))
        for name, a in sorted(arrays.items())
    ]
    text = json.dumps(config.document(), indent=2, sort_keys=True) + "\n"
    with atomic_output(out, ADAPTER_DIRECTORY, force=force) as tmp:
        tmp.mkdir()
        (tmp / ADAPTER_CONFIG).write_text(text, "utf-8")
        with write_safetensors(tmp / ADAPTER_WEIGHTS, specs, {"format": "pt"}) as write:
            for _, a in sorted(arrays.items()):
                write([a])
    return out
