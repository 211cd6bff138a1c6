"""MemoryOutSerializer.to_representation, built by hand, against DRF's field-by-field
representation of the same rows: same keys, same values, same JSON."""

from datetime import UTC, datetime, timedelta

import pytest
from rest_framework import serializers

from ferrum_memory.core.renderers import OrjsonRenderer
from memory.models import MemoryItem
from memory.selectors import MemoryHit
from memory.serializers import MemoryOutSerializer, MemorySearchOutSerializer

pytestmark = pytest.mark.django_db

CREATED = datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)


def item(**fields: object) -> MemoryItem:
    defaults: dict[str, object] = {
        "agent_id": "a",
        "content": "Ada took the dogs on a hike.",
        "content_hash": "h",
        "created_at": CREATED,
        "embedding": b"",
        "embedding_model": "m",
        "revision": 1,
    }
    return MemoryItem.objects.create(**{**defaults, **fields})


def test_an_item_is_drfs_field_by_field_representation():
    item()  # every default: no session, no position, no expiry
    fresh = item(
        session_id="s1",
        position=3,
        kind=MemoryItem.Kind.SEMANTIC,
        source=MemoryItem.Source.CONSOLIDATION,
        importance=0.25,
        sensitivity=MemoryItem.Sensitivity.PII,
        tags=["dogs", "é"],
        metadata={"k": [1, None, {"deep": 1.5}]},
        expires_at=CREATED + timedelta(days=1),
        access_count=7,
        version=4,
    )
    serializer, renderer = MemoryOutSerializer(), OrjsonRenderer()
    # As stored (a store's answer: choices as enum members) and as read back.
    for row in [fresh, *MemoryItem.objects.all()]:
        generic = dict(serializers.ModelSerializer.to_representation(serializer, row))
        assert set(generic) == set(MemoryOutSerializer.Meta.fields)
        assert serializer.to_representation(row) == generic
        assert renderer.render(serializer.to_representation(row)) == renderer.render(generic)


def test_a_search_answer_nests_the_same_representation():
    row = item(tags=["x"])
    hit = MemoryHit(row, 1.5, 0.75, 0.5, 1.0)
    answer = MemorySearchOutSerializer({"results": [hit]}).data
    generic = serializers.ModelSerializer.to_representation(MemoryOutSerializer(), row)
    assert answer["results"][0] == {"score": 1.5, "relevance": 0.75, "item": dict(generic)}
