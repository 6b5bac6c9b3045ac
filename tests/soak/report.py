"""The soak's result: its counts, the per-fault table, which oracles failed and why, and
the one line every run ends with."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.soak.checks import LogScan, Tally
from tests.soak.faults import FaultRecord


@dataclass
class SoakResult:
    seconds: float = 0.0
    streams: int = 0
    tally: Tally = field(default_factory=Tally)
    faults: list[FaultRecord] = field(default_factory=list)
    catchup_bound_s: float = 0.0
    growth: dict[str, dict[str, float]] = field(default_factory=dict)
    orphans: list[str] = field(default_factory=list)
    logs: LogScan = field(default_factory=LogScan)
    failures: dict[str, list[str]] = field(default_factory=dict)  # oracle -> why
    counts: dict[str, object] = field(default_factory=dict)  # more numbers for the record

    def fail(self, oracle: str, why: str) -> None:
        self.failures.setdefault(oracle, []).append(why)

    def max_growth(self, metric: str) -> float:
        values = self.growth.get(metric, {}).values()
        return max(values, default=float("nan"))

    def max_catchup(self) -> float:
        return max((f.catchup_s for f in self.faults if f.catchup_s is not None), default=0.0)

    def line(self) -> str:
        played = [f for f in self.faults if not f.skipped]
        t = self.tally
        return (
            f"soak hours={self.seconds / 3600:.2f} nodes=3 streams={self.streams}"
            f" confirmed={t.confirmed} lost={t.lost} duplicated={t.duplicated}"
            f" out_of_order={t.out_of_order} delayed_early={t.delayed_early}"
            f" delayed_lost={t.delayed_lost} faults={len(played)}"
            f" max_catchup_s={self.max_catchup():.1f}"
            f" disk_growth={self.max_growth('disk'):.2f}"
            f" rss_growth={self.max_growth('rss'):.2f}"
            f" fd_growth={self.max_growth('fds'):.2f}"
            f" orphans={len(self.orphans)}"
        )

    def table(self, started: float) -> str:
        rows = [
            "| # | at s | fault | target | lasted s | catch-up s | result |",
            "|---|---|---|---|---|---|---|",
        ]
        for i, f in enumerate(self.faults, 1):
            result = (
                f"skipped: {f.skipped}"
                if f.skipped
                else "; ".join(f.problems)[:200]
                if f.problems
                else "ok"
            )
            if f.notes:
                result += f" ({'; '.join(f.notes)})"
            catchup = "-" if f.catchup_s is None else f"{f.catchup_s:.1f}"
            rows.append(
                f"| {i} | {f.started - started:.0f} | {f.kind} | {f.target} |"
                f" {f.healed - f.started:.1f} | {catchup} | {result} |"
            )
        return "\n".join(rows)

    def text(self, started: float) -> str:
        out = [self.table(started), ""]
        for (event, cause), n in sorted(self.logs.explained.items()):
            out.append(f"logged error {event} x{n}: during {cause}")
        if self.failures:
            out.append("FAILED oracles:")
            for oracle, whys in self.failures.items():
                out.append(f"  {oracle}: {len(whys)}")
                out += [f"    - {w[:500]}" for w in whys[:8]]
        else:
            out.append("every oracle held")
        out += [f"{k}={v}" for k, v in self.counts.items()]
        out.append(self.line())
        return "\n".join(out)
