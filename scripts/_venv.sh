# Sourced by scripts/run and scripts/test: create or refresh .venv when pyproject.toml changed.
# PYTHON picks the interpreter; without it, the first of python3, python3.13, python3.12 and
# python3.11 that is 3.11 or newer (requires-python), so a machine whose python3 is older but
# has a newer one beside it still works. HOOKLEDGER_VENV is another environment directory, so a
# second interpreter can be tested beside .venv (see .ci/run).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HOOKLEDGER_VENV:-$root/.venv}"
stamp="$venv/.installed-stamp"
_recent_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
if [ ! -x "$venv/bin/python" ]; then
    python="${PYTHON:-}"
    if [ -z "$python" ]; then
        for candidate in python3 python3.13 python3.12 python3.11; do
            if _recent_enough "$candidate"; then
                python="$candidate"
                break
            fi
        done
    fi
    if [ -z "$python" ] || ! _recent_enough "$python"; then
        echo "hookledger needs Python 3.11 or newer: ${python:-python3} is $("${python:-python3}" --version 2>&1 | head -n 1)." >&2
        echo "Install one, or point PYTHON at it: PYTHON=/path/to/python3.12 $0" >&2
        exit 1
    fi
    if ! "$python" -m venv "$venv"; then
        # Debian and Ubuntu ship venv's pip apart (python3-venv); a half-made environment
        # would only fail later, less clearly.
        rm -rf "$venv"
        echo "could not create $venv with $python (on Debian or Ubuntu: apt install python3-venv)" >&2
        exit 1
    fi
fi
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install --quiet -e "$root[test]"
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
