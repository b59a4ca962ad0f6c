#!/usr/bin/env bash
# Create (or reuse) .venv/ in the repo root with ictrl[dev] under the exact tested set in constraints.txt.
# Re-running is cheap: the install is skipped while constraints.txt and pyproject.toml are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi

stamp=.venv/.ictrl-installed
want="$(cat constraints.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import ictrl" 2>/dev/null; then
    exit 0
fi

# pyproject.toml declares ranges; constraints.txt pins every package of the tested set. torch==2.13.0 there is
# satisfied by the CPU wheel only where pip is offered one (see README: CPU-only machines elsewhere add
# --index-url https://download.pytorch.org/whl/cpu for torch).
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev]"
echo "$want" > "$stamp"
