"""billing.ids: UUIDv7 layout (time, version, variant) for one id and for ids made together."""

from __future__ import annotations

import pickle
import time
import uuid

import msgspec
import pytest

from billing import ids


def _milliseconds(value: uuid.UUID) -> int:
    return value.int >> 80


def test_ids_made_together_are_distinct_v7_uuids_of_this_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    made = ids.new_ids(1000)
    after = time.time_ns() // 1_000_000
    assert len(made) == 1000 and len(set(made)) == 1000
    for value in made:
        assert value.version == 7 and value.variant == uuid.RFC_4122
        assert before <= _milliseconds(value) <= after
    # The random part really varies, in every byte of it that is not version or variant.
    for index in (6, 7, 8, 9, 10, 11, 12, 13, 14, 15):
        assert len({value.bytes[index] for value in made}) > 1


def test_one_id_has_the_same_layout_and_time_orders_ids() -> None:
    first = ids.new_id()
    time.sleep(0.002)
    second = ids.new_id()
    assert first.version == second.version == 7 and first.variant == uuid.RFC_4122
    assert _milliseconds(first) < _milliseconds(second) and first < second


def test_no_ids_is_an_empty_list() -> None:
    assert ids.new_ids(0) == []


def test_ids_behave_as_uuid_objects_wherever_they_go() -> None:
    """They are asyncpg's UUID (fast to make and to write); everywhere else they must be a uuid.UUID:
    equal to and hashed as the same UUID parsed from text, ordered with plain ones, printed,
    JSON-encoded by msgspec, pickled."""
    made = ids.new_ids(3)
    plain = [uuid.UUID(str(value)) for value in made]
    for value, twin in zip(made, plain, strict=True):
        assert isinstance(value, uuid.UUID) and value == twin and hash(value) == hash(twin)
        assert {twin: 1}[value] == 1 and str(value) == str(twin) and value.bytes == twin.bytes
        assert msgspec.json.encode(value) == msgspec.json.encode(twin) == f'"{twin}"'.encode()
        assert pickle.loads(pickle.dumps(value)) == twin
    # Mixed comparisons order exactly as the plain twins do, in both directions.
    for i, value in enumerate(made):
        for twin in plain:
            assert (value < twin) == (plain[i] < twin) and (twin < value) == (twin < plain[i])
    assert sorted([*made, uuid.UUID(int=0)])[0] == uuid.UUID(int=0)


def test_parse_id_reads_what_str_wrote_and_refuses_the_rest() -> None:
    for value in (*ids.new_ids(5), uuid.uuid4(), uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1)):
        parsed = ids.parse_id(str(value))
        assert parsed == value and hash(parsed) == hash(value) and isinstance(parsed, uuid.UUID)
        assert ids.parse_id(value.hex) == value
    good = str(uuid.uuid4())
    for bad in ("", "zz", good[:-1], good + "0", good[:-1] + "g", "{" + good + "}", "urn:uuid:" + good):
        with pytest.raises(ValueError):
            ids.parse_id(bad)


def test_ids_made_one_message_at_a_time_never_repeat_across_pool_refills() -> None:
    """Ids take their random bits from a pool that one system call fills; many small calls (a
    message and its deliveries) run through several refills, and a call larger than the pool."""
    made = [value for _ in range(3000) for value in ids.new_ids(1 + _ % 4)]
    made += ids.new_ids(2000)  # more than one pool holds
    assert len(set(made)) == len(made)
    # Ids of the same millisecond differ in their random bits, not only in the clock.
    assert len({value.int & ((1 << 80) - 1) for value in made}) == len(made)


def test_threads_never_get_the_same_random_bits() -> None:
    import threading

    results: list[list[uuid.UUID]] = [[] for _ in range(8)]

    def make(slot: list[uuid.UUID]) -> None:
        for _ in range(2000):
            slot.extend(ids.new_ids(2))

    threads = [threading.Thread(target=make, args=(slot,)) for slot in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [value for slot in results for value in slot]
    assert len(every) == 8 * 4000 and len(set(every)) == len(every)


def test_a_forked_child_does_not_hand_out_its_parents_random_bits() -> None:
    import os

    ids.new_ids(1)  # the pool now holds unused bits the child would otherwise inherit
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: send its next ids' random parts and leave at once
        try:
            child = b"".join(value.bytes for value in ids.new_ids(50))
            os.write(write_end, child)
        finally:
            os._exit(0)
    os.close(write_end)
    child_bytes = b""
    while chunk := os.read(read_end, 65536):
        child_bytes += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    parent = ids.new_ids(50)
    child = [uuid.UUID(bytes=child_bytes[i:i + 16]) for i in range(0, len(child_bytes), 16)]
    assert len(child) == 50
    random_part = (1 << 80) - 1
    assert not {value.int & random_part for value in parent} & {value.int & random_part for value in child}
