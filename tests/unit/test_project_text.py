"""The project's text says what is, never when it came: nothing is labelled by the order of the
work that made it (an ordinal before the word session, "until the" before an ordinal). History
lives in git. The examples below are put together from pieces, so this file passes its own scan.

Every tracked text file is read (README, docs, code, comments, tests, scripts); a line that
matches one of the patterns below fails the test with its place.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_ORDINAL = (r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|[a-z]+teenth"
            r"|twentieth|thirtieth|fortieth|fiftieth|twenty-[a-z]+|thirty-[a-z]+|forty-[a-z]+|[0-9]+(st|nd|rd|th))")
PATTERNS = tuple(re.compile(pattern, re.IGNORECASE) for pattern in (
    _ORDINAL + r" sessions?\b",  # an ordinal, then the word session
    r"\buntil the " + _ORDINAL + r"\b",  # "until the", then an ordinal
    r"\b(this|that|an? earlier|the previous|a later|the next|each) session('s)? (measur|run|figure|found|made|change)",
    r"\bsession [0-9]+\b",  # "Session 30"
    r"\b(stop|run) #?[0-9]+ (landed|measured|found)",
))
_TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".html", ".sh", ".cfg", ".ini", ".yml", ".yaml", ".json", ".mako", ""}


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = [ROOT / name for name in listed.decode().split("\0") if name]
    return [path for path in paths if path.suffix in _TEXT_SUFFIXES and path.is_file() and path != Path(__file__)]


def offending_lines(text: str) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if any(pattern.search(line) for pattern in PATTERNS):
            found.append((number, line.strip()[:120]))
    return found


def test_no_text_labels_anything_by_the_order_of_the_work():
    files = _tracked_text_files()
    assert len(files) > 100  # the scan really reads the project
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(ROOT)}:{number}: {line}" for number, line in offending_lines(text)]
    assert found == []


def test_the_patterns_catch_what_they_are_for():
    session = "sess" + "ion"
    labelled = (
        f"The twenty-eighth {session}'s measurements beside the thirtieth's.",
        "until " + "the ninth, a SIGTERM left all five running",
        f"In this {session}'s run the share was 75%.",
        f"## {session.title()} 30 (stop 39)",
        f"figures from the 12th {session}",
    )
    for line in labelled:
        assert offending_lines(line) == [(1, line)], line
    plain = ("The first attempt is sent at once.", "a session cookie of at most 8 h",
             "until the batch commits", "sessions expire after 8 hours", "each session's CSRF token")
    for line in plain:
        assert offending_lines(line) == [], line
