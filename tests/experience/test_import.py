import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from experience.models import Experience
from experience.tau_bench import experiences_from_file

TAU_BENCH = (
    Path(__file__).resolve().parents[2]
    / ".."
    / "shared"
    / "data"
    / "tau_bench"
    / "gpt-4o-airline.json"
)


@pytest.mark.django_db
def test_import_loads_every_trajectory_once(capsys):
    records = json.loads(TAU_BENCH.read_text())
    call_command("import_experiences", str(TAU_BENCH))
    assert "200 experiences imported, 0 already there." in capsys.readouterr().out
    assert Experience.objects.count() == len(records) == 200
    # NOTES.txt: 84 of 200 rewarded, 1164 tool calls.
    assert Experience.objects.filter(passed=True).count() == 84
    assert sum(len(e.tool_calls) for e in Experience.objects.all()) == 1164
    first = Experience.objects.get(experience_id="tau-gpt-4o-airline-0-0")
    assert first.task == records[0]["info"]["task"]["instruction"]
    assert first.reward == records[0]["reward"] and first.agent_id == "tau-bench-gpt-4o-airline"
    assert first.tool_calls[0]["name"] == "get_user_details"
    booking = next(call for call in first.tool_calls if call["name"] == "book_reservation")
    assert booking["error"].startswith("Error: payment amount does not add up")

    call_command("import_experiences", str(TAU_BENCH), "--ttl", "0")
    assert "0 experiences imported, 200 already there." in capsys.readouterr().out
    with pytest.raises(CommandError, match="already used by another agent"):
        call_command("import_experiences", str(TAU_BENCH), "--agent", "other")


def test_tool_results_go_to_the_oldest_pending_call_with_their_id(tmp_path):
    # tau-bench reuses call ids within a trajectory; answers must not swap between calls.
    trajectory = [
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "function": {"name": "a", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "answer a"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "function": {"name": "b", "arguments": "not json"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "answer b"},
    ]
    record = {
        "task_id": 1,
        "trial": 0,
        "reward": 1.0,
        "traj": trajectory,
        "info": {"task": {"instruction": "do it"}, "reward_info": None},
    }
    path = tmp_path / "mini.json"
    path.write_text(json.dumps([record]))
    [item] = experiences_from_file(path)
    assert [(c["name"], c["output"]) for c in item["tool_calls"]] == [
        ("a", "answer a"),
        ("b", "answer b"),
    ]
    assert item["tool_calls"][1]["arguments"] == {"raw": "not json"}
    assert item["test_result"]["passed"] is True


@pytest.mark.django_db
def test_import_refuses_a_missing_file(tmp_path):
    with pytest.raises(CommandError, match="No such file"):
        call_command("import_experiences", str(tmp_path / "nope.json"))
