"""The sender's scheduler: bounds, order within an endpoint, turns between endpoints and hosts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from delivery.engine.send_lanes import Lanes


def _run_all(lanes: Lanes, running: list[tuple]) -> list[object]:
    """Finish the oldest running send until none runs; the items in the order they started."""
    started = []
    while running:
        endpoint, host, _ = running.pop(0)
        following = lanes.finish(endpoint, host)
        lanes.check()
        if following is not None:
            running.append(following)
            started.append(following[2])
    return started


def test_a_send_starts_at_once_while_every_bound_has_room() -> None:
    lanes: Lanes[str] = Lanes(per_endpoint=2, per_host=3, total=4)
    assert lanes.offer("a", "h1", "a1") and lanes.offer("a", "h1", "a2")
    assert not lanes.offer("a", "h1", "a3"), "the endpoint's bound"
    assert lanes.offer("b", "h1", "b1")
    assert not lanes.offer("c", "h1", "c1"), "the host's bound"
    assert lanes.offer("d", "h2", "d1")
    assert not lanes.offer("e", "h3", "e1"), "the total bound"
    assert (lanes.running, lanes.waiting, lanes.endpoints) == (4, 3, 5)
    lanes.check()


def test_endpoints_of_a_host_take_turns() -> None:
    lanes: Lanes[str] = Lanes(per_endpoint=4, per_host=1, total=10)
    assert lanes.offer("e1", "h", "e1a")
    for item in ("e1b", "e1c"):
        assert not lanes.offer("e1", "h", item)
    assert not lanes.offer("e2", "h", "e2a")
    assert _run_all(lanes, [("e1", "h", "e1a")]) == ["e1b", "e2a", "e1c"]
    assert (lanes.running, lanes.waiting, lanes.endpoints) == (0, 0, 0)


def test_hosts_waiting_for_the_total_bound_take_turns() -> None:
    lanes: Lanes[str] = Lanes(per_endpoint=10, per_host=10, total=1)
    assert lanes.offer("a", "ha", "a1")
    for item in ("a2", "a3"):
        assert not lanes.offer("a", "ha", item)
    for item in ("b1", "b2"):
        assert not lanes.offer("b", "hb", item)
    assert _run_all(lanes, [("a", "ha", "a1")]) == ["a2", "b1", "a3", "b2"]


def test_an_endpoint_whose_host_changed_has_a_lane_per_host() -> None:
    lanes: Lanes[str] = Lanes(per_endpoint=1, per_host=5, total=5)
    assert lanes.offer("e", "old", "x") and lanes.offer("e", "new", "y")
    assert lanes.finish("e", "old") is None and lanes.finish("e", "new") is None
    with pytest.raises(ValueError):
        lanes.finish("e", "new")


def test_drain_returns_the_waiting_and_keeps_the_running() -> None:
    lanes: Lanes[str] = Lanes(per_endpoint=1, per_host=1, total=1)
    assert lanes.offer("a", "h", "a1")
    assert not lanes.offer("a", "h", "a2") and not lanes.offer("b", "h2", "b1")
    assert sorted(lanes.drain()) == ["a2", "b1"]
    lanes.check()
    assert (lanes.running, lanes.waiting, lanes.endpoints) == (1, 0, 1)
    assert lanes.finish("a", "h") is None
    assert lanes.endpoints == 0


operations = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(0, 5), st.integers(0, 2)),  # endpoint, host
        st.tuples(st.just("finish"), st.integers(0, 1000), st.just(0)),  # which running send
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(per_endpoint=st.integers(1, 3), per_host=st.integers(1, 4), total=st.integers(1, 6), ops=operations)
def test_any_sequence_keeps_the_bounds_the_order_and_no_idle_slot(per_endpoint, per_host, total, ops) -> None:
    lanes: Lanes[int] = Lanes(per_endpoint=per_endpoint, per_host=per_host, total=total)
    running: list[tuple] = []
    started: list[int] = []
    offered: dict[tuple, list[int]] = {}
    for number, (kind, a, b) in enumerate(ops):
        if kind == "offer":
            endpoint, host = f"e{a}", f"h{(a + b) % 3 if b == 2 else a % 3}"  # mostly one host per endpoint
            offered.setdefault((endpoint, host), []).append(number)
            if lanes.offer(endpoint, host, number):
                running.append((endpoint, host, number))
                started.append(number)
        elif running:
            endpoint, host, _ = running.pop(a % len(running))
            following = lanes.finish(endpoint, host)
            if following is not None:
                running.append(following)
                started.append(following[2])
        lanes.check()
        assert lanes.running == len(running)
    started.extend(_run_all(lanes, running))
    assert sorted(started) == sorted(n for items in offered.values() for n in items), "each send starts exactly once"
    position = {item: index for index, item in enumerate(started)}
    for items in offered.values():
        assert [position[item] for item in items] == sorted(position[item] for item in items), "FIFO per endpoint"
    assert (lanes.running, lanes.waiting, lanes.endpoints) == (0, 0, 0)


def test_an_endpoint_bound_that_shrinks_holds_its_sends_and_one_that_grows_starts_them() -> None:
    """limit_of (backpressure) lowers one endpoint's bound under per_endpoint: its waiting sends
    stay queued while it is at its bound, other endpoints go on, and next_allowed starts what a
    grown bound allows."""
    bounds = {"a": 4}
    lanes: Lanes[str] = Lanes(per_endpoint=4, per_host=10, total=10, limit_of=lambda key: bounds.get(key, 4))
    running = [("a", "h", f"a{n}") for n in range(4) if lanes.offer("a", "h", f"a{n}")]
    assert len(running) == 4
    assert not lanes.offer("a", "h", "a4") and not lanes.offer("a", "h", "a5")
    bounds["a"] = 1  # halved twice while four were on the wire
    for _ in range(3):
        endpoint, host, _ = running.pop(0)
        assert lanes.finish(endpoint, host) is None, "still at or above its bound of 1"
        lanes.check()
    assert lanes.offer("b", "h", "b0"), "another endpoint is not slowed"
    endpoint, host, _ = running.pop(0)
    assert lanes.finish(endpoint, host) == ("a", "h", "a4")  # one at a time now
    lanes.check()
    bounds["a"] = 2
    assert lanes.next_allowed() == ("a", "h", "a5") and lanes.next_allowed() is None
    lanes.check()
