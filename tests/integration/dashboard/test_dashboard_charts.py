"""The overview chart's geometry (pure): buckets, stacking, scale."""

from __future__ import annotations

import pytest

from delivery.dashboard import charts


def test_bars_stack_by_outcome_in_the_hour_they_belong_to():
    chart = charts.hourly_outcomes([(0, "delivered", 3), (0, "dead", 1), (5, "pending", 1), (5, "sending", 1),
                                    (30, "delivered", 9)])
    assert chart.totals == {"delivered": 3, "dead": 1, "live": 2}  # 30 h ago is outside the window
    now_bars = [bar for bar in chart.bars if bar.title.startswith("0 h ago")]
    assert [bar.outcome for bar in now_bars] == ["delivered", "dead"]
    delivered, dead = now_bars
    assert dead.y + dead.height == pytest.approx(delivered.y)  # stacked, no gap
    assert delivered.y + delivered.height == charts.PLOT_BOTTOM
    assert all(bar.x < now_bars[0].x for bar in chart.bars if bar not in now_bars)  # now is rightmost


def test_an_empty_day_draws_no_bars():
    chart = charts.hourly_outcomes([])
    assert chart.empty and chart.bars == []


@pytest.mark.parametrize("peak, ceiling", [(0, 4), (4, 4), (5, 8), (9, 20), (21, 40), (41, 80), (81, 200), (1001, 2000)])
def test_the_scale_ends_on_a_round_number_at_least_the_peak(peak, ceiling):
    assert charts._nice_ceiling(peak) == ceiling
