-- A generation loop on the paged cache (issue 24): each step appends one
-- token to every sequence and attends one query row, as a decoder does;
-- the host's wall clock per step over many steps (the device kept busy:
-- one synchronisation at the end), against the same loop's attend alone on
-- a cache that does not change.  bf16, D = 128, Hq = 32, Hkv = 8.
-- Usage (GPU machine): build-gpu/flashattn-lua scripts/probe_kv_loop.lua [B] [prefill] [page_size] [steps]
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
for i = 1, 5 do
  local a = arg[i]
  if a and (i == 5 or not (math.tointeger(tonumber(a)) and tonumber(a) >= 1)) then
    io.stderr:write("probe_kv_loop.lua: expected [B] [prefill] [page_size] [steps], whole numbers >= 1, got '", a, "'\n")
    os.exit(1)
  end
end
local B, prefill, ps, steps = tonumber(arg[1]) or 64, tonumber(arg[2]) or 4096, tonumber(arg[3]) or 16,
                              tonumber(arg[4]) or 1000
local Hq, Hkv, D, dev = 32, 8, 128, "cuda"
local cache <close> = fa.kv_cache { batch = B, heads = Hkv, dim = D, capacity = prefill + steps + 16, page_size = ps,
                                    dtype = "bf16", device = dev }
local function r(shape, s) return fa.randn(shape, { dtype = "bf16", device = dev, seed = s }) end
cache:append(r({ B, Hkv, prefill, D }, 1), r({ B, Hkv, prefill, D }, 2))
local q, k1, v1 = r({ B, Hq, 1, D }, 3), r({ B, Hkv, 1, D }, 4), r({ B, Hkv, 1, D }, 5)
local function loop(append)
  for _ = 1, 5 do if append then cache:append(k1, v1) end; cache:attend(q):free() end -- warm
  fa.sync()
  local start = sweep.wall_ns()
  for _ = 1, steps do
    if append then cache:append(k1, v1) end
    cache:attend(q):free()
  end
  fa.sync()
  local stop = sweep.wall_ns()
  return (stop - start) / 1e3 / steps
end
local with = loop(true)
local alone = loop(false)
print(("probe_kv_loop: B = %d, prefill %d, pages of %d, %d steps: append + attend %.1f us a step, attend alone %.1f us"):format(
  B, prefill, ps, steps, with, alone))
