-- fa.block_mask on the GPU at 128k x 128k (issue 26 target: 5 ms at tiles of 128):
-- the best of 3 calls for a sliding window and for documents of 3000 keys.
-- Usage (GPU machine): FLASHATTN_DEVICE=cuda build-gpu/flashattn-lua scripts/probe_block_mask.lua
local fa = require "flashattn"
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
for _, c in ipairs({{"sliding", sliding}, {"document", document}}) do
  fa.block_mask(c[2], 1, 1, 1024, 1024, {tile = {128, 128}}) -- compiles
  fa.sync()
  local best = math.huge
  for _ = 1, 3 do
    local t0 = wall()
    local bm = fa.block_mask(c[2], 1, 1, L, L, {tile = {128, 128}})
    best = math.min(best, wall() - t0)
    if _ == 1 then print(c[1], "counts", bm:counts()) end
  end
  print(("fa.block_mask %s 128k x 128k, tiles 128: %.2f ms"):format(c[1], best * 1e3))
end
