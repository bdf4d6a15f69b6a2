"""No test empties a Redis server it did not start.

Users point REDIS_URL at a Redis of their own, and the suite then uses one database there, the one
the URL names (tests/conftest.py empties it for each test with FLUSHDB). FLUSHALL empties every
database on the server: it is allowed only on a server the test started itself.

The scan parses every Python file under tests/ and finds each call that empties a whole server, in
any spelling: a method named flushall in any case (`client.flushall()`, `client.FlushAll()`), the
command given as a string (`execute_command("FLUSHALL")`, `execute_command("flushall", "ASYNC")`),
`getattr(client, "flushall")`, or the command string kept in a variable (`command = "FLUSHALL"`).
Such a call is allowed only in a function (or module) that names a Redis of the test's own
(the private_redis fixture, services.RedisProcess, services.start_embedded_redis) and none of the
shared ones (the redis_url and redis_server_url fixtures, settings.redis, REDIS_URL). A helper that
shows neither is refused too: the scan cannot tell which server it empties.

FLUSHDB empties the database its client was made for; no test may switch a client to another
database (SELECT, SWAPDB, MOVE as commands), so a FLUSHDB can only ever empty the test's own.

This file names the command in order to find it, and is the one file the scan of tests/ leaves out.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

WHOLE_SERVER = "FLUSHALL"
OTHER_DATABASE = ("SELECT", "SWAPDB", "MOVE")  # commands that reach a database other than the client's
OWN_SERVER_NAMES = {"private_redis", "RedisProcess", "start_embedded_redis"}
SHARED_SERVER_NAMES = {"redis_url", "redis_server_url"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _command_word(value: object) -> str | None:
    """The Redis command a string constant starts with, in capitals (None for anything else)."""
    if not isinstance(value, str) or not value.strip():
        return None
    return value.split()[0].upper()


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """Strings that are whole statements (docstrings and the like): text, never a command."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _server_flushes(tree: ast.AST) -> list[ast.AST]:
    """Every node that empties a whole server, in any spelling."""
    text_only = _docstring_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.upper() == WHOLE_SERVER:
            found.append(node)  # client.flushall(...), client.FLUSHALL, a bound method passed along
        elif (isinstance(node, ast.Constant) and id(node) not in text_only
              and _command_word(node.value) == WHOLE_SERVER):
            found.append(node)  # execute_command("FLUSHALL"), getattr(client, "flushall"), command = "flushall"
    return found


def _database_switches(tree: ast.AST) -> list[ast.AST]:
    """Redis commands, given as strings to execute_command, that reach another database."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "execute_command" and node.args and isinstance(node.args[0], ast.Constant)
                and _command_word(node.args[0].value) in OTHER_DATABASE):
            found.append(node)
        elif isinstance(node, ast.Attribute) and node.attr.lower() == "swapdb":
            found.append(node)
    return found


def _scopes(tree: ast.Module) -> list[ast.AST]:
    """The module and every function in it, innermost last."""
    return [tree, *(node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))]


def _innermost_scope(tree: ast.Module, target: ast.AST) -> ast.AST:
    scope = tree
    for candidate in _scopes(tree)[1:]:
        if any(node is target for node in ast.walk(candidate)):
            scope = candidate  # ast.walk goes outside in, so the last one holding the node is innermost
    return scope


def _names_in(scope: ast.AST) -> set[str]:
    """Every name, attribute, parameter and string the scope mentions (settings.redis as 'settings.redis')."""
    names = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
            if node.attr == "redis" and isinstance(node.value, ast.Name) and node.value.id == "settings":
                names.add("settings.redis")
        elif isinstance(node, ast.Constant) and node.value == "REDIS_URL":
            names.add("REDIS_URL")
    return names


def _own_server_only(scope: ast.AST) -> bool:
    names = _names_in(scope)
    return bool(names & OWN_SERVER_NAMES) and not names & (SHARED_SERVER_NAMES | {"settings.redis", "REDIS_URL"})


def scan_source(source: str, path: str = "<source>") -> list[Finding]:
    """What in this source empties a Redis server the test did not start, or reaches another database."""
    tree = ast.parse(source)
    findings = [Finding(path, node.lineno, "empties a whole server (FLUSHALL) the test did not start")
                for node in _server_flushes(tree) if not _own_server_only(_innermost_scope(tree, node))]
    findings += [Finding(path, node.lineno, "a Redis command that reaches another database")
                 for node in _database_switches(tree)]
    return sorted(findings, key=lambda finding: (finding.path, finding.line))


def scan_tree(root: Path) -> list[Finding]:
    findings = []
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts or path.name == Path(__file__).name:
            continue
        findings += scan_source(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    return findings


def test_no_test_flushes_a_server_it_did_not_start() -> None:
    findings = scan_tree(TESTS)
    assert not findings, "\n".join(str(finding) for finding in findings)


PLANTED_ON_THE_SHARED_SERVER = [
    "await client.flushall()",
    "await client.FlushAll(asynchronous=True)",
    'await client.execute_command("FLUSHALL")',
    "await client.execute_command('flushall', 'ASYNC')",
    'await getattr(client, "flushall")()',
    'command = "FLUSHALL"',
]


def _test_using(parameters: str, url: str, line: str) -> str:
    return (f"async def test_planted({parameters}):\n"
            f'    """Says FLUSHALL in its docstring, which is text, not a command."""\n'
            f"    client = Redis.from_url({url})\n"
            f"    {line}\n")


def test_the_scan_catches_each_spelling_planted_in_a_test_on_the_shared_server() -> None:
    for line in PLANTED_ON_THE_SHARED_SERVER:
        assert [finding.line for finding in scan_source(_test_using("redis_url", "redis_url", line))] == [4], line
        # A test that starts a server of its own but empties the shared one is caught as well.
        mixed = _test_using("redis_url, private_redis", "redis_url", line)
        assert [finding.line for finding in scan_source(mixed)] == [4], line


def test_a_flushall_on_a_server_the_test_started_passes_and_docstrings_are_text() -> None:
    for line in PLANTED_ON_THE_SHARED_SERVER:
        assert scan_source(_test_using("private_redis", "private_redis.url", line)) == [], line
    assert scan_source('"""FLUSHALL Redis: the chaos run does, on its own server."""\n') == []


def test_a_helper_that_does_not_show_its_server_is_refused() -> None:
    source = "async def wipe(client):\n    await client.flushall()\n"
    assert [finding.line for finding in scan_source(source)] == [2]


def test_switching_a_client_to_another_database_is_refused() -> None:
    source = ("async def test_planted(redis_url):\n"
              "    client = Redis.from_url(redis_url)\n"
              "    await client.execute_command('SELECT', 5)\n"
              "    await client.flushdb()\n"
              "    await client.swapdb(0, 5)\n")
    assert [(finding.line, finding.what) for finding in scan_source(source)] == [
        (3, "a Redis command that reaches another database"), (5, "a Redis command that reaches another database")]
    assert scan_source(source.replace("    await client.execute_command('SELECT', 5)\n", "")
                       .replace("    await client.swapdb(0, 5)\n", "")) == []


def test_the_scan_catches_a_flushall_planted_in_a_copy_of_the_real_tests(tmp_path: Path) -> None:
    """The acceptance test that empties Redis under its worker, with FLUSHDB turned back into FLUSHALL
    (as it once was), is found at each line in a scan of a copy of tests/."""
    copied = tmp_path / "tests"
    shutil.copytree(TESTS, copied, ignore=shutil.ignore_patterns("__pycache__"))
    planted = copied / "acceptance" / "test_worker_processes.py"
    text = planted.read_text(encoding="utf-8")
    assert text.count("await client.flushdb()") == 2
    planted.write_text(text.replace("await client.flushdb()", "await client.flushall()"), encoding="utf-8")
    lines = [number for number, line in enumerate(planted.read_text(encoding="utf-8").splitlines(), 1)
             if "flushall()" in line]
    findings = scan_tree(copied)
    assert [(finding.path, finding.line) for finding in findings] == [
        ("acceptance/test_worker_processes.py", line) for line in lines]
