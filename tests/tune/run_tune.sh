#!/usr/bin/env bash
# tandem-tune end to end: two short train_lm trials under tandemrun; checks the table, the trial
# files and that the best config is valid for tandem-config.
#   run_tune.sh TANDEM_TUNE TANDEM_CONFIG TANDEMRUN TRAIN_LM
set -euo pipefail
tune="$1" config="$2" tandemrun="$3" train_lm="$4"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "run_tune: $*" >&2; exit 1; }
out="$("$tune" --grid ddp.bucket_cap_mb=1,25 --steps 20 --log-every 5 --out best.yaml \
        -- "$tandemrun" --standalone --nproc-per-node 2 "$train_lm" --set train.batch_size=4 2>&1)" ||
  { echo "$out"; fail "tandem-tune failed"; }
echo "$out"
grep -q "<- best" <<<"$out" || fail "no best trial marked"
[ "$(grep -c ' ok' <<<"$out")" -ge 2 ] || fail "expected two ok trials"
for i in 1 2; do
  [ -s "tune_trials/trial_$i.jsonl" ] || fail "missing tune_trials/trial_$i.jsonl"
  [ "$(wc -l < "tune_trials/trial_$i.jsonl")" -eq 4 ] || fail "trial $i: expected 4 progress records"
done
grep -q "^  bucket_cap_mb: " best.yaml || fail "best.yaml has no ddp.bucket_cap_mb"
"$config" check --config best.yaml || fail "tandem-config rejects best.yaml"
# A failing command is reported, not hidden.
if "$tune" --grid ddp.bucket_cap_mb=1 --steps 20 --log-every 5 -- false >bad.txt 2>&1; then
  fail "an all-failing grid must exit non-zero"
fi
grep -q "every trial failed" bad.txt || { cat bad.txt; fail "no 'every trial failed' message"; }
# --scale (issue 19): the same training at 1 and 2 ranks, throughput and scaling efficiency.
out="$("$tune" --scale 2 --steps 20 --log-every 5 --dir scale \
        -- "$tandemrun" --standalone --nproc-per-node 1 "$train_lm" --set train.batch_size=4 2>&1)" ||
  { echo "$out"; fail "tandem-tune --scale failed"; }
echo "$out"
grep -q "ranks *samples/s *per rank *speedup *efficiency" <<<"$out" || fail "no scaling table"
grep -Eq "^1 +[0-9.]+ +[0-9.]+ +1.00x +100.0%" <<<"$out" || fail "no 1-rank row at 100%"
grep -Eq "^2 +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9.]+%" <<<"$out" || fail "no 2-rank row"
[ -s scale/ranks_2.jsonl ] || fail "missing scale/ranks_2.jsonl"
echo "run_tune: ok"
