#!/usr/bin/env bash
# The GPU check of tessera-lab: every runtime path on 1, 2 or 8 GPUs in at most 10 minutes, everything under $OUT.
#
#   OUT=/path/to/dir scripts/gpu_check.sh                (default OUT: ./gpu-check-<UTC date>)
#   OUT=/path/to/dir scripts/gpu_check.sh --rehearse N    (N = 1, 2 or 8: the N-GPU step list on CPU)
#
# Steps by GPU count (each states what it expects; a step runs under `timeout`, its output in $OUT/<step>.log):
#   1 GPU    meta          versions, nvidia-smi, git commit -> meta.txt
#            run-1f1b      run --pp 1 --ep 1 --schedule 1f1b --check: losses match the CPU reference
#            run-ovl       run --pp 1 --ep 1 --schedule overlapped --pair-exec scheduled --check: the same
#            trace         the overlapped run under the torch profiler: Chrome traces in torch-trace/
#            dry-run       measure --dry-run of Qwen3-Next at EP 8: host memory per process <= 8 GiB
#            pair-ep1      measure of one layer pair at EP 1: a table labelled "no communication"
#            optable       the op table (GEMM, grouped GEMM, attention, Gated DeltaNet; with 2+ GPUs all-to-all
#                          and p2p too): op-table.json, schema checked (tessera_lab.cost.optable)
#            sync-debug    run overlapped, scheduled, capacity dispatch (EP 2 with 2+ GPUs) with
#                          TESSERA_LAB_SYNC_DEBUG=error: any host sync in a step's actions raises
#   2 GPUs   run-ep2       run --pp 1 --ep 2 overlapped, scheduled, --ep-dispatch capacity --check: EP all-to-alls
#                          on the communication stream with the capacity dispatch
#            run-pp2-1f1b  run --pp 2 --ep 1 --schedule 1f1b --check (p2p between two GPUs)
#            run-pp2-ovl   run --pp 2 --ep 1 --schedule overlapped --pair-exec scheduled --check
#            pair-ep2      measure of one layer pair at EP 2: a table with the EP all-to-all
#   8 GPUs   run-pp2-ep4   run --pp 2 --ep 4 overlapped, scheduled --check
#            torchrun      the same job launched by torchrun (8 processes): the same losses as run-pp2-ep4
# Every run step also records each rank's peak memory beside the planner's prediction (its JSON, the summary).
# $OUT/summary.txt: one line per step, `STEP pass|fail|skip WHY`. A step whose timeout (plus the 10 s kill grace)
# would pass the 10-minute budget is skipped (and says so). Exit status: 0 when every step passed; 1 when a step
# failed or was skipped (a skipped GPU step is a check not made); 2 when nothing could start.
# meta.txt names the commit (`git rev-parse HEAD`, else $TESSERA_LAB_COMMIT) and always a digest of the sources
# (tessera_lab/ and scripts/), which identifies the code where the copy has no .git.
#
# --rehearse N runs the N-GPU list on CPU: gloo, the cpu measuring backend, the tiny runner model, the op table's
# tiny sizes, one thread per process; it checks every flag and path without a GPU (losses then bitwise equal).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rehearse=0
if [ "${1:-}" = "--rehearse" ]; then
  rehearse="${2:-}"
  case "$rehearse" in 1|2|8) ;; *) echo "gpu_check.sh: --rehearse = '${rehearse}' is not allowed; allowed: 1, 2 or 8" >&2; exit 2;; esac
elif [ $# -gt 0 ]; then
  echo "gpu_check.sh: argument '$1' is not allowed; allowed: --rehearse 1|2|8 or none" >&2; exit 2
fi
OUT="${OUT:-$PWD/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
py="${PYTHON:-python}"
if [ -z "${PYTHON:-}" ] && ! command -v python >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1; then py=python3; fi
# wheels fetched beforehand by scripts/gpu_wheels.sh (a GPU machine may have no package index): installed into a
# private folder put first on PYTHONPATH, never into the machine's environment
site=""
if compgen -G "$here/.whl/*.whl" >/dev/null; then
  site="${TMPDIR:-/tmp}/tessera-lab-site"
  "$py" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$here"/.whl/*.whl >"$OUT/wheels.log" 2>&1 || {
    echo "meta fail installing .whl/ wheels into $("$py" -V 2>&1) (see wheels.log; a wheel for another Python version? fetch them with scripts/gpu_wheels.sh $("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null))" \
      | tee "$OUT/summary.txt" >&2; exit 2; }
fi
cli=("$py" -m tessera_lab)
verify=("$py" "$here/scripts/gpu_check_verify.py")
export PYTHONPATH="$here${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1
summary="$OUT/summary.txt"
: > "$summary"
t_begin=$(date +%s)
BUDGET_S=600
failed=0
skipped=0

{
  echo "date_utc $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git $(git -C "$here" rev-parse HEAD 2>/dev/null || echo "${TESSERA_LAB_COMMIT:-unknown (no .git; set TESSERA_LAB_COMMIT)}")"
  echo "git_status $(git -C "$here" status --porcelain 2>/dev/null | wc -l | tr -d ' ') changed path(s) (0 when no .git)"
  echo "sources_sha256 $(cd "$here" && find tessera_lab scripts -type f \( -name '*.py' -o -name '*.sh' \) | LC_ALL=C sort \
    | xargs sha256sum | sha256sum | cut -c1-16)"
  echo "host $(hostname) cores $(nproc --all) load $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ "$rehearse" = 0 ]; then nvidia-smi 2>&1 || echo "nvidia-smi: not available"; nvidia-smi topo -m 2>&1 || true; fi
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl",
            ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
            "gpus", torch.cuda.device_count())' 2>&1
} > "$OUT/meta.txt"

if ! grep -q "^torch " "$OUT/meta.txt"; then
  echo "meta fail $py cannot import torch (see meta.txt); set PYTHON or activate the environment" | tee -a "$summary" >&2
  exit 2
fi
# every runtime dependency the steps import, before any step: a missing one fails here in one line, not per step
missing=$("$py" -c 'import importlib.util as u
print(" ".join(m for m in ("numpy", "pandas", "matplotlib", "seaborn", "tqdm", "filelock", "highspy")
               if u.find_spec(m) is None))' 2>&1)
wheels=none; [ -n "$site" ] && wheels="$(cd "$here/.whl" && ls *.whl | tr '\n' ' ')installed into $site"
echo "wheels ${wheels} missing ${missing:-none}" >> "$OUT/meta.txt"
if [ -n "$missing" ]; then
  echo "meta fail $py lacks: $missing; fetch wheels with scripts/gpu_wheels.sh on a machine with an index, or set PYTHON" | tee -a "$summary" >&2
  exit 2
fi
if [ "$rehearse" = 0 ]; then
  ngpu=$("$py" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
  if [ "$ngpu" -lt 1 ]; then
    echo "meta fail no CUDA GPU visible to torch (use --rehearse N on CPU)" | tee -a "$summary" >&2
    exit 2
  fi
  size=1; [ "$ngpu" -ge 2 ] && size=2; [ "$ngpu" -ge 8 ] && size=8
  B=nccl; MB=cuda; MODEL=qwen3-next-80b-a3b; MODE=close; OPSIZES=gpu
  # half of Qwen3-Next's widths: at size factor 1 and EP 1 the 512 experts alone take minutes to initialise on one
  # host thread (measure --dry-run prints the estimate)
  PAIR=(--size-factor 0.5 --repeats 5 --orders 2 --warmup 1 --budget-s 100 --timeout 150)
  RUNT=120; PAIRT=160
  echo "meta pass $ngpu GPU(s), running the $size-GPU steps (see meta.txt)" | tee -a "$summary"
else
  size=$rehearse
  B=gloo; MB=cpu; MODEL=tiny-runner; MODE=bitwise; OPSIZES=tiny
  PAIR=(--size-factor 1.0 --repeats 3 --orders 2 --warmup 0 --budget-s 40 --timeout 90)
  RUNT=150; PAIRT=100
  echo "meta pass rehearsal of the $size-GPU steps on CPU (gloo, cpu backend, tiny sizes)" | tee -a "$summary"
fi
KF=linear_attention+moe
KB=full_attention+moe
[ "$MODEL" = tiny-runner ] && KB=$KF

# step NAME SECONDS "EXPECTS" CHECK -- CMD...: run CMD under timeout, then CHECK (a verify command, or "-" for the
# exit status alone); append `NAME pass|fail|skip WHY` to the summary
step() {
  local name="$1" secs="$2" expects="$3" check="$4"; shift 5
  local left=$(( BUDGET_S - ($(date +%s) - t_begin) ))
  if [ $((secs + 10)) -gt "$left" ]; then
    echo "$name skip its ${secs} s timeout would pass the 10-minute budget (${left} s left); expected: $expects" | tee -a "$summary"
    skipped=$((skipped + 1)); return 0
  fi
  local t0; t0=$(date +%s)
  timeout --kill-after=10 "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$? wall=$(( $(date +%s) - t0 ))
  if [ $rc -ne 0 ]; then
    echo "$name fail exit status $rc after ${wall} s (log $name.log: $(tail -1 "$OUT/$name.log" | cut -c1-200)); expected: $expects" | tee -a "$summary"
    failed=$((failed + 1)); return 0
  fi
  if [ "$check" = "-" ]; then
    echo "$name pass ${wall} s; $expects" | tee -a "$summary"; return 0
  fi
  local why; why=$(eval "$check" 2>&1 | tail -1)
  case "$why" in
    ok:*) echo "$name pass ${wall} s; $expects: ${why#ok: }" | tee -a "$summary" ;;
    *) echo "$name fail ${wall} s; $why; expected: $expects" | tee -a "$summary"; failed=$((failed + 1)) ;;
  esac
}

run_step() {  # run_step NAME "EXPECTS" RUN-OPTIONS...: tessera-lab run with --check and a JSON result
  local name="$1" expects="$2"; shift 2
  step "$name" "$RUNT" "$expects" "${verify[*]} run '$OUT/$name.json' $MODE" -- \
    "${cli[@]}" run --backend "$B" --steps 3 --check --json "$OUT/$name.json" --out "$OUT/$name-run" "$@"
}

ovl=(--schedule overlapped --pair-exec scheduled)
run_step run-1f1b "tessera-lab run --pp 1 --ep 1 1F1B: losses match the single-process reference" --pp 1 --ep 1 --schedule 1f1b
run_step run-ovl "overlapped pairs node by node at pp 1 ep 1: losses match the reference" --pp 1 --ep 1 "${ovl[@]}"
step trace "$RUNT" "torch profiler Chrome traces, one per rank" "${verify[*]} trace '$OUT/torch-trace'" -- \
  env TESSERA_LAB_TORCH_PROFILE="$OUT/torch-trace" "${cli[@]}" run --backend "$B" --pp 1 --ep 1 "${ovl[@]}" --steps 2
step dry-run 60 "measure --dry-run at Qwen3-Next's shapes, EP 8: host memory per process <= 8 GiB, nothing started" \
  "awk '/^host memory per process:/ { ok = (\$5 <= 8); print (ok ? \"ok: \" : \"FAIL: \") \$0; exit !ok }' '$OUT/dry-run.log'" -- \
  "${cli[@]}" measure --backend "$MB" --model qwen3-next-80b-a3b --ep 8 --size-factor 1.0 --dry-run
step pair-ep1 "$PAIRT" "one layer pair measured at EP 1, labelled no communication" \
  "${verify[*]} measure '$OUT/pair-ep1.json' no-comm '$OUT/pair-ep1.log'" -- \
  "${cli[@]}" measure --backend "$MB" --model "$MODEL" --ep 1 --pair "$KF,$KB" "${PAIR[@]}" --no-progress \
  --out "$OUT/pair-ep1-profile.json" --json "$OUT/pair-ep1.json"
ranks=0; [ "$size" -ge 2 ] && ranks=2
step optable 120 "op table with compute rows (and all-to-all, p2p rows with 2+ devices), schema checked" \
  "${verify[*]} optable '$OUT/op-table.json'" -- \
  "$py" -m tessera_lab.runner.measure.optable --backend "$MB" --sizes "$OPSIZES" --ranks "$ranks" --out "$OUT/op-table.json"

# every host synchronisation inside a step's actions raises (torch.cuda.set_sync_debug_mode "error" via
# TESSERA_LAB_SYNC_DEBUG; the setting does nothing on CPU): the capacity dispatch, node by node, is claimed free of them
sync_args=(--pp 1 --ep 1); [ "$size" -ge 2 ] && sync_args=(--pp 1 --ep 2)
step sync-debug "$RUNT" "${sync_args[*]} overlapped, scheduled, capacity dispatch with TESSERA_LAB_SYNC_DEBUG=error: no host sync in a step's actions (no effect on CPU)" - -- \
  env TESSERA_LAB_SYNC_DEBUG=error "${cli[@]}" run --backend "$B" "${sync_args[@]}" "${ovl[@]}" --ep-dispatch capacity --steps 2

if [ "$size" -ge 2 ]; then
  run_step run-ep2 "EP 2 all-to-alls on the communication stream, capacity dispatch: losses match the reference" \
    --pp 1 --ep 2 "${ovl[@]}" --ep-dispatch capacity
  run_step run-pp2-1f1b "pp 2 1F1B (p2p between devices): losses match the reference" --pp 2 --ep 1 --schedule 1f1b
  run_step run-pp2-ovl "pp 2 overlapped, scheduled: losses match the reference" --pp 2 --ep 1 "${ovl[@]}"
  step pair-ep2 "$PAIRT" "one layer pair measured at EP 2 with its all-to-all" \
    "${verify[*]} measure '$OUT/pair-ep2.json' comm '$OUT/pair-ep2.log'" -- \
    "${cli[@]}" measure --backend "$MB" --model "$MODEL" --ep 2 --pair "$KF,$KB" "${PAIR[@]}" --no-progress \
    --out "$OUT/pair-ep2-profile.json" --json "$OUT/pair-ep2.json"
fi

if [ "$size" -ge 8 ]; then
  run_step run-pp2-ep4 "pp 2 x ep 4 overlapped, scheduled: losses match the reference" --pp 2 --ep 4 "${ovl[@]}"
  step torchrun "$RUNT" "torchrun (8 processes) runs the job of run-pp2-ep4 with the same losses" \
    "${verify[*]} same-losses '$OUT/torchrun.json' '$OUT/run-pp2-ep4.json' $MODE" -- \
    "$py" -m torch.distributed.run --standalone --nproc-per-node 8 -m tessera_lab.runner --backend "$B" \
    --pp 2 --ep 4 "${ovl[@]}" --steps 3 --json "$OUT/torchrun.json"
fi

total=$(( $(date +%s) - t_begin ))
echo "done in ${total} s: $failed failed, $skipped skipped; everything is under $OUT"
if [ "$failed" -gt 0 ] || [ "$skipped" -gt 0 ]; then
  echo "gpu_check.sh: $failed step(s) failed, $skipped skipped (see $summary)" >&2; exit 1
fi
exit 0
