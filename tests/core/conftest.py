"""Leaves and container types the core tests build their trees from.

``trees`` holds two arrays, ``W`` (3, 4) and ``V`` (5,), and a NamedTuple and a
dataclass pytree to put them in; the tables of tie shapes are functions of it, so
that a tree named twice in a table holds the very same leaf objects.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest


class Block(NamedTuple):
    kernel: object
    bias: object


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Model:
    embed: object
    head: object
    extra: object = None


@pytest.fixture(scope="session")
def trees() -> SimpleNamespace:
    """``W``, ``V``, ``Block`` and ``Model``: one set of objects for the whole session."""
    return SimpleNamespace(
        W=jnp.arange(12.0).reshape(3, 4), V=jnp.ones(5), Block=Block, Model=Model
    )


@pytest.fixture(scope="session")
def W(trees: SimpleNamespace) -> jax.Array:
    return trees.W


@pytest.fixture(scope="session")
def V(trees: SimpleNamespace) -> jax.Array:
    return trees.V
