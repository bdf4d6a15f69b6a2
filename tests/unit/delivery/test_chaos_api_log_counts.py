"""The chaos run's count of what the API processes logged: unhandled errors and lost COMMITs."""

from __future__ import annotations

import json
from pathlib import Path

from delivery.chaos.run import api_log_counts


def _line(event: str, **fields) -> str:
    return json.dumps({"event": event, "level": "warning", **fields}) + "\n"


def test_counts_each_event_over_every_api_log_and_ignores_the_workers(tmp_path: Path) -> None:
    (tmp_path / "api-1.log").write_text(
        _line("unhandled error", exception="Traceback ...\nFileNotFoundError: [Errno 2]")
        + _line("lost the connection while committing 3 new messages (ConnectionDoesNotExistError()); asking")
        + _line("the 3 new messages were written; their requests answer as usual")
        + _line("database unavailable"))
    (tmp_path / "api-7.log").write_text(
        _line("unhandled error")
        + _line("the 1 new messages were not written; their requests answer 503 write-failed")
        + _line("could not tell within 10 s whether 2 new messages were written; their requests answer 503"))
    (tmp_path / "worker-3.log").write_text(_line("unhandled error"))
    assert api_log_counts(tmp_path) == {"unhandled_errors": 2, "commits_lost_then_written": 1,
                                        "commits_lost_not_written": 1, "commits_lost_unknown": 1}


def test_no_api_logs_count_zero(tmp_path: Path) -> None:
    assert set(api_log_counts(tmp_path).values()) == {0}
