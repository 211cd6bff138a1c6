"""POST /memory/search?rerank=true with a tiny cross-encoder the test builds itself, on both
vector engines (the `vector_engine` fixture of tests/memory/conftest.py).

The ONNX graph takes a cross-encoder's inputs (input_ids, attention_mask, token_type_ids, int64
[batch, seq]) and returns logits [batch, 1] = how many times one token ("banana") appears in the
tokenized (query, document) pair. So the reranked order is known in advance, and differs from
what dense + BM25 fusion would give: the item that matches the query best mentions bananas
least. fastembed loads it as a supported model name from a local folder (nothing downloaded),
with the MiniLM tokenizer files the project already assembles.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx  # requirements-dev.txt: builds the test's cross-encoder
import pytest
from rest_framework.test import APIClient

from memory.embeddings import _minilm_int8_dir, reset_reranker

# A model name fastembed's TextCrossEncoder supports; the files come from our folder.
RERANK_MODEL = "Xenova/ms-marco-MiniLM-L-6-v2"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
)
COUNTED_WORD = "banana"
AGENT = "agent-rerank"


def _token_id(folder: Path, word: str) -> int:
    from tokenizers import Tokenizer

    encoding = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(
        word, add_special_tokens=False
    )
    # tokenizer.json pads to a fixed length: keep the real tokens only.
    ids = [i for i, real in zip(encoding.ids, encoding.attention_mask, strict=True) if real]
    assert len(ids) == 1, f"{word!r} must be a single token of the MiniLM vocabulary"
    return ids[0]


def _counting_model(token_id: int) -> Any:
    """logits[b, 0] = number of unmasked positions of row b whose id is `token_id`."""
    from onnx import TensorProto, helper

    batch_seq = ["batch", "seq"]
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, batch_seq)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])
    nodes = [
        helper.make_node(
            "Constant",
            [],
            ["token"],
            value=helper.make_tensor("t", TensorProto.INT64, [], [token_id]),
        ),
        helper.make_node(
            "Constant", [], ["axis"], value=helper.make_tensor("a", TensorProto.INT64, [1], [1])
        ),
        helper.make_node("Equal", ["input_ids", "token"], ["is_token"]),
        helper.make_node("Cast", ["is_token"], ["is_token_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["is_token_f", "mask_f"], ["counted"]),
        # token_type_ids must be an input a cross-encoder gets, but does not change the score.
        helper.make_node("Cast", ["token_type_ids"], ["types_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["types_f", "mask_f"], ["types_masked"]),
        helper.make_node("ReduceSum", ["types_masked", "axis"], ["types_sum"], keepdims=1),
        helper.make_node("Mul", ["types_sum", "zero"], ["no_effect"]),
        helper.make_node("ReduceSum", ["counted", "axis"], ["count"], keepdims=1),
        helper.make_node("Add", ["count", "no_effect"], ["logits"]),
    ]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    graph = helper.make_graph(nodes, "count_token", inputs, [logits], initializer=[zero])
    # opset 13: ReduceSum takes its axes as an input; IR 8 keeps older onnxruntimes happy.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    return model


@pytest.fixture
def cross_encoder(settings: Any, tmp_path: Path) -> Iterator[Path]:
    """A fastembed model folder: our counting graph at onnx/model.onnx, MiniLM's tokenizer."""
    minilm = _minilm_int8_dir(tmp_path / "minilm")
    folder = tmp_path / "counting-cross-encoder"
    (folder / "onnx").mkdir(parents=True)
    for name in TOKENIZER_FILES:
        (folder / name).symlink_to((minilm / name).resolve())
    onnx.save(_counting_model(_token_id(folder, COUNTED_WORD)), folder / "onnx" / "model.onnx")
    reset_reranker()
    settings.FASTEMBED_RERANK_MODEL = RERANK_MODEL
    settings.FASTEMBED_RERANK_MODEL_PATH = str(folder)
    yield folder
    reset_reranker()


def _store(client: APIClient, contents: list[str]) -> dict[str, str]:
    body = [{"agent_id": AGENT, "content": content} for content in contents]
    response = client.post("/memory/store", body, format="json")
    assert response.status_code == 201, response.content
    items = response.json()["items"]
    assert all(item["indexed"] and not item["duplicate"] for item in items)
    return {item["item"]["content"]: item["point_id"] for item in items}


def _search(client: APIClient, query: str, rerank: bool | None, limit: int = 10) -> Any:
    path = "/memory/search" + ("" if rerank is None else f"?rerank={str(rerank).lower()}")
    body = {"agent_id": AGENT, "query": query, "limit": limit}
    return client.post(path, body, format="json")


# The query matches the first memory best, by words and by meaning, and the fourth not at all;
# the counted word appears 0, 1, 2 and 3 times.
MEMORIES = [
    "The deploy of the billing service failed because the database migration timed out.",
    "The billing service deploy was retried once; a banana was on the desk.",
    "Deploys of the billing service are slow on Fridays, banana banana.",
    "Lunch order: banana bread, banana smoothie and a banana.",
]
QUERY = "why did the billing service deploy fail? the database migration timed out"


@pytest.mark.django_db
def test_rerank_orders_by_the_cross_encoder(
    api_client: APIClient, vector_engine: str, cross_encoder: Path
) -> None:
    ids = _store(api_client, MEMORIES)

    fused = _search(api_client, QUERY, rerank=None)
    assert fused.status_code == 200, fused.content
    fused_ids = [hit["item"]["point_id"] for hit in fused.json()["results"]]
    assert fused_ids[0] == ids[MEMORIES[0]], "the fused ranking puts the best match first"

    reranked = _search(api_client, QUERY, rerank=True)
    assert reranked.status_code == 200, reranked.content
    results = reranked.json()["results"]
    # Most bananas first: the cross-encoder's order, the reverse of the relevance order.
    assert [hit["item"]["point_id"] for hit in results] == [ids[m] for m in reversed(MEMORIES)]
    # The scores are the cross-encoder's logits (token counts), not the fused scores.
    assert [hit["score"] for hit in results] == [3.0, 2.0, 1.0, 0.0]
    assert [hit["item"]["point_id"] for hit in results] != fused_ids


@pytest.mark.django_db
def test_rerank_reorders_a_candidate_pool_then_cuts_to_the_limit(
    api_client: APIClient, vector_engine: str, cross_encoder: Path
) -> None:
    ids = _store(api_client, MEMORIES)

    response = _search(api_client, QUERY, rerank=True, limit=1)

    assert response.status_code == 200, response.content
    results = response.json()["results"]
    # The fused top hit is MEMORIES[0]; the reranker scored a larger pool of candidates and
    # kept the one with the most bananas (how large the pool is, is the selector's business).
    assert len(results) == 1
    best = results[0]["item"]["content"]
    assert best in MEMORIES[2:]
    assert results[0]["item"]["point_id"] == ids[best]
    assert results[0]["score"] == float(best.count(COUNTED_WORD))


@pytest.mark.django_db
def test_rerank_false_keeps_the_fused_order(
    api_client: APIClient, vector_engine: str, cross_encoder: Path
) -> None:
    _store(api_client, MEMORIES)

    default = _search(api_client, QUERY, rerank=None).json()["results"]
    explicit = _search(api_client, QUERY, rerank=False).json()["results"]

    assert [h["item"]["point_id"] for h in explicit] == [h["item"]["point_id"] for h in default]
    assert default[0]["item"]["content"] == MEMORIES[0]


@pytest.mark.django_db
def test_rerank_without_a_model_is_a_clear_400(
    api_client: APIClient, vector_engine: str, settings: Any
) -> None:
    reset_reranker()
    settings.FASTEMBED_RERANK_MODEL = ""
    settings.FASTEMBED_RERANK_MODEL_PATH = ""
    _store(api_client, MEMORIES[:1])

    response = _search(api_client, QUERY, rerank=True)

    assert response.status_code == 400, response.content
    assert "FASTEMBED_RERANK_MODEL" in response.content.decode()
    assert _search(api_client, QUERY, rerank=False).status_code == 200
