-- The decode kernel's chunk count (opts.splits) against its automatic choice, on the Lq = 1 shapes of
-- bench_decode.lua where the call read K and V slower than cuDNN (issue 24): bf16, D = 128, Hq = 32.  Per
-- shape, the automatic call and each count of --splits, timed in turns (--rounds rounds, fa.bench's median of
-- --rep repetitions behind a cache flush, as bench_decode.lua times), K + V GB/s, and the best count.
-- A shape may name its query rows a head (B:Hkv:Lk:Lq; 1 by default): issue 24 wants Lq = 4 and 16 within
-- 1.1 x the time of Lq = 1 at B = 8.
-- Usage (GPU machine): flashattn-lua scripts/probe_decode_splits.lua [--splits 8,16,33,66,132] [--rounds 3]
--   [--rep 30] [--shapes B:Hkv:Lk[:Lq],...] [--json out.json]
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
local NAME = "probe_decode_splits.lua"
local function parse(argv)
  local p = require "argparse"(NAME, "The decode kernel's chunk count against its automatic choice.")
  p:option("--splits", "chunk counts to time beside the automatic one", "8,16,24,33,48,66,99,132")
   :convert(sweep.list_arg("--splits", true))
  p:option("--shapes", "B:Hkv:Lk[:Lq],... (Hq = 32, or Hkv when larger; Lq 1 by default)",
    "1:8:131072,1:32:32768,1:32:131072,8:8:32768,8:8:131072,64:8:4096,8:32:4096,64:32:4096")
   :convert(sweep.list_arg("--shapes"))
  p:option("--rounds", "rounds of the variants in turns", "3"):convert(math.tointeger)
  p:option("--rep", "fa.bench repetitions a round", "30"):convert(math.tointeger)
  p:option("--json", "write the results to this JSON file")
  return sweep.parse_args(p, argv, NAME)
end
local args = sweep.main(NAME, parse, { ... })
local cuda = fa.device_info().backend == "cuda"
local D, Hq, dt = cuda and 128 or 32, cuda and 32 or 4, cuda and "bf16" or "f32"
local counts = cuda and args.splits or { 2, 4 }
local results = {}
for _, s in ipairs(args.shapes) do
  local B, Hkv, Lk, Lq = s:match("^(%d+):(%d+):(%d+):?(%d*)$")
  assert(B, "--shapes: expected B:Hkv:Lk[:Lq],..., got '" .. s .. "'")
  B, Hkv, Lk, Lq = tonumber(B), tonumber(Hkv), cuda and tonumber(Lk) or 512, tonumber(Lq) or 1
  local hq = math.max(Hq, Hkv)
  local q = fa.randn({ B, hq, Lq, D }, { dtype = dt, seed = 1 })
  local k = fa.randn({ B, Hkv, Lk, D }, { dtype = dt, seed = 2 })
  local v = fa.randn({ B, Hkv, Lk, D }, { dtype = dt, seed = 3 })
  local o = fa.zeros({ B, hq, Lq, D }, { dtype = dt })
  local bytes = 2.0 * B * Hkv * Lk * D * (dt == "f32" and 4 or 2)
  local variants = { { name = "auto", opts = { out = o } } }
  for _, c in ipairs(counts) do variants[#variants + 1] = { name = tostring(c), opts = { out = o, splits = c } } end
  local ref = fa.attention(q, k, v)
  local ms = {}
  for _ = 1, args.rounds do
    for _, var in ipairs(variants) do
      local got = fa.attention(q, k, v, var.opts)
      assert(fa.max_abs_diff(got, ref) < 0.05, var.name .. ": result off")
      local t = fa.bench(function() fa.attention(q, k, v, var.opts) end,
        { warmup = 2, rep = args.rep, flush_cache = true }).median_ms
      ms[var.name] = math.min(ms[var.name] or math.huge, t)
    end
  end
  local row = { B = B, Hq = hq, Hkv = Hkv, Lq = Lq, Lk = Lk, kv_mb = bytes / 1e6, ms = ms, gbs = {} }
  local best = "auto"
  for _, var in ipairs(variants) do
    row.gbs[var.name] = bytes / (ms[var.name] * 1e-3) / 1e9
    if ms[var.name] < ms[best] then best = var.name end
  end
  row.best = best
  local line = ("B %2d Hkv %2d Lq %2d Lk %6d  auto %7.1f µs %5.0f GB/s |"):format(B, Hkv, Lq, Lk, ms.auto * 1e3,
    row.gbs.auto)
  for _, c in ipairs(counts) do line = line .. (" %d: %.1f"):format(c, ms[tostring(c)] * 1e3) end
  print(line .. ("  best %s (%.3f x auto's time)"):format(best, ms[best] / ms.auto))
  results[#results + 1] = row
end
if args.json then sweep.write_json_object({ meta = sweep.run_meta(1), device = fa.device_info().name, dtype = dt, D = D,
  rounds = args.rounds, rep = args.rep, timing = "fa.bench median behind a cache flush, the best of the rounds, "
    .. "variants in turns", results = results }, args.json) end
