#!/usr/bin/env bash
# Measure the overlap table of Qwen3-Next-like layer pairs on a CUDA machine and write the profile.
#
#   scripts/gpu_profile.sh [OUTPUT_DIR]        (default: $OUT if set, else data/profiles)
#
# What it does (a few minutes on one H100/H200):
#   1. records the machine (nvidia-smi, torch and CUDA versions) in OUTPUT_DIR/gpu_profile_env.txt;
#   2. runs a quick check of the cuda backend on one small pair;
#   3. measures the overlap table of qwen3-next-80b-a3b at full size (4,096 tokens per micro-batch, ep=8 shapes):
#      forward of micro-batch i+1 with the full backward (B+W) of micro-batch i, for every layer-kind
#      combination, compute on one CUDA stream and communication on another, CUDA events, 3 warm-up and 20
#      timed repetitions (median and quartiles);
#      - with two or more GPUs visible the all-to-all is NCCL's (all_to_all_single over up to 8 GPUs);
#      - with one GPU a device-to-device copy of the same bytes on the communication stream stands in, and
#        every entry records comm_proxy = "copy";
#   4. writes OUTPUT_DIR/cuda-qwen3-next-80b-a3b-<gpu>.json (the profile, with device, driver, torch/CUDA
#      versions, dtype, shapes, repeats, spread and date per entry) and the table as JSON beside it.
# Commit the profile under data/profiles/ and update data/profiles/README.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
outdir="${1:-${OUT:-$here/data/profiles}}"
mkdir -p "$outdir"
py="${PYTHON:-python}"
if [ -x "$here/.venv/bin/python" ] && [ -z "${PYTHON:-}" ]; then py="$here/.venv/bin/python"; fi
cli=("$py" -m tessera_lab)

"$py" - <<'PY' || { echo "gpu_profile.sh: no CUDA GPU visible to torch; nothing measured" >&2; exit 2; }
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
PY

gpu="$("$py" -c 'import torch; print(torch.cuda.get_device_name(0).split()[-1].replace("/", "-"))' 2>/dev/null || echo gpu)"
env_txt="$outdir/gpu_profile_env.txt"
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
  nvidia-smi topo -m 2>/dev/null || true
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
} > "$env_txt"
cat "$env_txt"

# 1) quick check: one small pair, few repeats (fails fast if the backend is broken)
"$py" - <<'PY'
from tessera_lab.overlap import core as ov
from tessera_lab.model.spec import load_model
m = load_model("qwen3-next-80b-a3b")
r = ov.measure_pair(ov.bundle(m, 0, "F"), ov.bundle(m, 3, "BW"), "cuda", size_factor=0.25, repeats=3, warmup=2,
                    timeout_s=300)
print(f"quick check: t_a {r.t_a*1e3:.3f} ms, t_b {r.t_b*1e3:.3f} ms, t_ab {r.t_ab*1e3:.3f} ms, "
      f"e {r.overlap_efficiency:.3f}, comm {r.metadata['comm']}, proxy {r.metadata['comm_proxy']}")
PY

# 2) the table at full size, measured with the runner's node-level executor on an EP group of one process per
#    GPU (the largest power of two <= the visible GPUs, at most 8; never run yet on a GPU)
ngpu_ep=$("$py" -c "import torch; n=min(8, torch.cuda.device_count()); print(1 << (n.bit_length() - 1) if n else 1)")
profile="$outdir/cuda-qwen3-next-80b-a3b-${gpu}.json"
"${cli[@]}" measure --backend cuda --model qwen3-next-80b-a3b --ep "$ngpu_ep" --size-factor 1.0 --repeats 20 --warmup 3 \
  --timeout 540 --out "$profile" --json "$outdir/cuda-qwen3-next-80b-a3b-${gpu}-table.json"

# 3) the analytic table beside it, for comparison
"${cli[@]}" measure --backend analytic --model qwen3-next-80b-a3b --no-progress \
  --out "$outdir/analytic-qwen3-next-80b-a3b.json" --json "$outdir/analytic-qwen3-next-80b-a3b-table.json" >/dev/null

echo "profile: $profile"

# 4) the runner on this GPU machine (issue 13; never run yet: no GPU machine was available when it was written).
#    With >= 2 GPUs: NCCL, node-level pairs with async all-to-alls; the calibration and validation matrix.
ngpu=$("$py" -c "import torch; print(torch.cuda.device_count())")
if [ "$ngpu" -ge 2 ]; then
  "${cli[@]}" run --pp 2 --ep 1 --schedule overlapped --pair-exec scheduled --steps 3 \
    --json "$outdir/runner-overlapped-scheduled-${gpu}.json" || echo "runner check failed" >&2
  if [ "$ngpu" -ge 4 ]; then
    "${cli[@]}" run --pp 2 --ep 2 --schedule overlapped --pair-exec scheduled --steps 3 \
      --json "$outdir/runner-overlapped-scheduled-ep2-${gpu}.json" || echo "runner ep=2 check failed" >&2
  fi
  "${cli[@]}" calibrate --out "$outdir/device-${gpu}.json" || echo "calibrate failed" >&2
  "${cli[@]}" validate --quick --device "$outdir/device-${gpu}.json" --json "$outdir/validate-${gpu}.json" \
    || echo "validate failed" >&2
fi
