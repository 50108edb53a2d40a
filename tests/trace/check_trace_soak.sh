#!/usr/bin/env bash
# Soak check (ctest label `soak`): memory stays flat while a timeline is recorded. Runs the main
# job as scripts/main does (tandemrun --trace-dir, 2 workers of train_lm with
# examples/configs/train_lm.yaml, 300 steps) and fails when a worker's peak RSS after the last
# step is more than 5% above its peak after step 50. Rank 0's peaks come from its progress
# records (metrics.file, the "peak" of the progress line); every worker's VmHWM is also sampled
# from /proc. Before the recorder kept its events out of malloc's heap, rank 0 grew 15-135%.
#   check_trace_soak.sh TANDEMRUN TRAIN_LM [STEPS]
set -euo pipefail
tandemrun="$(readlink -f "$1")" train_lm="$(readlink -f "$2")" steps="${3:-300}"
configs="$(cd "$(dirname "$0")/../../examples/configs" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "check_trace_soak: $*" >&2; exit 1; }
hwm_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status" 2>/dev/null || true; }

"$tandemrun" --standalone --nproc-per-node 2 --trace-dir trace "$train_lm" \
  --config "$configs/train_lm.yaml" --set train.steps="$steps" --set metrics.log_every=50 \
  --set metrics.file=m.jsonl >log.txt 2>&1 &
job=$!
declare -A at50 last  # worker pid -> VmHWM (KiB) after step 50 / at the last sample
while kill -0 "$job" 2>/dev/null; do
  for pid in $(pgrep -P "$job" -x train_lm || true); do
    kib="$(hwm_kib "$pid")"
    [ -n "$kib" ] || continue
    # Only while training: the torch 2.11 wheel's exit-time destructors, which run on the one
    # thread left, raise VmHWM by about 100 MB after the last step (teardown, not growth).
    [ "$(ls "/proc/$pid/task" 2>/dev/null | wc -l)" -ge 2 ] || continue
    last[$pid]="$kib"
    if [ -z "${at50[$pid]:-}" ] && grep -q '"step":50,' m.jsonl 2>/dev/null; then at50[$pid]="$kib"; fi
  done
  sleep 0.2
done
status=0
wait "$job" || status=$?
cat log.txt
[ "$status" -eq 0 ] || fail "the traced job failed (exit $status)"
[ -s trace/timeline.json ] || fail "no timeline trace/timeline.json: tracing was not on"

peak() { grep "\"step\":$1," m.jsonl | grep -o '"peak_bytes":[0-9]*' | cut -d: -f2; }
p50="$(peak 50)" pend="$(peak "$steps")"
[ -n "$p50" ] && [ -n "$pend" ] || fail "no progress records for steps 50 and $steps in metrics.file"
ok=1
check() {  # what, peak after step 50, peak at the end (any unit)
  local pct
  pct="$(awk -v a="$2" -v b="$3" 'BEGIN { printf "%+.1f", (b / a - 1) * 100 }')"
  echo "check_trace_soak: $1: peak after step 50 $2, after step $steps $3 ($pct%)"
  awk -v a="$2" -v b="$3" 'BEGIN { exit !(b <= a * 1.05) }' || ok=0
}
check "rank 0 (progress record, bytes)" "$p50" "$pend"
[ "${#at50[@]}" -eq 2 ] || fail "sampled ${#at50[@]} workers after step 50, expected 2"
for pid in "${!at50[@]}"; do check "worker pid $pid (VmHWM, KiB)" "${at50[$pid]}" "${last[$pid]}"; done
[ "$ok" -eq 1 ] || fail "peak memory grew more than 5% between step 50 and step $steps with tracing on"
echo "check_trace_soak: ok"
