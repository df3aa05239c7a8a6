-- fa.softmax "auto" on views (API §6) against the same rows contiguous, on
-- the GPU: a transposed (B, L, H, N) tensor, a narrow of wider rows, a head
-- slice, each beside a contiguous tensor of its shape, f32 and f16, timed
-- with fa.bench (device events, caches flushed); every result checked
-- against the softmax of the view's contiguous copy (bit for bit).  Without
-- a GPU: small shapes on the CPU, 3 repetitions (a smoke test).
-- Usage: flashattn-lua scripts/probe_softmax_views.lua [--json FILE]
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
local NAME = "probe_softmax_views.lua"
local args = sweep.main(NAME, sweep.json_only(NAME, "Softmax of views against contiguous rows, on the GPU."), { ... })
local device = fa.backends()[2] and "cuda" or "cpu"
local q = device == "cpu"
-- name, the tensor's shape, the view of it
local cases = {
  { "transposed", q and { 2, 64, 4, 256 } or { 8, 1024, 4, 1024 }, function(t) return t:transpose(2, 3) end },
  { "transposed_long", q and { 2, 2, 2, 4096 } or { 4, 16, 2, 32768 }, function(t) return t:transpose(2, 3) end },
  { "narrow", q and { 512, 384 } or { 32768, 1536 }, function(t) return t:narrow(2, 1, t:shape()[2] * 2 // 3) end },
  { "head_slice", q and { 256, 4, 256 } or { 4096, 8, 1024 }, function(t) return t:select(2, 3) end },
}
local results = {}
print(string.format("%-6s %-16s %-18s %12s %12s %8s", "dtype", "case", "view shape", "view_us", "contig_us", "ratio"))
for _, dt in ipairs { "f32", "f16" } do
  for i, c in ipairs(cases) do
    local t = fa.randn(c[2], { dtype = dt, device = device, seed = 100 + i })
    local v = c[3](t)
    local vc = v:contiguous()
    local want = fa.softmax(vc)
    local got = fa.softmax(v)
    local diff = fa.max_abs_diff(got, want)
    if diff ~= 0 then error(("%s %s: the view's softmax is %g off its contiguous copy's"):format(dt, c[1], diff)) end
    local function time(x)
      return fa.bench(function() return fa.softmax(x) end, { warmup = 2, rep = q and 3 or 20 }).median_ms * 1e3
    end
    local tv, tc = time(v), time(vc)
    local shape = table.concat(v:shape(), "x")
    print(string.format("%-6s %-16s %-18s %12.1f %12.1f %8.3f  diff %g", dt, c[1], shape, tv, tc, tv / tc, diff))
    results[#results + 1] = { dtype = dt, case = c[1], shape = shape, view_us = tv, contiguous_us = tc,
                              ratio = tv / tc, max_abs_diff = diff }
    t:free(); vc:free(); want:free(); got:free()
  end
end
if args.json then
  sweep.write_json_object({ meta = sweep.run_meta(0), device = fa.device_info().name, results = results }, args.json)
end
