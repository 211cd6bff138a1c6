"""Extraction and the exactly-once consolidation run."""

from datetime import timedelta

import numpy as np
import pytest
from celery.exceptions import Retry
from django.utils import timezone

from memory.embeddings import get_embedder
from memory.models import MemoryItem
from sessions.consolidation import extract, representative_turns, summary_size, tool_errors
from sessions.models import Consolidation
from sessions.services import (
    ConsolidationBusy,
    session_close,
    session_consolidation_run,
    session_start,
    session_update,
)
from sessions.tasks import consolidate_session
from tests.sessions.conftest import AGENT, chat

TOPICS = {
    "cooking": [
        "I baked sourdough bread with a long cold fermentation overnight.",
        "The pasta sauce needs fresh basil, garlic and San Marzano tomatoes.",
        "My oven runs hot so I roast vegetables at a lower temperature.",
    ],
    "football": [
        "Our team won the league match two goals to one on Saturday.",
        "The striker scored a penalty in the final minute of the game.",
        "The coach changed the formation to three defenders for the cup.",
    ],
    "taxes": [
        "I filed my income tax return and claimed the home office deduction.",
        "The accountant says the capital gains tax is due by April.",
        "We keep every receipt for the VAT audit next quarter.",
    ],
}


def test_representative_turns_cover_every_topic():
    texts = [t for group in TOPICS.values() for t in group]
    vectors = get_embedder().embed_documents(texts)
    picks = representative_turns(vectors, list(range(len(texts))), 3)
    assert len(picks) == 3
    assert sorted(p // 3 for p in picks) == [0, 1, 2]  # one per topic, not three of one


def test_representative_turns_maximise_coverage_on_synthetic_clusters():
    rng = np.random.default_rng(7)
    centres = np.eye(8, dtype=np.float32)[:4]
    points = np.repeat(centres, 10, axis=0) + rng.normal(0, 0.05, (40, 8)).astype(np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    picks = representative_turns(points, list(range(40)), 4)
    assert sorted(p // 10 for p in picks) == [0, 1, 2, 3]
    assert representative_turns(points, [], 3) == []
    assert representative_turns(points, [1, 2], 0) == []


def test_summary_size_keeps_a_share_of_the_turns():
    assert summary_size(1) == 1 and summary_size(20) == 3 and summary_size(1_000) == 12


def test_tool_errors_are_found_anywhere_in_tool_state():
    state = {
        "calls": [{"name": "pytest", "error": "2 failed"}, {"name": "ls", "error": None}],
        "git": {"error": "merge conflict in  setup.py"},
        "errors": [{"tool": "pip", "error": "no matching distribution"}],
    }
    assert sorted(tool_errors(state)) == [
        "Tool git failed: merge conflict in setup.py",
        "Tool pip failed: no matching distribution",
        "Tool pytest failed: 2 failed",
    ]


def test_extraction_without_turns_keeps_the_facts_and_task():
    extraction = extract(
        {"task": "Rotate keys", "facts": ["A", "a", "B"], "outcome": "done"},
        embedder=get_embedder(),
    )
    assert extraction.summary == "Task: Rotate keys\nOutcome: done"
    assert extraction.key_facts == ["A", "B"] and extraction.turn_count == 0


@pytest.mark.django_db
def test_a_configured_summarizer_writes_the_summary(settings):
    settings.SESSION_SUMMARIZER = "tests.sessions.summarizers.first_and_last"
    state = {"messages": chat("one two three four five", "six seven eight nine ten", at="May")}
    extraction = extract(state, embedder=get_embedder())
    assert extraction.summary == (
        "LLM summary of 2 turns: [May] Ada: one two three four five ... "
        "[May] Ada: six seven eight nine ten"
    )
    assert extraction.summarizer == "tests.sessions.summarizers.first_and_last"


def closed_consolidation(*texts: str) -> Consolidation:
    session, _ = session_start(agent_id=AGENT, fields={"task": "Write the report"})
    session_update(session_id=session.pk, version=1, fields={}, append_messages=chat(*texts))
    return session_close(session_id=session.pk)  # on_commit does not run: not sent


TEXTS = (
    "The quarterly report covers revenue growth in Europe and Asia.",
    "We decided to drop the chart about churn from the appendix.",
    "Marketing needs the final numbers before Thursday noon.",
)


@pytest.mark.django_db
def test_a_consolidation_runs_once():
    consolidation = closed_consolidation(*TEXTS)
    done = session_consolidation_run(consolidation_id=consolidation.pk)
    assert done.status == "done" and done.attempts == 1 and done.state is None
    items = MemoryItem.objects.count()
    assert items == len(done.memory_item_ids) >= 2
    again = session_consolidation_run(consolidation_id=consolidation.pk)
    assert again.attempts == 1 and MemoryItem.objects.count() == items
    assert again.session.summary_item_id == done.summary_item_id
    assert again.session.consolidated_version == 2


@pytest.mark.django_db
def test_a_run_killed_mid_task_is_taken_over_when_its_lease_ends():
    consolidation = closed_consolidation(*TEXTS)
    now = timezone.now()
    # A worker claimed it and was killed (nothing released the claim).
    Consolidation.objects.filter(pk=consolidation.pk).update(
        status="running", claim_token="dead", lease_until=now + timedelta(seconds=60)
    )
    with pytest.raises(ConsolidationBusy) as busy:
        session_consolidation_run(consolidation_id=consolidation.pk, now=now)
    assert 59 <= busy.value.retry_in <= 60
    done = session_consolidation_run(
        consolidation_id=consolidation.pk, now=now + timedelta(seconds=61)
    )
    assert done.status == "done" and done.memory_item_ids


@pytest.mark.django_db
def test_a_run_killed_after_storing_stores_nothing_twice():
    consolidation = closed_consolidation(*TEXTS)
    done = session_consolidation_run(consolidation_id=consolidation.pk)
    items = set(MemoryItem.objects.values_list("id", flat=True))
    # As if the worker died after storing the items and before finishing: the snapshot is
    # still there and the lease ran out.
    Consolidation.objects.filter(pk=consolidation.pk).update(
        status="running",
        lease_until=timezone.now() - timedelta(seconds=1),
        state=_snapshot(consolidation),
    )
    redone = session_consolidation_run(consolidation_id=consolidation.pk)
    assert redone.status == "done" and redone.attempts == 2
    assert set(MemoryItem.objects.values_list("id", flat=True)) == items
    assert sorted(redone.memory_item_ids) == sorted(done.memory_item_ids)


def _snapshot(consolidation: Consolidation) -> dict:
    from sessions.models import Session

    session = Session.objects.get(pk=consolidation.session_id)
    return {
        "session_id": str(session.pk),
        "agent_id": AGENT,
        "task": "Write the report",
        "messages": chat(*TEXTS),
        "version": consolidation.version,
    }


@pytest.mark.django_db
def test_an_error_releases_the_claim_for_the_next_try(settings):
    consolidation = closed_consolidation(*TEXTS)
    settings.SESSION_SUMMARIZER = "tests.sessions.summarizers.broken"
    with pytest.raises(RuntimeError):
        session_consolidation_run(consolidation_id=consolidation.pk)
    consolidation.refresh_from_db()
    assert consolidation.status == "pending" and consolidation.claim_token == ""
    assert not MemoryItem.objects.exists()
    settings.SESSION_SUMMARIZER = ""
    assert session_consolidation_run(consolidation_id=consolidation.pk).status == "done"


@pytest.mark.django_db
def test_the_task_runs_it_and_retries_while_another_run_holds_it():
    consolidation = closed_consolidation(*TEXTS)
    Consolidation.objects.filter(pk=consolidation.pk).update(
        status="running", claim_token="other", lease_until=timezone.now() + timedelta(seconds=30)
    )
    with pytest.raises(Retry):
        consolidate_session.apply(args=[consolidation.pk], throw=True)
    Consolidation.objects.filter(pk=consolidation.pk).update(status="pending")
    result = consolidate_session.apply(args=[consolidation.pk], throw=True).get()
    assert result["status"] == "done" and result["items"] >= 2


@pytest.mark.django_db
def test_an_unknown_consolidation_is_404():
    from ferrum_memory.core.exceptions import NotFound

    with pytest.raises(NotFound):
        session_consolidation_run(consolidation_id=987654)
