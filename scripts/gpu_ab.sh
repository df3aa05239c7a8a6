#!/usr/bin/env bash
# A/B probes on the GPU: the working tree against other commits, built side
# by side and measured in turns in one device call, so that a change is
# judged against its base on the same card at the same time.
#   here:  bash scripts/gpu_ab.sh prepare REV...   (each REV's tree into .snap/REV)
#   there: bash scripts/gpu_ab.sh build   (carry .deps and .snap)
#          bash scripts/gpu_ab.sh run ROUNDS SCRIPT [ARGS...]
#          bash scripts/gpu_ab.sh digest
# `build` builds the working tree ("work", into build-gpu as gpu_run.sh
# does) and every .snap/REV (build-ab/REV) for sm_90a, side by side; `run`
# builds what is not built yet, then runs `flashattn-lua SCRIPT ARGS --json ...` ROUNDS times on each in
# turn (work, REV..., work, REV...), and writes $OUT/ab.json: for every row
# of the script's JSON results (keyed by the shape fields the row has: bench_attention's dtype, D, L,
# causal, algo, rule; bench_backward's, its deterministic_ms kept beside ms, and its --extras rows; bench_decode's B, Hkv, Lq,
# Lk and its paged rows' page_size; bench_variants' case, its builtin_ms and block_mask_ms kept beside ms)
# the median ms of each build in each round, and prints the ratios.
# FA_AB_ENV_NAME: build NAME's runs under that environment (e.g. FA_AB_ENV_one="FA_X=1"; NAME's characters
# other than letters, digits and _ as _), so that one build packed twice under two names measures a
# switch of its own in turns.
# FA_AB_NAMES: the carried builds to run against work (space-separated names; default every one).
# Without a build there (FA_CARRIED=1, carrying .deps/debs and .snap/ab; with more than two builds,
# `bash scripts/gpu_pack.sh --bundle` makes them one file that fits the tool's 64 MiB): here
#   cmake -S . -B build90 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real
#   cmake --build build90 --target flashattn_shared flashattn_lua_shared; bash scripts/gpu_pack.sh build90 work
# and the same from a git worktree of each base (bash scripts/gpu_pack.sh WORKTREE/build90 NAME);
# there: FA_CARRIED=1 bash scripts/gpu_ab.sh run ROUNDS SCRIPT [ARGS...]
# `digest` runs scripts/probe_output_digest.lua with every build (outputs and lse of a fixed list of
# calls, as .npy files in a scratch folder) and says, for each build beside work, how many of those
# files differ from work's: a change meant to leave every figure as it was shows 0.  The checksums go
# to $OUT/ab/digest_NAME.sum; exit status 3 when a build's differ.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = prepare ]; then
  shift
  for rev in "$@"; do
    rm -rf ".snap/$rev" && mkdir -p ".snap/$rev" && git archive "$rev" | tar -x -C ".snap/$rev" || exit 1
  done
  exit 0
fi
mode=${1:-}
[ "$mode" = build ] || [ "$mode" = digest ] || { [ "$mode" = run ] && [ $# -ge 3 ]; } ||
  { echo "usage: gpu_ab.sh prepare REV... | build | run ROUNDS SCRIPT [ARGS...] | digest"; exit 2; }
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/ab"
if [[ ${FA_CARRIED:-0} == 1 ]]; then
  # builds made here and packed by `scripts/gpu_pack.sh BUILD NAME` (.snap/ab/NAME.tar.xz; one is
  # named work, the others are set against it): nothing is compiled there but the interpreter
  # (or all of them in one .snap/ab/bundle.tar.xz: scripts/gpu_pack.sh --bundle)
  FA_NO_BG=1 . scripts/gpu_carried.sh
  rm -rf bg-ab
  if [ -f .snap/ab/bundle.tar.xz ]; then
    for t in .snap/ab/*.tar.xz; do
      [ "$t" = .snap/ab/bundle.tar.xz ] || { echo "gpu_ab: $t beside the bundle: scripts/gpu_pack.sh --bundle takes it in"; exit 2; }
    done
    carried_bundle .snap/ab/bundle.tar.xz bg-ab || exit 1
  else
    for t in .snap/ab/*.tar.xz; do
      [ -f "$t" ] || continue
      carried_unpack "$t" "bg-ab/$(basename "$t" .tar.xz)" || exit 1
    done
  fi
  [ -d bg-ab/work ] || { echo "gpu_ab: FA_CARRIED=1 wants a build named work (scripts/gpu_pack.sh BUILD work)"; exit 2; }
  names=(work) builds=(bg-ab/work)
  for d in bg-ab/*/; do
    n=$(basename "$d")
    # FA_AB_NAMES (names, space-separated): only those builds against work (a bundle may hold others, such
    # as a trace build, for the same call's other steps)
    [[ -z ${FA_AB_NAMES:-} || " $FA_AB_NAMES " == *" $n "* ]] || continue
    [ "$n" = work ] || names+=("$n") builds+=("bg-ab/$n")
  done
  for i in "${!names[@]}"; do
    echo "${names[$i]}: $(cat ".snap/ab/${names[$i]}.commit" 2>/dev/null)" | tee -a "$OUT/ab/ab.log"
  done
else
  . scripts/gpu_env.sh
  names=(work) dirs=(.) builds=(build-gpu)
  for d in .snap/*/; do
    [ -f "$d/CMakeLists.txt" ] && names+=("$(basename "$d")") dirs+=("$d") builds+=("build-ab/$(basename "$d")")
  done
  njobs=$(($(nproc) / ${#names[@]} + 1)) pids=()
  for i in "${!names[@]}"; do
    gpu_build "${builds[$i]}" "${dirs[$i]}" $njobs >"$OUT/ab/build_${names[$i]}.log" 2>&1 &
    pids+=($!)
  done
  fail=0
  for pid in "${pids[@]}"; do wait "$pid" || fail=1; done
  [ $fail = 0 ] || { tail -30 "$OUT"/ab/build_*.log; exit 1; }
fi
[ "$mode" = build ] && exit 0
if [ "$mode" = digest ]; then
  dev=${FA_AB_DEVICE:-cuda} scratch=$(mktemp -d) differ=0
  for i in "${!names[@]}"; do
    n=${names[$i]}
    mkdir -p "$scratch/$n"
    FLASHATTN_DEVICE=$dev "${builds[$i]}/flashattn-lua" scripts/probe_output_digest.lua "$scratch/$n" --device "$dev" >"$OUT/ab/digest_$n.log" 2>&1 ||
      { tail -5 "$OUT/ab/digest_$n.log"; rm -rf "$scratch"; exit 1; }
    (cd "$scratch/$n" && sha256sum -- *.npy) | sort -k2 >"$OUT/ab/digest_$n.sum"
    if [ "$n" != work ]; then
      d=$(diff "$OUT/ab/digest_work.sum" "$OUT/ab/digest_$n.sum" | grep -c '^>')
      echo "digest $n: $d of $(wc -l <"$OUT/ab/digest_work.sum") files differ from work's" | tee -a "$OUT/ab/ab.log"
      diff "$OUT/ab/digest_work.sum" "$OUT/ab/digest_$n.sum" | grep '^>' | head -5
      [ "$d" = 0 ] || differ=3
    fi
  done
  rm -rf "$scratch"
  exit $differ
fi
rounds=$2 script=$3
shift 3
export FLASHATTN_DEVICE=${FA_AB_DEVICE:-cuda} # FA_AB_DEVICE=cpu: a dry run of the machinery here
for r in $(seq 1 "$rounds"); do
  for i in "${!names[@]}"; do
    n=${names[$i]}
    echo "== round $r: $n" | tee -a "$OUT/ab/ab.log"
    ev="FA_AB_ENV_${n//[^A-Za-z0-9_]/_}" # (a name's other characters as _)
    env ${!ev:-} "${builds[$i]}/flashattn-lua" "$script" "$@" --json "$OUT/ab/${n}_$r.json" 2>&1 | tee -a "$OUT/ab/ab.log" || exit 1
  done
done
python3 - "$OUT" "$rounds" "${names[@]}" <<'PY'
import json, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows, order = {}, []
# a row is keyed by the shape fields it has: bench_attention's (dtype, D, L, causal, algo, rule),
# bench_backward's (no algo; its --extras rows a list of their own, with rule), bench_decode's (B, Hkv, Lq, Lk;
# its paged rows a list of their own, with page_size), bench_variants' (case, L, B; its built-in and block-mask
# calls kept beside ms)
FIELDS = ("dtype", "D", "B", "Hq", "Hkv", "L", "Lq", "Lk", "page_size", "causal", "algo", "rule", "case")
for n in names:
    for r in range(1, rounds + 1):
        d = json.load(open(f"{out}/ab/{n}_{r}.json"))
        for part in ("results", "paged", "extras"):
            for x in d.get(part) or []:
                if x.get("status", "ok") != "ok" or "ms" not in x:
                    continue
                row = {f: x[f] for f in FIELDS if f in x}
                row.setdefault("algo", "-")  # bench_backward's rows have none
                row.setdefault("rule", "plain")
                if part != "results":
                    row["part"] = part
                key = tuple(sorted((k, str(v)) for k, v in row.items()))
                if key not in rows:
                    rows[key] = row
                    order.append(key)
                rows[key].setdefault(n + "_ms", []).append(round(x["ms"], 5))
                for extra in ("deterministic_ms", "builtin_ms", "block_mask_ms"):  # bench_backward's
                    if x.get(extra) is not None:  # deterministic call; bench_variants' built-in and block-mask calls
                        rows[key].setdefault(f"{n}_{extra}", []).append(round(x[extra], 5))
                rows[key].setdefault(n + "_rel_err", []).append(x.get("rel_err"))
res = {"device": d.get("device"), "builds": names, "rounds": rounds, "rows": [rows[k] for k in order]}
json.dump(res, open(f"{out}/ab.json", "w"), indent=1)
print("shape" + " " * 57 + " ".join(f"{n:>10}" for n in names) + "   ratios to work")
for k in order:
    x = rows[k]
    label = " ".join(f"{f}={x[f]}" for f in FIELDS + ("part",) if f in x and x[f] not in ("-", "plain"))
    best = {n: min(x.get(n + "_ms", [float("nan")])) for n in names}
    print(f"{label:62}" + " ".join(f"{best[n]:10.4f}" for n in names)
          + "   " + " ".join(f"{best[n] / best['work']:.3f}" for n in names[1:]))
PY
