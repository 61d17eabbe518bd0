"""``bridge.shared_params``: DeepSpeed's output, right where DeepSpeed is wrong.

Each DeepSpeed flaw has a test that runs ``deepspeed_shared_params`` -- a
restatement of ``DeepSpeedEngine._get_shared_params`` (deepspeed/runtime/
engine.py, 0.19.8) in ``tests/_support/deepspeed_walk.py``, a fixture -- beside ours, asserting the
wrong answer it gives and the right one we give. ``benchmarks/bridge_convert.py`` runs
the real DeepSpeed.
"""

from collections.abc import Iterator, Mapping

import pytest
import torch
from torch import nn

from bridge import shared_params
from bridge.torch.shared import storage_key


class TiedLM(nn.Module):
    def __init__(self, tie: bool = True):
        super().__init__()
        self.wte = nn.Embedding(8, 4)
        self.ln = nn.LayerNorm(4)
        self.lm_head = nn.Linear(4, 8, bias=False)
        if tie:
            self.lm_head.weight = self.wte.weight


class Encoder(nn.Module):  # T5-like: one embedding under four names
    def __init__(self):
        super().__init__()
        self.shared = nn.Embedding(8, 4)
        self.encoder = nn.Module()
        self.encoder.embed_tokens = self.shared
        self.decoder = nn.Module()
        self.decoder.embed_tokens = self.shared
        self.lm_head = nn.Linear(4, 8, bias=False)
        self.lm_head.weight = self.shared.weight


def _twice_registered_module() -> nn.Module:
    block = nn.Linear(2, 2)
    return nn.ModuleDict({"a": block, "b": block})


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: TiedLM(tie=False), {}),
        (TiedLM, {"lm_head.weight": "wte.weight"}),
        (
            Encoder,
            {
                "encoder.embed_tokens.weight": "shared.weight",
                "decoder.embed_tokens.weight": "shared.weight",
                "lm_head.weight": "shared.weight",
            },
        ),
        (_twice_registered_module, {"b.weight": "a.weight", "b.bias": "a.bias"}),
    ],
    ids=["none", "pair", "four-names", "shared-module"],
)
def test_ties_of_a_module(make, expected):
    assert shared_params(make()) == expected


@pytest.mark.parametrize(
    "make", [TiedLM, Encoder, lambda: TiedLM(tie=False)], ids=["pair", "four", "none"]
)
def test_agrees_with_deepspeed_where_deepspeed_is_right(make, deepspeed_shared_params):
    model = make()
    assert shared_params(model) == deepspeed_shared_params(model)


def test_state_dict_and_module_agree_and_keep_state_dict_order():
    model = Encoder()
    ours = shared_params(model.state_dict())  # detached copies: distinct objects, one memory
    assert ours == shared_params(model)
    assert list(ours) == [k for k in model.state_dict() if k in ours]


# -- one test per DeepSpeed flaw ---------------------------------------------


def test_zero_size_parameters_are_not_tied(deepspeed_shared_params):
    model = nn.ParameterDict(
        {"a": nn.Parameter(torch.empty(0)), "b": nn.Parameter(torch.empty(0, 7))}
    )
    assert deepspeed_shared_params(model) == {"b": "a"}  # data_ptr() == 0 for both
    assert shared_params(model) == {}


def test_a_view_at_the_same_address_with_another_shape_is_not_a_tie(deepspeed_shared_params):
    model = nn.Module()
    model.a = nn.Parameter(torch.arange(10.0))
    model.b = nn.Parameter(model.a.data[:5])
    assert model.b.data_ptr() == model.a.data_ptr()
    assert deepspeed_shared_params(model) == {"b": "a"}
    assert shared_params(model) == {}


def test_persistent_buffers_are_walked(deepspeed_shared_params):
    model = nn.Module()
    table = torch.arange(4.0)
    model.register_buffer("cos", table)
    model.register_buffer("cos_again", table)
    model.register_buffer("scratch", table, persistent=False)  # not in state_dict
    assert deepspeed_shared_params(model) == {}
    assert shared_params(model) == {"cos_again": "cos"}


def test_a_module_registered_twice_under_one_parent_is_found(deepspeed_shared_params):
    model = _twice_registered_module()
    assert deepspeed_shared_params(model) == {}  # named_children() skips the second name
    assert shared_params(model) == {"b.weight": "a.weight", "b.bias": "a.bias"}


def test_a_parameter_registered_twice_in_one_module_is_found(deepspeed_shared_params):
    model = nn.Module()
    weight = nn.Parameter(torch.ones(3))
    model.register_parameter("w", weight)
    model.register_parameter("w_alias", weight)
    assert deepspeed_shared_params(model) == {}  # named_parameters() skips it too
    assert shared_params(model) == {"w_alias": "w"}


def test_zero3_parameters_are_keyed_by_ds_id(deepspeed_shared_params):
    # Under ZeRO-3 every parameter is an empty placeholder; only ds_id tells them apart.
    model = nn.Module()
    for name, ds_id in [("wte", 0), ("other", 1), ("lm_head", 0)]:
        p = nn.Parameter(torch.empty(0))
        p.ds_id = ds_id
        model.register_parameter(name, p)
    assert deepspeed_shared_params(model, zero3=True) == {"lm_head": "wte"}
    assert shared_params(model) == {"lm_head": "wte"}


# -- keyed by storage, walking with references held ---------------------------


@pytest.mark.parametrize(
    "make_b, tied",
    [
        (lambda a: a, True),
        (lambda a: a.detach(), True),
        (lambda a: a.view(2, 3).view(6), True),
        (lambda a: a[:3], False),  # another shape
        (lambda a: a[3:], False),  # another offset
        (lambda a: a.view(torch.int32), False),  # another dtype
        (lambda a: a.view(3, 2).t().reshape(6), False),  # a copy
        (lambda a: a.as_strided((3,), (2,)), False),  # another stride
    ],
    ids=["same", "detached", "reshaped-back", "prefix", "suffix", "dtype", "copy", "stride"],
)
def test_tensors_are_keyed_by_storage_offset_shape_stride_and_dtype(make_b, tied):
    a = torch.arange(6.0)
    state = {"a": a, "b": make_b(a)}
    assert shared_params(state) == ({"b": "a"} if tied else {})


class _FreshTensors(Mapping):
    """A state dict whose values are made on access, as a lazy loader's are."""

    def __init__(self, n: int):
        self._keys = [f"t{i}" for i in range(n)]

    def __getitem__(self, key: str) -> torch.Tensor:
        return torch.ones(256)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def test_the_walk_holds_references_so_freed_addresses_are_not_ties():
    lazy = _FreshTensors(8)
    # Keyed one at a time without holding them, fresh tensors reuse freed memory:
    addresses = [storage_key(lazy[k]) for k in lazy]
    assert len(set(addresses)) < len(addresses)
    assert shared_params(lazy) == {}


def test_non_tensor_entries_are_never_tied():
    state = {"w": torch.ones(2), "_extra_state": b"x", "again": b"x"}
    assert shared_params(state) == {}


@pytest.mark.parametrize("bad, match", [(42, "got int"), ({1: torch.ones(1)}, "keys must be str")])
def test_bad_input_is_named(bad, match):
    with pytest.raises(TypeError, match=match):
        shared_params(bad)
