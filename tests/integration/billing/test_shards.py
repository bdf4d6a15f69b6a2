"""billing.shards computes what PostgreSQL computes: PostgreSQL itself is the oracle.

partition_of must name the very partition PostgreSQL routes an account's rows to (the claims and
the group commit group their statements by it), and citus_hash must equal uuid_hash, the hash
Citus routes a uuid distribution column by. Thousands of random uuids, several moduli.
"""

from __future__ import annotations

import random
import time
import uuid

import asyncpg
import pytest

from billing import shards

UUIDS = 3000
MODULI = (2, 3, 8, 16, 64)


def _random_uuids(seed: int, count: int) -> list[uuid.UUID]:
    rng = random.Random(seed)
    made = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(count - 2)]
    return made + [uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1)]  # the edges too


@pytest.mark.parametrize("modulus", MODULI)
async def test_partition_of_is_the_partition_postgresql_routes_to(pool: asyncpg.Pool, modulus: int) -> None:
    """For each uuid, exactly one remainder k satisfies PostgreSQL's hash partition check, and
    partition_of answers that k; and a row inserted into a table of `modulus` partitions lands in
    the partition whose remainder partition_of names."""
    values = _random_uuids(modulus, UUIDS)
    async with pool.acquire() as connection:
        await connection.execute("CREATE TABLE sharded (account_id uuid NOT NULL) PARTITION BY HASH (account_id)")
        for remainder in range(modulus):
            await connection.execute(f"CREATE TABLE sharded_{remainder} PARTITION OF sharded"
                                     f" FOR VALUES WITH (MODULUS {modulus}, REMAINDER {remainder})")
        rows = await connection.fetch(
            "SELECT v, array_agg(k ORDER BY k) FILTER (WHERE satisfies_hash_partition('sharded'::regclass, $2, k, v))"
            " AS remainders FROM unnest($1::uuid[]) v CROSS JOIN generate_series(0, $2 - 1) k GROUP BY v",
            values, modulus)
        await connection.execute("INSERT INTO sharded SELECT unnest($1::uuid[])", values)
        landed = await connection.fetch("SELECT account_id, tableoid::regclass::text AS partition FROM sharded")
    assert len(rows) == len(values)
    for row in rows:
        assert row["remainders"] == [shards.partition_of(row["v"], modulus)], row["v"]
    for row in landed:
        assert row["partition"] == f"sharded_{shards.partition_of(row['account_id'], modulus)}"
    # Not a constant answer: every partition gets some of 3,000 random uuids.
    assert {shards.partition_of(value, modulus) for value in values} == set(range(modulus))


async def test_citus_hash_is_uuid_hash(pool: asyncpg.Pool) -> None:
    """citus_hash equals PostgreSQL's uuid_hash (int4, signed) for every uuid; uuid_hash_extended
    equals PostgreSQL's for seed 0 and for the partition seed."""
    values = _random_uuids(7, UUIDS)
    rows = await pool.fetch(
        "SELECT v, uuid_hash(v) AS hash, uuid_hash_extended(v, 0) AS hash0,"
        " uuid_hash_extended(v, $2) AS seeded FROM unnest($1::uuid[]) v",
        values, shards.HASH_PARTITION_SEED)  # below 2^63: a bigint as it is
    negative = 0
    for row in rows:
        assert shards.citus_hash(row["v"]) == row["hash"], row["v"]
        assert shards.uuid_hash_extended(row["v"], 0) == row["hash0"] % (1 << 64)
        assert shards.uuid_hash_extended(row["v"], shards.HASH_PARTITION_SEED) == row["seeded"] % (1 << 64)
        negative += row["hash"] < 0
    assert 0 < negative < len(rows)  # both signs occur, so the signed conversion is exercised


def test_citus_shard_index_follows_the_hash_ranges() -> None:
    """Citus's default ranges: shard i from INT32_MIN + i * (2^32 // n); the last to INT32_MAX."""
    values = _random_uuids(11, UUIDS)
    for shard_count in (1, 3, 32):
        increment = (1 << 32) // shard_count
        for value in values:
            index = shards.citus_shard_index(value, shard_count)
            low = -(1 << 31) + index * increment
            high = (1 << 31) - 1 if index == shard_count - 1 else low + increment - 1
            assert low <= shards.citus_hash(value) <= high
    with pytest.raises(ValueError):
        shards.citus_shard_index(values[0], 0)
    with pytest.raises(ValueError):
        shards.partition_of(values[0], 0)


def test_partition_of_is_fast_enough() -> None:
    """Thousands of calls a second with room to spare, computed (not cached): under 50 µs each."""
    values = _random_uuids(13, 20_000)
    started = time.perf_counter()
    for value in values:
        shards.partition_hash(value)
    per_call = (time.perf_counter() - started) / len(values)
    assert per_call < 50e-6, per_call


def test_shard_of_names_the_hash_it_groups_by() -> None:
    """shard_of is partition_of for `postgres` and citus_shard_index for `citus`, and the two place
    some accounts differently (so grouping by the wrong one would mix shards)."""
    values = _random_uuids(17, 500)
    assert [shards.shard_of(value, 8) for value in values] == [shards.partition_of(value, 8) for value in values]
    by_citus = [shards.shard_of(value, 8, "citus") for value in values]
    assert by_citus == [shards.citus_shard_index(value, 8) for value in values]
    assert by_citus != [shards.partition_of(value, 8) for value in values]
    with pytest.raises(ValueError):
        shards.shard_of(values[0], 8, "md5")
