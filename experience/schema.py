"""OpenAPI additions of the experience API that drf-spectacular cannot derive."""

from typing import Any

from ferrum_memory.core.schema import Link, add_links, link


def td_error_body_with_updates_is_a_batch(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: PUT /experience/td-error reads a body holding
    `updates` as a batch, whatever else it holds (TdErrorView); the single-update branch of its
    oneOf says so, or a body that is both would be valid as a single update."""
    schema = result["components"]["schemas"]["TdErrorRequestRequest"]
    single, batch = schema["oneOf"]
    schema["oneOf"] = [{"allOf": [single], "not": {"required": ["updates"]}}, batch]
    return result


_ONE = {"experience_id": "$response.body#/id"}
_FIRST = {"experience_id": "$response.body#/items/0/id"}
_LISTED = {"experience_id": "$response.body#/results/0/id"}
_TD_ERROR = {"experience_id": "$response.body#/id", "td_error": 0.5}
_FIRST_CYCLE = {"cycle_id": "$response.body#/results/0/id"}
_ITS_AGENT = {"agent_id": "$response.body#/results/0/agent_id"}
_CLAIMED = {"cycle_id": "$response.body#/id"}
# A report needs a TD error for each draw: this one fills a one-draw cycle's.
_REPORT = {
    "lease_token": "$response.body#/lease_token",
    "td_errors": [{"experience_id": "$response.body#/items/0/experience_id", "td_error": 0.5}],
}
LINKS: list[Link] = [
    ("experience_create", "201", "GetExperience", link("experience_retrieve", _ONE)),
    ("experience_create", "201", "DeleteExperience", link("experience_destroy", _ONE)),
    ("experience_create", "201", "SetTdError", link("experience_td_error_update", None, _TD_ERROR)),
    ("experience_create", "201", "GetFirstOfBatch", link("experience_retrieve", _FIRST)),
    ("experience_list", "200", "GetFirstListed", link("experience_retrieve", _LISTED)),
    ("dream_cycles_list", "200", "GetFirstCycle", link("dream_cycles_retrieve", _FIRST_CYCLE)),
    (
        "dream_cycles_list",
        "200",
        "ClaimForItsAgent",
        link("dream_cycles_claim_create", None, _ITS_AGENT),
    ),
    (
        "dream_cycles_claim_create",
        "200",
        "GetClaimedCycle",
        link("dream_cycles_retrieve", _CLAIMED),
    ),
    (
        "dream_cycles_claim_create",
        "200",
        "ReportTdErrors",
        link("dream_cycles_td_errors_create", _CLAIMED, _REPORT),
    ),
]


def experience_links(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook."""
    return add_links(result, LINKS)
