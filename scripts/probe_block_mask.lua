-- fa.block_mask on the GPU at 128k x 128k (issue 26 target: 5 ms at tiles of 128):
-- a sliding window and documents of 3000 keys, a call's time as per_call measures it.
-- Usage (GPU machine): FLASHATTN_DEVICE=cuda build-gpu/flashattn-lua scripts/probe_block_mask.lua
local fa = require "flashattn"
if arg and arg[1] then
  io.stderr:write("probe_block_mask.lua: takes no arguments, got '", arg[1], "'\n")
  os.exit(1)
end
fa.set_default_device("cuda")
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local sweep = require "flashattn.sweep"
local function wall() return sweep.wall_ns() * 1e-9 end -- seconds
local L = 131072
local sliding = function(b, h, q, k) return q:ge(k) & (q - k):le(1024) end
local ids = {}
for i = 1, L do ids[i] = (i - 1) // 3000 end
local doc = fa.tensor(ids, {device = "cuda"})
local document = function(b, h, q, k) return doc[q]:eq(doc[k]) & q:ge(k) end
-- a call's time: 5 calls between two clock reads, less the cost of one read
-- (a process start, milliseconds), the best of 3 such loops
local function per_call(f)
  local best = math.huge
  for _ = 1, 3 do
    local a, b = wall(), wall()
    local t0 = wall()
    for _ = 1, 5 do f() end
    local t1 = wall()
    best = math.min(best, ((t1 - t0) - (b - a)) / 5)
  end
  return best
end
for _, c in ipairs({{"sliding", sliding}, {"document", document}}) do
  fa.block_mask(c[2], 1, 1, 1024, 1024, {tile = {128, 128}}) -- compiles
  local bm = fa.block_mask(c[2], 1, 1, L, L, {tile = {128, 128}}) -- compiles for these bounds
  print(c[1], "counts", bm:counts())
  fa.sync()
  local t = per_call(function() fa.block_mask(c[2], 1, 1, L, L, {tile = {128, 128}}) end)
  print(("fa.block_mask %s 128k x 128k, tiles 128: %.2f ms"):format(c[1], t * 1e3))
end
