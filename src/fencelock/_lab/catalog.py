"""Every scenario the lab knows, in the order of the table: `SCENARIOS`, and `by_id`.

Each module of scenarios keeps its own list; this is the one place that joins them.
"""

from __future__ import annotations

from . import scenarios, scenarios_durable, scenarios_loss
from .scenarios import Scenario

SCENARIOS: list[Scenario] = sorted([*scenarios.SCENARIOS, *scenarios_loss.SCENARIOS,
                                    *scenarios_durable.SCENARIOS_DURABLE], key=lambda s: (s.number, s.id))


def by_id(scenario_id: str) -> Scenario:
    for s in SCENARIOS:
        if s.id == scenario_id:
            return s
    raise ValueError(f"unknown scenario {scenario_id!r}; known: {', '.join(s.id for s in SCENARIOS)}")


__all__ = ["SCENARIOS", "by_id"]
