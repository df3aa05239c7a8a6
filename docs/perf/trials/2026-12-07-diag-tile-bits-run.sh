#!/usr/bin/env bash
# session 95: the causal diagonal tile's mask as bits (bits) against main's kernels (work)
# (kept from session 95: copy to .snap/fx/ and run there, with the bundle of builds work and bits in .snap/ab;
# docs/perf/README.md, session 95, says how to make them)
set -uo pipefail
export OUT=${OUT:-$PWD/out}
W=$PWD/w95; mkdir -p $W/logs
FA_NO_BG=1 . scripts/gpu_carried.sh
rm -rf bg-ab; carried_bundle .snap/ab/bundle.tar.xz bg-ab || exit 1
finish() { (cd $W && tar -czf $OUT/logs.tgz logs); cp $W/*.json $OUT/ 2>/dev/null; ls -la $OUT; }
trap finish EXIT
echo "== oracle forward on bits"; t0=$SECONDS
timeout 120 python3 scripts/oracle_attention.py --lib bg-ab/bits/libflashattn.so --filter all --cases 600 --seed 9501 \
  --commit "$(cat .snap/ab/bits.commit)" --json $W/oracle-bits-9501.json > $W/logs/oracle_all.log 2>&1; echo "rc $? $((SECONDS-t0)) s"
tail -4 $W/logs/oracle_all.log
echo "== A/B"; t0=$SECONDS
FA_AB_NAMES=bits FA_CARRIED=1 OUT=$W timeout 300 bash scripts/gpu_ab.sh run 3 scripts/bench_attention.lua --dtypes bf16 \
  --dims 64,128,256 --ls 1024,2048,4096 --algos flash > $W/logs/ab.log 2>&1; echo "rc $? $((SECONDS-t0)) s"
cp $W/ab/ab.json $W/ab-bits.json 2>/dev/null
grep -vE "^\s*$" $W/logs/ab.log | tail -30
echo "== oracle decode, paged on bits"; t0=$SECONDS
timeout 90 python3 scripts/oracle_attention.py --lib bg-ab/bits/libflashattn.so --filter decode --cases 300 --seed 9502 \
  --commit "$(cat .snap/ab/bits.commit)" --json $W/oracle-bits-decode-9502.json > $W/logs/oracle_decode.log 2>&1; echo "rc $?"
tail -2 $W/logs/oracle_decode.log
timeout 90 python3 scripts/oracle_attention.py --lib bg-ab/bits/libflashattn.so --filter paged --cases 200 --seed 9503 \
  --commit "$(cat .snap/ab/bits.commit)" --json $W/oracle-bits-paged-9503.json > $W/logs/oracle_paged.log 2>&1; echo "rc $? $((SECONDS-t0)) s"
tail -2 $W/logs/oracle_paged.log
echo "== gpu_check, test_fp8, test_variants on bits"; t0=$SECONDS
export LD_LIBRARY_PATH=$PWD/bg-ab/bits:$LD_LIBRARY_PATH
timeout 150 bg-ab/bits/flashattn-lua scripts/gpu_check.lua > $W/logs/gpu_check.log 2>&1; echo "gpu_check rc $?"
grep -E "FAIL|gpu_check:" $W/logs/gpu_check.log | tail -5
for t in test_fp8 test_variants; do
  timeout 90 bg-ab/bits/flashattn-lua tests/lua/$t.lua > $W/logs/$t.log 2>&1; echo "$t rc $?"; tail -2 $W/logs/$t.log
done
echo "$((SECONDS-t0)) s"
for n in work bits; do cuobjdump -res-usage bg-ab/$n/libflashattn.so > $W/logs/res_$n.txt 2>&1; done
