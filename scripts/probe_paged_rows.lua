-- Decoding through the paged cache against the same call on contiguous K/V (bf16, causal, 8 key heads), by packed
-- query rows a key head, page size and head dim, with the chunks chosen (auto) and with one chunk a (batch, key
-- head), where blocks are bound by their instructions: what the paged copies cost beyond the contiguous ones.
-- Pages that are a multiple of 16 are read a page-table entry a run of 16 rows, other sizes an entry a row.
-- Device time (fa.bench, caches flushed); paged / contiguous time and the largest difference of the outputs.
-- --short: the short calls alone (B = 1 at 4k, 32k and 128k keys, B = 8 at 4k; D = 128, Lq = 1, pages of 16 and
-- 256), where a block's first reads (the sequence's length, the page table) are a large part of its time.
-- Usage (GPU machine): flashattn-lua scripts/probe_paged_rows.lua [--short] [--json out.json]
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
local NAME = "probe_paged_rows.lua"
local opts = sweep.main(NAME, function(argv)
  local p = require "argparse"(NAME, "Paged decode calls against contiguous ones.")
  p:flag("--short", "the short calls alone (B = 1 at 4k, 32k and 128k keys, B = 8 at 4k)")
  p:option("--json", "write the results to this JSON file")
  return sweep.parse_args(p, argv, NAME)
end, {...})
if fa.device_info().backend ~= "cuda" then error("probe_paged_rows.lua: needs the cuda backend (the decode kernel)", 0) end
local cases = { -- B, Hq, D, Lq, Lk, page sizes
  {8, 32, 128, 1, 32768, {16, 256, 8}}, {8, 32, 128, 4, 4096, {16, 256}}, {8, 32, 128, 16, 4096, {16}},
  {8, 32, 128, 16, 32768, {16, 256}}, {8, 64, 128, 16, 4096, {16}}, {8, 32, 64, 1, 32768, {16}},
  {8, 16, 256, 1, 32768, {16, 256}}, {8, 16, 256, 4, 4096, {16}}, {64, 32, 128, 1, 4096, {16}},
}
if opts.short then
  cases = {{1, 32, 128, 1, 4096, {16, 256}}, {1, 32, 128, 1, 32768, {16, 256}}, {1, 32, 128, 1, 131072, {16, 256}},
    {8, 32, 128, 1, 4096, {16, 256}}}
end
local results = {}
for _, c in ipairs(cases) do
  local B, Hq, D, Lq, Lk, pages = table.unpack(c)
  local Hkv = 8
  local k = fa.randn({B, Hkv, Lk, D}, {dtype = "bf16", seed = 2})
  local v = fa.randn({B, Hkv, Lk, D}, {dtype = "bf16", seed = 3})
  local q = fa.randn({B, Hq, Lq, D}, {dtype = "bf16", seed = 1})
  local auto, one = {causal = true}, {causal = true, splits = 1}
  local function ms(fn, rep) return fa.bench(fn, {warmup = 2, rep = rep, flush_cache = true}).median_ms end
  local d = ms(function() fa.attention(q, k, v, auto) end, 20)
  local d1 = ms(function() fa.attention(q, k, v, one) end, 5)
  local ref = fa.attention(q, k, v, auto)
  for _, ps in ipairs(pages) do
    local cache = fa.kv_cache{batch = B, heads = Hkv, dim = D, capacity = Lk, page_size = ps, dtype = "bf16"}
    cache:append(k, v)
    local o = cache:attend(q, auto)
    local diff = fa.max_abs_diff(o, ref)
    local p = ms(function() cache:attend(q, auto) end, 20)
    local p1 = ms(function() cache:attend(q, one) end, 5)
    print(("B%-2d Hq%d D%-3d Lq%-2d rows %3d Lk%6d page %3d  auto: dense %.4f paged %.4f x %.3f   splits=1: dense %.4f " ..
      "paged %.4f x %.3f  diff %.1e"):format(B, Hq, D, Lq, Hq // Hkv * Lq, Lk, ps, d, p, p / d, d1, p1, p1 / d1, diff))
    results[#results + 1] = {B = B, Hq = Hq, Hkv = Hkv, D = D, Lq = Lq, Lk = Lk, page_size = ps, dense_ms = d, paged_ms = p,
      ratio = p / d, dense_splits1_ms = d1, paged_splits1_ms = p1, ratio_splits1 = p1 / d1, max_abs_diff = diff}
    o:free(); cache:free(); collectgarbage()
  end
  ref:free(); k:free(); v:free(); q:free(); collectgarbage()
end
if opts.json then
  sweep.write_json_object({meta = sweep.run_meta(1), device = fa.device_info().name, results = results}, opts.json)
end
