-- f32 attention with few query rows against many keys (issue 24's shapes in f32; the oracle's case 814 of
-- seed 7003): the largest error against the f64 reference, relative to the largest output, and the device time
-- (fa.bench, caches flushed), for "auto" (cuda's f32 kernel cuts the keys into chunks of one launch), one chunk
-- (splits = 1), separate pieces (splits = 4, 16), the SIMT kernel, two_pass and flash_row.
-- Usage: flashattn-lua scripts/probe_f32_chunks.lua [--json out.json]   (FLASHATTN_DEVICE=cuda on the GPU)
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
local NAME = "probe_f32_chunks.lua"
local opts = sweep.main(NAME,
  sweep.json_only(NAME, "f32 attention, few query rows against many keys: error and time by schedule."), {...})
local dev = fa.device_info().backend == "cuda" and "cuda" or "cpu"
local cuda = dev == "cuda"
local results = {}
local function run(B, Hq, Hkv, Lq, Lk, D, q_scale)
  local q = fa.randn({B, Hq, Lq, D}, {dtype = "f32", device = dev, seed = 11}) * (q_scale or 1)
  local k = fa.randn({B, Hkv, Lk, D}, {dtype = "f32", device = dev, seed = 12})
  local v = fa.randn({B, Hkv, Lk, D}, {dtype = "f32", device = dev, seed = 13})
  local ref = fa.attention_reference(q, k, v, {})
  local rmax = math.max(ref:max(), -ref:min())
  local cases = {{name = "auto", o = {}}, {name = "splits=1", o = {splits = 1}}, {name = "splits=4", o = {splits = 4}},
                 {name = "splits=16", o = {splits = 16}}, {name = "two_pass", o = {algo = "two_pass"}},
                 {name = "flash_row", o = {algo = "flash_row"}}}
  if cuda then table.insert(cases, 5, {name = "simt", o = {kernel = "simt"}}) end
  for _, c in ipairs(cases) do
    local ok, o = pcall(fa.attention, q, k, v, c.o)
    if ok then
      local err = fa.max_abs_diff(o, ref)
      o:free()
      local ms = fa.bench(function() fa.attention(q, k, v, c.o) end,
        {warmup = 1, rep = cuda and 10 or 1, flush_cache = cuda}).median_ms
      print(string.format("B%d Hq%d Hkv%d Lq%d Lk%d D%d q*%g %-10s err %.3g rel %.3g %9.4f ms", B, Hq, Hkv, Lq, Lk, D,
        q_scale or 1, c.name, err, err / rmax, ms))
      results[#results + 1] = {B = B, Hq = Hq, Hkv = Hkv, Lq = Lq, Lk = Lk, D = D, q_scale = q_scale or 1,
        case = c.name, err = err, rel_max = err / rmax, ms = ms}
    else
      print(c.name, tostring(o):sub(1, 100))
    end
  end
end
local L = cuda and 1 or 1 / 16 -- the CPU: a smoke run at a sixteenth of the keys
run(3, 16, 8, 1, math.floor(32768 * L), 64)
run(3, 16, 8, 1, math.floor(32768 * L), 64, 0.1)
run(3, 16, 8, 16, math.floor(32768 * L), 64)
run(1, 8, 8, 1, math.floor(32768 * L), 128)
run(1, 32, 8, 1, math.floor(131072 * L), 128)
run(1, 8, 8, 64, math.floor(4096 * L), 64)
if opts.json then
  sweep.write_json_object({meta = sweep.run_meta(11), device = fa.device_info().name, results = results}, opts.json)
end
