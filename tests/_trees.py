"""Leaves and container types shared by the core tests."""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

W = jnp.arange(12.0).reshape(3, 4)
V = jnp.ones(5)


class Block(NamedTuple):
    kernel: object
    bias: object


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Model:
    embed: object
    head: object
    extra: object = None
