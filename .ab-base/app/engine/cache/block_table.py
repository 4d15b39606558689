"""A request's block table: the list of its KV block ids, with an int32 copy kept in step.

The runner writes every decoding sequence's table into a step's arrays. From a Python list that
converts each id to an int32 every step: at 32k tokens (2,000 blocks) about 40 us a row, 1.3 ms
a step of 32 sequences on the project's VM (bench/lab/host_cost.py). A table grows only at its
end, a block at a time while decoding, and is dropped whole when the request lets its blocks go;
so the copy here is updated by those changes alone and `array` is a view, no conversion.

`BlockTable` is a list (everything that reads or compares block tables as lists still does);
the appends (`append`, `extend`, `+=`) write only the new ids into the copy, and any other change
(assigning an item, deleting, sorting ...) rebuilds it, so the copy always equals the list.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex

import numpy as np

_MIN_CAPACITY = 16


class BlockTable(list[int]):
    __slots__ = ("_array",)

    def __init__(self, block_ids: Iterable[int] = ()) -> None:
        super().__init__(block_ids)
        self._array = np.empty(max(_MIN_CAPACITY, len(self)), dtype=np.int32)
        self._copy_from(0)

    @property
    def array(self) -> np.ndarray:
        """The ids as int32, a view valid until the table next changes (do not write to it)."""
        return self._array[: len(self)]

    # --- growth at the end: only the new ids are copied ---

    def append(self, block_id: int) -> None:
        super().append(block_id)
        self._copy_from(len(self) - 1)

    def extend(self, block_ids: Iterable[int]) -> None:
        start = len(self)
        super().extend(block_ids)
        self._copy_from(start)

    def __iadd__(self, block_ids: Iterable[int]) -> BlockTable:  # type: ignore[override,misc]
        self.extend(block_ids)
        return self

    # --- any other change rebuilds the copy ---

    def insert(self, index: SupportsIndex, block_id: int) -> None:
        super().insert(index, block_id)
        self._copy_from(0)

    def pop(self, index: SupportsIndex = -1) -> int:
        block_id = super().pop(index)
        self._copy_from(0)
        return block_id

    def remove(self, block_id: int) -> None:
        super().remove(block_id)
        self._copy_from(0)

    def sort(self, *args: Any, **kwargs: Any) -> None:
        super().sort(*args, **kwargs)
        self._copy_from(0)

    def reverse(self) -> None:
        super().reverse()
        self._copy_from(0)

    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        self._copy_from(0)

    def __delitem__(self, index: Any) -> None:
        super().__delitem__(index)
        self._copy_from(0)

    def __imul__(self, times: SupportsIndex) -> BlockTable:  # type: ignore[override,misc]
        super().__imul__(times)
        self._copy_from(0)
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # pickles and copies as the ids alone
        return (BlockTable, (list(self),))

    def _copy_from(self, start: int) -> None:
        """Write ids [start:] into the copy, growing its buffer (doubling) when they do not fit."""
        n = len(self)
        if n > len(self._array):
            grown = np.empty(max(n, 2 * len(self._array)), dtype=np.int32)
            grown[:start] = self._array[:start]
            self._array = grown
        if n > start:
            self._array[start:n] = self[start:n] if start else self


def block_table_array(block_ids: Sequence[int]) -> np.ndarray:
    """int32 ids of a block table: the kept copy of a BlockTable, else a conversion."""
    if isinstance(block_ids, BlockTable):
        return block_ids.array
    return np.asarray(block_ids, dtype=np.int32)


class BlockTableField:
    """Keeps a dataclass field a BlockTable whatever is assigned to it (a list, a range, a tuple):
    `request.block_ids = []` and `Request(..., block_ids=[1, 2])` still work as they did."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._attr = f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return ()  # the dataclass's default: an empty table (a tuple, so not a shared mutable)
        return getattr(obj, self._attr)

    def __set__(self, obj: Any, value: Iterable[int]) -> None:
        setattr(obj, self._attr, value if type(value) is BlockTable else BlockTable(value))
