"""Shared by the dream-cycle tests: small, fast dream settings and a bulk loader."""

from typing import Any

import pytest

from experience.models import Experience
from experience.services import experience_create_many
from tests.experience.factories import experience_jsons


@pytest.fixture
def dream_settings(settings: Any) -> Any:
    settings.DREAM_MIN_EXPERIENCES = 4
    settings.DREAM_BATCH_SIZE = 8
    settings.DREAM_STRATEGY = "prioritized"
    settings.DREAM_HALF_LIFE = 3600.0
    settings.DREAM_BETA0 = 0.4
    settings.DREAM_BETA_ANNEAL_CYCLES = 4
    settings.DREAM_LEASE_SECONDS = 300
    settings.DREAM_MAX_PENDING = 0
    return settings


def stock(agent_id: str, count: int, **overrides: Any) -> list[Experience]:
    """Store `count` experiences for an agent in one service call; return the rows."""
    items = experience_jsons(count, agent_id=agent_id, **overrides)
    for item in items:
        item["experience_id"] = item.pop("id")
    return [stored.experience for stored in experience_create_many(items=items)]
