"""scripts/bench_retention.py runs end to end on a small scale, and its sizes say what they must
whatever the machine and whatever else the server runs: erasure leaves the rows' own bytes smaller
and plain VACUUM never makes the files smaller. (How much VACUUM frees, reuse and VACUUM FULL depend
on no other session holding an old snapshot on the server, which a shared test server does not
promise: the script reports the dead bytes VACUUM could not remove beside them. Its rates and sizes
are figures for the README, measured at 100,000 deliveries; nothing here times anything.)"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_retention  # noqa: E402  (scripts/ is not a package)

DELIVERIES = 2_000


async def test_storage_run_reports_every_phase_and_erasure_shrinks_the_rows_not_the_files(database_url):
    report = await bench_retention.run_storage(DELIVERIES)
    per = report["bytes_per_delivery"]
    assert per["kept_live_rows"] > bench_retention.PAYLOAD_BYTES > per["erased_live_rows"]
    tables = report["tables"]
    for name in bench_retention.TABLES:
        assert tables["erased_after_vacuum"][name]["heap"] >= tables["kept_after_vacuum"][name]["heap"]
    assert set(tables["kept_after_vacuum"]) == {*bench_retention.TABLES, bench_retention.RETAINED_INDEX}
    assert set(report["dead_bytes_vacuum_could_not_remove"]) == set(tables)


async def test_index_cost_run_ingests_into_both_databases(database_url):
    report = await bench_retention.run_index_cost(1_000, 2)
    assert report["deliveries_each"] == 1_000 and set(report["ingest_messages_per_second"]) == {
        "with_index", "without_index"}
    assert all(rate > 0 for rate in report["ingest_messages_per_second"].values())
