-- A plugin script that fails on purpose (a mask of the wrong shape): the host
-- must report the engine's "flashattn:" message with a Lua stack traceback.
local q, k, v, o = ...
local fa = flashattn

local function make_mask(lq, lk)
  return fa.zeros({lq + 1, lk}) -- one row too many
end

local function run_layer()
  return fa.attention(q, k, v, {mask = make_mask(q:size(3), k:size(3)), out = o})
end

run_layer()
