#!/usr/bin/env bash
# The GPU check of tessera-lab's runtime: at most 10 minutes on 1, 2 or 8 GPUs; everything goes under $OUT.
#
#   OUT=/path/to/dir scripts/gpu_check.sh          (default OUT: ./gpu-check-<UTC date>)
#
# Steps (each under `timeout`, its exit status in $OUT/summary.txt, its output in $OUT/<step>.log):
#   meta      nvidia-smi (+ topo), torch / CUDA / NCCL versions, GPU count, date, git commit -> meta.txt
#   run-1f1b  run --backend nccl --pp 2 --ep 1 --schedule 1f1b --steps 3 --check          (needs >= 2 GPUs)
#   run-ovl   run --backend nccl --pp 2 --ep E --schedule overlapped --pair-exec scheduled --steps 3 --check,
#             E = 2 with >= 4 GPUs, else 1 (catches NCCL p2p deadlocks and the rank -> GPU mapping)
#   trace     the run-ovl job again under the torch profiler: torch-trace/rank<r>.json (Chrome/Perfetto), the
#             communication stream(s) beside the compute stream
#   pair      measure --backend cuda: one layer pair at Qwen3-Next-80B-A3B's real shapes (4,096 tokens per
#             micro-batch) with EP = the GPU count (2 or 8); with 1 GPU it is refused: EP 1 has no all-to-all,
#             an overlap table would hold no communication
# With one GPU only meta runs (the runner puts one rank per GPU; pp 2 needs two). Budget: 150 + 150 + 120 + 150
# seconds of step timeouts = 9.5 minutes at most.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$PWD/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
py="${PYTHON:-python}"
cli=("$py" -m tessera_lab)
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
summary="$OUT/summary.txt"
: > "$summary"

step() {  # step NAME SECONDS CMD...
  local name="$1" secs="$2"; shift 2
  local t0; t0=$(date +%s)
  timeout --kill-after=10 "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall_s=$(( $(date +%s) - t0 )) cmd: $*" | tee -a "$summary"
  return 0
}

{
  echo "date_utc $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git $(git -C "$here" rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  nvidia-smi topo -m 2>&1 || true
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl",
            ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
            "gpus", torch.cuda.device_count())' 2>&1
} > "$OUT/meta.txt"
tail -1 "$OUT/meta.txt"

ngpu=$("$py" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
echo "gpus $ngpu" | tee -a "$summary"
if [ "$ngpu" -lt 1 ]; then
  echo "gpu_check.sh: no CUDA GPU visible to torch; nothing run" | tee -a "$summary" >&2
  exit 2
fi

if [ "$ngpu" -ge 2 ]; then
  ep=1
  if [ "$ngpu" -ge 4 ]; then ep=2; fi
  step run-1f1b 150 "${cli[@]}" run --backend nccl --pp 2 --ep 1 --schedule 1f1b --steps 3 --check \
    --json "$OUT/run-1f1b.json" --trace "$OUT/run-1f1b-trace.json"
  step run-ovl 150 "${cli[@]}" run --backend nccl --pp 2 --ep "$ep" --schedule overlapped --pair-exec scheduled \
    --steps 3 --check --json "$OUT/run-overlapped.json" --trace "$OUT/run-overlapped-trace.json"
  export TESSERA_LAB_TORCH_PROFILE="$OUT/torch-trace"
  step trace 120 "${cli[@]}" run --backend nccl --pp 2 --ep "$ep" --schedule overlapped --pair-exec scheduled \
    --steps 2
  unset TESSERA_LAB_TORCH_PROFILE
  pair_ep=$ngpu
  if [ "$pair_ep" -gt 8 ]; then pair_ep=8; fi
  step pair 150 "${cli[@]}" measure --backend cuda --model qwen3-next-80b-a3b --ep "$pair_ep" --size-factor 1.0 \
    --repeats 10 --warmup 2 --timeout 140 --no-progress --out "$OUT/cuda-pair-ep$pair_ep.json" \
    --json "$OUT/cuda-pair-ep$pair_ep-table.json"
else
  echo "run-1f1b, run-ovl, trace: skipped: 1 GPU (pp 2 needs 2 ranks, one per GPU)" | tee -a "$summary"
  echo "pair: refused: EP = 1 GPU has no all-to-all; an overlap table would hold no communication" | tee -a "$summary"
fi
echo "everything is under $OUT"
