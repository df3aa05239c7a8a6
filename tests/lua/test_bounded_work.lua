-- Bounded work (README "Reliability"): fa.bench's counts have a maximum,
-- fa.tensor refuses a nested table's shape past its element cap before any
-- walk (rows shared between levels claim any size from a few KiB), and an
-- error or a yield inside fa.bench's fn is a flashattn: error naming fn,
-- with nothing kept.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu

local function shared(levels, width)
  local t = {}
  for i = 1, width do t[i] = 1 end
  for _ = 1, levels do
    local up = {}
    for i = 1, width do up[i] = t end
    t = up
  end
  return t
end

TestBoundedBench = {}

function TestBoundedBench:test_count_maximum()
  local max = 1000000
  U.assert_fa_error({"warmup", "1000000"}, fa.bench, function() end, {warmup = max + 1, rep = 1})
  U.assert_fa_error({"rep", "1000000"}, fa.bench, function() end, {rep = max + 1})
  -- the probe's counts: an error at once, not minutes of C calls
  local t0 = os.clock()
  U.assert_fa_error({"warmup"}, fa.bench, setmetatable({}, {__call = pcall}), {warmup = 16777216, rep = 16777216})
  lu.assertTrue(os.clock() - t0 < 1)
end

function TestBoundedBench:test_yield_inside_fn()
  local before = fa.memory().current
  local co = coroutine.wrap(function()
    return fa.bench(function() coroutine.yield(1) end, {rep = 2, flush_cache = true})
  end)
  U.assert_fa_error({"fn", "yield"}, co)
  collectgarbage()
  collectgarbage()
  lu.assertEquals(fa.memory().current, before)
  lu.assertEquals(fa.bench(function() end, {rep = 2}).n, 2)
end

function TestBoundedBench:test_errors_in_fn()
  U.assert_fa_error({"fn", "boom"}, fa.bench, function() error("boom") end, {rep = 2})
  -- the engine's own messages pass unchanged
  local ok, err = pcall(fa.bench, function() fa.zeros(-1) end, {rep = 1})
  lu.assertFalse(ok)
  lu.assertNotStrContains(err, "(fn)")
  -- error values that are not strings too
  local obj = {}
  ok, err = pcall(fa.bench, function() error(obj) end, {rep = 1})
  lu.assertFalse(ok)
  lu.assertIs(err, obj)
end

TestBoundedTensor = {}

function TestBoundedTensor:test_shared_rows_past_the_cap()
  local t0 = os.clock()
  U.assert_fa_error({"data", "1024x1024x1024x1024", "134217728"}, fa.tensor, shared(3, 1024))
  U.assert_fa_error({"data"}, fa.tensor, shared(2, 1 << 14)) -- 2^42: the product would overflow past 2^63 too
  lu.assertTrue(os.clock() - t0 < 2, "refused before any walk")
end

function TestBoundedTensor:test_shared_rows_within_the_cap()
  local t = fa.tensor(shared(2, 64), {dtype = "f64", device = "cpu"})
  lu.assertEquals(t:shape(), {64, 64, 64})
  lu.assertEquals(t:sum(), 64 * 64 * 64)
  -- more than one chunk of 65536 elements, values in order
  local flat = {}
  for i = 1, 200000 do flat[i] = i end
  local f = fa.tensor(flat, {dtype = "f64", device = "cpu"})
  lu.assertEquals(f:get(1), 1)
  lu.assertEquals(f:get(65537), 65537)
  lu.assertEquals(f:get(200000), 200000)
  lu.assertEquals(f:sum(), 200000 * 200001 / 2)
end

function TestBoundedTensor:test_ragged_after_a_chunk_keeps_nothing()
  collectgarbage()
  local before = fa.memory().current
  local rows = {}
  for i = 1, 300 do rows[i] = shared(0, 1000) end
  rows[300] = {1, 2}
  U.assert_fa_error({"ragged"}, fa.tensor, rows)
  rows[300] = shared(0, 1000)
  rows[299] = shared(0, 1000)
  rows[299][7] = true
  U.assert_fa_error({"[299][7]", "boolean"}, fa.tensor, rows)
  collectgarbage()
  collectgarbage()
  lu.assertEquals(fa.memory().current, before)
end

U.run()
