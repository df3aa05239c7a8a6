-- Scripts that run in the middle of an engine call and free what it is using.
--
-- Lua code can run inside a binding function: an __index metamethod of an
-- opts table, a finalizer (__gc) at any allocation, the finalizers of the
-- full collection the binding runs before retrying an out-of-memory call.
-- Each case below frees (t:free()) the tensors a call holds from there, or
-- hands it tensors that nothing else keeps alive.  Every call must give the
-- right result or a "flashattn:" error, never touch freed memory (run under
-- ASan/valgrind), and the engine must hold nothing at the end.
--   flashattn-lua tests/fuzz/borrow.lua
local fa = require "flashattn"
-- calls of each operation with finalizers that free its tensor (part 3): a
-- finalizer runs at whichever allocation the collector reaches it, so the
-- chance to hit a given one grows with the count (valgrind runs fewer)
local ROUNDS = math.tointeger(tonumber(os.getenv("FLASHATTN_BORROW_ROUNDS") or "")) or 1500

local failures, cases = 0, 0
local function fail(name, msg)
  failures = failures + 1
  io.stderr:write(("FAIL %s: %s\n"):format(name, msg))
end

-- Runs f; an error must be a flashattn one.  Returns ok, result.
local function try(name, f)
  cases = cases + 1
  local ok, r = pcall(f)
  if not ok and not (type(r) == "string" and r:match("^flashattn:")) then
    fail(name, "error without the flashattn: prefix: " .. tostring(r))
  end
  return ok, r
end

local function close(name, got, want, tol)
  local e = fa.rel_error(got, want)
  if not (e <= (tol or 1e-5)) then fail(name, ("rel error %g"):format(e)) end
end

-- an opts table whose every field read runs `hook(key)` first and then
-- answers from `fields`
local function hooked(fields, hook)
  return setmetatable({}, {__index = function(_, key)
    hook(key)
    return fields[key]
  end})
end

collectgarbage()
local mem0 = fa.memory().current

-- ---- 1. __index frees the inputs while the options are read -----------------
do
  local function qkv() return fa.randn(1, 2, 5, 8, {seed = 1}), fa.randn(1, 2, 7, 8, {seed = 2}), fa.randn(1, 2, 7, 8, {seed = 3}) end
  local q, k, v = qkv()
  local want = fa.attention(q, k, v, {causal = true})
  for _, victim in ipairs({"q", "k", "v"}) do
    for _, when in ipairs({"algo", "mask", "kv_lens", "softcap", "lse_out"}) do
      local t = {}
      t.q, t.k, t.v = qkv()
      local opts = hooked({causal = true}, function(key)
        if key == when then t[victim]:free(); collectgarbage() end
      end)
      local name = ("attention: __index('%s') frees %s"):format(when, victim)
      local ok, o = try(name, function() return fa.attention(t.q, t.k, t.v, opts) end)
      if ok then close(name, o, want) end
    end
  end
  -- the reference, the cost model, softmax and matmul the same way
  local x = fa.randn(3, 9, {seed = 4})
  local y = fa.softmax(x)
  local x2 = x:clone()
  local ok, r = try("softmax: __index frees x", function()
    return fa.softmax(x2, hooked({}, function() x2:free(); collectgarbage() end))
  end)
  if ok then close("softmax: __index frees x", r, y) end
  local a, b = fa.randn(4, 5, {seed = 5}), fa.randn(5, 6, {seed = 6})
  local c = fa.matmul(a, b)
  local a2, b2 = a:clone(), b:clone()
  ok, r = try("matmul: __index frees a, b", function()
    return fa.matmul(a2, b2, hooked({}, function() a2:free(); b2:free(); collectgarbage() end))
  end)
  if ok then close("matmul: __index frees a, b", r, c) end
  local q3, k3, v3 = qkv()
  ok, r = try("attention_reference: __index frees q", function()
    return fa.attention_reference(q3, k3, v3, hooked({causal = true}, function() q3:free(); collectgarbage() end))
  end)
  if ok then close("attention_reference: __index frees q", r, want) end
  local q4, k4, v4 = qkv()
  try("cost.attention: __index frees q, k, v", function()
    return fa.cost.attention(q4, k4, v4, hooked({}, function() q4:free(); k4:free(); v4:free(); collectgarbage() end))
  end)
  local x4 = x:clone()
  try("cost.softmax: __index frees x", function()
    return fa.cost.softmax(x4, hooked({}, function() x4:free(); collectgarbage() end))
  end)
end

-- ---- 2. __index hands out tensors that nothing else keeps alive -------------
do
  local q, k, v = fa.randn(1, 2, 5, 8, {seed = 7}), fa.randn(1, 2, 7, 8, {seed = 8}), fa.randn(1, 2, 7, 8, {seed = 9})
  local mask = fa.randn(5, 7, {seed = 10})
  local want = fa.attention(q, k, v, {mask = mask})
  local opts = setmetatable({}, {__index = function(_, key)
    if key == "mask" then return mask:clone() end   -- a temporary: garbage once read
    if key == "out" then return fa.full({1, 2, 5, 8}, 0 / 0) end
    if key == "alibi" then return fa.zeros(2) end
    collectgarbage()                                -- collects the temporaries handed out so far
  end})
  local ok, o = try("attention: temporaries from __index", function() return fa.attention(q, k, v, opts) end)
  if ok then close("attention: temporaries from __index", o, want) end
  local x = fa.randn(4, 6, {seed = 11})
  ok, o = try("softmax: out from __index", function()
    return fa.softmax(x, setmetatable({}, {__index = function(_, key)
      if key == "out" then return fa.zeros(4, 6) end
      collectgarbage()
    end}))
  end)
  if ok then close("softmax: out from __index", o, fa.softmax(x)) end
end

-- ---- 3. finalizers that free a call's tensors at any allocation --------------
do
  -- Finalizers that free the tensor of the call under way ("current").  New
  -- objects survive the cycle they are made in, so garbage made just before a
  -- call is finalized after it; instead a ring of old objects with such
  -- finalizers is kept, and each call lets a few of them die.  With the
  -- collector's pause at 0 a step runs at nearly every allocation, and the
  -- dead ones' finalizers run at whichever of the call's allocations comes
  -- when the cycle reaches them.
  local current
  local ring, head = {}, 0
  local function bomb() return setmetatable({}, {__gc = function() if current then current:free() end end}) end
  for i = 1, 64 do ring[i] = bomb() end
  local function doomed(t)
    current = t
    for _ = 1, 4 do
      head = head % #ring + 1
      ring[head] = bomb()
    end
  end
  local ops = {
    reshape = function() local t = fa.randn(4, 6):transpose(1, 2); doomed(t); return t:reshape(24) end,
    shape = function() local t = fa.randn(4, 6, 2); doomed(t); return t:shape() end,
    totable = function() local t = fa.randn(4, 6); doomed(t); return t:totable() end,
    tostring = function() local t = fa.randn(40, 60); doomed(t); return tostring(t) end,
    allclose = function() local a, b = fa.randn(40, 6), fa.randn(40, 6); doomed(a); doomed(b); return fa.allclose(a, b) end,
    rsub = function() local t = fa.randn(40, 6); doomed(t); return 1 - t end,
    rdiv = function() local t = fa.randn(40, 6); doomed(t); return 1 / t end,
    copy = function() local a, b = fa.randn(40, 6), fa.randn(6, 40):transpose(); doomed(a); doomed(b); return a:copy_(b) end,
    alibi = function()
      local q = fa.randn(1, 2, 4, 8); local al = fa.tensor({0.1, 0.2}); doomed(al)
      return fa.attention(q, q, q, {alibi = al, kv_lens = {4}})
    end,
    attention = function()
      local q, k, v = fa.randn(1, 2, 4, 8), fa.randn(1, 2, 4, 8), fa.randn(1, 2, 4, 8)
      doomed(q); doomed(k); doomed(v)
      return fa.attention(q, k, v, {kv_lens = {3}, alibi = {0.1, 0.2}, return_lse = true})
    end,
    merge = function()
      local o1, o2, l1, l2 = fa.randn(3, 4), fa.randn(3, 4), fa.randn(3), fa.randn(3)
      doomed(o1); doomed(l2)
      return fa.merge_states(o1, l1, o2, l2)
    end,
    matmul = function() local a, b = fa.randn(8, 8), fa.randn(8, 8); doomed(a); doomed(b); return fa.matmul(a, b, {out = fa.zeros(8, 8)}) end,
  }
  -- every method, on a tensor that finalizers free while the method runs
  local method_args = {
    shape = {}, size = {2}, dim = {}, numel = {}, dtype = {}, device = {}, to = {"f64"}, cpu = {}, float = {},
    half = {}, bf16 = {}, double = {}, clone = {}, contiguous = {}, is_contiguous = {}, totable = {}, sum = {},
    max = {}, min = {}, norm = {}, isfinite = {}, fill_ = {2}, get = {1, 2}, set = {1, 2, 3}, view = {-1},
    reshape = {3, -1}, select = {1, 2}, narrow = {2, 1, 2}, transpose = {}, add = {1}, sub = {1}, mul = {2},
    div = {2}, free = {},
  }
  for name, args in pairs(method_args) do
    ops["t:" .. name] = function()
      local t = fa.randn(3, 4, {seed = 1})
      if name == "reshape" then t = t:transpose() end
      doomed(t)
      return t[name](t, table.unpack(args))
    end
  end
  ops["tostring(t), #t, t[1], t[1] = 0, -t"] = function()
    local t = fa.randn(3, 4); doomed(t)
    local s, n, row = tostring(t), #t, t[1]
    t[1] = 0
    return s, n, row, -t
  end

  local names = {}
  for name in pairs(ops) do names[#names + 1] = name end
  table.sort(names)
  collectgarbage("incremental", 0, 1000, 0)
  for _, name in ipairs(names) do
    for _ = 1, ROUNDS do try("finalizer frees: " .. name, ops[name]) end
  end
  collectgarbage("incremental", 200, 100, 13) -- Lua's defaults
end

-- ---- 4. the collection before an out-of-memory retry frees the tensor ---------
do
  local function doomed(t) setmetatable({}, {__gc = function() t:free() end}) end
  local calls = {
    ["t:double()"] = function(t) return t:double() end,
    ["t:clone()"] = function(t) return t:clone() end,
    ["t:contiguous()"] = function(t) return t:transpose(1, 2):contiguous() end,
    ["t + 1"] = function(t) return t + 1 end,
    ["t * t"] = function(t) return t * t end,
    ["2 / t"] = function(t) return 2 / t end,
    ["fa.softmax(t)"] = function(t) return fa.softmax(t) end,
    ["fa.matmul(t, t)"] = function(t) return fa.matmul(t, t) end,
  }
  local names = {}
  for name in pairs(calls) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    collectgarbage()
    local t = fa.randn(64, 64)
    local held = fa.memory().current
    fa.set_memory_limit(held + 1024) -- t fits, its result does not
    doomed(t)
    local ok = try("oom retry: " .. name, function() return calls[name](t) end)
    fa.set_memory_limit(0)
    if ok then fail("oom retry: " .. name, "succeeded under a limit it cannot fit") end
  end
end

-- ---- 5. a coroutine that dies inside a call, its pins still taken --------------------
-- (Lua closes a dead coroutine's to-be-closed slots only on coroutine.close;
-- the collector releases the pins otherwise)
if coroutine then
  for _, close in ipairs({false, true}) do
    local co = coroutine.create(function()
      local q = fa.randn(1, 2, 6, 8)
      return fa.attention(q, q, q, setmetatable({}, {__index = function(_, key)
        if key == "softcap" then error("fuzz-boom in a coroutine") end
      end}))
    end)
    local ok, err = coroutine.resume(co)
    cases = cases + 1
    if ok or not tostring(err):find("fuzz%-boom") then fail("coroutine", "expected its error, got " .. tostring(err)) end
    if close then coroutine.close(co) end
    co = nil
  end
end

collectgarbage()
collectgarbage()
local mem1 = fa.memory().current
if mem1 ~= mem0 then fail("end", ("the engine holds %d bytes, %d at the start"):format(mem1, mem0)) end
print(("borrow: %d cases, %d failures"):format(cases, failures))
os.exit(failures == 0 and 0 or 1, true)
