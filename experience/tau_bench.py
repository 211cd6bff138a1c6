"""tau-bench trajectories (Yao et al., 2024) as experience tuples, for import_experiences."""

import json
from pathlib import Path
from typing import Any

TASK_CHARS = 20_000


def _tool_calls(trajectory: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The assistant's tool calls, each with the tool's answer as output (or error).

    Call ids repeat within a trajectory, so an answer goes to the oldest pending call with its id.
    """
    calls: list[dict[str, Any]] = []
    pending: list[tuple[str, dict[str, Any]]] = []
    for message in trajectory:
        for call in message.get("tool_calls") or []:
            function = call["function"]
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = {"raw": function.get("arguments")}
            record = {
                "name": function["name"],
                "arguments": arguments,
                "output": None,
                "error": None,
            }
            calls.append(record)
            pending.append((call.get("id", ""), record))
        if message.get("role") == "tool":
            match = next(
                (i for i, (cid, _) in enumerate(pending) if cid == message.get("tool_call_id")), 0
            )
            if pending:
                _, record = pending.pop(match)
                content = message.get("content") or ""
                if content.startswith("Error"):
                    record["error"] = content
                else:
                    record["output"] = content
    return calls


def experiences_from_file(path: Path, *, agent_id: str | None = None) -> list[dict[str, Any]]:
    """One experience per trajectory: the user's instruction as task, the tool calls, the reward,
    and a test result that passes when the reward is 1 (tau-bench's success criterion)."""
    records = json.loads(path.read_text())
    agent = agent_id or f"tau-bench-{path.stem}"
    experiences = []
    for record in records:
        task = record["info"]["task"]
        reward = float(record["reward"])
        passed = reward >= 1.0
        reward_info = record["info"].get("reward_info") or {}
        r_actions = (reward_info.get("info") or {}).get("r_actions")
        experiences.append(
            {
                "id": f"tau-{path.stem}-{record['task_id']}-{record['trial']}",
                "agent_id": agent,
                "session_id": f"task-{record['task_id']}",
                "task": task["instruction"][:TASK_CHARS],
                "tool_calls": _tool_calls(record["traj"]),
                "test_result": {
                    "passed": passed,
                    "total": 1,
                    "failed": 0 if passed else 1,
                    "errors": 0,
                    "output": f"tau-bench reward {reward}; actions matched: {r_actions}",
                },
                "reward": reward,
                "metadata": {
                    "source": "tau-bench",
                    "task_id": record["task_id"],
                    "trial": record["trial"],
                },
            }
        )
    return experiences
