"""Building SQL statements with numbered parameters."""

from typing import Any


class Params:
    """Collects query parameters; calling it with a value returns its `$n` placeholder, so a
    statement assembled from optional parts numbers its parameters without counting."""

    def __init__(self, *values: Any) -> None:
        self.values: list[Any] = list(values)

    def __call__(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}"
