"""Which shard an account's rows live in: PostgreSQL's hash partition, and Citus's hash.

Every account-scoped table can be distributed by `account_id`. A statement that names the
accounts of one shard only is routed to that shard; so the claims and the group commit group
their work by `shard_of(account_id, shards, shard_hash)` (HOOKLEDGER_ACCOUNT_SHARDS and
HOOKLEDGER_ACCOUNT_SHARD_HASH) before they write: PostgreSQL's hash partitions by default, Citus's
shards with `citus`.

Two hashes, both pure Python copies of PostgreSQL's C code, each tested against PostgreSQL itself:
- `partition_of` is the remainder of the partition PostgreSQL puts a row in for a table
  `PARTITION BY HASH (account_id)` with `partitions` partitions of MODULUS `partitions`
  (migration option HOOKLEDGER_ACCOUNT_PARTITIONS): partbounds.c's compute_partition_hash_value,
  `hash_combine64(0, uuid_hash_extended(id, HASH_PARTITION_SEED))`, unsigned, modulo the modulus.
- `citus_hash` is PostgreSQL's 32-bit `uuid_hash(id)`, what Citus hashes a uuid distribution
  column with; `citus_shard_index` maps it to a shard as Citus does for a table distributed with
  `shard_count` shards.

Both are Bob Jenkins' lookup3 as src/common/hashfn.c has it (hash_bytes and hash_bytes_extended),
on a little-endian server: a uuid is 16 bytes, read as four little-endian 32-bit words. (A
big-endian server hashes differently; PostgreSQL promises nothing across byte orders.)
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable
from typing import TypeVar

Key = TypeVar("Key", bound=tuple)

HASH_PARTITION_SEED = 0x7A5B22367996DCFD  # src/include/catalog/partition.h
_COMBINE_CONSTANT = 0x49A0F4DD15E5A8E3  # hash_combine64's "64bit random data" (src/include/common/hashfn.h)
_UUID_BYTES = 16
_INITIAL = (0x9E3779B9 + _UUID_BYTES + 3923095) & 0xFFFFFFFF  # lookup3's state for a 16-byte key
_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
PARTITIONS_MAX = 1024  # far above any shard count worth running; a bound for the caches below
_CITUS_HASH_TOKENS = 1 << 32
_INT32_MIN = -(1 << 31)


def _rot(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _M32


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - c) & _M32; a ^= _rot(c, 4); c = (c + b) & _M32  # lookup3's own layout, a line per step
    b = (b - a) & _M32; b ^= _rot(a, 6); a = (a + c) & _M32
    c = (c - b) & _M32; c ^= _rot(b, 8); b = (b + a) & _M32
    a = (a - c) & _M32; a ^= _rot(c, 16); c = (c + b) & _M32
    b = (b - a) & _M32; b ^= _rot(a, 19); a = (a + c) & _M32
    c = (c - b) & _M32; c ^= _rot(b, 4); b = (b + a) & _M32
    return a, b, c


def _final(a: int, b: int, c: int) -> tuple[int, int, int]:
    c ^= b; c = (c - _rot(b, 14)) & _M32
    a ^= c; a = (a - _rot(c, 11)) & _M32
    b ^= a; b = (b - _rot(a, 25)) & _M32
    c ^= b; c = (c - _rot(b, 16)) & _M32
    a ^= c; a = (a - _rot(c, 4)) & _M32
    b ^= a; b = (b - _rot(a, 14)) & _M32
    c ^= b; c = (c - _rot(b, 24)) & _M32
    return a, b, c


def _words(value: uuid.UUID) -> tuple[int, int, int, int]:
    data = value.bytes
    return (int.from_bytes(data[0:4], "little"), int.from_bytes(data[4:8], "little"),
            int.from_bytes(data[8:12], "little"), int.from_bytes(data[12:16], "little"))


def _lookup3(value: uuid.UUID, seed: int) -> tuple[int, int]:
    """hash_bytes_extended of the uuid's 16 bytes (seed 0: hash_bytes); returns the final (b, c)."""
    a = b = c = _INITIAL
    if seed:
        a = (a + (seed >> 32)) & _M32
        b = (b + (seed & _M32)) & _M32
        a, b, c = _mix(a, b, c)
    w0, w1, w2, w3 = _words(value)
    a, b, c = _mix((a + w0) & _M32, (b + w1) & _M32, (c + w2) & _M32)
    a = (a + w3) & _M32  # the last 4 bytes: lookup3's `case 4`
    _, b, c = _final(a, b, c)
    return b, c


def uuid_hash_extended(value: uuid.UUID, seed: int) -> int:
    """PostgreSQL's uuid_hash_extended(value, seed), as an unsigned 64-bit integer."""
    b, c = _lookup3(value, seed & _M64)
    return (b << 32) | c


def partition_hash(value: uuid.UUID) -> int:
    """The row hash PostgreSQL routes a `PARTITION BY HASH (account_id)` row with (unsigned 64 bits)."""
    return (uuid_hash_extended(value, HASH_PARTITION_SEED) + _COMBINE_CONSTANT) & _M64


@functools.lru_cache(maxsize=65_536)
def partition_of(account_id: uuid.UUID, partitions: int) -> int:
    """The remainder k of the hash partition (MODULUS `partitions`) that holds this account's rows.

    Cached: an account's shard never changes, and the hot paths ask for the same few accounts
    again and again (a cached answer costs ~0.1 µs, a computed one a few µs).
    """
    if not 1 <= partitions <= PARTITIONS_MAX:
        raise ValueError(f"partitions must be 1..{PARTITIONS_MAX}")
    if partitions == 1:
        return 0
    return partition_hash(account_id) % partitions


def citus_hash(account_id: uuid.UUID) -> int:
    """PostgreSQL's uuid_hash(account_id), a signed 32-bit integer: what Citus hashes a uuid
    distribution column with (the type's hash function of its default hash operator class).

    Citus splits the 32-bit hash space into `shard_count` equal ranges, one per shard, in order:
    shard i (0-based) holds hashes from INT32_MIN + i * (2^32 // shard_count), and the last shard
    runs to INT32_MAX (pg_dist_shard's shardminvalue and shardmaxvalue show them). A statement whose
    WHERE clause fixes the distribution column (`account_id = $1`) is routed to the one shard whose
    range holds the value's hash; so is one whose rows all hash into one range. Rebalancing moves
    whole shards between nodes and never changes a range, so an account's shard never changes.
    """
    _, c = _lookup3(account_id, 0)
    return c - (1 << 32) if c >= 1 << 31 else c


SHARD_HASHES = ("postgres", "citus")  # HOOKLEDGER_ACCOUNT_SHARD_HASH


def shard_of(account_id: uuid.UUID, shards: int, shard_hash: str = "postgres") -> int:
    """The shard of `shards` that holds this account's rows: PostgreSQL's hash partition
    (`postgres`, partition_of) or Citus's shard (`citus`, citus_shard_index). The two differ: a
    statement grouped by one hash spans several shards of the other."""
    if shard_hash == "postgres":
        return partition_of(account_id, shards)
    if shard_hash == "citus":
        return citus_shard_index(account_id, shards)
    raise ValueError(f"shard_hash must be one of {', '.join(SHARD_HASHES)}, got {shard_hash!r}")


def citus_shard_index(account_id: uuid.UUID, shard_count: int) -> int:
    """The 0-based index of the Citus shard (of a table distributed with `shard_count` shards, the
    default hash ranges) that holds this account's rows; see citus_hash."""
    if not 1 <= shard_count <= PARTITIONS_MAX:
        raise ValueError(f"shard_count must be 1..{PARTITIONS_MAX}")
    increment = _CITUS_HASH_TOKENS // shard_count
    return min((citus_hash(account_id) - _INT32_MIN) // increment, shard_count - 1)


def by_shard(keys: Iterable[Key], shards: int, shard_hash: str = "postgres") -> list[list[Key]]:
    """Row keys whose first item is the account (a (account_id, id) primary key), grouped by the
    shard that holds their account, in shard order; one group of them all when there is one shard.
    A statement given one group names the accounts of one shard only."""
    keys = list(keys)
    if shards == 1:
        return [keys] if keys else []
    groups: dict[int, list[Key]] = {}
    for key in keys:
        groups.setdefault(shard_of(key[0], shards, shard_hash), []).append(key)
    return [groups[shard] for shard in sorted(groups)]
