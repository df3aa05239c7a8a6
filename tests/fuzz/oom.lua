-- Out of memory, at every allocation of every operation (README "Reliability").
--
-- For each operation below, under an engine memory limit
-- (fa.set_memory_limit) that starts at what the engine already holds and
-- rises to exactly what the failing request asked for (the "out of memory"
-- message says how many bytes, and how many the engine held), the call is
-- repeated until it succeeds, so that each of its allocations (tensors,
-- temporaries, the backends' workspaces) is in turn the one that fails.
-- Every failure must be a "flashattn: out of memory" error that leaves the
-- engine holding what it held before; the call that finally succeeds must
-- give the result of an unlimited call; and the next call succeeds.
-- Last, requests larger than the host can give (no limit) fail cleanly.
--
-- Run by tests/c/test_oom.c, which wraps the engine's host allocations, the
-- script also gets a global `fault` (fault.arm(n, from), fault.disarm() ->
-- failures injected) and fails each allocation of each operation in turn:
-- once (the binding collects garbage and retries: the call must succeed
-- with the right result), and from there on (a "flashattn:" error, the
-- engine holding what it held before, the next call fine).
--   flashattn-lua tests/fuzz/oom.lua      (FLASHATTN_OOM_VERBOSE=1: every step)
--   test_oom tests/fuzz/oom.lua           (with injected failures too)
local fa = require "flashattn"
local fault = rawget(_G, "fault")

local VERBOSE = (os.getenv("FLASHATTN_OOM_VERBOSE") or "") ~= ""
local failures, steps, ops = 0, 0, 0
local function fail(name, msg)
  failures = failures + 1
  io.stderr:write(("FAIL %s: %s\n"):format(name, msg))
end

local function held()
  collectgarbage()
  collectgarbage()
  return fa.memory().current
end

-- Compares two results (tensors, numbers, strings, tables of them).
local function same(a, b)
  if fa.is_tensor(a) and fa.is_tensor(b) then
    if a:dtype() ~= b:dtype() or table.concat(a:shape(), "x") ~= table.concat(b:shape(), "x") then return false end
    if a:numel() == 0 then return true end
    local d = fa.max_abs_diff(a:double(), b:double())
    return d == 0 or (d ~= d and not a:isfinite())
  elseif type(a) == "table" and type(b) == "table" then
    if #a ~= #b then return false end
    for i = 1, #a do if not same(a[i], b[i]) then return false end end
    return true
  end
  return a == b or (a ~= a and b ~= b)
end

-- Walks op's allocations; `make` builds fresh inputs, `run(inputs)` the call.
local function walk(name, make, run)
  ops = ops + 1
  local inputs = make()
  local want = table.pack(run(inputs))
  want.n = nil
  local base = held()
  local budget, tries = 0, 0
  while true do
    tries = tries + 1
    if tries > 10000 then fail(name, "no success after 10000 limits") return end
    fa.set_memory_limit(base + budget + 1) -- (+1: a limit of 0 means none)
    local res = table.pack(pcall(run, inputs))
    fa.set_memory_limit(0)
    steps = steps + 1
    if VERBOSE and not res[1] then io.stderr:write(("  %s, limit +%d: %s\n"):format(name, budget, tostring(res[2]))) end
    if res[1] then
      if VERBOSE then io.stderr:write(("%s: succeeded at limit +%d after %d failures\n"):format(name, budget, tries - 1)) end
      table.remove(res, 1)
      res.n = nil
      if not same(res, want) then fail(name, ("the result under a limit of %d bytes differs"):format(budget)) end
      break
    end
    local err = res[2]
    if type(err) ~= "string" or not err:match("^flashattn: out of memory") then
      fail(name, ("limit +%d: expected a flashattn: out of memory error, got %s"):format(budget, tostring(err)))
      return
    end
    res = nil
    local now = held()
    if now ~= base then
      fail(name, ("limit +%d: the engine holds %d bytes after the failure, %d before (%s)"):format(budget, now, base, err))
      return
    end
    -- the next limit: exactly what the failed request needed
    local requested, holding = err:match("(%d+) bytes requested on cpu %(engine holds (%d+)")
    local next_budget = requested and (tonumber(holding) + tonumber(requested) - base) or budget + 64
    budget = next_budget > budget and next_budget or budget + 1
  end
  -- and the next call, unlimited, succeeds
  local ok, err = pcall(run, inputs)
  if not ok then fail(name, "the call after the out-of-memory errors failed: " .. tostring(err)) end
  if not fault then return end

  -- injected failures: allocation n fails for good, then only once
  for n = 1, 100000 do
    base = held()
    fault.arm(n, true)
    local res = table.pack(pcall(run, inputs))
    local hits = fault.disarm()
    steps = steps + 1
    if hits == 0 then -- fewer than n allocations: the call ran to its end
      if not res[1] then fail(name, "no allocation failed, yet: " .. tostring(res[2]))
      else
        table.remove(res, 1)
        res.n = nil
        if not same(res, want) then fail(name, "the result differs") end
      end
      break
    end
    if res[1] then
      fail(name, ("allocation %d failed, and every one after it, yet the call succeeded"):format(n))
    elseif not (type(res[2]) == "string" and res[2]:match("^flashattn:")) then
      fail(name, ("allocation %d failed: an error without the flashattn: prefix: %s"):format(n, tostring(res[2])))
    end
    res = nil
    local now = held()
    if now ~= base then fail(name, ("allocation %d failed: the engine holds %d bytes, %d before"):format(n, now, base)) end
    fault.arm(n, false)
    res = table.pack(pcall(run, inputs))
    fault.disarm()
    steps = steps + 1
    if not res[1] then
      fail(name, ("allocation %d failed once: the retry did not succeed: %s"):format(n, tostring(res[2])))
    else
      table.remove(res, 1)
      res.n = nil
      if not same(res, want) then fail(name, ("allocation %d failed once: the result differs"):format(n)) end
    end
  end
end

local function qkv(dtype, B, Hq, Hkv, Lq, Lk, D)
  return fa.randn(B, Hq, Lq, D, {seed = 1, dtype = dtype}), fa.randn(B, Hkv, Lk, D, {seed = 2, dtype = dtype}),
    fa.randn(B, Hkv, Lk, D, {seed = 3, dtype = dtype})
end

-- ---- constructors ----------------------------------------------------------------
for _, ctor in ipairs({"zeros", "ones", "rand", "randn"}) do
  local opts = (ctor == "rand" or ctor == "randn") and {seed = 1} or nil
  walk("fa." .. ctor, function() return {} end, function() return fa[ctor](3, 5, opts) end)
end
walk("fa.full", function() return {} end, function() return fa.full({4, 4}, 2.5, {dtype = "f16"}) end)
walk("fa.arange", function() return {} end, function() return fa.arange(17, {dtype = "f64"}) end)
walk("fa.tensor", function() return {} end, function() return fa.tensor({{1, 2}, {3, 4}}, {dtype = "bf16"}) end)

-- ---- methods ------------------------------------------------------------------------
local function t35() return {fa.randn(3, 5, {seed = 4}), fa.randn(5, 3, {seed = 5}):transpose()} end
for _, m in ipairs({"clone", "contiguous", "double", "half", "bf16", "float", "cpu", "totable", "sum", "norm", "max",
                    "isfinite"}) do
  walk("t:" .. m .. " (a transposed view)", t35, function(x) return x[2][m](x[2]) end)
end
walk("t:to('bool')", t35, function(x) return x[1]:to("bool") end)
walk("t:reshape (a copy)", t35, function(x) return x[2]:reshape(15) end)
walk("t:copy_ across dtypes and an overlap", function() return {fa.randn(4, 4, {seed = 6})} end,
  function(x) local t = x[1]:clone(); t:copy_(t:transpose()); return t end)
walk("tostring", t35, function(x) return tostring(x[2]) end)
walk("t + t, t * 2, 2 - t, 2 / t, -t", t35, function(x)
  local a, b = x[1], x[2]
  return a + b, a * 2, 2 - a, 2 / b, -a
end)
walk("fa.allclose / rel_error / max_abs_diff", t35, function(x)
  return fa.allclose(x[1], x[2]), fa.rel_error(x[1], x[2]), fa.max_abs_diff(x[1], x[2])
end)

-- ---- kernels ---------------------------------------------------------------------------
-- f64 attention is the CPU's (the reference's); on cuda it is a dtype error
local ON_CUDA = fa.zeros(1):device() == "cuda"
for _, dtype in ipairs({"f32", "f16", "f64"}) do
  for _, algo in ipairs(dtype == "f64" and ON_CUDA and {} or {"naive", "two_pass", "flash_row", "flash"}) do
    walk(("attention %s %s"):format(algo, dtype), function()
      -- views that need copies: q transposed, v narrowed; a float mask to convert
      local q = fa.randn(2, 4, 16, 20, {seed = 1, dtype = dtype}):transpose(3, 4)
      local k = fa.randn(2, 2, 33, 16, {seed = 2, dtype = dtype})
      local v = fa.randn(2, 2, 33, 20, {seed = 3, dtype = dtype}):narrow(4, 3, 16)
      local mask = algo == "flash" and fa.rand(20, 33, {seed = 7}):to("bool") or fa.randn(1, 20, 33, {seed = 7, dtype = "f64"})
      return {q, k, v, mask}
    end, function(x)
      return fa.attention(x[1], x[2], x[3], {algo = algo, causal = true, mask = x[4], return_lse = true,
                                             alibi = {0.1, 0.2, 0.3, 0.4}, kv_lens = {30, 33}, tile = {8, 16}})
    end)
  end
  walk("attention_reference " .. dtype, function() return {qkv(dtype, 1, 2, 1, 9, 12, 8)} end,
    function(x) return fa.attention_reference(x[1], x[2], x[3], {window = {3, 1}, return_lse = true}) end)
end
walk("attention into opts.out (f16, a view)", function()
  local q, k, v = qkv("f16", 1, 2, 2, 10, 10, 8)
  return {q, k, v, fa.zeros(1, 2, 12, 8, {dtype = "f16"}), fa.zeros(1, 2, 10, {dtype = "f32"})}
end, function(x)
  local out = x[4]:narrow(3, 2, 10)
  return fa.attention(x[1], x[2], x[3], {out = out, lse_out = x[5], return_lse = true})
end)
for _, dtype in ipairs({"f32", "bf16", "f64"}) do
  for _, algo in ipairs({"naive", "safe", "online", "fused", "auto"}) do
    walk(("softmax %s %s"):format(algo, dtype), function()
      return {fa.randn(6, 300, {seed = 8, dtype = dtype}):transpose()}
    end, function(x) return fa.softmax(x[1], {algo = algo, block = 64}) end)
  end
end
walk("softmax, a long row (online chunks)", function() return {fa.randn(2, 70000, {seed = 9})} end,
  function(x) return fa.softmax(x[1], {algo = "online"}) end)
for _, algo in ipairs({"naive", "tiled", "blas"}) do
  for _, dtype in ipairs({"f32", "f16"}) do
    walk(("matmul %s %s"):format(algo, dtype), function()
      return {fa.randn(17, 9, {seed = 10, dtype = dtype}), fa.randn(13, 9, {seed = 11, dtype = dtype}):transpose()}
    end, function(x) return fa.matmul(x[1], x[2], {algo = algo, tile = 4}) end)
  end
end
walk("matmul into opts.out that is a", function() return {fa.randn(8, 8, {seed = 12})} end,
  function(x) local a = x[1]:clone(); return fa.matmul(a, a, {out = a}) end)
walk("merge_states", function()
  return {fa.randn(2, 3, 5, {seed = 13, dtype = "f16"}), fa.randn(2, 3, {seed = 14}), fa.randn(2, 3, 5, {seed = 15, dtype = "f16"}),
          fa.randn(2, 3, {seed = 16}):double()}
end, function(x) return fa.merge_states(x[1], x[2], x[3], x[4]:float()) end)

-- ---- Part II: variants (the traced expression is an allocation too), decoding, backward ----------
do
  local q, k, v = qkv("f32", 2, 4, 2, 3, 40, 8)
  local bias = fa.randn(4, 3, 40, {seed = 9})
  local sm = function(s, b, h, i, j) return s + bias[h][i][j] end
  local mm = function(b, h, i, j) return (i * 3):ge(j) end
  walk("attention score_mod + mask_mod", function() return {} end,
    function() return fa.attention(q, k, v, {score_mod = sm, mask_mod = mm, return_lse = true}) end)
  walk("fa.block_mask, and a call with it", function() return {} end, function()
    local bm = fa.block_mask(mm, 2, 4, 3, 40, {tile = {2, 8}})
    return {bm:counts()}, fa.attention(q, k, v, {mask_mod = mm, block_mask = bm, tile = {2, 8}})
  end)
  walk("attention_backward score_mod", function()
    local o, l = fa.attention(q, k, v, {return_lse = true, score_mod = sm})
    return {o, l}
  end, function(x) return fa.attention_backward(q, k, v, x[1], x[2], x[1], {score_mod = sm}) end)
  walk("merge_states of a table, attention splits", function() return {} end, function()
    local os, ls = {}, {}
    for i = 1, 3 do os[i], ls[i] = fa.attention(q, k:narrow(3, 1, 10 * i), v:narrow(3, 1, 10 * i), {return_lse = true}) end
    return fa.merge_states(os, ls), fa.attention(q, k, v, {splits = 3, causal = true, return_lse = true})
  end)
  walk("kv_cache append and attend", function() return {} end, function()
    local c = fa.kv_cache{batch = 2, heads = 2, dim = 8, capacity = 50, page_size = 4}
    c:append(k:narrow(3, 1, 5), v:narrow(3, 1, 5), {5, 2})
    c:append(k:narrow(3, 6, 7):transpose(3, 4):contiguous():transpose(3, 4), v:narrow(3, 6, 7):half(), {7, 3})
    return c:lengths(), c:attend(q, {causal = true, return_lse = true})
  end)
end

-- ---- more than the host can give ------------------------------------------------------------
for _, f in ipairs({
  function() return fa.zeros(2 ^ 42) end,
  function() return fa.full({2 ^ 21, 2 ^ 21}, 1) end,
  function() return fa.randn(2 ^ 40, 64) end,
}) do
  local base = held()
  local ok, err = pcall(f)
  steps = steps + 1
  if ok or not tostring(err):match("^flashattn: out of memory") then
    fail("a request past the host's memory", "expected a flashattn: out of memory error, got " .. tostring(err))
  end
  err = nil
  if held() ~= base then fail("a request past the host's memory", "memory not given back") end
  local q = fa.randn(1, 2, 8, 8, {seed = 1})
  local ok2, o = pcall(fa.attention, q, q, q)
  if not ok2 or not (fa.rel_error(o, fa.attention_reference(q, q, q)) < 1e-5) then
    fail("a request past the host's memory", "the next call failed: " .. tostring(o))
  end
end

collectgarbage()
collectgarbage()
if fa.memory().current ~= 0 then fail("end", ("the engine holds %d bytes"):format(fa.memory().current)) end
print(("oom: %d operations, %d calls under limits%s, %d failures"):format(ops, steps,
  fault and " and injected failures" or "", failures))
if fault then return failures == 0 end -- to tests/c/test_oom.c
os.exit(failures == 0 and 0 or 1, true)
