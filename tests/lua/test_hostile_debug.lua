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

-- The first value on the stack of a running call (any level) whose
-- metatable has the __name given (the debug library's reach into a call).
local function find_on_stack(name)
  for level = 2, 40 do
    if not debug.getinfo(level, "S") then return nil end
    for i = 1, 80 do
      local n, v = debug.getlocal(level, i)
      if not n then break end
      local mt = type(v) == "userdata" and debug.getmetatable(v)
      if mt and rawget(mt, "__name") == name then return v end
    end
  end
end

-- What a tester reached after the first suite: a box made while the script
-- stopped the collector, a pin list's metatable taken during a call (pins
-- are on no list either then), a block mask's expression holder given the
-- block mask's metatable, userdata of the call's own buffers (whose bytes a
-- script chooses: kv_lens) given the tensor and block-mask metatables, the
-- expression metatable's __index called on a number, and expressions kept
-- from a trace that raised.  Each is a flashattn: error or harmless.
function TestHostileDebug:test_debug_library_routes_of_a_tester()
  local dbg = debug
  if not dbg or not dbg.setmetatable then return end
  collectgarbage("stop")
  local t = fa.zeros({4})
  collectgarbage("restart")
  dbg.setmetatable(t, nil)
  t = nil
  collectgarbage()
  collectgarbage()
  lu.assertEquals(fa.softmax(fa.ones({4})):totable()[1], 0.25)
  -- a pin list's metatable taken while the call runs
  local opts = setmetatable({}, {__index = function(_, k)
    if k == "algo" then
      local p = find_on_stack("flashattn.Pins")
      if p then dbg.setmetatable(p, {__close = function() end}) end
    end
  end})
  pcall(fa.softmax, fa.ones({4}), opts)
  collectgarbage()
  collectgarbage()
  lu.assertEquals(fa.softmax(fa.ones({4})):totable()[1], 0.25)
  -- one kind of handle given another's metatable
  local bm = fa.block_mask(function(b, h, q, k) return q:ge(k) end, 1, 1, 16, 16, {tile = {16, 16}})
  local holder = dbg.getuservalue(bm, 1)
  local holder_mt = dbg.getmetatable(holder)
  dbg.setmetatable(holder, dbg.getmetatable(bm))
  for _, m in ipairs({"sizes", "counts", "tile"}) do
    local ok, err = pcall(function() return holder[m](holder, 1, 1, 1, 1) end)
    lu.assertFalse(ok, m)
    lu.assertStrContains(tostring(err), "flashattn:")
  end
  dbg.setmetatable(holder, holder_mt)
  lu.assertEquals(bm:sizes(), 1)
  -- the call's own buffers given module metatables
  local tensor_mt, block_mt = dbg.getmetatable(fa.zeros(1)), dbg.getmetatable(bm)
  for _, mt in ipairs({tensor_mt, block_mt}) do
    -- globals: a variant may not capture Lua tables (the debug library, the list)
    FORGE_MT, FORGED = mt, {}
    local q = fa.randn({1, 1, 4, 8})
    pcall(fa.attention, q, q, q, {
      kv_lens = {0x66614278, 0x414141414140, 0, 0, 0},
      score_mod = function(s)
        for level = 2, 8 do
          if not debug.getinfo(level, "S") then break end
          for i = 1, 60 do
            local n, v = debug.getlocal(level, i)
            if not n then break end
            if type(v) == "userdata" and debug.getmetatable(v) == nil then
              debug.setmetatable(v, FORGE_MT)
              FORGED[#FORGED + 1] = v
            end
          end
        end
        return s
      end,
    })
    local forged = FORGED
    FORGE_MT, FORGED = nil, nil
    lu.assertTrue(#forged > 0, "the test reached no buffer")
    for _, v in ipairs(forged) do
      lu.assertFalse(fa.is_tensor(v))
      lu.assertFalse(pcall(function() return v:dim() end))
      dbg.setmetatable(v, nil)
    end
    collectgarbage()
  end
  -- the expression metatable's __index on a number; expressions kept from a trace that raised
  local q = fa.randn({1, 1, 4, 8})
  local expr_mt, kept
  fa.attention(q, q, q, {score_mod = function(s) EXPR_MT = debug.getmetatable(s) return s end})
  expr_mt, EXPR_MT = EXPR_MT, nil
  local ok, err = pcall(rawget(expr_mt, "__index"), 0x41414140, "abs")
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err), "flashattn:")
  lu.assertFalse(pcall(fa.attention, q, q, q, {score_mod = function(s) kept = s; error("boom") end}))
  ok, err = pcall(function() return kept + 1 end)
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err), "used after the call")
end

U.run()
