-- Scripts that attack the binding itself (issue 21): the tensor metatable,
-- keys whose metamethods misbehave, a second copy of the module in the same
-- state.  Every such attempt is a "flashattn:" error or harmless, and the
-- engine's memory comes back.  What happens while lua_close runs is
-- tests/c/test_lua_lifecycle.c's.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu

-- A key whose __tostring, __name and __eq must never be used in a message.
local function hostile_key()
  local called = {}
  local mt = {
    __tostring = function() called.tostring = true return {} end, -- not a string: luaL_tolstring raises
    __name = {}, -- not a string either
    __eq = function() called.eq = true return true end,
  }
  return setmetatable({}, mt), called
end

TestHostileBinding = {}

-- getmetatable(t).__gc = nil made every later tensor leak.
function TestHostileBinding:test_metatable_is_protected()
  local t = fa.zeros(2, 3)
  lu.assertEquals(getmetatable(t), "flashattn.Tensor")
  lu.assertFalse(pcall(function() getmetatable(t).__gc = nil end))
  lu.assertFalse(pcall(setmetatable, t, {}))
  -- nor do the tensor's own fields lead to it
  for _, k in ipairs({"__gc", "__index", "__newindex", "__metatable", "__close", "__name"}) do
    lu.assertNil(t[k], k)
  end
  local m0 = U.mem_current()
  for _ = 1, 20 do local _ = fa.ones(256) end
  lu.assertEquals(U.mem_current(), m0, "tensors dropped after the attempt give their memory back")
  lu.assertEquals(tostring(t):match("%[flashattn%.Tensor f32 %a+ 2x3%]$") ~= nil, true)
end

-- t[k] = v with a key that is not an integer: the message describes the key
-- by its type (never its __tostring) or its value.
function TestHostileBinding:test_newindex_key_described_without_metamethods()
  local t = fa.zeros(4)
  local key, called = hostile_key()
  U.assert_fa_error({"index", "table"}, function() t[key] = 1 end)
  lu.assertNil(called.tostring, "__tostring was called")
  U.assert_fa_error({"index", "'foo'"}, function() t.foo = 1 end)
  U.assert_fa_error({"index", "true"}, function() t[true] = 1 end)
  U.assert_fa_error({"index", "flashattn.Tensor"}, function() t[fa.zeros(1)] = 1 end)
  local long = U.assert_fa_error({"index"}, function() t[("x"):rep(10000)] = 1 end)
  lu.assertTrue(#long < 300, "a long key is cut in the message")
  local m2 = fa.zeros(2, 2)
  U.assert_fa_error({"index"}, function() m2[key] = fa.ones(2) end)
  lu.assertNil(called.tostring, "__tostring was called")
end

-- A shape table with a stray key: described by type, never by its __tostring.
function TestHostileBinding:test_shape_key_described_without_metamethods()
  local key, called = hostile_key()
  for _, make in ipairs({fa.zeros, fa.ones, fa.randn}) do
    U.assert_fa_error({"shape", "table"}, function() make({2, 3, [key] = 1}) end)
  end
  U.assert_fa_error({"shape", "'dtype'"}, function() fa.zeros({2, 3, dtype = "f16"}) end)
  lu.assertNil(called.tostring, "__tostring was called")
end

-- fa.set_memory_limit(bytes, device): a bad device is argument #2.
function TestHostileBinding:test_device_argument_named()
  local before = fa.memory_limit()
  U.assert_fa_error({"argument #2", "device", "'x'"}, fa.set_memory_limit, 0, "x")
  U.assert_fa_error({"argument #2", "device", "table"}, fa.set_memory_limit, 0, {})
  lu.assertEquals(fa.memory_limit(), before, "the failed call set nothing")
  U.assert_fa_error({"argument #1", "device"}, fa.memory, "x")
  U.assert_fa_error({"argument #1", "device"}, fa.memory_limit, 7)
  U.assert_fa_error({"argument #1", "device"}, fa.reset_peak, "tpu")
  U.assert_fa_error({"argument #1", "device"}, fa.device_info, true)
end

-- The flashattn-lua interpreter has the engine linked in; flashattn.so
-- carries its own copy.  Both in one state shared the tensor metatable:
-- one copy freed the other's tensors (fa.memory() went negative).  The
-- second copy is refused.
function TestHostileBinding:test_second_copy_refused()
  lu.skipIf(package.preload.flashattn == nil, "the module is not the interpreter's linked-in copy")
  local so = package.searchpath("flashattn", package.cpath)
  lu.skipIf(so == nil, "flashattn.so is not on LUA_CPATH")
  local open = assert(package.loadlib(so, "luaopen_flashattn"))
  local m0 = U.mem_current()
  local t = fa.ones(1000)
  U.assert_fa_error({"another copy"}, open)
  U.assert_fa_error({"another copy"}, open) -- and again: nothing half made the first time
  lu.assertEquals(t:sum(), 1000)
  t = nil -- luacheck: ignore
  lu.assertEquals(U.mem_current(), m0)
  lu.assertTrue(fa.memory().current >= 0)
end

-- require "flashattn" again after package.loaded.flashattn = nil makes a second
-- module table; a variant that calls fa.where through the first one was
-- refused as a captured Lua table.
function TestHostileBinding:test_module_loaded_again_keeps_both_tables()
  local q = U.randn({1, 2, 8, 16})
  local want = fa.attention(q, q, q, {causal = "top_left"})
  local loaded = package.loaded.flashattn
  package.loaded.flashattn = nil
  local ok, fb = pcall(require, "flashattn")
  package.loaded.flashattn = loaded
  lu.assertTrue(ok, fb)
  lu.assertNotIs(fb, fa)
  for _, m in ipairs({fa, fb}) do
    local o = m.attention(q, q, q, {score_mod = function(s, b, h, i, j) return m.where(i:ge(j), s, -math.huge) end})
    lu.assertEquals(m.max_abs_diff(o, want), 0)
  end
end

-- A table whose metatable names it a tensor is not one, and the message says what it is.
function TestHostileBinding:test_impostor_named_as_a_table()
  local q = U.randn({1, 2, 8, 16})
  local fake = setmetatable({}, {__name = "flashattn.Tensor"})
  U.assert_fa_error({"argument #1 (q)", "expected flashattn.Tensor, got table"}, fa.attention, fake, q, q)
  U.assert_fa_error({"got table"}, fa.softmax, fake)
end

U.run()
