"""A head of a model, named the one way every view names it: "layer.head", both counted from 1.

>>> Head(4, 3).name, Head.at(3, 2).name, Head(4, 3).index
('4.3', '4.3', (3, 2))
"""

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Head:
    layer: int  # from 1
    head: int  # from 1, within its layer

    @classmethod
    def at(cls, layer: int, head: int) -> "Head":
        """The head at 0-based (layer, head): a row and a column of a (layers, heads) grid."""
        return cls(int(layer) + 1, int(head) + 1)

    @property
    def name(self) -> str:
        return f"{self.layer}.{self.head}"

    @property
    def index(self) -> tuple[int, int]:
        """(layer, head) from 0: where it sits in a (layers, heads) grid."""
        return self.layer - 1, self.head - 1

    def __str__(self) -> str:
        return self.name


def head_names(heads) -> list[str]:
    """"L.H" of each (layer, head) pair counted from 1."""
    return [Head(*pair).name for pair in heads]
