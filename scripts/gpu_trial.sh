#!/usr/bin/env bash
# A kernel trial's device call in one command: the builds carried in .snap/ab (work and the trial,
# scripts/gpu_pack.sh BUILD NAME, then --bundle) timed in turns, their outputs compared byte for byte,
# the outside oracle on the trial's build, and the peers on its figures.  On the device machine
# (carrying .deps/debs and .snap/ab):
#   FA_TRIAL=NAME bash scripts/gpu_trial.sh SCRIPT [ARGS...]
# e.g. FA_TRIAL=mb bash scripts/gpu_trial.sh scripts/bench_attention.lua --dtypes bf16 --dims 64 --rules mask_bool
# Steps, each logged under /tmp/gpu_trial and tarred into $OUT/trial_logs.tgz, a line each in $OUT/trial.txt:
#   1. FA_CARRIED=1 scripts/gpu_ab.sh run ROUNDS SCRIPT ARGS (work against NAME only; $OUT/ab.json);
#   2. scripts/gpu_ab.sh digest (NAME's outputs against work's; a change meant to leave every figure as it
#      was shows 0 files differing);
#   3. scripts/oracle_attention.py on NAME's library, ORACLE_CASES cases for each seed of ORACLE_SEEDS
#      ($OUT/oracle_NAME_SEED.json);
#   4. with PEERS=attention|backward|decode|variants, scripts/peers_PEERS.py on NAME's last round
#      ($OUT/peers_NAME.json);
#   5. with SUITES (e.g. "test_kernels test_attention"), those LuaUnit suites of tests/lua on NAME's build,
#      on cuda.
# ROUNDS (default 2), ORACLE_CASES (default 600), ORACLE_SEEDS (default 1), STEPS (default "ab digest oracle
# peers suites") choose.  FA_AB_ENV_NAME applies as in gpu_ab.sh.  Exit status: the first step that failed (1 to 5),
# else 0.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] && [ -n "${FA_TRIAL:-}" ] || { echo "usage: FA_TRIAL=NAME bash scripts/gpu_trial.sh SCRIPT [ARGS...]" >&2; exit 2; }
name=$FA_TRIAL
export OUT=${OUT:-$PWD/out}
logs=/tmp/gpu_trial
rm -rf "$logs" && mkdir -p "$logs" "$OUT"
summary=$OUT/trial.txt
: >"$summary"
rc=0
note() { echo "$*" | tee -a "$summary"; }
failed() { [ $rc != 0 ] || rc=$1; }
steps=" ${STEPS:-ab digest oracle peers suites} "
t0=$SECONDS

if [[ $steps == *" ab "* ]]; then
  FA_CARRIED=1 FA_AB_NAMES=$name bash scripts/gpu_ab.sh run "${ROUNDS:-2}" "$@" >"$logs/ab.log" 2>&1
  r=$?
  [ $r = 0 ] || failed 1
  note "ab: rc $r after $((SECONDS - t0)) s"
  sed -n '/^shape/,$p' "$logs/ab.log" | tee -a "$summary"
fi
# the carried builds (gpu_ab.sh unpacked them into bg-ab) and Lua's paths, here too
FA_NO_BG=1 . scripts/gpu_carried.sh >"$logs/carried.log" 2>&1
[ -x "bg-ab/$name/flashattn-lua" ] || { rm -rf bg-ab && carried_bundle .snap/ab/bundle.tar.xz bg-ab >>"$logs/carried.log" 2>&1; }
[ -x "bg-ab/$name/flashattn-lua" ] || { note "no build named $name in .snap/ab"; exit 2; }
commit=$(cat ".snap/ab/$name.commit" 2>/dev/null || echo unknown)
if [[ $steps == *" digest "* ]]; then
  FA_CARRIED=1 FA_AB_NAMES=$name bash scripts/gpu_ab.sh digest >"$logs/digest.log" 2>&1 || failed 2
  cp "$OUT"/ab/digest_*.sum "$logs/" 2>/dev/null
  note "$(grep '^digest' "$logs/digest.log" || tail -3 "$logs/digest.log") ($((SECONDS - t0)) s)"
fi
if [[ $steps == *" oracle "* ]]; then
  for seed in ${ORACLE_SEEDS:-1}; do
    python3 scripts/oracle_attention.py --lib "bg-ab/$name/libflashattn.so" --cases "${ORACLE_CASES:-600}" \
      --seed "$seed" --json "$OUT/oracle_${name}_$seed.json" --commit "$commit" >"$logs/oracle_$seed.log" 2>&1 || failed 3
    note "oracle seed $seed: $(grep -E '^oracle:' "$logs/oracle_$seed.log" | tail -1) ($((SECONDS - t0)) s)"
    grep -E '^(FAIL|NONDET|Traceback)' "$logs/oracle_$seed.log" | head -10 | tee -a "$summary"
  done
fi
if [[ $steps == *" peers "* && -n ${PEERS:-} ]]; then
  last=$OUT/ab/${name}_${ROUNDS:-2}.json
  if [ -f "$last" ]; then
    python3 "scripts/peers_$PEERS.py" --engine "$last" --json "$OUT/peers_$name.json" --commit "$commit" \
      >"$logs/peers.log" 2>&1
    r=$?
    [ $r = 0 ] || failed 4
    note "peers_$PEERS on $(basename "$last"): rc $r ($((SECONDS - t0)) s)"
    tail -40 "$logs/peers.log" >>"$summary"
  else
    note "peers: no $last to set against them"
  fi
fi
if [[ $steps == *" suites "* ]]; then
  for suite in ${SUITES:-}; do
    FLASHATTN_DEVICE=${FA_AB_DEVICE:-cuda} timeout 600 "bg-ab/$name/flashattn-lua" "tests/lua/$suite.lua" -o text >"$logs/$suite.log" 2>&1
    r=$?
    [ $r = 0 ] || failed 5
    note "$suite on $name: $(grep -E '^(Ran|OK|FAILED)' "$logs/$suite.log" | tr '\n' ' ')rc $r ($((SECONDS - t0)) s)"
  done
fi
tar -czf "$OUT/trial_logs.tgz" -C /tmp gpu_trial
note "gpu_trial: $((SECONDS - t0)) s, exit $rc"
exit $rc
