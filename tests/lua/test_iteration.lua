-- Iteration and reads past the end: t[i] for an integer i outside 1..#t is
-- nil at every rank (as in a Lua sequence), so `ipairs(t)` visits every
-- element of a 1-D tensor (every sub-tensor of an N-D one) and stops, and
-- `pairs(t)` walks the same way.  A non-integral number key, a write past
-- the end and any use of a freed tensor stay `flashattn:` errors.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

TestIteration = {}

function TestIteration:test_ipairs_1d_visits_every_element_and_stops()
  for _, dt in ipairs(U.all_dtypes) do
    local t = fa.arange(5, {dtype = dt, device = dev})
    local seen = {}
    for i, x in ipairs(t) do
      lu.assertEquals(type(x), "number")
      seen[i] = x
    end
    lu.assertEquals(seen, {0, 1, 2, 3, 4}, dt)
  end
end

function TestIteration:test_ipairs_bool_tensor()
  local m = fa.tensor({true, false, true}, {device = dev})
  local seen = {}
  for i, x in ipairs(m) do seen[i] = x end
  lu.assertEquals(seen, {1, 0, 1})
end

function TestIteration:test_ipairs_nd_visits_sub_tensors()
  local t = fa.arange(12, {device = dev}):view(3, 4)
  local n = 0
  for i, row in ipairs(t) do
    n = n + 1
    lu.assertTrue(fa.is_tensor(row))
    lu.assertEquals(row:shape(), {4})
    lu.assertEquals(row:totable(), {4 * (i - 1), 4 * (i - 1) + 1, 4 * (i - 1) + 2, 4 * (i - 1) + 3})
  end
  lu.assertEquals(n, 3)
  -- nested: every element of a 3-D tensor, in row-major order
  local c = fa.arange(24, {device = dev}):view(2, 3, 4)
  local flat = {}
  for _, a in ipairs(c) do
    for _, b in ipairs(a) do
      for _, x in ipairs(b) do flat[#flat + 1] = x end
    end
  end
  lu.assertEquals(#flat, 24)
  for i = 1, 24 do lu.assertEquals(flat[i], i - 1) end
end

function TestIteration:test_ipairs_views()
  -- a transposed view: #t and t[i] follow the view's first dimension
  local t = fa.arange(6, {device = dev}):view(2, 3):transpose(1, 2)
  local cols = {}
  for i, col in ipairs(t) do cols[i] = col:totable() end
  lu.assertEquals(cols, {{0, 3}, {1, 4}, {2, 5}})
  -- a narrowed 1-D view stops at its own end, not the storage's
  local n = fa.arange(10, {device = dev}):narrow(1, 3, 4)
  local seen = {}
  for _, x in ipairs(n) do seen[#seen + 1] = x end
  lu.assertEquals(seen, {2, 3, 4, 5})
end

function TestIteration:test_pairs_walks_as_ipairs()
  -- pairs(t) is ipairs(t): a loop written for a Lua array takes a tensor
  local t = fa.arange(4, {device = dev})
  local seen = {}
  for i, x in pairs(t) do seen[i] = x end
  lu.assertEquals(seen, {0, 1, 2, 3})
  local m = fa.arange(6, {device = dev}):view(3, 2)
  local rows = {}
  for i, row in pairs(m) do rows[i] = row:totable() end
  lu.assertEquals(rows, {{0, 1}, {2, 3}, {4, 5}})
  for _ in pairs(fa.zeros({0}, {device = dev})) do lu.fail("an empty tensor has no element") end
  -- a freed tensor fails at pairs itself; calling a tensor is a flashattn: error
  local f = fa.ones(2, {device = dev})
  f:free()
  U.assert_fa_error({"freed"}, pairs, f)
  U.assert_fa_error({"not callable"}, function() return t() end)
  U.assert_fa_error({"not callable"}, function() return t(1) end)
end

function TestIteration:test_empty_tensor_visits_nothing()
  local t = fa.zeros({0}, {device = dev})
  for _ in ipairs(t) do lu.fail("an empty tensor has no element") end
  lu.assertNil(t[1])
  local e = fa.zeros({0, 3}, {device = dev})
  for _ in ipairs(e) do lu.fail("no row") end
end

function TestIteration:test_reads_past_the_end_are_nil()
  local t = fa.arange(3, {device = dev})
  for _, i in ipairs({0, -1, 4, 5, 2 ^ 40, math.maxinteger, math.mininteger, 4.0}) do
    lu.assertNil(t[i], "t[" .. tostring(i) .. "]")
  end
  lu.assertEquals(t[3.0], 2) -- an integral float is an integer key
  local m = fa.zeros({2, 3, 4}, {device = dev})
  lu.assertNil(m[0])
  lu.assertNil(m[3])
  lu.assertNil(m[2][4])
  lu.assertNil(m[2][3][5])
  lu.assertEquals(m[2][3][4], 0)
  lu.assertEquals(#t, 3)
end

function TestIteration:test_non_integer_keys_and_writes_stay_errors()
  local t = fa.arange(3, {device = dev})
  U.assert_fa_error({"index", "integer"}, function() return t[1.5] end)
  U.assert_fa_error({"index", "integer"}, function() return t[0 / 0] end)
  U.assert_fa_error({}, function() t[4] = 1 end)
  U.assert_fa_error({}, function() t[0] = 1 end)
  local m = fa.zeros({2, 2}, {device = dev})
  U.assert_fa_error({}, function() m[3] = 1 end)
  lu.assertEquals(t:totable(), {0, 1, 2})
  lu.assertEquals(m:sum(), 0)
  -- get/set keep their checks: one index per dimension, within range
  U.assert_fa_error({}, function() return t:get(4) end)
  U.assert_fa_error({}, function() t:set(0, 1) end)
end

function TestIteration:test_freed_tensor_is_an_error()
  local t = fa.arange(3, {device = dev})
  t:free()
  U.assert_fa_error({}, function() return t[1] end)
  U.assert_fa_error({}, function() return t[9] end)
  U.assert_fa_error({}, function() for _ in ipairs(t) do end end)
end

function TestIteration:test_close_variable()
  local sum = 0
  do
    local t <close> = fa.arange(4, {device = dev})
    for _, x in ipairs(t) do sum = sum + x end
  end
  lu.assertEquals(sum, 6)
end

U.run()
