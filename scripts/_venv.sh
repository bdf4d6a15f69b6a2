# Sourced by scripts/run and scripts/test: create or refresh .venv when pyproject.toml changed.
# PYTHON picks the interpreter (python3 by default); HOOKLEDGER_VENV another environment
# directory, so a second interpreter can be tested beside .venv (see .ci/run).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HOOKLEDGER_VENV:-$root/.venv}"
stamp="$venv/.installed-stamp"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install --quiet -e "$root[test]"
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
