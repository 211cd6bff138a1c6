"""SESSION_SUMMARIZER callables for the tests (an LLM would sit here)."""

from typing import Any


def first_and_last(*, state: dict[str, Any], lines: list[str], picked: list[str]) -> str:
    return f"LLM summary of {len(lines)} turns: {lines[0]} ... {lines[-1]}"


def broken(*, state: dict[str, Any], lines: list[str], picked: list[str]) -> str:
    raise RuntimeError("the summarizer is down")
