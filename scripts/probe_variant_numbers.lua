-- One variant form swept over its numbers (issue 26): a softcap and a prefix length, each value's
-- first call (wall clock with fa.sync: an NVRTC compile where the code's text changes, which every
-- new number did while numbers were literals in it) and its time against the built-in rule that
-- computes the same (fa.bench medians, caches flushed).  bf16, B = 4, H = 16, L = 4096, D = 128.
-- Run with FLASHATTN_CACHE_DIR set to a fresh folder and CUDA_CACHE_DISABLE=1, so that the first
-- value of each form compiles as on a machine that never saw it.
-- Usage (GPU machine): flashattn-lua scripts/probe_variant_numbers.lua [--small] [--json FILE]
-- (--small: L = 256, the CPU when no GPU is there, a smoke test)
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"

local NAME = "probe_variant_numbers.lua"
local args = sweep.main(NAME, function(argv)
  local p = require "argparse"(NAME, "One variant form swept over its numbers: first calls, time against the built-in rule.")
  p:flag("--small", "L = 256, the CPU where no GPU is (a smoke test)")
  p:option("--json", "write the results to this JSON file")
  return sweep.parse_args(p, argv, NAME)
end, {...})
local small, json = args.small, args.json
local function wall() return sweep.wall_ns() * 1e-9 end
local inp = sweep.variant_probe_inputs(small)
local dev, dt, B, H, L, D, q, k, v = inp.dev, inp.dtype, inp.B, inp.H, inp.L, inp.D, inp.q, inp.k, inp.v
print(("probe_variant_numbers.lua: %s, %s, B %d H %d L %d D %d"):format(fa.device_info(dev).name or dev, dt, B, H,
  L, D))

local function prefix_mask(P) -- the built-in form of prefix_lm: a dense bool mask (1, 1, L, L)
  local rows = {}
  for r = 1, L do
    local row = {}
    for c = 1, L do row[c] = c <= P or r >= c end
    rows[r] = row
  end
  return fa.tensor({{rows}}, {dtype = "bool", device = dev})
end

local forms = {
  {"softcap", small and {30, 31} or {30, 31, 50, 20.5},
   function(c) return {score_mod = function(s) return (s / c):tanh() * c end} end,
   function(c) return {softcap = c} end},
  {"prefix_lm", small and {L // 4, L // 4 + 1} or {L // 4, L // 4 + 1, L // 2, 3 * L // 4},
   function(P) return {mask_mod = function(_, _, qi, ki) return ki:le(P) | qi:ge(ki) end} end,
   function(P) return {mask = prefix_mask(P)} end},
}
local rows = {}
for _, f in ipairs(forms) do
  for _, value in ipairs(f[2]) do
    local opts, builtin = f[3](value), f[4](value)
    local a = wall()
    local o = fa.attention(q, k, v, opts)
    fa.sync()
    local first = wall() - a
    local want = fa.attention(q, k, v, builtin)
    local err = fa.rel_error(o, want)
    o:free()
    want:free()
    local reps = {warmup = 2, rep = small and 3 or 10, flush_cache = true}
    local ms = fa.bench(function() fa.attention(q, k, v, opts):free() end, reps).median_ms
    local bms = fa.bench(function() fa.attention(q, k, v, builtin):free() end, reps).median_ms
    rows[#rows + 1] = {form = f[1], value = value, first_call_s = first, ms = ms, builtin_ms = bms, rel_error = err}
    print(("%-10s %-8s first call %.3f s, %.3f ms (built-in %.3f ms, x %.3f), rel error %.2g"):format(f[1],
      tostring(value), first, ms, bms, bms / ms, err))
  end
end
if json then
  local ok, cjson = pcall(require, "cjson")
  if not ok then
    io.stderr:write("probe_variant_numbers.lua: --json needs lua-cjson\n")
    os.exit(1)
  end
  local f = assert(io.open(json, "w"))
  f:write(cjson.encode({meta = sweep.run_meta(0), device = fa.device_info(dev), B = B, H = H, L = L,
    D = D, dtype = dt, rows = rows}))
  f:close()
end
