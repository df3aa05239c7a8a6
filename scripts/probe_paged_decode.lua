-- Paged decode against the contiguous call (issue 24: through the cache,
-- pages of 16 and of 256, >= 0.95 x the contiguous call).  bf16, D = 128,
-- Hq = 32, Hkv = 8, Lq = 1; per shape the same K and V appended to a cache of
-- each page size, each paged output checked equal to the contiguous call's,
-- then the three calls timed in turns (fa.bench, L2 flushed, median of 30)
-- over three rounds: ms and the paged / contiguous time ratios.
-- --ncu: no timing, three calls of each at B = 8, Lk = 32k, for
--   ncu --kernel-name regex:attn_decode_kernel --launch-skip 3 --launch-count 6 ...
-- Usage (GPU machine): build-gpu/flashattn-lua scripts/probe_paged_decode.lua [--ncu] [--json FILE]
-- (--small: f32 on the CPU at a small size, a smoke test)
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
local NAME = "probe_paged_decode.lua"
local function parse(argv)
  local p = require "argparse"(NAME, "Paged decode against the contiguous call.")
  p:flag("--ncu", "no timing: three calls of each at B = 8, Lk = 32k, for ncu")
  p:flag("--small", "f32 on the CPU at a small size, a smoke test")
  p:option("--json", "write the results to this JSON file")
  return sweep.parse_args(p, argv, NAME)
end
local opts = sweep.main(NAME, parse, { ... })
local ncu, small, json_path = opts.ncu, opts.small, opts.json
local dev, dt = small and "cpu" or "cuda", small and "f32" or "bf16"
local Hq, Hkv, D = small and 4 or 32, small and 2 or 8, small and 32 or 128
local shapes = small and { { 2, 100 }, { 1, 300 } } or ncu and { { 8, 32768 } }
               or { { 8, 4096 }, { 8, 32768 }, { 8, 131072 }, { 64, 4096 }, { 64, 32768 } }
local out = { meta = sweep.run_meta("fixed: q 1, k 2, v 3", { gpu = fa.device_info(dev).name or dev, dtype = dt,
  Hq = Hq, Hkv = Hkv, D = D, pages = { 16, 256 },
  timing = "fa.bench, L2 flushed, warmup 3, 30 repetitions, median; contiguous, pages of 16 and of 256 in turns" }),
  results = {} }
for _, shape in ipairs(shapes) do
  local B, L = shape[1], shape[2]
  local function randn(s, h, l) return fa.randn({ B, h, l, D }, { dtype = dt, device = dev, seed = s }) end
  local q, k, v = randn(1, Hq, 1), randn(2, Hkv, L), randn(3, Hkv, L)
  local ref = fa.attention(q, k, v)
  local calls, caches = { contiguous = function() fa.attention(q, k, v):free() end }, {}
  local row = { B = B, Lk = L, rounds = {} }
  for _, ps in ipairs({ 16, 256 }) do
    local c = fa.kv_cache { batch = B, heads = Hkv, dim = D, capacity = L, page_size = ps, dtype = dt, device = dev }
    c:append(k, v)
    local o = c:attend(q)
    local diff = fa.max_abs_diff(o, ref)
    o:free()
    row["p" .. ps .. "_max_abs_diff"] = diff
    if diff > (small and 1e-5 or 0) then
      error(("%s: B %d Lk %d pages of %d: the paged output differs from the contiguous call's by %g"):format(NAME, B, L,
        ps, diff), 0)
    end
    caches[#caches + 1] = c
    calls["p" .. ps] = function() c:attend(q):free() end
  end
  if ncu then
    for _ = 1, 3 do for _, n in ipairs({ "contiguous", "p16", "p256" }) do calls[n]() end end
    fa.sync()
  else
    for r = 1, small and 1 or 3 do
      local t = {}
      for _, n in ipairs({ "contiguous", "p16", "p256" }) do
        t[n .. "_ms"] = fa.bench(calls[n], { warmup = small and 1 or 3, rep = small and 3 or 30,
                                               flush_cache = not small }).median_ms
      end
      t.p16_ratio, t.p256_ratio = t.p16_ms / t.contiguous_ms, t.p256_ms / t.contiguous_ms
      row.rounds[r] = t
      print(("B %3d Lk %6d round %d: contiguous %.4f ms, pages of 16 %.4f (%.3f x), of 256 %.4f (%.3f x)"):format(B, L, r,
        t.contiguous_ms, t.p16_ms, t.p16_ratio, t.p256_ms, t.p256_ratio))
    end
  end
  out.results[#out.results + 1] = row
  for _, c in ipairs(caches) do c:free() end
  q:free(); k:free(); v:free(); ref:free()
  collectgarbage()
end
if json_path then
  sweep.write_json_object(out, json_path)
  print(NAME .. ": wrote " .. json_path)
end
