-- Loads the real flashattn module the way a user does (require through
-- LUA_CPATH) and runs one small computation of each kind.
--   lua5.4 smoke_module.lua [/expected/path/to/flashattn.so]
local expected = arg and arg[1]
local found = package.searchpath("flashattn", package.cpath)
assert(found, "flashattn.so is not on LUA_CPATH: " .. package.cpath)
if expected and expected ~= "" then
  assert(found == expected, ("loaded %s, expected %s"):format(found, expected))
end

local fa = require "flashattn"
assert(type(fa) == "table", "require 'flashattn' did not return a table")
assert(type(fa.version) == "string" and fa.version:match("^%d+%.%d+"), "fa.version")

local q = fa.randn({1, 2, 9, 8}, {seed = 1})
local k = fa.randn({1, 2, 11, 8}, {seed = 2})
local v = fa.randn({1, 2, 11, 8}, {seed = 3})
local o = fa.attention(q, k, v, {causal = true})
local r = fa.attention_reference(q:cpu(), k:cpu(), v:cpu(), {causal = true})
local err = fa.rel_error(o:cpu():double(), r)
assert(err < 1e-5, "attention rel error " .. err)

local y = fa.softmax(fa.randn({3, 5}, {seed = 4}))
for i = 1, 3 do
  local s = y:select(1, i):sum()
  assert(math.abs(s - 1) < 1e-5, "softmax row sum " .. s)
end
print(("ok: flashattn %s from %s (device %s, attention rel err %.2e)"):format(
  fa.version, found, o:device(), err))
