-- Integers and floats at the edges of their range in the argument slots that
-- take indices, dimensions, sizes and counts (found by fuzz_lua.lua under
-- UBSan: 1-based indices of math.mininteger overflowed when made 0-based).
-- Every call must raise a "flashattn:" error or succeed; UBSan checks the
-- arithmetic on the way.
--   flashattn-lua tests/fuzz/edges.lua
local fa = require "flashattn"

local failures, cases = 0, 0
local EDGES = {math.mininteger, math.mininteger + 1, -2 ^ 63, -1, 0, 2 ^ 31, 2 ^ 53, 2 ^ 62, math.maxinteger, 2 ^ 63,
               1 / 0, -1 / 0, 0 / 0, 1.5}

local function expect_fa_error_or_ok(name, f, ...)
  cases = cases + 1
  local ok, err = pcall(f, ...)
  if not ok and not (type(err) == "string" and err:match("^flashattn:")) then
    failures = failures + 1
    io.stderr:write(("FAIL %s: error without the flashattn: prefix: %s\n"):format(name, tostring(err)))
  end
  return ok
end

local function must_fail(name, f, ...)
  if expect_fa_error_or_ok(name, f, ...) then
    failures = failures + 1
    io.stderr:write(("FAIL %s: succeeded\n"):format(name))
  end
end

local function must_be_nil(name, f)
  cases = cases + 1
  local ok, r = pcall(f)
  if not ok or r ~= nil then
    failures = failures + 1
    io.stderr:write(("FAIL %s: expected nil, got %s %s\n"):format(name, ok and "" or "an error", tostring(r)))
  end
end

-- zero is a valid count, kv_len, block and tile (0 = the default)
local function nonzero(e) return e ~= 0 end
-- 2^31 elements of f32 are valid, and 8 GiB: never asked for here
local function not_big(e) return e ~= 2 ^ 31 end

local t = fa.zeros(3, 4)
local v = fa.zeros(5)
for _, e in ipairs(EDGES) do
  local s = tostring(e)
  must_fail("t:get(" .. s .. ", 1)", t.get, t, e, 1)
  must_fail("t:set(1, " .. s .. ", 0)", t.set, t, 1, e, 0)
  must_fail("t:select(1, " .. s .. ")", t.select, t, 1, e)
  must_fail("t:select(" .. s .. ", 1)", t.select, t, e, 1)
  must_fail("t:narrow(1, " .. s .. ", 1)", t.narrow, t, 1, e, 1)
  if nonzero(e) then must_fail("t:narrow(1, 1, " .. s .. ")", t.narrow, t, 1, 1, e) end
  must_fail("t:narrow(" .. s .. ", 1, 1)", t.narrow, t, e, 1, 1)
  must_fail("t:transpose(1, " .. s .. ")", t.transpose, t, 1, e)
  must_fail("t:size(" .. s .. ")", t.size, t, e)
  -- a read t[i] past either end is nil (tests/lua/test_iteration.lua); a key
  -- that is no Lua integer (1.5, inf, NaN, 2^63) stays an error
  if math.tointeger(e) then
    must_be_nil("t[" .. s .. "]", function() return t[e] end)
    must_be_nil("v[" .. s .. "]", function() return v[e] end)
  else
    must_fail("t[" .. s .. "]", function() return t[e] end)
    must_fail("v[" .. s .. "]", function() return v[e] end)
  end
  must_fail("v[" .. s .. "] = 1", function() v[e] = 1 end)
  if e ~= -1 then -- -1: the size inferred
    must_fail("t:view(" .. s .. ", 4)", t.view, t, e, 4)
    must_fail("t:view(4, " .. s .. ", 3)", t.view, t, 4, e, 3)
  end
  if nonzero(e) and not_big(e) then must_fail("fa.zeros(" .. s .. ", 2)", fa.zeros, e, 2) end
  if nonzero(e) then must_fail("fa.zeros(2, " .. s .. ", 2 ^ 40)", fa.zeros, 2, e, 2 ^ 40) end
  if nonzero(e) and not_big(e) then must_fail("fa.arange(" .. s .. ")", fa.arange, e) end
  must_fail("fa.bench rep " .. s, fa.bench, function() end, {rep = e})
  if nonzero(e) then must_fail("fa.bench warmup " .. s, fa.bench, function() end, {warmup = e, rep = 1}) end
  local q = fa.randn(1, 2, 4, 8)
  must_fail("attention tile " .. s, fa.attention, q, q, q, {tile = {e, 16}})
  if nonzero(e) then must_fail("attention kv_lens " .. s, fa.attention, q, q, q, {kv_lens = {e}}) end
  expect_fa_error_or_ok("attention window " .. s, fa.attention, q, q, q, {window = {e, e}})
  expect_fa_error_or_ok("attention scale " .. s, fa.attention, q, q, q, {scale = e})
  expect_fa_error_or_ok("attention softcap " .. s, fa.attention, q, q, q, {softcap = e})
  expect_fa_error_or_ok("attention alibi " .. s, fa.attention, q, q, q, {alibi = {e, e}})
  if nonzero(e) then
    must_fail("softmax block " .. s, fa.softmax, t, {block = e})
    must_fail("matmul tile " .. s, fa.matmul, t, t:transpose(), {tile = e, algo = "tiled"})
  end
  expect_fa_error_or_ok("fa.manual_seed(" .. s .. ")", fa.manual_seed, e)
  expect_fa_error_or_ok("fa.randn seed " .. s, fa.randn, 3, {seed = e})
  expect_fa_error_or_ok("fa.full value " .. s, fa.full, {2}, e)
  expect_fa_error_or_ok("t:fill_(" .. s .. ")", t.fill_, t, e)
  expect_fa_error_or_ok("set_memory_limit(" .. s .. ")", fa.set_memory_limit, e)
  fa.set_memory_limit(0)
end
print(("edges: %d cases, %d failures"):format(cases, failures))
os.exit(failures == 0 and 0 or 1, true)
