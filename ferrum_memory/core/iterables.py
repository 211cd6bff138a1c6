"""Iteration helpers shared by the apps."""

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TypeVar

Item = TypeVar("Item")


def batched(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    """`items` in lists of `size`, the last one shorter (itertools.batched, Python 3.12+)."""
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch
