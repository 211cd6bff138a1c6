"""The replay dashboard of the admin: the dashboard's figures drawn as server-side SVG charts."""

from typing import Any

from .charts import Datum, bar_chart, line_chart
from .dream_selectors import Bin, replay_dashboard


def _bins(bins: list[Bin]) -> list[Datum]:
    return [Datum(f"{b.low:.3g}", b.count, f"{b.low:.4g} to {b.high:.4g}: {b.count}") for b in bins]


def dashboard_context(*, agent_id: str | None = None) -> dict[str, Any]:
    data = replay_dashboard(agent_id=agent_id)
    fmt = "%m-%d %H:00" if data["bucket_kind"] == "hour" else "%Y-%m-%d"
    buckets = data["buckets"]
    return {
        "charts": [
            bar_chart(
                name="priority-histogram",
                title="Priority histogram",
                data=_bins(data["priority_bins"]),
            ),
            bar_chart(
                name="td-error-histogram",
                title="TD error distribution",
                data=_bins(data["td_error_bins"]),
            ),
            line_chart(
                name="reward-over-time",
                title=f"Mean reward per {data['bucket_kind']}",
                data=[
                    Datum(
                        b.start.strftime(fmt),
                        b.reward_mean,
                        f"{b.start:{fmt}}: {b.reward_mean:.4g} over {b.count}",
                    )
                    for b in buckets
                ],
            ),
            line_chart(
                name="pass-rate-over-time",
                title=f"Pass rate per {data['bucket_kind']}",
                data=[
                    Datum(
                        b.start.strftime(fmt),
                        b.pass_rate,
                        f"{b.start:{fmt}}: "
                        + ("no test results" if b.pass_rate is None else f"{b.pass_rate:.1%}"),
                    )
                    for b in buckets
                ],
                low=0.0,
                high=1.0,
            ),
            bar_chart(
                name="buffer-by-agent",
                title="Buffer size by agent",
                data=[Datum(agent, n, f"{agent}: {n}") for agent, n in data["agents"]],
            ),
            line_chart(
                name="spi-ratio-over-time",
                title="Samples per insert over time",
                data=[
                    Datum(
                        f"{p.at:%m-%d %H:%M}",
                        p.ratio,
                        f"{p.at:%Y-%m-%d %H:%M}: {p.samples} samples / {p.inserts} inserts",
                    )
                    for p in data["history"]
                ],
                low=0.0,
            ),
            line_chart(
                name="size-over-time",
                title="Buffer size over time",
                data=[
                    Datum(f"{p.at:%m-%d %H:%M}", p.size, f"{p.at:%Y-%m-%d %H:%M}: {p.size}")
                    for p in data["history"]
                ],
                low=0.0,
            ),
        ],
        "controls": data["controls"],
        "recent_cycles": data["recent_cycles"],
        "cycle_counts": data["cycle_counts"],
    }
