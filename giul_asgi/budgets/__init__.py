"""Energy budgets: joules or grams of CO2e per tenant, route or tier, per period, one server's.

- :mod:`.budget`: :class:`Budget`, the operator's value, checked when built;
- :mod:`.spending`: :class:`Budgets`, what each key spent this period across the server's
  workers, read on the request's path with one dictionary lookup, and the 429 it refuses with;
- :mod:`.shared`: the server's folder in the host's place where the workers meet.
"""

from __future__ import annotations

from .budget import PER, PERIODS, Budget, check_budgets
from .spending import Budgets, Measuring, OverBudget, Reserved

__all__ = ["PER", "PERIODS", "Budget", "Budgets", "Measuring", "OverBudget", "Reserved", "check_budgets"]
