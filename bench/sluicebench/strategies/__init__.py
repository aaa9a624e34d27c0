"""Every strategy the lab measures. To add one, see bench/README.md."""

from sluicebench.strategies.base import Context, Invocation, Strategy
from sluicebench.strategies.registry import all_strategies

__all__ = ["Context", "Invocation", "Strategy", "all_strategies"]
