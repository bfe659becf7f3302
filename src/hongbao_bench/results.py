"""What one benchmark scenario measured, and whether the money came out right."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ScenarioResult:
    name: str
    backend: str
    #: grab calls made (a user clicking twice counts twice)
    grabs_attempted: int
    #: users holding at least one claim in the design's storage after the run
    granted: int
    #: grabbers refused although shares remained (retries exhausted, lock wait timed out...)
    turned_away_while_left: int
    #: users holding more than one claim
    duplicates: int
    #: claims beyond the number of shares plus fen beyond the total (0 when nothing leaked)
    over_issue: int
    #: optimistic-lock conflicts, lock-acquire retries, EVAL nil replies... per design
    retries_or_conflicts: int
    #: wall time of the grab phase
    seconds: float
    p50_ms: float
    p99_ms: float
    extra: dict[str, Any] = field(default_factory=dict)
    #: claimed + still-unclaimed == the shares set up, in count and in fen, and every
    #: amount a grabber was told it won is in storage under its name
    conserved: bool = True
    #: grab calls that raised (counted as refusals; first message in extra["first_error"])
    errors: int = 0

    @property
    def grabs_per_second(self) -> float:
        return self.grabs_attempted / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.over_issue == 0 and self.conserved and self.errors == 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["grabs_per_second"] = round(self.grabs_per_second, 1)
        data["ok"] = self.ok
        return data
