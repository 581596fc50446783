"""Figures of one benchmark: samples, median, p99, and the ratio to a baseline."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any


def percentile(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100) by linear interpolation."""
    if not samples:
        raise ValueError("no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"expected a percentile between 0 and 100, got {q!r}")
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Series:
    """Samples of one measured quantity (milliseconds unless ``unit`` says otherwise)."""

    name: str
    samples: list[float]
    unit: str = "ms"
    higher_is_better: bool = False  # throughput-like figures: the ratio reads the other way

    @property
    def median(self) -> float:
        """The median sample (NaN when there is none: the benchmark could not measure)."""
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def p99(self) -> float:
        """The 99th percentile (NaN when there is no sample)."""
        return percentile(self.samples, 99) if self.samples else float("nan")

    def summary(self) -> dict[str, Any]:
        """The figures reported for this series, and its samples (for plots)."""
        some = bool(self.samples)
        return {
            "name": self.name,
            "unit": self.unit,
            "n": len(self.samples),
            "median": round(self.median, 3) if some else None,
            "p99": round(self.p99, 3) if some else None,
            "min": round(min(self.samples), 3) if some else None,
            "max": round(max(self.samples), 3) if some else None,
            "higher_is_better": self.higher_is_better,
            "samples": [round(s, 3) for s in self.samples],
        }


@dataclass
class Result:
    """One benchmark (at one size): what was measured, its baseline, the target and the verdict.

    ``met`` is the benchmark's own reading of its target; it is reported, never asserted.
    """

    id: str
    what: str
    measured: Series
    baseline: Series | None
    target: str
    met: bool | None
    variant: str = ""
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``id`` with its variant, e.g. ``relay@100``."""
        return f"{self.id}@{self.variant}" if self.variant else self.id

    @property
    def ratio(self) -> float | None:
        """Median over baseline median (for throughput: how much of the baseline we reach)."""
        if self.baseline is None or not self.baseline.samples or not self.measured.samples:
            return None
        if self.baseline.median == 0:
            return None
        return self.measured.median / self.baseline.median

    def to_json(self) -> dict[str, Any]:
        """The JSON form written under ``bench/results/``."""
        return {
            "id": self.id,
            "variant": self.variant,
            "label": self.label,
            "what": self.what,
            "measured": self.measured.summary(),
            "baseline": self.baseline.summary() if self.baseline else None,
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "target": self.target,
            "met": self.met,
            "notes": list(self.notes),
            "extra": dict(self.extra),
        }
