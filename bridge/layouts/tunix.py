"""Tunix's layouts: the shipped tables, and any Tunix key-mapping as a table.

google-tunix loads a Hugging Face checkpoint into its NNX models through one
table per model, ``_get_key_and_transform_mapping(cfg)`` in
``tunix/models/*/params.py``: ``{torch regex: (nnx path, (permute, reshape))}``,
then a hand-written post-step (Gemma 3 stacks q, k and v into one einsum
kernel; Qwen3-MoE stacks its experts). The ``tunix`` layout ships that table
for Qwen3, Qwen3-MoE, Llama 3 and Gemma 3 (text) as data
(``bridge/layouts/tables/tunix/*.toml``), chosen by ``config.json``'s
``model_type``; :func:`from_tunix` turns any such mapping into a table of
jaxshare's own, post-steps as stack entries, so a model Tunix adds converts
both ways the day it lands.

Nothing here imports Tunix, torch or JAX.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from types import MappingProxyType
from typing import Any

from bridge.layouts.ops import Op, Permute, Split, Stack
from bridge.layouts.table import TABLES, Entry, Table, TableTie, read_table

__all__ = ["TUNIX_TABLES", "from_tunix", "tunix_tables"]

#: Where the shipped tables are.
TUNIX_TABLES = TABLES / "tunix"


@cache
def tunix_tables() -> tuple[Table, ...]:
    """The shipped Tunix tables: Qwen3, Llama 3, Gemma 3 (text)."""
    return tuple(read_table(path) for path in sorted(TUNIX_TABLES.glob("*.toml")))


_GROUP = re.compile(r"\((?!\?)([^()]*)\)")
_OPTIONAL = re.compile(r"\(\?:[^()]*\)\?")
#: Tunix's post-steps, by the temporary paths its table maps to.
_GEMMA3_QKV = re.compile(r"tmp\.layers\.\\1\.attn\.([qkv])")


def _pattern(regex: str, where: str) -> tuple[str, dict[str, tuple[str, ...]], list[str]]:
    """A Tunix torch regex as a name pattern: its groups as placeholders (numbers
    as ``{i}``, ``{e}``; alternatives as named parts), an optional prefix left out."""
    text = _OPTIONAL.sub("", regex)
    names: list[str] = []
    parts: dict[str, tuple[str, ...]] = {}
    numbers = iter(("i", "e", "n"))

    def group(m: re.Match[str]) -> str:
        body = m.group(1)
        if body in ("[0-9]+", r"\d+"):
            name = next(numbers)
        elif re.fullmatch(r"[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)+", body):
            name = f"p{len(parts)}" if parts else "p"
            parts[name] = tuple(body.split("|"))
        else:
            raise ValueError(f"{where}: the group ({body}) is not a number or a list of names")
        names.append(name)
        return "{" + name + "}"

    text = _GROUP.sub(group, text)
    plain = text.replace("\\.", ".")
    if re.search(r"[\\^$*+?()\[\]|]", plain.replace("{", "").replace("}", "")):
        raise ValueError(f"{where}: {regex!r} is not a name pattern jaxshare can read")
    return plain, parts, names


def _target(path: str, names: list[str]) -> str:
    r"""A Tunix nnx path (``layers.\1.attn.q_proj.w``) as a Flax path pattern."""
    out = re.sub(r"\\(\d)", lambda m: "{" + names[int(m.group(1)) - 1] + "}", path)
    return out.replace(".", "/")


def _size(config: Any, key: str, hf_key: str) -> int | None:
    if isinstance(config, Mapping):
        return config.get(hf_key)
    return getattr(config, key, None)


def _reshape(shape: tuple[int, ...], rank: int, hidden: int | None, where: str) -> Op:
    """Tunix's reshape of a ``rank``-D kernel to ``shape`` as a split: the axis
    of the hidden size stays, the other splits."""
    if rank != 2 or len(shape) != 3:
        raise ValueError(f"{where}: a reshape of a {rank}-D tensor to {shape} is not a split")
    first, last = shape[0] == hidden, shape[-1] == hidden
    if first == last:
        raise ValueError(
            f"{where}: cannot tell which axis of {shape} the hidden size ({hidden}) is; "
            "write the entry with an explicit split."
        )
    return Split(1, shape[1:]) if first else Split(0, shape[:2])


def from_tunix(mapping: Mapping[str, Any], *, config: Any, name: str = "tunix") -> Table:
    r"""A Tunix key mapping as a layout table.

    Args:
      mapping: what ``_get_key_and_transform_mapping(cfg)`` returns:
        ``{torch regex: (nnx path, None | (permute, reshape))}``.
      config: the model's ``config.json`` as a dict (or Tunix's ``ModelConfig``),
        whose hidden size tells which axis a reshape splits.
      name: the table's name.

    Groups ``([0-9]+)`` become ``{i}`` (then ``{e}``), alternatives
    ``(gate|up|down)`` named parts, an optional prefix ``(?:language_model\.)?``
    is left out. Paths under ``unused.`` become ``ignore`` patterns. Tunix's
    post-steps become stack entries: Gemma 3's ``tmp.layers.\1.attn.{q,k,v}``
    (heads first, then stacked into ``qkv_einsum``, or ``q_einsum`` and
    ``kv_einsum``). Where both ``lm_head`` and the embedding are mapped, the head
    is tied to the embedding when ``tie_word_embeddings`` is set (the model
    computes it) and a leaf of its own otherwise. Entries are optional: a Tunix
    table maps more than any one model holds (Llama's q_norm, Qwen3's experts).

    Raises:
      ValueError: one line naming the regex: a group that is neither a number nor
        a list of names, a reshape that is not a split of a kernel.

    >>> t = from_tunix({r"model\.layers\.([0-9]+)\.self_attn\.q_proj\.weight": (
    ...     r"layers.\1.attn.q_proj.w", ((1, 0), (8, 2, 4)))}, config={"hidden_size": 8})
    >>> t.entries[0].describe()
    'model.layers.{i}.self_attn.q_proj.weight -> layers/{i}/attn/q_proj/w'
    >>> t.entries[0].ops
    (Permute(perm=(1, 0)), Split(axis=1, into=(2, 4)))
    """
    hidden = _size(config, "embed_dim", "hidden_size")
    heads = _size(config, "num_heads", "num_attention_heads")
    kv_heads = _size(config, "num_kv_heads", "num_key_value_heads")
    entries: list[Entry] = []
    ignore: list[str] = []
    qkv: dict[str, tuple[str, tuple[Op, ...]]] = {}
    for regex, value in mapping.items():
        where = f"the Tunix key mapping, {regex!r}"
        if not isinstance(value, tuple | list) or len(value) != 2:
            raise ValueError(f"{where}: expected (nnx path, transform), got {value!r}")
        target, transform = value
        if target.startswith("unused"):
            plain = _OPTIONAL.sub("", regex).replace(".*", "*").replace("\\.", ".")
            ignore.append(re.sub(r"\([^()]*\)", "*", plain))
            continue
        torch, parts, names = _pattern(regex, where)
        ops: list[Op] = []
        if transform is not None:
            permute, reshape = transform
            if permute:
                ops.append(Permute(tuple(permute)))
            if reshape:
                ops.append(_reshape(tuple(reshape), len(permute or (0, 1)), hidden, where))
        fused = _GEMMA3_QKV.fullmatch(target)
        if fused is not None:
            qkv[fused.group(1)] = (torch, tuple(ops))
            continue
        entries.append(Entry(torch, _target(target, names), tuple(ops), parts, optional=True))
    if qkv:
        entries.extend(_gemma3_qkv(qkv, heads, kv_heads))
    ties: tuple[TableTie, ...] = ()
    torch_names = {e.torch for e in entries}
    if {"lm_head.weight", "model.embed_tokens.weight"} <= torch_names:
        head = next(e for e in entries if e.torch == "lm_head.weight")
        entries[entries.index(head)] = Entry(
            head.torch, head.flax, head.ops, head.parts, "not tie_word_embeddings", True
        )
        ties = (
            TableTie("lm_head.weight", "model.embed_tokens.weight", True, "tie_word_embeddings"),
        )
    return Table(
        name,
        tuple(entries),
        ties,
        defaults=MappingProxyType({"tie_word_embeddings": False}),
        ignore=tuple(ignore),
    )


def _gemma3_qkv(
    qkv: Mapping[str, tuple[str, tuple[Op, ...]]], heads: int | None, kv_heads: int | None
) -> list[Entry]:
    """Gemma 3's post-step (``_make_preprocess_fn``) as stack entries: each of q,
    k, v with its heads first, stacked into ``qkv_einsum`` when there are as many
    key-value heads as query heads, else q alone and k, v stacked."""
    if set(qkv) != {"q", "k", "v"}:
        raise ValueError(f"the Tunix key mapping stacks q, k and v; it maps only {sorted(qkv)}")
    pattern = qkv["q"][0].replace("q_proj", "{p}_proj")
    heads_first = Permute((1, 0, 2))
    if heads is not None and heads == kv_heads:
        return [
            Entry(
                pattern,
                "layers/{i}/attn/qkv_einsum/w",
                (*qkv["q"][1], heads_first, Stack("p", 0)),
                MappingProxyType({"p": ("q", "k", "v")}),
                optional=True,
            )
        ]
    return [
        Entry(
            qkv["q"][0], "layers/{i}/attn/q_einsum/w", (*qkv["q"][1], heads_first), optional=True
        ),
        Entry(
            pattern,
            "layers/{i}/attn/kv_einsum/w",
            (*qkv["k"][1], heads_first, Stack("p", 0)),
            MappingProxyType({"p": ("k", "v")}),
            optional=True,
        ),
    ]
