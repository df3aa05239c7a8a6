-- Scripts that use the debug library against the binding: it reaches what
-- getmetatable does not (tests/lua/test_hostile_binding.lua has the rest).
-- The binding's promise for it is smaller: no crash, no read of another
-- userdata as the module's own, and the engine goes on; a box freed without
-- its finalizer leaks what it held, so that LeakSanitizer is off for this
-- file (tests/CMakeLists.txt).
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu

TestHostileDebug = {}

-- The debug library reaches what getmetatable does not: a tensor's, a
-- kv_cache's and a block mask's metatable taken away (Lua then frees the box
-- without its finalizer: what it held leaks, nothing may point into it), the
-- module's metatables given to other userdata (never read as the module's
-- own), their finalizers called by hand.  No crash (the ASan and valgrind
-- stages run this file), and the engine goes on.
function TestHostileDebug:test_debug_library_cannot_crash()
  local dbg = debug
  if not dbg or not dbg.setmetatable then return end
  local tensor_mt = dbg.getmetatable(fa.zeros(1))
  local cache = fa.kv_cache({batch = 1, heads = 1, dim = 4, capacity = 16, page_size = 16})
  local cache_mt = dbg.getmetatable(cache)
  local mask = fa.block_mask(function(b, h, q, k) return q:ge(k) end, 1, 1, 16, 16, {tile = {16, 16}})
  local mask_mt = dbg.getmetatable(mask)
  for _ = 1, 3 do
    local t = fa.randn({4, 4})
    dbg.setmetatable(t, nil) -- freed without __gc at the next collection
    local c = fa.kv_cache({batch = 1, heads = 1, dim = 4, capacity = 16, page_size = 16})
    dbg.setmetatable(c, nil)
    local m = fa.block_mask(function(b, h, q, k) return q:ge(k) end, 1, 1, 16, 16, {tile = {16, 16}})
    dbg.setmetatable(m, nil)
    collectgarbage()
    collectgarbage()
    local a, b = fa.ones({3}), fa.ones({3}) -- boxes made after the freed ones
    lu.assertEquals((a + b):totable(), {2, 2, 2})
  end
  -- other userdata with the module's metatables
  for _, mt in ipairs({tensor_mt, cache_mt, mask_mt}) do
    do
      local u = io.tmpfile()
      dbg.setmetatable(u, mt)
      lu.assertFalse(pcall(fa.attention, u, u, u))
      lu.assertFalse(pcall(fa.attention, fa.ones({1, 2, 4}), fa.ones({1, 2, 4}), fa.ones({1, 2, 4}), {block_mask = u}))
      for _, name in ipairs({"__gc", "__close", "__tostring", "__len", "__index"}) do
        local f = rawget(mt, name)
        if type(f) == "function" then pcall(f, u, 1) end
      end
      if rawget(mt, "__index") then pcall(function() return u:shape() end) end
      dbg.setmetatable(u, nil)
    end
  end
  -- a finalizer called by hand, then the real one
  local t = fa.ones({2})
  rawget(tensor_mt, "__gc")(t)
  lu.assertFalse(pcall(function() return t:totable() end))
  t = nil
  collectgarbage()
  collectgarbage()
  lu.assertEquals(fa.ones({2}):totable(), {1, 1})
  lu.assertEquals(cache:lengths(), {0})
  lu.assertNotNil(mask)
end

U.run()
