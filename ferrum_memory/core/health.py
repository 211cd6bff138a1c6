"""Health checks and statistics that each app contributes.

An app registers its checks and statistics in its AppConfig.ready(); /health and /stats report
whatever is registered, so a new backend shows up without touching the views.
"""

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

HealthCheck = Callable[[], dict[str, Any] | None]
StatsProvider = Callable[[list[str] | None], dict[str, Any]]

_checks: dict[str, HealthCheck] = {}
_stats: dict[str, StatsProvider] = {}


def register_check(name: str) -> Callable[[HealthCheck], HealthCheck]:
    """A check raises when its backend is down; it may return details to show when up."""

    def decorator(check: HealthCheck) -> HealthCheck:
        _checks[name] = check
        return check

    return decorator


def register_stats(name: str) -> Callable[[StatsProvider], StatsProvider]:
    """A provider takes the agent ids the caller may see (None: all) and returns a dict."""

    def decorator(provider: StatsProvider) -> StatsProvider:
        _stats[name] = provider
        return provider

    return decorator


# A check may return this status: the backend works in part (an index being rebuilt answers
# searches only once it is done). /health then answers 200 with status "degraded".
REBUILDING = "rebuilding"


def run_checks() -> tuple[str, dict[str, dict[str, Any]]]:
    """The overall status (ok, degraded: a backend rebuilding, error: one down) and each
    backend's."""
    results: dict[str, dict[str, Any]] = {}
    for name, check in _checks.items():
        try:
            results[name] = {"status": "ok", **(check() or {})}
        except Exception as exc:  # noqa: BLE001 - any failure of a backend is what we report
            logger.warning("health check %s failed: %s", name, exc)
            results[name] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    statuses = {result["status"] for result in results.values()}
    if "error" in statuses:
        return "error", results
    return ("degraded" if REBUILDING in statuses else "ok"), results


def collect_stats(agent_ids: list[str] | None) -> dict[str, Any]:
    return {name: provider(agent_ids) for name, provider in _stats.items()}
