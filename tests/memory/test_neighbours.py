"""Items' order within their session, and the search's neighbour context built on it."""

import importlib
import uuid
from dataclasses import replace

import numpy as np
import pytest
from django.apps import apps

from memory.models import MemoryItem
from memory.selectors import memory_search
from memory.services import memory_store_many
from memory.vector_index import diversify_sessions, neighbour_context

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("vector_engine")]


def positions(agent_id="a"):
    rows = MemoryItem.objects.filter(agent_id=agent_id).values_list("content", "position")
    return dict(rows)


def test_a_session_numbers_its_items_in_store_order_across_batches():
    memory_store_many(
        items=[
            {"agent_id": "a", "session_id": "s1", "content": "one in s1"},
            {"agent_id": "a", "session_id": "s2", "content": "one in s2"},
            {"agent_id": "a", "session_id": "s1", "content": "two in s1"},
            {"agent_id": "a", "content": "no session at all"},
            {"agent_id": "b", "session_id": "s1", "content": "another agent's s1"},
        ]
    )
    memory_store_many(
        items=[
            {"agent_id": "a", "session_id": "s1", "content": "one in s1"},  # merged: no place
            {"agent_id": "a", "session_id": "s1", "content": "three in s1"},
        ]
    )
    assert positions() == {
        "one in s1": 0,
        "two in s1": 1,
        "three in s1": 2,
        "one in s2": 0,
        "no session at all": None,
    }
    assert positions("b") == {"another agent's s1": 0}


def test_the_migration_numbers_existing_items_in_the_order_they_were_stored():
    contents = [f"turn {i} of a long talk" for i in range(6)]
    memory_store_many(items=[{"agent_id": "a", "session_id": "s", "content": c} for c in contents])
    memory_store_many(items=[{"agent_id": "a", "content": "no session"}])
    MemoryItem.objects.update(position=None)
    migration = importlib.import_module("memory.migrations.0004_position")
    migration.number_sessions(apps, None)
    # One batch shares its created_at: the order comes from the events, not the random ids.
    assert positions() == {c: i for i, c in enumerate(contents)} | {"no session": None}


def test_neighbour_context_adds_the_best_adjacent_score_above_the_floor_and_half_two_away():
    a, b, c, d, e = (uuid.uuid4() for _ in range(5))
    hits = [(a, 3.0), (b, 2.0), (c, 1.0), (d, 0.5), (e, -1.0)]
    places = {a: ("s", 4), b: ("t", 0), c: ("s", 5), e: ("s", 3)}  # d: no session
    rescored = dict(neighbour_context(hits, places, 0.5))
    # floor -1; a's neighbours are c (1.0) and e (-1.0); c's is a (3.0); e's is a; b has none.
    # Two places away, at half the weight: e has c (s 5); c has e, at the floor; a has none.
    assert rescored == {
        a: 3.0 + 0.5 * 2.0,
        b: 2.0,
        c: 1.0 + 0.5 * 4.0,
        d: 0.5,
        e: -1.0 + 0.5 * (4.0 + 2.0 / 2),
    }
    assert [pk for pk, _ in neighbour_context(hits, places, 0.5)] == [a, c, b, e, d]
    assert neighbour_context([], {}, 0.5) == []


def test_session_diversity_lowers_each_further_hit_of_a_session():
    a, b, c, d, e = (uuid.uuid4() for _ in range(5))
    hits = [(a, 4.0), (b, 3.9), (c, 3.8), (d, 3.0), (e, 1.0)]
    places = {a: ("s", 0), b: ("s", 1), c: ("s", 2), d: ("t", 0)}  # e: no session
    step = float(np.std([score for _, score in hits]))  # 1.127: one standard deviation
    # a first; b and c lose one and two steps for a (and b) of their session ranked before
    # them, so d (another session) goes before them; e has no session and keeps its score.
    assert diversify_sessions(hits, places, 1.0) == [
        (a, 4.0),
        (d, 3.0),
        (b, pytest.approx(3.9 - step)),
        (c, pytest.approx(3.8 - 2 * step)),
        (e, 1.0),
    ]
    # A small penalty lowers the scores and keeps the order; none changes nothing.
    gentle = diversify_sessions(hits, places, 0.1)
    assert [pk for pk, _ in gentle] == [a, b, c, d, e]
    assert [score for _, score in gentle] == sorted((score for _, score in gentle), reverse=True)
    assert diversify_sessions(hits, places, 0.0) == hits
    assert diversify_sessions([], {}, 1.0) == []


TALK = [
    "Melanie: What did you bring to the potluck at the community garden last weekend?",
    "Caroline: A big pot of lentil soup with cumin, everyone asked for the recipe.",
    "Melanie: That sounds lovely, I should try making it.",
]
OTHERS = [
    "Caroline loves hiking in the mountains with her dog.",
    "Melanie painted a sunrise over the lake last year.",
    "The community centre opens at nine on weekdays.",
    "Caroline read a book about the history of bread.",
    "Melanie's kids play football on Saturdays.",
    "Caroline bought a new bicycle for the commute.",
    "Caroline planted tomatoes in the community garden.",
    "The garden club meets every second weekend.",
    "Caroline brought her guitar to the beach party.",
    "What should I bring to a picnic?",
]


def ranked(query, settings, weight, lever="MEMORY_NEIGHBOUR_WEIGHT"):
    setattr(settings, lever, weight)
    return [hit.item.content for hit in memory_search(query=query, agent_id="a", limit=10)]


def test_a_turn_is_found_through_the_turn_before_it(settings):
    default = settings.MEMORY_NEIGHBOUR_WEIGHT
    assert default > 0
    settings.MEMORY_PREVIOUS_TURN_WEIGHT = 0.0  # the neighbour context alone
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in OTHERS])
    memory_store_many(items=[{"agent_id": "a", "session_id": "talk", "content": c} for c in TALK])
    query = "What did Caroline bring to the potluck at the community garden?"
    without = ranked(query, settings, 0.0)
    with_context = ranked(query, settings, default)
    # The answer shares few words with the question; the question before it shares many.
    assert without[0] == TALK[0] and with_context[0] == TALK[0]
    assert without.index(TALK[1]) > 2 and with_context.index(TALK[1]) == 2, (without, with_context)
    # Items without a session keep their order among themselves (the last may drop out of the
    # top 10 below a turn that gained).
    kept = [c for c in with_context if c in OTHERS]
    assert kept == [c for c in without if c in OTHERS][: len(kept)]


def test_only_hybrid_search_uses_the_context(settings):
    default = settings.MEMORY_NEIGHBOUR_WEIGHT
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in OTHERS])
    memory_store_many(items=[{"agent_id": "a", "session_id": "talk", "content": c} for c in TALK])
    query = "What did Caroline bring to the potluck at the community garden?"
    for mode in ("dense", "sparse"):
        settings.MEMORY_NEIGHBOUR_WEIGHT = 0.0
        plain = memory_search(query=query, agent_id="a", limit=10, mode=mode)
        settings.MEMORY_NEIGHBOUR_WEIGHT = default
        again = memory_search(query=query, agent_id="a", limit=10, mode=mode)
        # The same ranking and scores; the in-process Qdrant answered the same dense search
        # with scores differing in the last float32 digit from one call to the next (seen on
        # this machine, on the code before the change too; the cause was not found).
        assert [h.item.pk for h in plain] == [h.item.pk for h in again]
        assert [h.score for h in again] == pytest.approx([h.score for h in plain], rel=1e-6)


def test_a_consolidations_items_get_no_context(settings):
    """Summaries and facts of one session are no conversation: they rank as fused."""
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in OTHERS])
    facts = [{"agent_id": "a", "session_id": "s", "kind": "semantic", "content": c} for c in TALK]
    memory_store_many(items=facts)
    assert set(positions().values()) == {None, 0, 1, 2}
    query = "What did Caroline bring to the potluck at the community garden?"
    default = settings.MEMORY_NEIGHBOUR_WEIGHT
    assert ranked(query, settings, default) == ranked(query, settings, 0.0)


def db_places():
    """(session, position) of each conversation's turn, as the DB has them."""
    turns = MemoryItem.objects.filter(kind=MemoryItem.Kind.EPISODIC, position__isnull=False)
    rows = turns.exclude(session_id="").values_list("pk", "session_id", "position")
    return {pk: (session, position) for pk, session, position in rows}


def test_the_context_reads_the_whole_pool_not_only_the_hits_asked_for(settings, monkeypatch):
    """A hit's neighbour counts wherever it ranks in the pool: asked for the top 1, the search
    still scores the question through the answer below it, against the pool's lowest score.
    The pool stays each mode's top PREFETCH (here 6 of 13 items), however many are asked for,
    and the places the index reads with it are the DB's."""
    from memory import vector_index
    from memory.embeddings import get_embedder
    from memory.vector_index import SearchFilter, get_vector_index

    monkeypatch.setattr(vector_index, "PREFETCH", 6)
    settings.MEMORY_SESSION_DIVERSITY = 0.0  # the context's scores alone
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in OTHERS])
    memory_store_many(items=[{"agent_id": "a", "session_id": "talk", "content": c} for c in TALK])
    query = "What did Caroline bring to the potluck at the community garden?"
    embedder = get_embedder()
    weight = settings.MEMORY_NEIGHBOUR_WEIGHT
    settings.MEMORY_NEIGHBOUR_WEIGHT = 0.0
    embedded = embedder.embed_query_tokens(query)
    pool = get_vector_index().search(
        mode="hybrid",
        dense=embedded.vector.tolist(),
        sparse=embedder.sparse_query(query),
        tokens=embedded.tokens.tolist(),
        flt=SearchFilter(agent_id="a", now=0.0),
        limit=1,
        whole_pool=True,
    )
    settings.MEMORY_NEIGHBOUR_WEIGHT = weight
    assert 6 < len(pool) < len(OTHERS) + len(TALK)
    places = db_places()
    expected = neighbour_context(pool, places, weight)
    top_only = neighbour_context(pool[:1], places, weight)
    # The top hit gains from a neighbour below it: with only itself there is nothing to gain.
    assert expected[0][0] == top_only[0][0] and expected[0][1] > top_only[0][1] == pool[0][1]

    hits = memory_search(query=query, agent_id="a", limit=1)

    assert [(h.item.pk, h.score) for h in hits] == [
        (pk, pytest.approx(score)) for pk, score in expected[:1]
    ]


def test_an_index_made_before_it_held_places_is_rebuilt_with_them(settings):
    """The places come from the index alone: an index whose points lack them ranks without
    the context, and one made by the layout before them is rebuilt on the next catch-up."""
    from memory.embeddings import get_embedder
    from memory.vector_index import _fingerprint, _point, get_vector_index, index_rows

    settings.MEMORY_SESSION_DIVERSITY = 0.0  # it reads the places too: the context alone
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in OTHERS])
    memory_store_many(items=[{"agent_id": "a", "session_id": "talk", "content": c} for c in TALK])
    query = "What did Caroline bring to the potluck at the community garden?"
    weight = settings.MEMORY_NEIGHBOUR_WEIGHT
    without, with_context = ranked(query, settings, 0.0), ranked(query, settings, weight)
    assert without != with_context
    index, model = get_vector_index(), get_embedder().model_name
    cursor = index.engine.load_state()["cursor"]
    points = [_point(row, model) for row in index_rows(MemoryItem.objects.all())]
    index.engine.reset(get_embedder().dim)
    index.engine.upsert(
        [
            replace(p, payload={k: v for k, v in p.payload.items() if k != "position"})
            for p in points
        ]
    )

    index.engine.save_state({"cursor": cursor, "model": _fingerprint(model)})
    assert ranked(query, settings, weight) == without  # what the index holds is what counts
    index.engine.save_state({"cursor": cursor, "model": f"{model} sentences"})  # the layout before
    assert ranked(query, settings, weight) == with_context


def test_a_turn_is_found_by_the_words_of_the_turn_before_it(settings):
    default = settings.MEMORY_PREVIOUS_TURN_WEIGHT
    assert default > 0
    settings.MEMORY_NEIGHBOUR_WEIGHT = 0.0  # the previous turn's words alone
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in OTHERS])
    memory_store_many(items=[{"agent_id": "a", "session_id": "talk", "content": c} for c in TALK])
    query = "What did Caroline bring to the potluck at the community garden?"
    without = ranked(query, settings, 0.0, lever="MEMORY_PREVIOUS_TURN_WEIGHT")
    with_words = ranked(query, settings, default, lever="MEMORY_PREVIOUS_TURN_WEIGHT")
    # The answer shares one word with the question ("Caroline"); the question before it, many.
    assert with_words.index(TALK[1]) < without.index(TALK[1]), (without, with_words)
    # The sparse mode searches each item's own words only.
    settings.MEMORY_PREVIOUS_TURN_WEIGHT = default
    sparse = memory_search(query="potluck", agent_id="a", limit=10, mode="sparse")
    assert [hit.item.content for hit in sparse] == [TALK[0]]


def holding_previous_words(word):
    """The items whose previous-turn document matches `word`, from the index itself."""
    from memory.embeddings import get_embedder
    from memory.vector_index import WITH_PREVIOUS, SearchFilter, get_vector_index

    embedder, index = get_embedder(), get_vector_index()
    index.catch_up()
    hits = index.engine.search(
        mode=WITH_PREVIOUS,
        dense=embedder.embed_query(word).tolist(),
        sparse=embedder.sparse_query(word),
        flt=SearchFilter(agent_id="a", now=0.0),
        limit=10,
    )
    ids = [uuid.UUID(pk) for pk, _ in hits]
    return set(MemoryItem.objects.filter(pk__in=ids).values_list("content", flat=True))


def test_a_deleted_turns_words_leave_the_next_turn():
    from memory.services import memory_delete_many

    memory_store_many(items=[{"agent_id": "a", "session_id": "talk", "content": c} for c in TALK])
    assert holding_previous_words("potluck") == {TALK[0], TALK[1]}
    assert holding_previous_words("lentil") == {TALK[1], TALK[2]}

    memory_delete_many(queryset=MemoryItem.objects.filter(content=TALK[0]))

    # Erased means erased: no other item's index entry keeps its words.
    assert holding_previous_words("potluck") == set()
    assert holding_previous_words("lentil") == {TALK[1], TALK[2]}


def test_an_edited_turns_new_words_reach_the_next_turn():
    from memory.services import memory_update

    memory_store_many(items=[{"agent_id": "a", "session_id": "talk", "content": c} for c in TALK])
    first = MemoryItem.objects.get(content=TALK[0])
    edited = "Melanie: What did you cook for the harvest festival at the allotment?"
    memory_update(item=first, version=first.version, changes={"content": edited})

    assert holding_previous_words("potluck") == set()
    assert holding_previous_words("allotment") == {edited, TALK[1]}


def test_the_next_turns_of_many_sessions_are_found_a_few_sessions_at_a_time(settings):
    """A catch-up after a long pause can touch thousands of sessions: SQLite refuses one
    expression over 1,000 deep, so they are asked in groups."""
    from memory.vector_index import next_turns

    settings.MEMORY_NEAR_DUPLICATE = 1.01  # keep every text: they are much alike

    items = [
        {"agent_id": "a", "session_id": f"s{n}", "content": f"{word} of talk {n}"}
        for n in range(150)
        for word in ("opening", "reply")
    ]
    memory_store_many(items=items)
    firsts = [("a", f"s{n}", 0) for n in range(150)]
    replies = MemoryItem.objects.filter(content__startswith="reply").values_list("pk", flat=True)
    assert len(replies) == 150
    assert sorted(next_turns(firsts)) == sorted(replies)
    assert next_turns([]) == []


GARDEN = [
    "Caroline: I planted tomatoes and basil in the community garden this spring.",
    "Melanie: Your tomatoes in the community garden look great, what soil do you use?",
    "Caroline: Compost from the community garden, the tomatoes love it.",
    "Melanie: I want to grow tomatoes in the community garden too next year.",
]
LATER = "Caroline: The garden club gave away tomato seedlings today."


def test_a_search_may_ask_for_its_hits_spread_over_sessions(api_client):
    """Four turns of one session outrank the one of another for the query; the default ranks
    them above it, as does 0 (relevance alone); a higher session_diversity lifts the other
    session's turn, up to right after the first."""
    memory_store_many(items=[{"agent_id": "a", "content": c} for c in OTHERS])
    memory_store_many(
        items=[{"agent_id": "a", "session_id": "spring", "content": c} for c in GARDEN]
    )
    memory_store_many(items=[{"agent_id": "a", "session_id": "summer", "content": LATER}])

    def turns(**options):
        """The conversations' turns among the hits, best first."""
        body = {"agent_id": "a", "query": "tomatoes in the community garden", **options}
        response = api_client.post("/memory/search", body, format="json")
        assert response.status_code == 200, response.json()
        hits = [hit["item"]["content"] for hit in response.json()["results"]]
        return [content for content in hits if content in [*GARDEN, LATER]]

    assert turns(session_diversity=0).index(LATER) == 4
    assert turns().index(LATER) == 4
    # Each further turn of a session costs more: the other session's turn rises step by step.
    assert turns(session_diversity=1).index(LATER) in (2, 3)
    assert turns(session_diversity=100).index(LATER) == 1
