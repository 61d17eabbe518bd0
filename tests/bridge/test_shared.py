"""``bridge.shared_params``: DeepSpeed's output, right where DeepSpeed is wrong.

Each DeepSpeed flaw has a test that runs ``deepspeed_shared_params`` -- a
restatement of ``DeepSpeedEngine._get_shared_params`` (deepspeed/runtime/
engine.py, 0.19.8) in ``tests/_support/deepspeed_walk.py``, a fixture -- beside ours, asserting the
wrong answer it gives and the right one we give. ``benchmarks/bridge_convert.py`` runs
the real DeepSpeed.
"""

from collections.abc import Callable, Iterator, Mapping

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import parametrize

from bridge import shared_params
from bridge.torch.shared import state_dict_of, storage_key
from jaxshare.internal import memory_ties


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
        (lambda a: a[:1].expand(6), False),  # another stride alone
    ],
    ids=[
        "same",
        "detached",
        "reshaped-back",
        "prefix",
        "suffix",
        "dtype",
        "copy",
        "stride",
        "broadcast",
    ],
)
def test_tensors_are_keyed_by_storage_offset_shape_stride_and_dtype(make_b, tied):
    a = torch.arange(6.0)
    state = {"a": a, "b": make_b(a)}
    assert shared_params(state) == ({"b": "a"} if tied else {})
    # The plain key and the extent agree on every pair.
    assert _assert_keys_agree([a, state["b"]]) == (2 if tied and state["b"] is not a else 0)


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


# -- the walk is state_dict() --------------------------------------------------
# `state_dict_of` walks a module itself where every submodule saves as
# `nn.Module` does, and asks `state_dict()` otherwise: either way the same names,
# order and objects as `state_dict(keep_vars=True)`, and the same ties as keying
# that state dict by extents.


def _ties_of_state_dict(module: nn.Module) -> dict[str, str]:
    """The oracle: ``state_dict(keep_vars=True)`` keyed by extents."""
    state = module.state_dict(keep_vars=True)
    return memory_ties({n: storage_key(v, extent=True) for n, v in state.items()}).aliases


def _assert_walk_is_state_dict(module: nn.Module) -> None:
    got, want = state_dict_of(module), module.state_dict(keep_vars=True)
    assert list(got) == list(want)
    assert all(got[k] is want[k] for k in want)
    assert shared_params(module) == _ties_of_state_dict(module)


def _gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=16, n_positions=8)
    return transformers.GPT2LMHeadModel(config)


def _buffers() -> nn.Module:
    model = nn.Module()
    table = torch.arange(4.0)
    model.register_buffer("cos", table)
    model.register_buffer("scratch", table, persistent=False)
    model.register_buffer("cos_again", table)
    model.register_buffer("unset", None)
    model.register_parameter("no_bias", None)
    model.register_module("no_child", None)
    return model


def _batchnorms() -> nn.Module:
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2), nn.BatchNorm2d(2))
    model[2].running_mean = model[1].running_mean  # buffers tied, `num_batches_tracked` kept
    return model


def _parameter_twice() -> nn.Module:
    model = nn.Linear(2, 2)
    model.register_parameter("weight_again", model.weight)
    return model


class _Symmetric(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.triu() + x.triu(1).transpose(-1, -2)


def _parametrized() -> nn.Module:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    parametrize.register_parametrization(model[0], "weight", _Symmetric())
    model[1].weight = model[0].parametrizations.weight.original
    return model


class _SavesATie(nn.Linear):  # a class that saves more than `nn.Module` does
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight_copy"] = destination[prefix + "weight"]


class _StateDictSavesATie(nn.Linear):  # as a class overriding `state_dict` itself
    def state_dict(self, *, destination=None, prefix="", keep_vars=False):
        out = super().state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)
        out[prefix + "weight_again"] = out[prefix + "weight"]
        return out


class _TensorExtraState(nn.Linear):  # its extra state is a tensor (as Transformer Engine's)
    def get_extra_state(self) -> torch.Tensor:
        return self.weight

    def set_extra_state(self, state: torch.Tensor) -> None:
        pass


def _in(child: nn.Module, hook: Callable[[nn.Module], object] | None = None) -> nn.Module:
    """``child`` under a parent that has a tie of its own; ``hook(child)`` applied."""
    model = TiedLM()
    model.block = child
    if hook is not None:
        hook(child)
    return model


def _patch_state_dict(module: nn.Module) -> None:
    original = module.state_dict

    def state_dict(*, destination=None, prefix="", keep_vars=False):
        out = original(destination=destination, prefix=prefix, keep_vars=keep_vars)
        out[prefix + "weight_again"] = out[prefix + "weight"]
        return out

    module.state_dict = state_dict  # type: ignore[method-assign]  # the object's own


def _drop_bias_after_saving(module: nn.Module) -> None:
    def hook(m: nn.Module, state: dict, prefix: str, meta: dict) -> None:
        del state[prefix + "bias"]

    module.register_state_dict_post_hook(hook)


def _tie_before_saving(module: nn.Module) -> None:
    table = torch.arange(3.0)

    def hook(m: nn.Module, prefix: str, keep_vars: bool) -> None:
        m.register_buffer("table", table)
        m.register_buffer("table_again", table)

    module.register_state_dict_pre_hook(hook)


def _renaming_root_hook(module: nn.Module) -> nn.Module:
    # The private API, whose returned dict replaces the root's state dict.
    module._register_state_dict_hook(
        lambda m, sd, prefix, meta: {"x." + k: v for k, v in sd.items()}
    )
    return module


@pytest.mark.parametrize(
    "make",
    [
        _gpt2,
        _batchnorms,
        _twice_registered_module,
        _parameter_twice,
        _buffers,
        _parametrized,
        Encoder,
        # Each of these only `state_dict()` can answer:
        lambda: _in(_SavesATie(2, 2)),
        lambda: _in(_StateDictSavesATie(2, 2)),
        lambda: _in(_TensorExtraState(2, 2)),
        lambda: _in(nn.Linear(2, 2), _patch_state_dict),
        lambda: _in(nn.Linear(2, 2), _drop_bias_after_saving),
        lambda: _in(nn.Linear(2, 2), _tie_before_saving),
        lambda: _in(TiedLM(), _renaming_root_hook),
        lambda: _renaming_root_hook(TiedLM()),
    ],
    ids=[
        "gpt2",
        "batchnorm",
        "shared-module",
        "parameter-twice",
        "buffers-and-none",
        "parametrized",
        "four-names",
        "save-to-state-dict",
        "state-dict-override",
        "tensor-extra-state",
        "patched-state-dict",
        "post-hook",
        "pre-hook",
        "child-returning-hook",
        "root-returning-hook",
    ],
)
def test_the_walk_is_state_dict(make):
    module = make()
    _assert_walk_is_state_dict(module)
    assert shared_params(module)  # every case has a tie, so a lost one would show


def test_the_walk_of_a_lazy_module_is_state_dict():
    module = nn.Sequential(nn.LazyLinear(3), nn.Linear(3, 3))  # LazyLinear saves its own way
    got, want = state_dict_of(module), module.state_dict(keep_vars=True)
    assert list(got) == list(want) and all(got[k] is want[k] for k in want)


# Views of a 1-D tensor (of 12 elements, or of none).
_VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "same": lambda t: t,
    "view": lambda t: t.view(t.shape),
    "prefix": lambda t: t[: len(t) // 2],
    "suffix": lambda t: t[len(t) // 2 :],
    "matrix": lambda t: t.view(2, -1) if len(t) else t.view(0, 2),
    "transposed": lambda t: t.view(2, -1).t() if len(t) else t.view(0, 2).t(),
    "matrix, strided": lambda t: t.view(-1, 2).t() if len(t) else t.view(2, 0),
    "broadcast": lambda t: t[:1].expand(len(t)),
    "as int": lambda t: t.view(torch.int32) if t.dtype == torch.float32 else t,
}


def _assert_keys_agree(tensors: list) -> int:
    """Asserts that the plain key is equal exactly where the extent is, pair by
    pair; returns how many pairs of distinct objects are one."""
    ties = 0
    for a in tensors:
        for b in tensors:
            same_extent = storage_key(a, extent=True) == storage_key(b, extent=True)
            assert (storage_key(a) == storage_key(b)) is same_extent, (a, b)
            ties += same_extent and a is not b
    return ties


def test_the_plain_key_is_equal_exactly_where_the_extent_is():
    zero3 = nn.Parameter(torch.empty(0))
    zero3.ds_id = 3
    tensors = [
        *(
            view(memory)
            for memory in (torch.arange(12.0), torch.zeros(0))
            for view in _VIEWS.values()
        ),
        torch.arange(12.0, device="meta"),
        zero3,
        "not a tensor",
    ]
    # "same" and "view" of the 12 elements, both ways; no zero-size pair.
    assert _assert_keys_agree(tensors) == 2


@st.composite
def _module_trees(draw: st.DrawFn) -> nn.Module:
    """Modules of parameters and buffers (persistent or not, or ``None``) over one
    memory and a zero-size tensor, as views of several shapes, offsets and dtypes or
    the very same objects again, and children registered once or under several
    names."""
    memory = [torch.arange(12.0), torch.zeros(0)]
    tensors: list[torch.Tensor] = []
    modules: list[nn.Module] = []
    for _ in range(draw(st.integers(1, 4))):
        module = nn.Module()
        for j in range(draw(st.integers(1, 6))):
            kind = draw(st.sampled_from(["parameter", "buffer", "again", "child", "none"]))
            if kind == "again" and tensors:
                again = draw(st.sampled_from(tensors))
                if isinstance(again, nn.Parameter):
                    module.register_parameter(f"p{j}", again)
                else:
                    module.register_buffer(f"b{j}", again, persistent=draw(st.booleans()))
            elif kind == "child" and modules:
                module.register_module(f"c{j}", draw(st.sampled_from(modules)))
            elif kind == "none":
                register = draw(st.sampled_from(["parameter", "buffer", "module"]))
                getattr(module, f"register_{register}")(f"n{j}", None)
            elif kind in ("parameter", "buffer"):
                tensor = _VIEWS[draw(st.sampled_from(list(_VIEWS)))](draw(st.sampled_from(memory)))
                if kind == "parameter":
                    tensor = nn.Parameter(tensor, requires_grad=False)
                    module.register_parameter(f"p{j}", tensor)
                else:
                    module.register_buffer(f"b{j}", tensor, persistent=draw(st.booleans()))
                tensors.append(tensor)
        if draw(st.integers(0, 9)) == 0:  # now and then, one only `state_dict()` can answer
            module.register_state_dict_post_hook(lambda m, sd, prefix, meta: None)
        modules.append(module)
    return modules[-1]


@given(_module_trees())
def test_the_walk_is_state_dict_on_any_module_tree(module):
    _assert_walk_is_state_dict(module)
    _assert_keys_agree(list(state_dict_of(module).values()))
