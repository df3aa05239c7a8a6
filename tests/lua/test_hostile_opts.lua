-- Hostile options and hostile scripts (issue 21): values at the edges of the
-- option ranges, opts tables whose keys or metamethods misbehave, and
-- scripts that hold millions of tensors.  Every case is a "flashattn:" error
-- naming the option and what was expected, and the engine stays usable.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

local function cpu_mem()
  U.collect()
  return fa.memory("cpu").current
end

local function qkv(dtype)
  return U.randn({1, 2, 6, 8}, dtype), U.randn({1, 2, 7, 8}, dtype), U.randn({1, 2, 7, 8}, dtype)
end

-- ---- opts.tile: a 0 the script wrote is a size, not "the default" ------------
TestTile = {}

function TestTile:test_zero_tile_is_an_error_naming_the_range()
  local q, k, v = qkv()
  for _, algo in ipairs({"auto", "flash", "two_pass", "naive", "flash_row"}) do
    for _, tile in ipairs({{0, 0}, {0, 32}, {32, 0}}) do
      local got = ("got {%d, %d}"):format(tile[1], tile[2])
      U.assert_fa_error({"opts.tile", "1 <= Br", "1 <= Bc", got}, fa.attention, q, k, v, {algo = algo, tile = tile})
    end
  end
  U.assert_fa_error({"opts.tile", "got {0, 0}"}, fa.cost.attention, q, k, v, {tile = {0, 0}})
end

function TestTile:test_the_default_is_leaving_tile_out()
  local q, k, v = qkv()
  U.check_attention(q, k, v, {algo = "flash"}, "no tile")
  U.check_attention(q, k, v, {algo = "flash", tile = {16, 16}}, "tile {16, 16}")
end

-- ---- opts.scale past f32's range -------------------------------------------
TestScale = {}

function TestScale:test_past_f32_is_an_error_in_f32()
  for _, dtype in ipairs(U.dtypes) do
    if dtype ~= "f64" then
      local q = U.randn({1, 1, 4, 8}, dtype)
      for _, s in ipairs({1e39, -1e39, 1e300}) do
        U.assert_fa_error({"opts.scale", "3.40282e+38", "f32"}, fa.attention, q, q, q, {scale = s})
      end
      U.assert_fa_error({"opts.scale"}, fa.cost.attention, q, q, q, {scale = 1e39})
      -- the largest f32 is a scale: no error (its scores may overflow, as f32 does)
      lu.assertNotNil(fa.attention(q, q, q, {scale = 3.4028234663852886e38}))
    end
  end
end

function TestScale:test_f64_and_the_reference_take_it()
  local q = U.randn({1, 1, 4, 8})
  local ref = fa.attention_reference(q, q, q, {scale = 1e39})
  lu.assertTrue(ref:isfinite(), "the reference (f64) is finite")
  if not U.cuda then
    local q64 = q:double()
    local o = fa.attention(q64, q64, q64, {scale = 1e39})
    lu.assertTrue(o:isfinite())
    lu.assertTrue(fa.max_abs_diff(o, ref) < 1e-12)
  end
end

-- ---- opts.out and opts.lse_out in one memory ----------------------------------
TestOutputs = {}

function TestOutputs:test_overlapping_outputs_are_an_error()
  local q, k, v = qkv()
  local buf = fa.zeros({1, 2, 6, 8}, {device = dev})
  local before = buf:clone()
  U.assert_fa_error({"opts.lse_out", "opts.out", "overlap"}, fa.attention, q, k, v,
    {out = buf, lse_out = buf:select(4, 1)})
  U.assert_fa_error({"opts.lse_out", "overlap"}, fa.attention, q, k, v,
    {out = buf, lse_out = buf:select(4, 8), return_lse = true})
  lu.assertEquals(fa.max_abs_diff(buf, before), 0, "nothing written")
end

function TestOutputs:test_disjoint_parts_of_one_buffer_work()
  local q, k, v = qkv()
  local n = 1 * 2 * 6 * 8
  local flat = fa.full({n + 12}, 0 / 0, {device = dev})
  local out, lse_out = flat:narrow(1, 1, n):view({1, 2, 6, 8}), flat:narrow(1, n + 1, 12):view({1, 2, 6})
  local o, lse = fa.attention(q, k, v, {out = out, lse_out = lse_out})
  lu.assertTrue(rawequal(o, out) and rawequal(lse, lse_out))
  local ro, rl = U.reference(q, k, v, {})
  U.assert_close(o, ro, "f32", "o in the buffer's first part")
  U.assert_lse(lse, rl, "f32", "lse in its tail")
end

-- ---- opts tables whose keys or metamethods misbehave -----------------------------
TestOptsTables = {}

function TestOptsTables:test_unknown_keys_are_named_without_metamethods()
  local q, k, v = qkv()
  local weird = setmetatable({}, {__tostring = function() return {} end})
  U.assert_fa_error({"unknown option", "table"}, fa.attention, q, k, v, {[weird] = 1})
  local raising = setmetatable({}, {__tostring = function() error("not me") end, __name = "Thing"})
  U.assert_fa_error({"unknown option", "Thing"}, fa.softmax, q, {[raising] = 1})
  U.assert_fa_error({"unknown option", "[1]"}, fa.attention, q, k, v, {true})
  U.assert_fa_error({"unknown option", "[2.5]"}, fa.matmul, U.randn({2, 2}), U.randn({2, 2}), {[2.5] = 1})
  U.assert_fa_error({"unknown option", "[true]"}, fa.zeros, 2, {[true] = 1})
  U.assert_fa_error({"unknown option", "'caual'"}, fa.attention, q, k, v, {caual = true})
  U.assert_fa_error({"unknown option"}, fa.bench, function() end, {[print] = 1})
end

function TestOptsTables:test_index_that_yields_or_raises()
  local q, k, v = qkv()
  local function proxy(on_read)
    return setmetatable({}, {__index = function(_, key) return on_read(key) end})
  end
  local yielding = proxy(function() coroutine.yield("sneaky") end)
  local co = coroutine.wrap(function() return pcall(fa.attention, q, k, v, yielding) end)
  local ok, msg = co()
  lu.assertFalse(ok)
  lu.assertStrContains(msg, "flashattn: opts.")
  lu.assertStrContains(msg, "yield")
  -- the same outside a coroutine, and for every function that reads opts
  U.assert_fa_error({"opts.algo", "boom"}, fa.attention, q, k, v, proxy(function() error("boom") end))
  U.assert_fa_error({"opts.algo", "table"}, fa.softmax, q, proxy(function() error({}) end))
  U.assert_fa_error({"opts.dtype", "boom"}, fa.zeros, 2, proxy(function() error("boom") end))
  U.assert_fa_error({"opts.warmup", "boom"}, fa.bench, function() end, proxy(function() error("boom") end))
  co = coroutine.wrap(function() return pcall(fa.randn, 2, proxy(function() coroutine.yield() end)) end)
  ok, msg = co()
  lu.assertFalse(ok)
  lu.assertEquals(tostring(msg):sub(1, 10), "flashattn:")
end

-- A call's pin list is reused from call to call (one spare a state): calls
-- nested in another's opts, one raising inside another, one whose opts free
-- the tensors, and a coroutine left suspended inside a nested call's pins
-- all keep their tensors alive exactly while they run and release them after.
function TestOptsTables:test_pin_lists_reused_by_nested_and_failing_calls()
  local q, k, v = qkv()
  local ro = U.reference(q, k, v, {causal = true})
  local m0 = U.mem_current()
  local function opts_running(fn)
    return setmetatable({}, {__index = function(_, key) if key == "causal" then fn() return true end end})
  end
  for _ = 1, 3 do
    local inner
    local o = fa.attention(q, k, v, opts_running(function()
      inner = fa.attention(q, k, v, opts_running(function() fa.softmax(q) end))
    end))
    U.assert_close(o, ro, "f32", "outer call with a nested call in its opts")
    U.assert_close(inner, ro, "f32", "nested call")
    local ok, msg = pcall(fa.attention, q, k, v, opts_running(function()
      fa.attention(q, k, v)
      error("boom")
    end))
    lu.assertFalse(ok)
    lu.assertStrContains(tostring(msg), "boom")
  end
  -- opts that free a temporary copy of q mid-call: the call's pin keeps it until the call ends
  local q2 = q:clone()
  local o = fa.attention(q2, k, v, opts_running(function() q2:free() end))
  U.assert_close(o, ro, "f32", "q freed by the opts while pinned")
  -- a coroutine that never finishes, suspended outside any call: its calls' pins are closed
  local co = coroutine.create(function()
    local x = fa.attention(q, k, v, {causal = true})
    coroutine.yield(x)
  end)
  local _, x = coroutine.resume(co)
  U.assert_close(x, ro, "f32", "call in a coroutine")
  o, x, co, q2 = nil, nil, nil, nil
  lu.assertEquals(U.mem_current(), m0, "every pinned and made tensor released")
  U.assert_close(fa.attention(q, k, v, {causal = true}), ro, "f32", "a call after all that")
end

-- A pin list finalized with its coroutine's slot still open, then closed by a later finalizer
-- (coroutine.close in a __gc), must not become the spare: off the state's list, the tensors a
-- later call pins in it would never be released.
function TestOptsTables:test_finalized_pin_list_is_not_reused()
  local bad = setmetatable({}, {__index = function() error("boom") end})
  local m0 = U.mem_current()
  do
    local q, k, v = qkv()
    local co = coroutine.create(function() return fa.attention(q, k, v, bad) end)
    local closer = setmetatable({co = co}, {__gc = function(o) coroutine.close(o.co) end}) -- older than the list
    lu.assertFalse((coroutine.resume(co)))
    q, k, v, co, closer = nil, nil, nil, nil, nil
  end
  lu.assertEquals(U.mem_current(), m0)
  do
    local q, k, v = qkv()
    local co = coroutine.create(function() return fa.attention(q, k, v, bad) end)
    lu.assertFalse((coroutine.resume(co)))
    q:free(); k:free(); v:free()
    q, k, v, co = nil, nil, nil, nil
  end
  lu.assertEquals(U.mem_current(), m0, "the tensors a dead coroutine's call pinned are released")
end

function TestOptsTables:test_index_options_still_apply()
  local q, k, v = qkv()
  local reads = {}
  local opts = setmetatable({}, {__index = function(_, key)
    reads[key] = (reads[key] or 0) + 1
    if key == "causal" then return true end
    if key == "return_lse" then return true end
  end})
  local o, lse = fa.attention(q, k, v, opts)
  local ro, rl = U.reference(q, k, v, {causal = true})
  U.assert_close(o, ro, "f32", "causal from __index")
  U.assert_lse(lse, rl, "f32", "lse from __index")
  for key, n in pairs(reads) do lu.assertEquals(n, 1, key .. " read once") end
  lu.assertEquals(reads.causal, 1)
end

-- ---- millions of tensors meet the memory limit ------------------------------------
TestHandles = {}

function TestHandles:test_empty_tensors_are_counted()
  local m0 = cpu_mem()
  local ts = {}
  for i = 1, 1000 do ts[i] = fa.zeros(0) end
  local held = fa.memory("cpu").current - m0
  lu.assertTrue(held >= 1000 * 64, ("1000 empty tensors count %d bytes"):format(held))
  ts = nil
  lu.assertEquals(cpu_mem(), m0)
end

function TestHandles:test_the_limit_stops_a_flood_of_empty_tensors()
  local m0 = cpu_mem()
  local old = fa.memory_limit("cpu")
  fa.set_memory_limit(fa.memory("cpu").current + (1 << 18), "cpu")
  local ts, n = {}, 0
  local ok, msg = pcall(function()
    for i = 1, 1000000 do
      ts[i] = fa.zeros(0, {device = "cpu"})
      n = i
    end
  end)
  fa.set_memory_limit(old, "cpu")
  lu.assertFalse(ok, ("%d empty tensors under a 256 KiB limit"):format(n))
  lu.assertStrContains(tostring(msg), "flashattn: out of memory")
  lu.assertTrue(n < 100000, n)
  -- views count too
  local base = fa.zeros({4, 4}, {device = "cpu"})
  local m1 = fa.memory("cpu").current
  local row = base:select(1, 2)
  lu.assertTrue(fa.memory("cpu").current > m1, "a view's handle is counted")
  row, base, ts = nil, nil, nil
  lu.assertEquals(cpu_mem(), m0)
  lu.assertNotNil(fa.zeros(3))
end

U.run()
