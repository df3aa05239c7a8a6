-- What the first call of a new variant costs (issue 26: at most 2 s, NVRTC included): bf16,
-- B = 4, H = 16, L = 4096, D = 128; each variant's first call, then each again, wall clock with
-- fa.sync.  Run it twice with FLASHATTN_CACHE_DIR set to a fresh folder: the first process
-- compiles, the second loads the instances from the disk.  NVRTC 13 has a disk cache of its
-- own (its library names CUDA_CACHE_DISABLE; on an H200 node a second process with a fresh
-- FLASHATTN_CACHE_DIR compiled the same variants in 0.2-0.3 s against 1.4-2.1 s the first
-- time, 2026-12-01): set CUDA_CACHE_DISABLE=1 too for the cost of an expression new to the
-- machine.  The rules that the engine turns into built-in options (alibi, sliding window)
-- compile nothing.  Prints the NVRTC library loaded.
-- Usage (GPU machine): CUDA_CACHE_DISABLE=1 FLASHATTN_CACHE_DIR=$(mktemp -d) flashattn-lua scripts/probe_first_calls.lua [--small]
-- (--small: L = 256 and the CPU when no GPU is there, a smoke test)
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
local small = arg and arg[1] == "--small"
if arg and arg[1] and not small then
  io.stderr:write("probe_first_calls.lua: the one option is --small, got '", arg[1], "'\n")
  os.exit(1)
end
local function wall() return sweep.wall_ns() * 1e-9 end
local t0 = wall()
local inp = sweep.variant_probe_inputs(small)
local dev, dt, B, H, L, D, q, k, v = inp.dev, inp.dtype, inp.B, inp.H, inp.L, inp.D, inp.q, inp.k, inp.v
print(("probe_first_calls.lua: %s, %s, B %d H %d L %d D %d"):format(fa.device_info(dev).name or dev, dt, B, H, L, D))
print(("%-30s %.3f s"):format("start and inputs", wall() - t0))
local function timed(name, fn)
  local a = wall()
  fn()
  fa.sync()
  print(("%-30s %.3f s"):format(name, wall() - a))
end
timed("plain call", function() fa.attention(q, k, v, { causal = true }):free() end)
timed("plain call again", function() fa.attention(q, k, v, { causal = true }):free() end)
local sl = {}
for h = 1, H do sl[h] = 2 ^ (-8 * h / H) end
local slopes = fa.tensor(sl, { device = dev })
local ids = {}
for j = 1, L do ids[j] = (j - 1) // (L // 6) end
local doc = fa.tensor(ids, { device = dev })
local document = function(_, _, i, j) return doc[i]:eq(doc[j]) & i:ge(j) end
local variants = {
  { "alibi score_mod", { score_mod = function(s, _, h, i, j) return s - slopes[h] * (i - j):abs() end } },
  { "softcap score_mod", { score_mod = function(s) return (s / 30):tanh() * 30 end } },
  { "sliding mask_mod", { mask_mod = function(_, _, i, j) return i:ge(j) & (i - j):le(L // 4) end } },
  { "document mask_mod", { mask_mod = document } },
  { "softcap + document", { score_mod = function(s) return (s / 20):tanh() * 20 end, mask_mod = document } },
}
for _, c in ipairs(variants) do timed(c[1], function() fa.attention(q, k, v, c[2]):free() end) end
for _, c in ipairs(variants) do timed(c[1] .. " (again)", function() fa.attention(q, k, v, c[2]):free() end) end
local maps = io.open("/proc/self/maps")
if maps then
  local seen = {}
  for line in maps:lines() do
    local path = line:match("(%S*nvrtc%S*)$")
    if path and not seen[path] then seen[path] = true print("loaded: " .. path) end
  end
  maps:close()
end
