"""The list of strategies, per engine, in the order of the first run."""

from __future__ import annotations

from sluicebench.strategies import classic, floor, peers, pyread, sluice
from sluicebench.strategies.base import Strategy


def all_strategies(engine: str) -> list[Strategy]:
    """Every strategy that can read from `engine`."""
    return [
        *floor.strategies(engine),
        *sluice.strategies(engine),
        *peers.strategies(engine),
        *classic.strategies(engine),
        *pyread.strategies(engine),
    ]
