#!/usr/bin/env bash
# Proves that ictrl together with its GPU extra resolves to one consistent set under constraints.txt, using pip's
# own resolver against the registry (--dry-run: nothing is installed, no CUDA wheel lands in the environment).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
"$PY" -m pip install --quiet --disable-pip-version-check --dry-run --ignore-installed --report "$report" \
    -c constraints.txt -e ".[vllm]" 2> >(grep -v "is ignored" >&2)
"$PY" - "$report" <<'PYEOF'
import json, sys
got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
want = [line.split("==") for line in open("constraints.txt") if "==" in line and not line.startswith("#")]
core = ("torch", "transformers", "trl", "accelerate")
print("resolved with [vllm]:", ", ".join(f"{n} {got.get(n, '?')}" for n in (*core, "vllm")))
bad = [f"{n} {got[n.lower()]} != {v.strip()}" for n, v in want if n.lower() in core and not got.get(n.lower(), "").startswith(v.strip())]
if "vllm" not in got or bad:
    sys.exit("extras resolution: " + ("; ".join(bad) or "vllm missing"))
PYEOF
