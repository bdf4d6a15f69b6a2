"""Charts as inline SVG, drawn on the server: geometry here (pure), markup in the templates.

No script and no inline style is needed to show them, so the Content-Security-Policy stays
strict: colours come from CSS classes in static/dashboard.css.
"""

from __future__ import annotations

from dataclasses import dataclass

HOURS = 24
OUTCOMES = ("delivered", "dead", "live")  # stacked bottom to top; live = pending or sending
WIDTH = 720
HEIGHT = 200
PLOT_LEFT = 40
PLOT_BOTTOM = 170
PLOT_TOP = 10
BAR_GAP = 4


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    outcome: str
    title: str


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str


@dataclass(frozen=True)
class HourlyChart:
    width: int
    height: int
    bars: list[Bar]
    labels: list[Label]
    gridlines: list[Label]  # y positions with their value
    totals: dict[str, int]
    summary: str  # the chart in words, for screen readers

    @property
    def empty(self) -> bool:
        return not any(self.totals.values())


def outcome_of(state: str) -> str:
    return state if state in ("delivered", "dead") else "live"


def hourly_outcomes(counts: list[tuple[int, str, int]]) -> HourlyChart:
    """Stacked bars, one per hour of the last 24, from (hours_ago 0..23, state, count) rows."""
    slots = [dict.fromkeys(OUTCOMES, 0) for _ in range(HOURS)]
    for hours_ago, state, count in counts:
        if 0 <= hours_ago < HOURS:
            slots[HOURS - 1 - hours_ago][outcome_of(state)] += count
    peak = max((sum(slot.values()) for slot in slots), default=0)
    scale_max = _nice_ceiling(peak)
    plot_height = PLOT_BOTTOM - PLOT_TOP
    slot_width = (WIDTH - PLOT_LEFT) / HOURS
    bars: list[Bar] = []
    for index, slot in enumerate(slots):
        x = PLOT_LEFT + index * slot_width + BAR_GAP / 2
        top = PLOT_BOTTOM
        hours_ago = HOURS - 1 - index
        title = f"{hours_ago} h ago: " + ", ".join(f"{slot[o]} {o}" for o in OUTCOMES)
        for outcome in OUTCOMES:
            if slot[outcome] == 0:
                continue
            height = plot_height * slot[outcome] / scale_max
            top -= height
            bars.append(Bar(round(x, 1), round(top, 1), round(slot_width - BAR_GAP, 1), round(height, 1), outcome, title))
    labels = [
        Label(round(PLOT_LEFT + index * slot_width + slot_width / 2, 1), HEIGHT - 10,
              "now" if index == HOURS - 1 else f"-{HOURS - 1 - index}h")
        for index in range(0, HOURS, 6)
    ] + [Label(round(PLOT_LEFT + (HOURS - 0.5) * slot_width, 1), HEIGHT - 10, "now")]
    gridlines = [Label(PLOT_LEFT - 6, round(PLOT_BOTTOM - plot_height * step / 4, 1), str(scale_max * step // 4))
                 for step in range(0, 5)]
    totals = {outcome: sum(slot[outcome] for slot in slots) for outcome in OUTCOMES}
    summary = "Deliveries in the last 24 hours: " + ", ".join(f"{totals[o]} {o}" for o in OUTCOMES)
    return HourlyChart(WIDTH, HEIGHT, bars, labels, gridlines, totals, summary)


def _nice_ceiling(value: int) -> int:
    """The smallest of 4, 8, 20, 40, 80, 200, ... at least `value`: gridlines at quarters stay whole."""
    ceiling = 4
    while ceiling < value:
        ceiling = ceiling * 2 if str(ceiling)[0] == "4" else ceiling * 5 // 2 if str(ceiling)[0] == "8" else ceiling * 2
    return ceiling
