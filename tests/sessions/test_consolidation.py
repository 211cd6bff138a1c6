"""Extraction and the exactly-once consolidation run."""

from datetime import timedelta

import numpy as np
import pytest
from celery.exceptions import Retry
from django.utils import timezone

from memory.embeddings import get_embedder
from memory.models import MemoryItem
from sessions.consolidation import (
    Sentence,
    budgeted_picks,
    extract,
    key_terms,
    tool_errors,
    word_budget,
)
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
FILLER = [
    "Haha, yes, that is so true, I really do agree with you.",
    "Oh wow, that is really really great, I am so happy for you.",
    "Yeah, totally, I know what you mean, that is so true.",
]


def sentences_of(texts: list[str]) -> list[Sentence]:
    embedder = get_embedder()
    return [
        Sentence(turn, text, len(text.split()), frozenset(embedder.sparse_document(text).indices))
        for turn, text in enumerate(texts)
    ]


def stored_words(extraction) -> int:
    texts = [extraction.summary, *extraction.decisions, *extraction.salient]
    return sum(len(text.split()) for text in texts)


def test_budgeted_picks_cover_every_cluster_when_only_coverage_counts():
    # Sentences without search terms: the gain is coverage alone (facility location).
    rng = np.random.default_rng(7)
    centres = np.eye(8, dtype=np.float32)[:4]
    points = np.repeat(centres, 10, axis=0) + rng.normal(0, 0.05, (40, 8)).astype(np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    sentences = [Sentence(i, f"s{i}", 5, frozenset()) for i in range(40)]
    picks = budgeted_picks(points, sentences, [0] * 40, budget=20)
    assert sorted(p // 10 for p in picks) == [0, 1, 2, 3]  # one per cluster, 4 x 5 words


def test_budgeted_picks_keep_specific_sentences_within_the_budget():
    texts = [*FILLER, *(group[0] for group in TOPICS.values())]
    sentences = sentences_of(texts)
    vectors = get_embedder().embed_documents(texts)
    prefix = [3] * len(texts)  # "[at] speaker:" words paid by each kept turn
    budget = 45
    picks = budgeted_picks(vectors, sentences, prefix, budget)
    assert sum(sentences[i].words + prefix[i] for i in picks) <= budget
    assert sorted(picks) == [3, 4, 5]  # the three topics, none of the filler
    assert budgeted_picks(vectors, sentences, prefix, budget=10) == []  # nothing fits


def test_a_long_session_lets_only_the_best_candidates_compete(monkeypatch):
    # Each step rescores every candidate, so a very long session is cut to the sentences worth
    # most on their own: the topics, not the filler.
    monkeypatch.setattr("sessions.consolidation.MAX_CANDIDATES", 3)
    texts = [*FILLER, *(group[0] for group in TOPICS.values())]
    sentences = sentences_of(texts)
    vectors = get_embedder().embed_documents(texts)
    picks = budgeted_picks(vectors, sentences, [3] * len(texts), budget=1_000)
    assert sorted(picks) == [3, 4, 5]


def test_key_terms_list_what_the_kept_sentences_miss():
    sentences = sentences_of(
        [
            "We flew to Lisbon and stayed near the harbour for the conference.",
            "The keynote about observability was better than expected.",
        ]
    )
    terms = key_terms(sentences, [1], get_embedder(), budget=3)
    assert terms[0] == "Lisbon"  # a name first
    assert len(terms) == 3 and not {"keynote", "observability"} & set(terms)
    assert key_terms(sentences, [0, 1], get_embedder(), budget=5) == []
    assert key_terms(sentences, [1], get_embedder(), budget=-1) == []  # a spent budget


@pytest.mark.parametrize("share", [0.1, 0.2, 0.4])
def test_extraction_keeps_the_informative_turns_within_the_word_budget(settings, share):
    settings.SESSION_CONSOLIDATION_SHARE = share
    texts = [t for group in TOPICS.values() for t in group] + FILLER * 3
    messages = chat(*texts, at="8 May 2023")
    session_words = sum(len(f"[8 May 2023] Ada: {t}".split()) for t in texts)
    extraction = extract({"messages": messages}, embedder=get_embedder())
    assert stored_words(extraction) <= word_budget(session_words)
    assert word_budget(session_words) == max(60, int(session_words * share))
    *turns, topics = extraction.summary.split("\n")  # the summary's turns, then its key terms
    kept = [*turns, *extraction.salient, *extraction.decisions]
    assert len(kept) == len(extraction.picked) >= 2
    assert all(line.startswith("[8 May 2023] Ada: ") for line in kept)  # the context kept
    assert not any(filler[:20] in line for line in kept for filler in FILLER)
    assert topics.startswith("Topics: ")


def test_kept_turns_with_a_decision_cue_outside_the_summary_are_decisions():
    texts = (
        "We decided to move the nightly backups to the Amsterdam region.",
        "The staging cluster runs Kubernetes 1.29 on three nodes in Frankfurt.",
        "We will rotate the database passwords every ninety days from now.",
        "Let's pin the Terraform provider to version 5.31 for the migration.",
    )
    extraction = extract({"messages": chat(*texts)}, embedder=get_embedder())
    assert len(extraction.picked) == 4  # a short session is kept whole
    summary_turns = extraction.summary.split("\n")
    assert len(summary_turns) == 2
    assert sorted([*summary_turns, *extraction.decisions, *extraction.salient]) == sorted(
        f"Ada: {text}" for text in texts
    )
    # Three of the four have a cue: at least one is not in the summary and is a decision.
    assert extraction.decisions and all("Kubernetes" not in d for d in extraction.decisions)
    assert all("Kubernetes" in s for s in extraction.salient)


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
