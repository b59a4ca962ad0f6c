#!/usr/bin/env bash
# Runs the TRL contract tests against trl 1.15.0, the lower end of pyproject's trl range (1.16.0 is constraints.txt's
# and runs in the main suite). trl 1.15.0 goes into its own directory, .trl115/ (pip --target, cached), and comes
# first on PYTHONPATH over .venv: every other package is the tested set's, which satisfies trl 1.15.0's requirements
# (checked below). .venv itself is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
TARGET=.trl115
want="$(sha256sum constraints-trl115.txt | cut -d' ' -f1)"
if [ ! -f "$TARGET/.stamp" ] || [ "$(cat "$TARGET/.stamp")" != "$want" ]; then
    rm -rf "$TARGET"
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$TARGET" \
        -c constraints-trl115.txt trl
    echo "$want" > "$TARGET/.stamp"
fi
export PYTHONPATH="$PWD/$TARGET${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'PYEOF'
# the trl imported is 1.15.0 from .trl115, and the environment meets its (non-extra) requirements
from importlib.metadata import PackageNotFoundError, distribution, version
import sys

import trl
from packaging.requirements import Requirement

pin = [l.split("==")[1].strip() for l in open("constraints-trl115.txt") if l.startswith("trl==")][0]
if trl.__version__ != pin or ".trl115" not in trl.__file__:
    sys.exit(f"check_trl_minor: imported trl {trl.__version__} from {trl.__file__}, wanted {pin} from .trl115")
unmet = []
for line in distribution("trl").requires or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = version(req.name)
    except PackageNotFoundError:
        have = None
    if have is None or have not in req.specifier:
        unmet.append(f"{req} (installed: {have})")
if unmet:
    sys.exit("check_trl_minor: trl " + pin + " requirements unmet: " + "; ".join(unmet))
print(f"check_trl_minor: trl {trl.__version__} from {trl.__file__}")
PYEOF
# TRL 1.15's fused LM head launches its Triton kernel on every device (1.16 folds the tiles in torch off CUDA/XPU):
# without CUDA, Triton's interpreter runs it on the CPU tensors. Stock TRL's own path, not a patch of it.
if ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    export TRITON_INTERPRET=1
fi
# The contract tests: ictrl's step equals stock TRL's (loss types, loss options, an SGD step of each trainer class),
# `trl grpo` and `ictrl train` start the same run from one file, every GRPOConfig field is in ictrl's table, the
# resume hooks and prompt order are TRL's, and every TRL attribute ictrl swaps or reads is where it expects it.
"$PY" -m pytest --integration -p no:randomly --durations=5 \
    tests/engine/test_trl_surface.py \
    tests/engine/test_trl_fields.py \
    "tests/engine/test_trl_equality.py::test_every_loss_type_and_level_equals_trl" \
    "tests/engine/test_trl_equality.py::test_each_loss_option_equals_trl_and_changes_the_step" \
    "tests/engine/test_trl_equality.py::test_sgd_steps_equal_the_stock_trainer" \
    "tests/train_cli/test_trl_cli_parity.py::test_a_plain_trl_file_trains_as_trl_grpo_bit_for_bit" \
    "tests/engine/test_resume.py::test_the_trainer_hooks_are_the_pinned_ones" \
    "tests/engine/test_resume.py::test_epoch_sampler_matches_trl_order_per_epoch" \
    "tests/engine/test_resume.py::test_checkpoints_appear_whole_or_not_at_all"
