-- kv_cache:attend for the calls the decode kernel does not take: a chunk of prefill (Lq = 256, causal) on top of
-- the cached positions, with equal and with ragged lengths; decoding at D = 256 (Gemma's head dim) and in f32.
-- The cache gathers its pages into contiguous K and V and runs fa.attention over them.  Per case: the device time
-- of attend (fa.bench, caches flushed), of fa.attention on the same positions held contiguous (the lengths as
-- kv_lens where they differ), their ratio, and attend's largest error against the f64 reference on sequence 1's
-- first query head.  Pages of 16.
-- Usage: flashattn-lua scripts/probe_kv_gather.lua [--json out.json]
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
local NAME = "probe_kv_gather.lua"
local opts = sweep.main(NAME, sweep.json_only(NAME, "kv_cache:attend through the gather."), {...})
local cuda = fa.device_info().backend == "cuda"
local S = cuda and 1 or 1 / 16 -- the cpu runs the same cases at a sixteenth of the lengths
local cases = {
  -- name, dtype, B, Hq, Hkv, D, Lq, cached lengths (nil: all Lk), Lk, opts
  {"prefill chunk, equal", "bf16", 8, 32, 8, 128, 256, nil, 4096, {causal = true}},
  {"prefill chunk, ragged", "bf16", 8, 32, 8, 128, 256, "ragged", 4096, {causal = true}},
  {"prefill chunk, ragged, not causal", "bf16", 8, 32, 8, 128, 256, "ragged", 4096, {}},
  {"decode D 256", "bf16", 8, 16, 8, 256, 1, nil, 4096, {causal = true}},
  {"decode D 256, 32k", "bf16", 4, 16, 8, 256, 1, nil, 32768, {causal = true}},
  {"decode D 256, ragged", "bf16", 8, 16, 8, 256, 1, "ragged", 8192, {causal = true}},
  {"decode f32", "f32", 4, 32, 8, 128, 1, nil, 8192, {causal = true}},
}
local results = {}
for _, c in ipairs(cases) do
  local name, dt, B, Hq, Hkv, D, Lq, ragged, Lk, o = table.unpack(c)
  Lk = math.max(16, math.floor(Lk * S))
  Lq = math.max(1, math.floor(Lq * S + 0.5))
  local lens = {}
  for b = 1, B do lens[b] = ragged and Lk - (b - 1) * (Lk // (2 * B)) or Lk end
  local k = fa.randn({B, Hkv, Lk, D}, {dtype = dt, seed = 2})
  local v = fa.randn({B, Hkv, Lk, D}, {dtype = dt, seed = 3})
  local q = fa.randn({B, Hq, Lq, D}, {dtype = dt, seed = 1})
  local cache = fa.kv_cache{batch = B, heads = Hkv, dim = D, capacity = Lk, page_size = 16, dtype = dt}
  cache:append(k, v, lens)
  local po = cache:attend(q, o)
  local L1 = lens[1]
  local ref = fa.attention_reference(q:narrow(1, 1, 1):narrow(2, 1, 1), k:narrow(1, 1, 1):narrow(2, 1, 1):narrow(3, 1, L1),
    v:narrow(1, 1, 1):narrow(2, 1, 1):narrow(3, 1, L1), o)
  local rel = fa.rel_error(po:narrow(1, 1, 1):narrow(2, 1, 1):cpu(), ref)
  po:free()
  local co = {}
  for key, val in pairs(o) do co[key] = val end
  if ragged then co.kv_lens = lens end
  local rep = cuda and 20 or 2
  local paged_ms = fa.bench(function() cache:attend(q, o) end, {warmup = 2, rep = rep, flush_cache = cuda}).median_ms
  local dense_ms = fa.bench(function() fa.attention(q, k, v, co) end, {warmup = 2, rep = rep, flush_cache = cuda}).median_ms
  print(string.format("%-36s %-4s B%d Hq%d Hkv%d D%d Lq%d Lk%d  attend %9.4f ms  contiguous %8.4f ms  x %6.2f  rel %.2e",
    name, dt, B, Hq, Hkv, D, Lq, Lk, paged_ms, dense_ms, paged_ms / dense_ms, rel))
  results[#results + 1] = {case = name, dtype = dt, B = B, Hq = Hq, Hkv = Hkv, D = D, Lq = Lq, Lk = Lk, lens = lens,
    causal = o.causal or false, attend_ms = paged_ms, contiguous_ms = dense_ms, ratio = paged_ms / dense_ms, rel_err = rel}
  cache:free(); k:free(); v:free(); q:free()
  collectgarbage()
end
if opts.json then
  sweep.write_json_object({meta = sweep.run_meta(1), device = fa.device_info().name, results = results}, opts.json)
end
