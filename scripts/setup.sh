#!/usr/bin/env bash
# Create (or reuse) .venv/ in the repo root with ictrl and its pinned dependencies.
# Re-running is cheap: the install is skipped while requirements and pyproject are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi

stamp=.venv/.ictrl-installed
want="$(cat requirements.txt constraints.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import ictrl" 2>/dev/null; then
    exit 0
fi

# The constraints file keeps pip on the CPU torch wheel (an unpinned torch pulls a multi-GB CUDA build).
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -r requirements.txt
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev]"
echo "$want" > "$stamp"
