#!/usr/bin/env bash
# GPU smoke test of ictrl with vLLM rollouts: a tiny Qwen2 built locally (no download), 3 ICT optimizer steps with
# vLLM colocated on the training GPU, then the same with a separate `vllm serve` server started by hand with the
# flags TRL's client needs (docs/vllm.md; needs a second GPU).
# Each run takes its ICT score from vLLM's top-K log-probs (selection_topk_source=sampler) and applies TRL's
# token-level truncated importance sampling; it checks both happened and prints the per-step metrics.
#
#   bash bench/gpu_smoke.sh                  # both modes, results under a fresh temp dir
#   bash bench/gpu_smoke.sh colocate OUT     # one mode ("colocate" | "server" | "both"), results under OUT
#   bash bench/gpu_smoke.sh cpu OUT          # the CPU half: the paper's recipe rehearsed (docs/scale.md), no GPU
#   ICTRL_SMOKE_PORT=8123 bash bench/gpu_smoke.sh server   # the server's HTTP port (default 8011)
#
# The port has its own variable: vLLM itself reads VLLM_PORT (for its internal ports), so setting that would change
# the server's internals as well.
#
# Needs: CUDA, and ictrl installed with the vllm extra (pip install -e ".[vllm]" -c constraints.txt).
# Writes OUT/<mode>/log_history.json. Exit status 0 only if every requested mode ran its 3 steps and passed the
# checks. Status: written without a GPU; it has never run (see docs/vllm.md).
set -euo pipefail

MODE=${1:-both}
OUT=${2:-$(mktemp -d -t ictrl-gpu-smoke-XXXX)}
PY=${PYTHON:-python}
PORT=${ICTRL_SMOKE_PORT:-8011}
mkdir -p "$OUT"
echo "gpu_smoke: mode=$MODE out=$OUT"

if [ "$MODE" = cpu ]; then
  # configs/qwen2.5-0.5b/ict.yaml as written (vLLM colocate, TIS, dynamic sampling) in bf16 on 2 processes, at the
  # real width with 2 layers, steps and lengths cut; a checkpoint, then --resume. On a GPU machine the same two
  # ictrl train lines run on the GPUs.
  ICTRL=${ICTRL:-ictrl}
  "$ICTRL" tiny-model "$OUT/model" --shape qwen2.5-0.5b --layers 2 --untrained
  rehearse() {
    "$ICTRL" train configs/qwen2.5-0.5b/ict.yaml --model_name_or_path="$OUT/model" --output_dir="$OUT/ict" \
      --bf16=true --num-processes 2 --prompts_per_step=2 --num_generations=4 --max_completion_length=32 \
      --overlong_buffer_length=8 --dynamic_sampling_max_rounds=1 --dataset_limit=64 --save_steps=2 "$@"
  }
  rehearse --max_steps=2
  rehearse --max_steps=4 --resume
  "$PY" - "$OUT/ict" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl")]
assert [r["step"] for r in rows] == [1, 2, 3, 4], [r["step"] for r in rows]
assert any("sampling/sampling_logp_difference/max" in r for r in rows), "no rollout reported vLLM's log-probs"
for r in rows:
    print({k: r[k] for k in ("step", "reward", "step_time", "sampling/sampling_logp_difference/max",
                             "sampling/importance_sampling_ratio/mean", "ictrl/topk_from_sampler") if k in r})
print("gpu_smoke cpu: OK")
EOF
  echo "gpu_smoke: done ($OUT)"
  exit 0
fi

"$PY" -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, 'vllm', vllm.__version__, 'GPUs', torch.cuda.device_count())"

# A tiny Qwen2 with head_dim 64 (vLLM's attention kernels take 64/128/...; the test default of 16 is too small).
# Saved in bf16: vLLM's fast attention backends do not take fp32 weights.
"$PY" - "$OUT/model" <<'EOF'
import sys, torch
from transformers import AutoModelForCausalLM
from ictrl.models import save_tiny_model
path = save_tiny_model(sys.argv[1], seed=0, hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).save_pretrained(path)
print("tiny model saved to", path)
EOF

cat > "$OUT/smoke_train.py" <<'EOF'
"""3 ICT steps with vLLM rollouts (argv: model_dir out_dir vllm_mode port)."""
import json, math, sys
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from ictrl.engine.config import ICTGRPOConfig
from ictrl.engine.trainer import ICTGRPOTrainer

model_dir, out_dir, mode, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
prompts = [f"Q: {a}+{b}=A:" for a in range(4) for b in range(4)]


def reward(prompts, completions, **kwargs):
    return [float(any(ch.isdigit() for ch in c)) for c in completions]


tokenizer = AutoTokenizer.from_pretrained(model_dir)
tokenizer.padding_side = "left"
args = ICTGRPOConfig(
    output_dir=out_dir, report_to="none", save_strategy="no", logging_steps=1, max_steps=3, bf16=True,
    per_device_train_batch_size=8, num_generations=4, max_completion_length=32, learning_rate=1e-4, seed=0,
    token_selector="ict", selection_warmup_steps=1, selection_topk=8, selection_topk_source="sampler",
    use_vllm=True, vllm_mode=mode, vllm_server_port=port, vllm_gpu_memory_utilization=0.25,
    vllm_max_model_length=256, vllm_importance_sampling_correction=True,
    vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=2.0,
)
from ictrl.train_cli.process_group import process_group_left

with process_group_left():  # leave the launch's process group at every exit, as ictrl train does
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trainer = ICTGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_dict(
        {"prompt": prompts}), processing_class=tokenizer)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    with open(f"{out_dir}/log_history.json", "w") as f:
        json.dump(trainer.state.log_history, f, indent=1)
    for h in steps:
        print({k: h[k] for k in ("step", "loss", "reward", "ictrl/selected_frac", "ictrl/topk_from_sampler",
                                 "ictrl/is_ratio_mean", "ictrl/is_clipped_frac", "ictrl/stats_time") if k in h})
    assert len(steps) == 3, f"expected 3 logged steps, got {len(steps)}"
    assert all(math.isfinite(h["loss"]) for h in steps)
    assert [h["ictrl/warmup"] for h in steps] == [1.0, 0.0, 0.0]
    assert all(h["ictrl/topk_from_sampler"] == 1.0 for h in steps[1:]), "ICT score did not come from vLLM's top-K"
    assert all(0.0 < h["ictrl/is_ratio_mean"] <= 2.0 for h in steps), "no importance weight logged"
    print(f"gpu_smoke {mode}: OK")
EOF

SERVER_PID=""
trap '[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; true' EXIT

run_colocate() {
  mkdir -p "$OUT/colocate"
  # TRL's colocated vLLM uses the external_launcher backend: it needs a torch.distributed launch, even for 1 GPU.
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} "$PY" -m torch.distributed.run --nproc_per_node 1 \
    "$OUT/smoke_train.py" "$OUT/model" "$OUT/colocate" colocate "$PORT"
}

run_server() {
  local n
  n=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  if [ "$n" -lt 2 ]; then
    echo "gpu_smoke server: SKIPPED (needs 2 GPUs: the server's and the trainer's NCCL ranks cannot share one)"
    return 0
  fi
  mkdir -p "$OUT/server"
  # The command of docs/vllm.md: dev mode and the NCCL weight-transfer engine for TRL's weight sync, processed
  # log-probs for the importance weight and the top-K, no cap on their number.
  CUDA_VISIBLE_DEVICES=1 VLLM_SERVER_DEV_MODE=1 vllm serve "$OUT/model" --port "$PORT" \
    --gpu-memory-utilization 0.3 --max-model-len 256 --weight-transfer-config '{"backend": "nccl"}' \
    --logprobs-mode processed_logprobs --max-logprobs -1 > "$OUT/server/vllm_serve.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 120); do  # up to 10 minutes for the server to come up
    if curl -sf "http://localhost:$PORT/health" > /dev/null 2>&1 || curl -sf "http://localhost:$PORT/health/" \
        > /dev/null 2>&1; then break; fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then echo "vllm serve exited:"; tail -40 "$OUT/server/vllm_serve.log"; return 1; fi
    sleep 5
  done
  CUDA_VISIBLE_DEVICES=0 "$PY" "$OUT/smoke_train.py" "$OUT/model" "$OUT/server" server "$PORT"
}

case "$MODE" in
  colocate) run_colocate ;;
  server) run_server ;;
  both) run_colocate; run_server ;;
  *) echo "usage: bash bench/gpu_smoke.sh [colocate|server|both|cpu] [OUT]" >&2; exit 2 ;;
esac
echo "gpu_smoke: done ($OUT)"
