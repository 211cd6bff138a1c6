from typing import Any

import factory

from experience.models import Experience
from experience.services import experience_create_many


class ToolCallFactory(factory.DictFactory):
    name = factory.Faker("word")
    arguments = factory.LazyFunction(lambda: {"query": "flights JFK SEA"})
    output = factory.Faker("sentence")
    error = None
    duration_ms = factory.Faker("pyfloat", min_value=0, max_value=500)


class TestResultFactory(factory.DictFactory):
    passed = factory.Faker("pybool")
    total = 10
    failed = factory.LazyAttribute(lambda o: 0 if o.passed else 3)
    errors = 0
    output = "10 tests"
    duration_ms = 1200.0


class ExperiencePayloadFactory(factory.DictFactory):
    """The JSON body of POST /experience/."""

    id = factory.Sequence(lambda n: f"exp-{n}")
    agent_id = "agent-a"
    task = factory.Faker("sentence", nb_words=12)
    tool_calls = factory.LazyFunction(lambda: [ToolCallFactory(), ToolCallFactory()])
    test_result = factory.SubFactory(TestResultFactory)
    reward = factory.Faker("pyfloat", min_value=-1, max_value=1)


def experience_json(**overrides: Any) -> dict[str, Any]:
    """A POST /experience/ body (typed as the dict DictFactory returns)."""
    return ExperiencePayloadFactory(**overrides)  # type: ignore[return-value]


def experience_jsons(count: int, **overrides: Any) -> list[dict[str, Any]]:
    return [experience_json(**overrides) for _ in range(count)]


def store(**overrides: Any) -> Experience:
    """Store one experience through the service, as the API would; return the model row."""
    item = experience_json(**overrides)
    item["experience_id"] = item.pop("id")
    return experience_create_many(items=[item])[0].experience
