-- Decoding with many query heads a key head (GQA groups of 8, multi-query): the packed rows G·Lq of a key head
-- pass 64 at Lq = 16 (G = 8) or Lq = 4 (G = 32), where the decode kernel takes blocks of 64 rows.  Per shape the
-- device time of the automatic call (fa.bench, caches flushed), the kernel it runs (fa.kernels' first), K + V
-- read per second, and the time against the same shape at Lq = 1; then the same calls through a paged KV cache
-- (pages of 16).  bf16, D = 128.
-- Usage (GPU machine): flashattn-lua scripts/probe_decode_rows.lua [--json out.json]
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
local NAME = "probe_decode_rows.lua"
local opts = sweep.main(NAME, sweep.json_only(NAME, "Decoding with many query heads a key head."), {...})
local cuda = fa.device_info().backend == "cuda"
local D, dt = cuda and 128 or 64, cuda and "bf16" or "f32"
local results = {}
local shapes = cuda and {{1, 64, 8}, {8, 64, 8}, {1, 32, 1}, {8, 32, 1}} or {{1, 8, 1}}
local lks = cuda and {4096, 32768} or {300}
for _, s in ipairs(shapes) do
  local B, Hq, Hkv = table.unpack(s)
  for _, Lk in ipairs(lks) do
    local k = fa.randn({B, Hkv, Lk, D}, {dtype = dt, seed = 2})
    local v = fa.randn({B, Hkv, Lk, D}, {dtype = dt, seed = 3})
    local cache = fa.kv_cache{batch = B, heads = Hkv, dim = D, capacity = Lk, page_size = 16, dtype = dt}
    cache:append(k, v)
    local t1
    for _, Lq in ipairs({1, 4, 16}) do
      local q = fa.randn({B, Hq, Lq, D}, {dtype = dt, seed = 1})
      local o = fa.attention(q, k, v, {causal = true})
      local ref = fa.attention_reference(q:narrow(1, 1, 1):narrow(2, 1, 1), k:narrow(1, 1, 1):narrow(2, 1, 1),
        v:narrow(1, 1, 1):narrow(2, 1, 1), {causal = true})
      local rel = fa.rel_error(o:narrow(1, 1, 1):narrow(2, 1, 1):cpu(), ref)
      o:free()
      local kernel = fa.kernels(q, k, v)[1]
      for _, paged in ipairs({false, true}) do
        local fn = paged and function() cache:attend(q, {causal = true}) end
          or function() fa.attention(q, k, v, {causal = true}) end
        local ms = fa.bench(fn, {warmup = 2, rep = cuda and 20 or 1, flush_cache = cuda}).median_ms
        if Lq == 1 and not paged then t1 = ms end
        local gbs = 2 * B * Hkv * Lk * D * (dt == "f32" and 4 or 2) / (ms * 1e-3) / 1e9
        print(string.format("B%d Hq%d Hkv%d Lq%2d Lk%6d %-6s %-8s %8.4f ms %7.0f GB/s  x Lq=1 %.2f  rel %.2e", B, Hq, Hkv,
          Lq, Lk, paged and "paged" or "dense", kernel, ms, gbs, ms / t1, rel))
        results[#results + 1] = {B = B, Hq = Hq, Hkv = Hkv, Lq = Lq, Lk = Lk, case = paged and "paged16" or "dense",
          kernel = kernel, ms = ms, kv_gbs = gbs, lq1_ratio = ms / t1, rel_err = rel}
      end
      q:free()
    end
    cache:free(); k:free(); v:free()
    collectgarbage()
  end
end
if opts.json then
  sweep.write_json_object({meta = sweep.run_meta(1), device = fa.device_info().name, results = results}, opts.json)
end
