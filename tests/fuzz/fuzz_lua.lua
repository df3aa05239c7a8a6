-- A seeded fuzzer of the Lua API (README "Reliability").
--
--   flashattn-lua tests/fuzz/fuzz_lua.lua
--   FLASHATTN_FUZZ_SEED=n      replay the run that printed seed n
--   FLASHATTN_FUZZ_ITERS=n     calls to make (default 10000)
--   FLASHATTN_FUZZ_VERBOSE=1   print each call before it runs (to find the
--                              last one before a crash)
--
-- Each iteration makes one random call of the API: constructors, methods,
-- arithmetic, the kernels with random shapes, dtypes, views and options
-- (valid, borderline and invalid), wrong types in every argument slot,
-- freed tensors, huge sizes, NaN/inf data, tight memory limits, and script
-- code (finalizers, __index metamethods) that frees tensors while a call is
-- using them.  Every call must either
--   - succeed, when its arguments are valid, with a result that matches an
--     independent computation: a plain-Lua f64 one (softmax, matmul,
--     merge_states, small attentions), else fa.attention_reference (and
--     fa.attention_backward_reference for fa.attention_backward); rows
--     that the reference gives finite must match even when other rows hold
--     NaN/inf (NaN propagates only to the rows it touches);
--   - or raise an error whose message starts "flashattn:" (always, when
--     the arguments are invalid).
-- Outputs written through a view must leave the rest of the viewed tensor
-- untouched, and inputs must not change.  Every few hundred calls all
-- tensors are dropped and the engine must hold no memory (fa.memory()).
-- Crashes, leaks and bad memory accesses are for ASan/UBSan and valgrind,
-- which run this script in CI (tests/CMakeLists.txt).
--
-- A failure prints the seed and the iteration; the run is deterministic, so
-- FLASHATTN_FUZZ_SEED=<seed> FLASHATTN_FUZZ_ITERS=<iteration> stops right
-- after the failing call.
local fa = require "flashattn"

local SEED = math.tointeger(tonumber(os.getenv("FLASHATTN_FUZZ_SEED") or ""))
if not SEED then SEED = (os.time() * 7919 + math.floor(os.clock() * 1e6)) % 1000000007 end
local ITERS = math.tointeger(tonumber(os.getenv("FLASHATTN_FUZZ_ITERS") or "")) or 10000
local VERBOSE = (os.getenv("FLASHATTN_FUZZ_VERBOSE") or "") ~= ""
local DEV = os.getenv("FLASHATTN_DEVICE")
if DEV == nil or DEV == "" then DEV = "cpu" end
local OTHER_DEV = DEV == "cpu" and "cuda" or "cpu"
local HAS_OTHER = false
for _, b in ipairs(fa.backends()) do if b == OTHER_DEV then HAS_OTHER = true end end

-- A cap on what the engine may hold, so that a weird argument such as 2^31
-- in a shape costs an error rather than 8 GiB; the calls that test the
-- host's own refusal lift it (sizes no host has).
local BASE_LIMIT = 512 * 1024 * 1024
fa.set_memory_limit(BASE_LIMIT)

io.stderr:write(("fuzz_lua: seed %d, %d calls on %s (FLASHATTN_FUZZ_SEED=%d replays)\n"):format(SEED, ITERS, DEV, SEED))
math.randomseed(SEED)

-- ---- random helpers ------------------------------------------------------------
local function R(a, b) if b then return math.random(a, b) end return math.random(a) end
local function chance(p) return math.random() < p end
local function pick(list) return list[math.random(#list)] end
local function seed() return math.random(0, 2^40) end

local NaN, inf = 0 / 0, math.huge
local FLOAT_DTYPES = {"f32", "f32", "f64", "f16", "bf16"}
local ALL_DTYPES = {"f32", "f64", "f16", "bf16", "bool"}

-- ---- failures ---------------------------------------------------------------------
local iter, label = 0, ""
local failures, MAX_FAILURES = 0, 20
local stats = {calls = 0, ok = 0, errors = 0, checked = 0}

local function fail(msg)
  failures = failures + 1
  io.stderr:write(("FAIL [seed %d, iteration %d] %s: %s\n"):format(SEED, iter, label, msg))
  if failures >= MAX_FAILURES then
    io.stderr:write("fuzz_lua: too many failures, stopping\n")
    os.exit(1, true)
  end
end

local function is_fa_error(e) return type(e) == "string" and e:sub(1, 10) == "flashattn:" end
-- errors raised on purpose by the fuzzer's own metamethods
local function is_own_error(e) return type(e) == "string" and e:find("fuzz%-boom") ~= nil end

-- ---- values ---------------------------------------------------------------------------
-- Flat row-major array of a tensor's values (bool as 1/0).
local function flat(t) return t:reshape({ t:numel() }):cpu():totable() end

local function finite(x) return x == x and x ~= inf and x ~= -inf end

local function prod(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

local function shape_str(shape)
  local p = {}
  for i, s in ipairs(shape) do p[i] = tostring(s) end
  return table.concat(p, "x")
end

local function maxabs(a)
  local m = 0
  for _, x in ipairs(a) do
    if finite(x) and math.abs(x) > m then m = math.abs(x) end
  end
  return m
end

-- The largest Euclidean norm of the rows of n values in a (non-finite values left out).
local function max_row_norm(a, n)
  local m = 0
  for r = 0, #a // n - 1 do
    local ss = 0
    for c = 1, n do
      local x = a[r * n + c]
      if finite(x) then ss = ss + x * x end
    end
    if ss > m then m = ss end
  end
  return math.sqrt(m)
end

-- "tensor 2x3 f32", "freed tensor", or the type.
local function describe(t)
  if not fa.is_tensor(t) then return type(t) end
  local ok, s = pcall(t.shape, t)
  if not ok then return "freed tensor" end
  return "tensor " .. shape_str(s) .. " " .. t:dtype()
end

-- ---- the tensor pool ---------------------------------------------------------------------
-- Tensors that random calls pick from (some freed, some views).
local pool = {}
local POOL_MAX = 40

local function remember(t)
  if fa.is_tensor(t) then
    if #pool >= POOL_MAX then table.remove(pool, R(#pool)) end
    pool[#pool + 1] = t
  end
  return t
end

local function pool_pick()
  if #pool == 0 then return fa.zeros(1, {device = DEV}) end
  return pool[R(#pool)]
end

local function random_shape(rank, maxsize)
  local shape = {}
  maxsize = maxsize or 9
  for i = 1, rank do
    shape[i] = chance(0.05) and 0 or R(1, maxsize)
  end
  return shape
end

-- Values for a tensor: tame normals (scaled), or tame with a few NaN/±inf.
local function fill_special(t, n)
  local shape = t:shape()
  if prod(shape) == 0 then return end
  for _ = 1, n do
    local idx = {}
    for i, s in ipairs(shape) do idx[i] = R(s) end
    idx[#idx + 1] = pick({NaN, inf, -inf})
    t:set(table.unpack(idx))
  end
end

-- A tensor of `shape`, maybe a non-contiguous view of a larger one: a
-- narrow, a transpose, or a select.  wild: a few NaN/±inf elements.
local function make(shape, dtype, opts)
  opts = opts or {}
  local device = opts.device or DEV
  local scale = opts.scale or 1
  local base_dtype = dtype == "bool" and "f32" or dtype
  local function fresh(sh)
    local t
    if dtype == "bool" then
      t = fa.rand(sh, {seed = seed(), device = device})
      t = (t - 0.3):to("bool") -- mostly true
    else
      t = fa.randn(sh, {seed = seed(), dtype = base_dtype, device = device})
      if scale ~= 1 then t = t * scale end
    end
    return t
  end
  local t
  local rank = #shape
  local how = opts.contiguous and 0 or R(0, 5)
  if how == 1 and rank >= 1 then -- narrow of a larger dimension
    local d = R(rank)
    local big = {table.unpack(shape)}
    local extra = R(1, 3)
    big[d] = big[d] + extra
    t = fresh(big):narrow(d, R(1, extra + 1), shape[d])
  elseif how == 2 and rank >= 2 then -- transpose of the swapped shape
    local d1, d2 = R(rank), R(rank)
    local sw = {table.unpack(shape)}
    sw[d1], sw[d2] = sw[d2], sw[d1]
    t = fresh(sw):transpose(d1, d2)
  elseif how == 3 and rank <= 3 then -- a select of one more dimension
    local big = {table.unpack(shape)}
    local d = R(rank + 1)
    table.insert(big, d, R(1, 3))
    t = fresh(big):select(d, R(big[d]))
  else
    t = fresh(shape)
  end
  if opts.wild and dtype ~= "bool" then fill_special(t, R(1, 3)) end
  return t
end

-- ---- weird values for argument slots ---------------------------------------------------------
local freed_tensor = fa.zeros(2, {device = DEV})
freed_tensor:free()
local other_udata = io.stdout
local WEIRD = {
  "nil", true, false, 0, -1, 1, 2, 1.5, -0.0, 2 ^ 31, 2 ^ 53, 2 ^ 63, -2 ^ 63, math.maxinteger, math.mininteger,
  inf, -inf, NaN, "", "f32", "bool", "cuda", "cpu", "x", "flash", string.rep("a", 200), {}, {1}, {1, 2}, {-1, -1},
  {1, 2, 3, 4, 5}, {{1}}, {a = 1}, {0 / 0, 1}, function() end, "freed", "udata", "tensor", "boom", "thread",
}
local function weird()
  local w = pick(WEIRD)
  if w == "nil" then return nil end
  if w == "freed" then return freed_tensor end
  if w == "udata" then return other_udata end
  if w == "tensor" then return pool_pick() end
  if w == "thread" then return coroutine.create(function() end) end
  if w == "boom" then return setmetatable({}, {__index = function() error("fuzz-boom") end}) end
  return w
end

-- ---- running a call ---------------------------------------------------------------------------
-- expect: "ok" (must succeed), "error" (must raise a flashattn: error) or
-- "any".  check(results...) verifies a success.
local function call(expect, f, check)
  stats.calls = stats.calls + 1
  if VERBOSE then io.stderr:write(("[%d] %s\n"):format(iter, label)) end
  local c0 = os.clock()
  local res = table.pack(pcall(f))
  if VERBOSE and os.clock() - c0 > 0.5 then io.stderr:write(("  (%.2f s)\n"):format(os.clock() - c0)) end
  if res[1] then
    stats.ok = stats.ok + 1
    if expect == "error" then
      fail("succeeded, expected a flashattn: error")
    elseif check then
      local ok, err = pcall(check, table.unpack(res, 2, res.n))
      if ok then
        stats.checked = stats.checked + 1
      elseif not (type(err) == "string" and err:find("has been freed")) then -- a finalizer freed what we check
        fail("wrong result: " .. tostring(err))
      end
    end
  else
    stats.errors = stats.errors + 1
    local e = res[2]
    if not is_fa_error(e) and not is_own_error(e) then
      fail("error without the flashattn: prefix: " .. tostring(e))
    elseif expect == "ok" and not is_own_error(e) then
      fail("failed on valid arguments: " .. tostring(e))
    end
  end
  return res[1], res[2]
end

-- ---- tolerances -------------------------------------------------------------------------------
-- |got - want| allowed relative to the scale of the values combined.
local TOL = {f32 = 3e-5, f64 = 1e-9, f16 = 3e-3, bf16 = 1.6e-2}
local LSE_TOL = {f32 = 1e-4, f64 = 2e-6, f16 = 1e-4, bf16 = 1e-4}

-- Compares rows of n values; a row whose reference is all finite must match
-- within tol (absolute); rows with NaN/inf in the reference are skipped.
local function compare_rows(got, want, nrows, n, tol, what)
  for r = 0, nrows - 1 do
    local fin = true
    for c = 1, n do
      if not finite(want[r * n + c]) then fin = false break end
    end
    if fin then
      for c = 1, n do
        local g, w = got[r * n + c], want[r * n + c]
        if not (math.abs(g - w) <= tol) then
          error(("%s: row %d, element %d: got %s, expected %s (tolerance %g)"):format(what, r + 1, c, g, w, tol))
        end
      end
    end
  end
end

-- ---- plain-Lua references -------------------------------------------------------------------

local function tanh(x)
  if x > 20 then return 1 elseif x < -20 then return -1 end
  local e = math.exp(-2 * math.abs(x))
  local t = (1 - e) / (1 + e)
  return x < 0 and -t or t
end

-- Attention on flat arrays: dm = {B, Hq, Hkv, Lq, Lk, D, Dv}; o = resolved
-- options (scale, causal 0/1/2, window {l, r} or nil, kv_lens, alibi,
-- softcap, mask = {v = flat, shape = 4 sizes (right-aligned, 1 = broadcast), bool}).
local function lua_attention(q, k, v, dm, o)
  local B, Hq, Hkv, Lq, Lk, D, Dv = table.unpack(dm)
  local out, lse = {}, {}
  local group = Hq // Hkv
  local mstride
  if o.mask then
    local ms = o.mask.shape
    mstride = {ms[2] * ms[3] * ms[4], ms[3] * ms[4], ms[4], 1}
    for i = 1, 4 do if ms[i] == 1 then mstride[i] = 0 end end
  end
  local s = {}
  for b = 0, B - 1 do
    for h = 0, Hq - 1 do
      local hk = h // group
      for i = 0, Lq - 1 do
        local row = (b * Hq + h) * Lq + i
        local diag = i + Lk - Lq
        local mx, has_nan = -inf, false
        for j = 0, Lk - 1 do
          local ok = true
          if o.kv_lens and j >= o.kv_lens[b + 1] then ok = false end
          if o.causal == 1 and j > diag then ok = false end
          if o.causal == 2 and j > i then ok = false end
          if o.window then
            local l, r = o.window[1], o.window[2]
            if l >= 0 and j < diag - l then ok = false end
            if r >= 0 and j > diag + r then ok = false end
          end
          local midx
          if o.mask then midx = b * mstride[1] + h * mstride[2] + i * mstride[3] + j * mstride[4] + 1 end
          if ok and o.mask and o.mask.bool and o.mask.v[midx] == 0 then ok = false end
          local sc = -inf
          if ok then
            local dot = 0
            local qo, ko = row * D, ((b * Hkv + hk) * Lk + j) * D
            for e = 1, D do dot = dot + q[qo + e] * k[ko + e] end
            sc = dot * o.scale
            if o.softcap > 0 then sc = o.softcap * tanh(sc / o.softcap) end
            if o.alibi then sc = sc - o.alibi[h + 1] * math.abs(i + Lk - Lq - j) end
            if o.mask and not o.mask.bool then sc = sc + o.mask.v[midx] end
          end
          s[j] = sc
          if sc ~= sc then has_nan = true elseif sc > mx then mx = sc end
        end
        local oo = row * Dv
        if has_nan or mx == -inf then
          for e = 1, Dv do out[oo + e] = has_nan and NaN or 0 end
          lse[row + 1] = has_nan and NaN or -inf
        else
          local sum = 0
          for e = 1, Dv do out[oo + e] = 0 end
          for j = 0, Lk - 1 do
            if s[j] ~= -inf then
              local w = math.exp(s[j] - mx)
              sum = sum + w
              local vo = ((b * Hkv + hk) * Lk + j) * Dv
              for e = 1, Dv do out[oo + e] = out[oo + e] + w * v[vo + e] end
            end
          end
          for e = 1, Dv do out[oo + e] = out[oo + e] / sum end
          lse[row + 1] = mx + math.log(sum)
        end
      end
    end
  end
  return out, lse
end

local function lua_softmax_rows(x, rows, n)
  local y = {}
  for r = 0, rows - 1 do
    local mx, has_nan = -inf, false
    for c = 1, n do
      local v = x[r * n + c]
      if v ~= v then has_nan = true elseif v > mx then mx = v end
    end
    if has_nan then
      for c = 1, n do y[r * n + c] = NaN end
    elseif mx == -inf then
      for c = 1, n do y[r * n + c] = 0 end
    else
      local sum = 0
      for c = 1, n do sum = sum + math.exp(x[r * n + c] - mx) end
      for c = 1, n do y[r * n + c] = math.exp(x[r * n + c] - mx) / sum end
    end
  end
  return y
end

-- ---- generators: kernels ----------------------------------------------------------------------

-- Builds an attention problem; returns label, expect, the call, a check.
local function gen_attention()
  local rank = pick({2, 3, 4, 4})
  local B = rank == 4 and R(1, 2) or 1
  local Hkv = rank >= 3 and R(1, 2) or 1
  local Hq = Hkv * (rank >= 3 and R(1, 2) or 1)
  local Lq = chance(0.04) and 0 or R(1, 12)
  local Lk = chance(0.04) and 0 or R(1, 14)
  local D, Dv = R(1, 9), R(1, 9)
  if chance(0.05) then -- past the default tiles (128 x 256) and the threading thresholds
    Lq, Lk, D, Dv = R(100, 300), R(200, 600), R(16, 64), R(16, 64)
  end
  local alias_out = chance(0.1) -- opts.out is one of the inputs
  if alias_out then Lk, Dv, Hq = Lq, D, Hkv end -- out can be q, k or v
  local dtype = pick(FLOAT_DTYPES)
  local wild = chance(0.2)
  local function shp(h, l, d)
    if rank == 4 then return {B, h, l, d} elseif rank == 3 then return {h, l, d} end
    return {l, d}
  end
  local expect, why, label_extra = "ok", {}, ""
  local function bad(reason) expect = "error"; why[#why + 1] = reason end

  if chance(0.03) then
    if chance(0.5) then D = 0 else Dv = 0 end
    bad("a head dimension of 0")
  end
  local qs, ks, vs = shp(Hq, Lq, D), shp(Hkv, Lk, D), shp(Hkv, Lk, Dv)
  local qd, kd, vd = dtype, dtype, dtype
  local qdev, kdev = DEV, DEV
  local m = R(1, 30)
  if m == 1 then ks = shp(Hkv, Lk, D + 1); bad("k's D differs")
  elseif m == 2 then vs = shp(Hkv, Lk + 1, Dv); bad("v's Lk differs")
  elseif m == 3 and rank >= 3 and Hq > 1 then ks = shp(Hq + 1, Lk, D); vs = shp(Hq + 1, Lk, Dv); bad("Hq % Hkv")
  elseif m == 4 then kd = pick({"f32", "f64", "f16", "bf16", "bool"}); if kd ~= dtype then bad("k's dtype") end
  elseif m == 5 then qd, kd, vd = "bool", "bool", "bool"; bad("bool inputs")
  elseif m == 6 then ks = {Lk, D}; if rank ~= 2 then bad("k's rank") end
  elseif m == 7 then qs = {D}; bad("q 1-D")
  elseif m == 8 and HAS_OTHER then kdev = OTHER_DEV; bad("k on the other device")
  elseif m == 9 and rank == 4 then vs = {B + 1, Hkv, Lk, Dv}; bad("v's batch")
  end

  local q = make(qs, qd, {wild = wild, scale = R(1, 3), device = qdev})
  local k = make(ks, kd, {wild = wild and chance(0.5), scale = R(1, 3), device = kdev})
  local v = make(vs, vd, {wild = wild and chance(0.5), scale = R(1, 3)})

  local o = {}
  local res = {scale = 1 / math.sqrt(D), causal = 0, softcap = 0}
  local algo = pick({false, "auto", "naive", "two_pass", "flash_row", "flash"})
  if algo then o.algo = algo end
  if chance(0.3) then
    local s = pick({1, 0.5, 0, -1, 1e-3, 2, 0.125})
    o.scale, res.scale = s, s
  end
  if chance(0.4) then
    local c = pick({false, true, "bottom_right", "top_left"})
    o.causal = c
    res.causal = (c == true or c == "bottom_right") and 1 or c == "top_left" and 2 or 0
  end
  if chance(0.25) then
    local w = {pick({-1, 0, 1, 2, 5, 100, 2 ^ 40}), pick({-1, 0, 1, 3, 100})}
    o.window = w
    if w[1] >= 0 or w[2] >= 0 then res.window = w end
  end
  if chance(0.2) then
    local sc = pick({0, 5, 30, 0.5})
    o.softcap, res.softcap = sc, sc
  end
  if chance(0.2) and Lk > 0 then
    local lens = {}
    for b = 1, B do lens[b] = R(0, Lk) end
    res.kv_lens = lens
    o.kv_lens = chance(0.5) and lens or fa.tensor(lens, {dtype = pick({"f32", "f64"})})
  end
  if chance(0.2) then
    local sl = {}
    for h = 1, Hq do sl[h] = pick({0, 0.1, 0.5, 1}) end
    res.alibi = sl
    o.alibi = chance(0.5) and sl or fa.tensor(sl, {device = "cpu"})
    if fa.is_tensor(o.alibi) then res.alibi = flat(o.alibi) end -- the slopes rounded to f32
  end
  if chance(0.25) then
    -- a mask broadcastable to (B, Hq, Lq, Lk): right-aligned, some sizes 1
    local full = {B, Hq, Lq, Lk}
    local mr = R(1, 4)
    local msh, padded = {}, {1, 1, 1, 1}
    for i = 1, mr do
      local t = full[4 - mr + i]
      msh[i] = chance(0.3) and 1 or t
      padded[4 - mr + i] = msh[i]
    end
    local mbool = chance(0.5)
    local mask = make(msh, mbool and "bool" or pick({"f32", "f64", "f16"}), {scale = 2})
    if not mbool and chance(0.3) then fill_special(mask, 1) end -- -inf/NaN/inf in the float mask
    o.mask = mask
    res.mask = {shape = padded, bool = mbool, tensor = mask}
    if chance(0.1) then
      msh[#msh] = Lk + 2 -- neither 1 nor Lk
      o.mask = make(msh, "bool")
      bad("mask shape")
    end
  end
  if chance(0.25) then o.tile = {pick({1, 2, 3, 7, 16, 64, 128, 4096}), pick({1, 2, 5, 16, 256, 4096})} end
  -- the CUDA rule for tiles (fa.attention_reference checks them too): up to 128 x 256
  -- (the sizes generated here always fit shared memory below those)
  if DEV == "cuda" and o.tile and (o.tile[1] > 128 or o.tile[2] > 256) then bad("tile past the cuda limits") end
  local want_lse = chance(0.4)
  if want_lse then o.return_lse = true end

  -- invalid option values
  local n = R(1, 40)
  if n == 1 then o.scale = pick({NaN, inf, -inf}); bad("scale")
  elseif n == 2 then o.window = {pick({-2, -100}), 0}; bad("window < -1")
  elseif n == 3 then o.window = pick({{1}, {1, 2, 3}, {1.5, 2}, "x", 3}); bad("window form")
  elseif n == 4 then o.softcap = pick({-1, inf, NaN}); bad("softcap")
  elseif n == 5 then o.tile = {pick({0, -1, 4097, 2 ^ 40}), 16}; bad("tile")
  elseif n == 6 then o.causal = pick({"sideways", 1, {}}); bad("causal")
  elseif n == 7 then o.algo = pick({"fast", 3, true}); bad("algo")
  elseif n == 8 then o.caual = true; bad("unknown option")
  elseif n == 9 then o.kv_lens = {Lk + 1}; if B == 1 then bad("kv_lens range") else bad("kv_lens count") end
  elseif n == 10 then o.kv_lens = {pick({-1, 0.5, NaN})}; bad("kv_lens value")
  elseif n == 11 then o.alibi = {NaN}; bad("alibi")
  elseif n == 12 and HAS_OTHER then o.mask = make({Lq, Lk}, "f32", {device = OTHER_DEV}); bad("mask device")
  elseif n == 13 then o.return_lse = pick({1, "yes"}); bad("return_lse type")
  elseif n == 14 then o.mask = freed_tensor; bad("freed mask")
  elseif n == 15 then o.out = pick({freed_tensor, "x", 1}); bad("out")
  end
  if Hq == 0 or (res.alibi and #res.alibi ~= Hq) then bad("alibi count") end

  local reference = chance(0.1)
  local fname = reference and "fa.attention_reference" or "fa.attention"
  -- outputs: a fresh poisoned tensor, or a view into a canvas; the reference's are f64 on the CPU
  local odt, ldt = reference and "f64" or dtype, reference and "f64" or "f32"
  local out_dev_bad = reference and DEV ~= "cpu"
  local canvas, lo, hi, out_dim
  local oshape = {table.unpack(qs)}
  oshape[#oshape] = Dv
  if chance(0.25) and expect ~= "error" then
    if chance(0.5) then
      out_dim = 1
      local big = {table.unpack(oshape)}
      local before, after = R(0, 2), R(0, 2)
      big[1] = big[1] + before + after
      canvas = fa.full(big, 7, {dtype = pick({odt, odt, "f32", "f64"}), device = DEV})
      o.out = canvas:narrow(1, before + 1, oshape[1])
      if o.out:dtype() ~= odt then bad("out dtype") end
      if out_dev_bad then bad("the reference's out on cuda") end
      lo, hi = before, before + oshape[1]
    else
      o.out = fa.full(oshape, NaN, {dtype = odt, device = DEV})
      if out_dev_bad then bad("the reference's out on cuda") end
    end
    if chance(0.1) then
      local ws = {table.unpack(oshape)}
      ws[#ws] = ws[#ws] + 1
      o.out = fa.zeros(ws, {dtype = odt, device = DEV})
      canvas = nil
      bad("out shape")
    end
  end
  if alias_out and expect ~= "error" then
    -- out is one of the inputs (same shape and dtype)
    local victim = pick({"q", "k", "v"})
    o.out = ({q = q, k = k, v = v})[victim]
    label_extra = " [out is " .. victim .. "]"
    if reference and (dtype ~= "f64" or DEV ~= "cpu") then bad("the reference's out not f64 on the cpu") end
  end
  if want_lse and #qs >= 2 and chance(0.2) then
    local ls = {table.unpack(qs, 1, #qs - 1)}
    o.lse_out = fa.full(ls, NaN, {dtype = chance(0.8) and ldt or pick({"f32", "f64"}), device = DEV})
    if o.lse_out:dtype() ~= ldt then bad("lse_out dtype") end
    if out_dev_bad then bad("the reference's lse_out on cuda") end
  end

  -- no f64 attention kernel on cuda: f64 is the CPU reference's
  if DEV == "cuda" and qd == "f64" and not reference then bad("f64 attention on cuda") end
  label = ("%s q %s %s, k %s, v %s, opts {%s}%s"):format(fname, shape_str(qs), qd, shape_str(ks), shape_str(vs),
    (function()
      local p = {}
      for key, val in pairs(o) do
        p[#p + 1] = key .. "=" .. (fa.is_tensor(val) and describe(val) or
          type(val) == "table" and ("{" .. table.concat((function()
            local x = {} for i, e in ipairs(val) do x[i] = tostring(e) end return x end)(), ",") .. "}") or tostring(val))
      end
      table.sort(p)
      return table.concat(p, ", ")
    end)(), wild and " (NaN/inf data)" or "")
  if #why > 0 then label = label .. " [invalid: " .. table.concat(why, ", ") .. "]" end
  label = label .. label_extra

  -- snapshots for the check (clones: a finalizer may free q, k, v)
  local qc, kc, vc, mc, pre, post
  if expect ~= "error" then
    qc, kc, vc = q:clone(), k:clone(), v:clone()
    if res.mask then mc = res.mask.tensor:clone() end
    if canvas then
      if lo > 0 then pre = canvas:narrow(1, 1, lo):clone() end
      local tail = canvas:size(1) - hi
      if tail > 0 then post = canvas:narrow(1, hi + 1, tail):clone() end
    end
  end
  local f = reference and fa.attention_reference or fa.attention
  local function run() return f(q, k, v, o) end

  local function check(out, lse)
    assert(fa.is_tensor(out), "no output tensor")
    local want_shape = shape_str(oshape)
    assert(shape_str(out:shape()) == want_shape, "output shape " .. shape_str(out:shape()) .. ", expected " .. want_shape)
    if reference then
      assert(out:dtype() == "f64" and out:device() == "cpu", "reference output dtype/device")
    else
      assert(out:dtype() == dtype, "output dtype " .. out:dtype())
    end
    if o.out then assert(rawequal(out, o.out), "the result is not opts.out") end
    if want_lse then
      assert(fa.is_tensor(lse), "no lse")
      assert(shape_str(lse:shape()) == shape_str({table.unpack(qs, 1, #qs - 1)}) or (#qs == 2 and lse:dim() == 1),
        "lse shape " .. shape_str(lse:shape()))
    else
      assert(lse == nil, "an lse without return_lse")
    end
    local dm = {B, Hq, Hkv, Lq, Lk, D, Dv}
    local rows = B * Hq * Lq
    -- the reference: plain Lua when small, else the engine's f64 one
    local ro, rl
    local small = rows * Lk * (D + Dv) <= 6000
    if small then
      local mres
      if mc then mres = {shape = res.mask.shape, bool = res.mask.bool, v = flat(mc)} end
      ro, rl = lua_attention(flat(qc), flat(kc), flat(vc), dm,
        {scale = res.scale, causal = res.causal, window = res.window, kv_lens = res.kv_lens, alibi = res.alibi,
         softcap = res.softcap, mask = mres})
    else
      local ro_opts = {scale = res.scale, causal = o.causal, window = o.window, kv_lens = o.kv_lens, alibi = o.alibi,
                       softcap = o.softcap, mask = mc, return_lse = true}
      local a, b = fa.attention_reference(qc, kc, vc, ro_opts)
      ro, rl = flat(a), flat(b)
    end
    local got = flat(out)
    local vmax = math.max(maxabs(flat(vc)), 1e-30)
    -- The scores carry their own rounding: a few units of the accumulating
    -- precision (f32 for every dtype but f64) of their magnitude, bounded by
    -- |scale|·max‖q‖·max‖k‖ plus the biases.  With big q and k (a scale of 2,
    -- D = 63, entries ~3σ) that is ~1e-4 of vmax, past TOL.f32 alone.
    local smag = math.abs(res.scale) * max_row_norm(flat(qc), D) * max_row_norm(flat(kc), D)
    if res.alibi then smag = smag + maxabs(res.alibi) * math.max(Lq, Lk) end
    if mc then smag = smag + maxabs(flat(mc)) end
    local u = (reference or dtype == "f64") and 2 ^ -53 or 2 ^ -24
    local tol = ((reference and TOL.f64 or TOL[dtype]) + 2 * u * smag) * vmax + (reference and 1e-12 or 0)
    compare_rows(got, ro, rows, Dv, tol, "o")
    -- rows with no key to attend: zeros and lse = -inf, never NaN
    if want_lse then
      local gl = flat(lse)
      local lt = reference and LSE_TOL.f64 or LSE_TOL[dtype]
      for r = 1, rows do
        local w, g = rl[r], gl[r]
        if w == -inf then
          if g ~= -inf then error(("lse row %d: got %s, expected -inf (no key to attend)"):format(r, g)) end
        elseif finite(w) then
          if not (math.abs(g - w) <= lt * math.max(1, math.abs(w))) then
            error(("lse row %d: got %s, expected %s"):format(r, g, w))
          end
        end
      end
    end
    for r = 0, rows - 1 do
      if rl[r + 1] == -inf then
        for c = 1, Dv do
          if got[r * Dv + c] ~= 0 then error(("o row %d: a fully masked row must be zeros, got %s"):format(r + 1, got[r * Dv + c])) end
        end
      end
    end
    -- the canvas outside the output view is untouched; the inputs too
    if pre then assert(fa.max_abs_diff(canvas:narrow(1, 1, lo), pre) == 0, "wrote before the output view") end
    if post then
      assert(fa.max_abs_diff(canvas:narrow(1, hi + 1, canvas:size(1) - hi), post) == 0, "wrote after the output view")
    end
    if not wild and fa.is_tensor(q) and not rawequal(o.out, q) then
      local ok, d = pcall(fa.max_abs_diff, q, qc)
      if ok and d ~= 0 then error("q changed") end
    end
  end
  return expect, run, check, {q, k, v, o.out}, function(wrap) return function() return f(q, k, v, wrap(o)) end end
end

local function gen_softmax()
  local rank = R(1, 4)
  local shape = random_shape(rank, 7)
  if chance(0.03) then shape = {1, pick({65536, 65537, 70000})} end
  local dtype = pick(FLOAT_DTYPES)
  local expect, why = "ok", {}
  local function bad(r) expect = "error"; why[#why + 1] = r end
  local wild = chance(0.2)
  local scale = pick({1, 2, 5, 30})
  local x = make(shape, chance(0.05) and "bool" or dtype, {wild = wild, scale = scale})
  if x:dtype() == "bool" then bad("bool x") end
  local o = {}
  local algo = pick({false, "auto", "naive", "safe", "online", "fused"})
  if algo then o.algo = algo end
  if chance(0.3) then o.block = pick({0, 1, 3, 64, 1024, 2 ^ 24}) end
  local n = shape[#shape]
  if algo == "fused" and n > fa.softmax_fused_max_n(dtype, DEV) then bad("fused row too long") end
  local m = R(1, 20)
  if m == 1 then o.block = pick({-1, 2 ^ 24 + 1, 1.5}); bad("block")
  elseif m == 2 then o.algo = "fastest"; bad("algo")
  elseif m == 3 then o.dim = 1; bad("unknown option")
  elseif m == 4 then o.out = fa.zeros(n + 1, {device = DEV}); bad("out shape")
  end
  local canvas
  if chance(0.2) and expect ~= "error" then
    o.out = fa.full(shape, NaN, {dtype = dtype, device = DEV})
    if chance(0.3) and rank >= 1 then
      canvas = o.out
    end
  end
  if chance(0.05) and expect ~= "error" and x:dtype() == dtype then o.out = x end -- in place
  if chance(0.04) and expect ~= "error" and x:dtype() ~= "bool" then
    -- x and out: two overlapping windows of one tensor, a row apart
    local big = {table.unpack(shape)}
    big[1] = big[1] + 1
    local base = make(big, dtype, {contiguous = true, scale = scale})
    x = base:narrow(1, 1, shape[1])
    o.out = base:narrow(1, 2, shape[1])
  end
  label = ("fa.softmax x %s %s%s, opts {algo=%s, block=%s, out=%s}"):format(shape_str(shape), x:dtype(),
    wild and " (NaN/inf)" or "", tostring(o.algo), tostring(o.block), tostring(o.out ~= nil))
  if #why > 0 then label = label .. " [invalid: " .. table.concat(why, ", ") .. "]" end
  local xc = expect ~= "error" and x:clone() or nil
  local function run() return fa.softmax(x, o) end
  local function check(y)
    assert(shape_str(y:shape()) == shape_str(shape), "shape")
    assert(y:dtype() == dtype, "dtype")
    if o.out then assert(rawequal(y, o.out), "result is not opts.out") end
    local xv = flat(xc)
    local rows = n > 0 and prod(shape) // n or 0
    if algo == "naive" then
      -- no max subtracted: overflow where the seeds say; check tame rows only
      if maxabs(xv) > 10 then return end
      for _, val in ipairs(xv) do if not finite(val) then return end end
    end
    compare_rows(flat(y), lua_softmax_rows(xv, rows, n), rows, n, TOL[dtype] * 2 + (dtype == "f32" and 1e-6 or 0), "y")
  end
  return expect, run, check, {x}, function(wrap) return function() return fa.softmax(x, wrap(o)) end end
end

local function gen_matmul()
  local M, K, N = R(0, 12), R(0, 12), R(0, 12)
  if chance(0.1) then M, K, N = R(1, 40), R(1, 40), R(1, 40) end
  local dtype = pick(FLOAT_DTYPES)
  local expect, why = "ok", {}
  local function bad(r) expect = "error"; why[#why + 1] = r end
  local wild = chance(0.15)
  local as, bs = {M, K}, {K, N}
  local m = R(1, 20)
  if m == 1 then bs = {K + 1, N}; bad("inner dims")
  elseif m == 2 then as = {M, K, 1}; bad("3-D a")
  elseif m == 3 then bs = {K}; bad("1-D b")
  end
  local a = make(as, dtype, {wild = wild})
  local bdt = dtype
  if m == 4 then bdt = pick({"f32", "f64", "f16"}); if bdt ~= dtype then bad("b dtype") end end
  local b = make(bs, bdt, {wild = wild and chance(0.5)})
  local o = {}
  local algo = pick({false, "auto", "naive", "tiled", "blas"})
  if algo then o.algo = algo end
  if chance(0.3) then o.tile = pick({0, 1, 3, 16, 64, 1024}) end
  if m == 5 then o.tile = pick({-1, 1025}); bad("tile") end
  -- cuda's tiled matmul: 1 to 32, or a multiple of 32 up to 128 (64 for f64)
  if DEV == "cuda" and o.algo == "tiled" and o.tile and o.tile > 0 and
      (o.tile > (dtype == "f64" and 64 or 128) or (o.tile > 32 and o.tile % 32 ~= 0)) then bad("tile past the cuda limits") end
  if m == 6 then o.transpose = true; bad("unknown option") end
  if chance(0.15) and expect ~= "error" then
    o.out = fa.full({M, N}, NaN, {dtype = dtype, device = DEV})
    if chance(0.2) then o.out = fa.zeros({N + 1, M}, {dtype = dtype, device = DEV}); bad("out shape") end
  end
  if chance(0.05) and expect ~= "error" and M == K and K == N then o.out = a end -- out is a
  label = ("fa.matmul a %s, b %s, %s, opts {algo=%s, tile=%s, out=%s}%s"):format(shape_str(as), shape_str(bs), dtype,
    tostring(o.algo), tostring(o.tile), tostring(o.out ~= nil), wild and " (NaN/inf)" or "")
  if #why > 0 then label = label .. " [invalid: " .. table.concat(why, ", ") .. "]" end
  local ac, bc = expect ~= "error" and a:clone(), expect ~= "error" and b:clone()
  local function run() return fa.matmul(a, b, o) end
  local function check(c)
    assert(shape_str(c:shape()) == shape_str({M, N}), "shape")
    assert(c:dtype() == dtype, "dtype")
    local av, bv, cv = flat(ac), flat(bc), flat(c)
    local scale = math.max(maxabs(av), 1e-30) * math.max(maxabs(bv), 1e-30) * math.max(K, 1)
    local want = {}
    for i = 0, M - 1 do
      for j = 0, N - 1 do
        local s = 0
        for p = 0, K - 1 do s = s + av[i * K + p + 1] * bv[p * N + j + 1] end
        want[i * N + j + 1] = s
      end
    end
    compare_rows(cv, want, M, N, TOL[dtype] * scale, "c")
  end
  return expect, run, check, {a, b}, function(wrap) return function() return fa.matmul(a, b, wrap(o)) end end
end

local function gen_merge()
  local rank = R(1, 4)
  local shape = random_shape(rank, 6)
  local dtype = pick(FLOAT_DTYPES)
  local lse_dtype = pick({"f32", "f32", "f64", dtype})
  local expect, why = "ok", {}
  local function bad(r) expect = "error"; why[#why + 1] = r end
  local lshape = {table.unpack(shape, 1, rank - 1)}
  if rank == 1 then lshape = {1} end
  local o1, o2 = make(shape, dtype), make(shape, dtype)
  local l1, l2 = make(lshape, lse_dtype, {scale = 3}), make(lshape, lse_dtype, {scale = 3})
  -- empty states (lse = -inf) and NaN
  if chance(0.3) then fill_special(l1, 1) end
  if chance(0.3) then fill_special(l2, 1) end
  local m = R(1, 15)
  if m == 1 then local s = {table.unpack(shape)}; s[#s] = s[#s] + 1; o2 = make(s, dtype); bad("o2 shape")
  elseif m == 2 then local s = {table.unpack(lshape)}; s[1] = s[1] + 1; l2 = make(s, lse_dtype); bad("lse2 shape")
  elseif m == 3 then o2 = make(shape, dtype == "f32" and "f64" or "f32"); bad("o2 dtype")
  elseif m == 4 then l1 = make(lshape, "bool"); bad("bool lse")
  elseif m == 5 then l1 = make(shape, lse_dtype); if rank > 1 or shape[1] ~= 1 then bad("lse with o's shape") end
  end
  label = ("fa.merge_states o %s %s, lse %s %s"):format(shape_str(shape), dtype, shape_str(lshape), lse_dtype)
  if #why > 0 then label = label .. " [invalid: " .. table.concat(why, ", ") .. "]" end
  local c = {}
  if expect ~= "error" then c = {o1:clone(), l1:clone(), o2:clone(), l2:clone()} end
  local function run() return fa.merge_states(o1, l1, o2, l2) end
  local function check(o, l)
    assert(shape_str(o:shape()) == shape_str(shape) and o:dtype() == dtype, "o shape/dtype")
    assert(shape_str(l:shape()) == shape_str(lshape) and l:dtype() == lse_dtype, "lse shape/dtype")
    local a, la, b, lb = flat(c[1]), flat(c[2]), flat(c[3]), flat(c[4])
    local dv = shape[#shape]
    local rows = #la
    local wo, wl = {}, {}
    for r = 0, rows - 1 do
      local x, y = la[r + 1], lb[r + 1]
      if x == -inf and y == -inf then
        wl[r + 1] = -inf
        for e = 1, dv do wo[r * dv + e] = 0 end
      elseif x == -inf or y == -inf then
        local src = x == -inf and b or a
        wl[r + 1] = x == -inf and y or x
        for e = 1, dv do wo[r * dv + e] = src[r * dv + e] end
      else
        local mx = math.max(x, y)
        local l = mx + math.log(math.exp(x - mx) + math.exp(y - mx))
        wl[r + 1] = l
        local w1, w2 = math.exp(x - l), math.exp(y - l)
        for e = 1, dv do wo[r * dv + e] = w1 * a[r * dv + e] + w2 * b[r * dv + e] end
      end
    end
    local scale = math.max(maxabs(a), maxabs(b), 1e-30)
    compare_rows(flat(o), wo, rows, dv, TOL[dtype] * scale, "o")
    compare_rows(flat(l), wl, rows, 1, TOL[lse_dtype] * math.max(1, maxabs(wl)) * 2, "lse")
  end
  return expect, run, check, {o1, l1, o2, l2}
end

-- fa.attention_backward on a small problem with random options, NaN/inf
-- in some inputs, and some misuse; checked against
-- fa.attention_backward_reference: wherever the reference's gradient is
-- finite, the backend's is finite and close (API §2 and §10: NaN and inf
-- reach only the pairs that connect them).
local BW_TOL = {f64 = 1e-8, f32 = 1e-3, f16 = 3e-3, bf16 = 1.6e-2} -- the gradients are rounded to the dtype
local function gen_backward()
  local B, Hkv = R(1, 2), R(1, 2)
  local Hq = Hkv * R(1, 2)
  local Lq, Lk, D, Dv = R(1, 9), R(1, 11), R(1, 8), R(1, 8)
  local dtype = pick(FLOAT_DTYPES)
  if DEV == "cuda" and dtype == "f64" then dtype = "f32" end
  local wild = chance(0.25)
  local q = make({B, Hq, Lq, D}, dtype, {wild = wild and chance(0.5), scale = R(1, 2)})
  local k = make({B, Hkv, Lk, D}, dtype, {wild = wild and chance(0.5), scale = R(1, 2)})
  local v = make({B, Hkv, Lk, Dv}, dtype, {wild = wild and chance(0.5)})
  local dout = make({B, Hq, Lq, Dv}, dtype, {wild = wild and chance(0.5)})
  local o = {}
  if chance(0.4) then o.causal = pick({true, "bottom_right", "top_left"}) end
  if chance(0.25) then o.window = {pick({-1, 0, 1, 3}), pick({-1, 0, 2})} end
  if chance(0.25) then
    local lens = {}
    for b = 1, B do lens[b] = R(0, Lk) end
    o.kv_lens = lens
  end
  if chance(0.2) then
    local sl = {}
    for h = 1, Hq do sl[h] = pick({0, 0.1, 0.5}) end
    o.alibi = sl
  end
  if chance(0.2) then o.softcap = pick({5, 30}) end
  if chance(0.2) then o.scale = pick({1, 0.5, 0.125}) end
  if chance(0.2) then o.mask = make({Lq, Lk}, chance(0.5) and "bool" or "f32") end
  -- the Lua variants (API §9, §10): score_mod's chain rule, terms free of s
  -- among them (no derivative, even a 0/0 one), mask_mod's pairs
  if chance(0.2) then
    o.score_mod = pick({
      function(s, b, h, q, k) return s + (q - k) * 0.1 end,
      function(s) return (s / 3):tanh() * 3 end,
      function(s, b, h, q, k) return s * 0.5 + (k - k):sqrt() * (q + 1):log() end,
      function(s, b, h, q, k) return fa.where(q:ge(k), s, s * 0.5) end,
      function(s) return s:min(2) + s:abs() * 0.1 end,
      function(s, b, h, q, k) return s - (q - k):abs() * 0.05 * h end,
    })
  end
  if chance(0.15) then
    o.mask_mod = pick({
      function(b, h, q, k) return q:ge(k - 2) end,
      function(b, h, q, k) return ((q + k) % 3):ne(0) end,
      function(b, h, q, k) return k:le(q) | h:eq(1) end,
    })
  end
  local fopts = {}
  for key, val in pairs(o) do fopts[key] = val end
  fopts.return_lse = true
  local out, lse = fa.attention(q, k, v, fopts)
  local expect, why = "ok", {}
  local function bad(r) expect = "error"; why[#why + 1] = r end
  local bo = o
  local m = R(1, 20)
  if m == 1 then dout = make({B, Hq, Lq + 1, Dv}, dtype); bad("dout shape")
  elseif m == 2 then out = make({B, Hq, Lq, Dv}, dtype == "f32" and "f64" or "f32"); bad("o dtype")
  elseif m == 3 then lse = make({B, Hq, Lq + 1}, "f32"); bad("lse shape")
  elseif m == 4 then bo = {}; for key, val in pairs(o) do bo[key] = val end; bo.deterministic = pick({1, "yes", {}}); bad("deterministic")
  elseif m == 5 then bo = weird(); expect = "any"
  elseif m == 6 then dout = weird(); expect = "any"
  elseif m == 7 then bo = {}; for key, val in pairs(o) do bo[key] = val end; bo.deterministic = pick({true, false})
  end
  local desc = {}
  for key, val in pairs(o) do
    desc[#desc + 1] = key .. "=" .. (type(val) == "table" and ("{" .. table.concat(val, ",") .. "}") or
      fa.is_tensor(val) and val:dtype() or type(val) == "function" and "function" or tostring(val))
  end
  table.sort(desc)
  label = ("fa.attention_backward %s B=%d Hq=%d Hkv=%d Lq=%d Lk=%d D=%d Dv=%d%s %s"):format(dtype, B, Hq, Hkv, Lq, Lk,
    D, Dv, wild and " (NaN/inf in some inputs)" or "", table.concat(desc, " "))
  if bo ~= o then label = label .. " [backward opts " .. tostring(bo) .. "]" end
  if #why > 0 then label = label .. " [invalid: " .. table.concat(why, ", ") .. "]" end
  local function run() return fa.attention_backward(q, k, v, out, lse, dout, bo) end
  local function check(dq, dk, dv)
    local ref = {fa.attention_backward_reference(q:cpu(), k:cpu(), v:cpu(), out:cpu(), lse:cpu(), dout:cpu(), o)}
    for i, g in ipairs({dq, dk, dv}) do
      local want, got = flat(ref[i]), flat(g)
      assert(#want == #got, "gradient sizes")
      local scale = 1
      for _, x in ipairs(want) do if finite(x) then scale = math.max(scale, math.abs(x)) end end
      for e = 1, #want do
        if finite(want[e]) and not (math.abs(got[e] - want[e]) <= BW_TOL[dtype] * scale) then
          error(("gradient %d, element %d: got %s, expected %s (scale %g)"):format(i, e, got[e], want[e], scale))
        end
      end
    end
  end
  -- other opts than the forward's: the gradients of an inconsistent lse may pass f16's range
  return expect, run, bo == o and check or nil, {q, k, v, out, lse, dout}
end

local function gen_cost()
  if chance(0.5) then
    local q = make(random_shape(4, 5), pick(FLOAT_DTYPES), {contiguous = true})
    local s = q:shape()
    local k = chance(0.8) and make({s[1], s[2], R(1, 6), s[4]}, q:dtype()) or pool_pick()
    label = "fa.cost.attention q " .. shape_str(s)
    local opts = chance(0.5) and {causal = pick({true, false}), algo = pick({"naive", "flash", "two_pass", "flash_row"})} or weird()
    return "any", function() return fa.cost.attention(q, k, k, opts) end, function(c)
      assert(type(c) == "table" and c.flops >= 0 and c.bytes >= 0, "cost")
    end, {q, k}
  end
  local x = chance(0.8) and make(random_shape(R(1, 3), 6), pick(FLOAT_DTYPES)) or weird()
  label = "fa.cost.softmax"
  local opts = chance(0.5) and {algo = pick({"naive", "safe", "online", "fused", "auto"})} or weird()
  return "any", function() return fa.cost.softmax(x, opts) end, function(c)
    assert(type(c) == "table" and c.flops >= 0 and c.bytes >= 0, "cost")
  end, {x}
end

-- ---- generators: constructors, methods, module functions ------------------------------------

local CTORS = {"zeros", "ones", "full", "rand", "randn", "arange", "tensor"}

local function gen_ctor()
  local name = pick(CTORS)
  local args, expect = {}, "any"
  if chance(0.6) then
    -- valid: a shape as numbers or a table, then the opts
    local shape = random_shape(R(1, 4), 6)
    local dtype = pick(ALL_DTYPES)
    local opts = {dtype = dtype, device = DEV}
    if name == "rand" or name == "randn" then opts.seed = seed() end
    if name == "tensor" then
      local function nest(d)
        if d > #shape then return pick({R(-5, 5), 0.5, NaN, inf, -inf, 1e30}) end
        local t = {}
        for i = 1, shape[d] do t[i] = nest(d + 1) end
        return t
      end
      if prod(shape) == 0 then shape = {R(1, 3)} end
      args = {nest(1), opts}
      label = "fa.tensor " .. shape_str(shape) .. " " .. dtype
      return "ok", function() return fa.tensor(table.unpack(args, 1, 2)) end, function(t)
        assert(shape_str(t:shape()) == shape_str(shape) and t:dtype() == dtype, "shape/dtype")
      end
    elseif name == "arange" then
      local n = R(0, 20)
      label = "fa.arange " .. n
      return "ok", function() return fa.arange(n, opts) end, function(t)
        assert(t:numel() == n, "numel")
        for i = 1, n do assert(t[i] == (dtype == "bool" and (i > 1 and 1 or 0) or
          (dtype == "bf16" and i > 257 and t[i] or i - 1)), "arange value") end
      end
    end
    if chance(0.5) then args = {shape} else args = {table.unpack(shape)} end
    if name == "full" then args[#args + 1] = pick({1, -2.5, NaN, inf, true, false}) end
    args[#args + 1] = opts -- (a boolean value with an explicit dtype is converted to it)
    label = ("fa.%s %s %s"):format(name, shape_str(shape), dtype)
    local n = #args
    -- random bools: an error (PyTorch's rand has no bool either)
    local expect = (name == "rand" or name == "randn") and dtype == "bool" and "error" or "ok"
    return expect, function() return fa[name](table.unpack(args, 1, n)) end, function(t)
      assert(shape_str(t:shape()) == shape_str(shape), "shape " .. shape_str(t:shape()))
      assert(t:dtype() == dtype, "dtype")
      if name == "zeros" and prod(shape) > 0 then assert(t:max() == 0 and t:min() == 0, "zeros") end
    end
  end
  -- invalid or weird: huge sizes, negative sizes, too many dims, bad opts
  local kind = R(1, 8)
  if kind == 1 then
    args = {pick({2 ^ 42, 2 ^ 62, math.maxinteger, 2 ^ 21}), pick({2 ^ 21, 2 ^ 30, 1})}
    if args[1] * args[2] < 2 ^ 40 then args[2] = 2 ^ 30 end
    if name == "full" then args[3] = 1 end
    if name == "arange" then args = {2 ^ 50} end
    -- more than the host has (or than an int64 holds), with no engine limit:
    -- the host's malloc refuses
    local n = #args
    label = ("fa.%s(%s) with no memory limit"):format(name, table.concat(args, ", "))
    return "error", function()
      fa.set_memory_limit(0)
      local ok, err = pcall(fa[name], table.unpack(args, 1, n))
      fa.set_memory_limit(BASE_LIMIT)
      if ok then return err end
      error(err, 0)
    end
  elseif kind == 2 then
    args = {R(1, 3), pick({-1, -2 ^ 40, 1.5, NaN, inf})}
    if name == "full" then args[3] = 1 end
    expect = "error"
  elseif kind == 3 then args = {1, 1, 1, 1, 1}; if name == "full" then args[6] = 1 end; expect = "error"
  elseif kind == 4 then args = {{2, 3}, {dtype = pick({"f8", "int", 3, true})}}; expect = "error"
  elseif kind == 5 then args = {{2, 3}, {device = pick({"tpu", 1, OTHER_DEV})}}; expect = HAS_OTHER and "any" or "error"
  elseif kind == 6 then args = {{2, 3}, {colour = "red"}}; expect = "error"
  elseif kind == 7 then args = {{2, 3, dtype = "f16"}}; expect = "error"
  else
    for i = 1, R(0, 4) do args[i] = weird() end
  end
  if name == "tensor" and kind ~= 8 then args = {weird(), weird()} expect = "any" end
  label = ("fa.%s with %d odd arguments (kind %d)"):format(name, #args, kind)
  local n = #args
  return expect, function() return fa[name](table.unpack(args, 1, n)) end
end

-- method name -> argument makers (each returns a list of arguments)
local function idx_for(t, valid)
  local ok, shape = pcall(t.shape, t)
  if not ok then return {weird()} end
  local a = {}
  for i, s in ipairs(shape) do a[i] = valid and s > 0 and R(s) or pick({0, -1, (s or 0) + 1, 1.5, NaN, R(1, 3)}) end
  return a
end

local METHODS = {
  shape = function() return {} end,
  size = function(t) return {pick({1, 2, 3, 4, 0, 5, -1, nil, 1.5})} end,
  dim = function() return {} end,
  numel = function() return {} end,
  dtype = function() return {} end,
  device = function() return {} end,
  to = function() return {pick({"f32", "f16", "bf16", "f64", "bool", "cpu", "cuda", "float", "half", "double", "x", 1})} end,
  cpu = function() return {} end,
  cuda = function() return {} end,
  float = function() return {} end,
  half = function() return {} end,
  bf16 = function() return {} end,
  double = function() return {} end,
  clone = function() return {} end,
  contiguous = function() return {} end,
  is_contiguous = function() return {} end,
  totable = function() return {} end,
  free = function() return {} end,
  sum = function() return {} end,
  max = function() return {} end,
  min = function() return {} end,
  norm = function() return {} end,
  isfinite = function() return {} end,
  fill_ = function() return {pick({0, 1, -3.5, NaN, inf, true, false, "x"})} end,
  copy_ = function(t) return {chance(0.6) and (function()
    local ok, s = pcall(t.shape, t)
    if ok then return make(s, pick(ALL_DTYPES)) end
    return pool_pick()
  end)() or pool_pick()} end,
  get = function(t) return idx_for(t, chance(0.7)) end,
  set = function(t) local a = idx_for(t, chance(0.7)); a[#a + 1] = pick({1, NaN, -inf, true, "x"}); return a end,
  view = function(t)
    local ok, n = pcall(t.numel, t)
    if ok and chance(0.6) then return {pick({{n}, {-1}, {1, n}, {n, 1}, {-1, 1}, {2, -1}, {-1, -1}, {n + 1}})} end
    return {pick({{2 ^ 62 + 1, 4}, {0, 2 ^ 40, 2 ^ 40}, {1, 1, 1, 1, 1}, {}, {-2}, "x"})}
  end,
  reshape = function(t)
    local ok, n = pcall(t.numel, t)
    if ok and chance(0.6) then return {pick({{n}, {-1}, {1, n}, {n, 1, 1}})} end
    return {pick({{2 ^ 62 + 1, 4}, {-1, 0}, {1.5}})}
  end,
  select = function(t) local ok, d = pcall(t.dim, t); d = ok and d or 1; return {R(0, d + 1), pick({1, 2, 0, -1, 2 ^ 40})} end,
  narrow = function(t)
    local ok, d = pcall(t.dim, t); d = ok and d or 1
    return {R(0, d + 1), pick({1, 2, 0, 3, 2 ^ 62}), pick({0, 1, 2, -1, 2 ^ 62})}
  end,
  transpose = function(t) local ok, d = pcall(t.dim, t); d = ok and d or 1; return {R(0, d + 1), R(0, d + 1)} end,
  add = function(t) return {chance(0.5) and pick({1, -2, NaN, inf}) or (chance(0.5) and t:clone() or pool_pick())} end,
  sub = function(t) return {chance(0.5) and 2 or pool_pick()} end,
  mul = function(t) return {chance(0.5) and 0.5 or pool_pick()} end,
  div = function(t) return {chance(0.5) and pick({0, 2}) or pool_pick()} end,
}
local METHOD_NAMES = {}
for name in pairs(METHODS) do METHOD_NAMES[#METHOD_NAMES + 1] = name end
table.sort(METHOD_NAMES)

-- the methods as functions, from a tensor's __index
local METHOD_FN = {}
do
  local t = fa.zeros(1)
  for _, name in ipairs(METHOD_NAMES) do METHOD_FN[name] = t[name] end
  t:free()
end

local function gen_method()
  local name = pick(METHOD_NAMES)
  local t = chance(0.9) and pool_pick() or weird()
  local args = fa.is_tensor(t) and pcall(t.dim, t) and METHODS[name](t) or {}
  if chance(0.15) then args[R(1, #args + 1)] = weird() end
  local n = R(0, 1) == 0 and #args or math.max(#args, 1)
  label = ("t:%s(%d args) on %s"):format(name, n,
    fa.is_tensor(t) and (pcall(t.dim, t) and (shape_str(t:shape()) .. " " .. t:dtype()) or "a freed tensor") or type(t))
  -- method-level checks of the results
  local check
  if name == "sum" and fa.is_tensor(t) and pcall(t.dim, t) then
    local vals = flat(t)
    check = function(s)
      local want = 0
      for _, v in ipairs(vals) do want = want + v end
      if finite(want) then
        assert(math.abs(s - want) <= 1e-9 * math.max(1, math.abs(want)) + 1e-9 * #vals, ("sum %s, expected %s"):format(s, want))
      end
    end
  elseif name == "get" and fa.is_tensor(t) and pcall(t.dim, t) then
    check = function(v)
      local ok, all = pcall(flat, t)
      if not ok then return end
      local shape = t:shape()
      local pos = 0
      for i = 1, #shape do pos = pos * shape[i] + (args[i] - 1) end
      local w = all[pos + 1]
      assert(v == w or (v ~= v and w ~= w), ("get: %s, totable has %s"):format(v, w))
    end
  elseif name == "view" or name == "reshape" or name == "select" or name == "narrow" or name == "transpose" then
    check = function(r) remember(r) end
  end
  local method = METHOD_FN[name] -- also with a non-tensor self
  return "any", function() return method(t, table.unpack(args, 1, n)) end, check
end

local function gen_index()
  local t = pool_pick()
  local i = pick({1, 2, 0, -1, 1.5, NaN, "x", 2 ^ 40, true})
  local write = chance(0.4)
  local val = pick({1, -1, NaN, true, "x", nil})
  if chance(0.3) then val = pool_pick() end
  label = ("t[%s]%s on %s"):format(tostring(i), write and (" = " .. tostring(val)) or "",
    pcall(t.dim, t) and shape_str(t:shape()) or "a freed tensor")
  if write then return "any", function() t[i] = val end end
  return "any", function() return t[i] end, function(r) remember(r) end
end

local ARITH = {
  function(a, b) return a + b end, function(a, b) return a - b end,
  function(a, b) return a * b end, function(a, b) return a / b end,
  function(a) return -a end,
}
local function gen_arith()
  local a = pool_pick()
  local b
  local kind = R(1, 4)
  if kind == 1 then b = pick({2, -0.5, 0, NaN, inf})
  elseif kind == 2 and pcall(a.shape, a) then b = make(a:shape(), pick(ALL_DTYPES))
  elseif kind == 3 then b = pool_pick()
  else b = weird() end
  local op = R(1, #ARITH)
  local swap = chance(0.3)
  label = ("arithmetic op %d%s on %s and %s"):format(op, swap and " (swapped)" or "", fa.is_tensor(a) and "tensor" or type(a),
    fa.is_tensor(b) and "tensor" or type(b))
  local x, y = a, b
  if swap and op ~= 5 then x, y = b, a end
  -- spot check: same-shape tensor op scalar, element 1
  local check
  if kind == 1 and not swap and op <= 4 and pcall(a.shape, a) and a:numel() > 0 and a:dtype() == "f64" then
    local first = flat(a)[1]
    check = function(r)
      local want = ({first + b, first - b, first * b, first / b})[op]
      local got = flat(r)[1]
      assert(got == want or (got ~= got and want ~= want), ("element 1: %s, expected %s"):format(got, want))
    end
  end
  return "any", function() return ARITH[op](x, y) end, check
end

local function gen_module()
  local kind = R(1, 14)
  local w = weird()
  label = "module function " .. kind .. " with " .. type(w)
  if kind == 1 then return "any", function() return fa.memory(w) end
  elseif kind == 2 then return "any", function() return fa.reset_peak(w) end
  elseif kind == 3 then return "any", function() return fa.device_info(w) end
  elseif kind == 4 then return "any", function() return fa.memory_limit(w) end
  elseif kind == 5 then return "any", function() return fa.set_default_device(w) end
  elseif kind == 6 then return "any", function() return fa.manual_seed(w) end
  elseif kind == 7 then return "any", function() return fa.softmax_fused_max_n(w, weird()) end
  elseif kind == 8 then return "any", function() return fa.max_abs_diff(pool_pick(), chance(0.5) and pool_pick() or w) end
  elseif kind == 9 then return "any", function() return fa.rel_error(pool_pick(), chance(0.5) and pool_pick() or w) end
  elseif kind == 10 then return "any", function() return fa.allclose(pool_pick(), pool_pick(), chance(0.5) and w or nil) end
  elseif kind == 11 then
    local opts = chance(0.5) and {rep = pick({1, 2, 0, -1}), warmup = pick({0, 1, -1})} or w
    return "any", function() return fa.bench(chance(0.8) and function() local _ = fa.zeros(3) end or w, opts) end
  elseif kind == 12 then return "any", function() return fa.sync(w) end
  elseif kind == 13 then return "any", function() return fa.set_memory_limit(w) end
  else return "any", function() return tostring(pool_pick()) end
  end
end

-- Script code that runs inside engine calls: garbage whose finalizer frees
-- a pool tensor, and opts tables whose reads run code.
local function gen_evil()
  local n = R(1, 4)
  label = ("%d finalizers that free pool tensors"):format(n)
  for _ = 1, n do
    local t = pool_pick()
    setmetatable({}, {__gc = function() t:free() end})
  end
  return "any", function() return nil end
end

-- The same kernel call with opts behind an __index metamethod that frees
-- the inputs or collects garbage when a given key is read.
local function wrap_opts_evil(inputs, o)
  local victim = inputs[R(#inputs)]
  local when = pick({"algo", "scale", "mask", "out", "tile", "kv_lens", "block"})
  local copy = {}
  for key, val in pairs(o or {}) do copy[key] = val end
  return setmetatable({}, {__index = function(_, key)
    if key == when then
      if fa.is_tensor(victim) then victim:free() end
      collectgarbage()
    end
    return copy[key]
  end})
end

-- ---- out of memory -------------------------------------------------------------------------------
local setup
local function limit_episode()
  collectgarbage()
  collectgarbage()
  local before = fa.memory().current
  local gen = pick({gen_attention, gen_softmax, gen_matmul, gen_merge})
  local expect, run, check = setup(gen)
  if not run then return end
  local budget = pick({0, 1, 64, 256, 1024, 4096, 16384, 65536})
  local limited = fa.memory().current + budget + 1 -- (0 would mean no limit)
  fa.set_memory_limit(limited)
  label = "[memory limit " .. budget .. " bytes] " .. label
  local ok, err = pcall(run)
  fa.set_memory_limit(BASE_LIMIT)
  stats.calls = stats.calls + 1
  if ok then
    stats.ok = stats.ok + 1
    if expect == "error" then fail("succeeded, expected a flashattn: error") end
  else
    stats.errors = stats.errors + 1
    if not is_fa_error(err) then fail("error without the flashattn: prefix: " .. tostring(err))
    elseif expect == "ok" and not err:find("out of memory") then fail("failed on valid arguments: " .. err) end
  end
  -- nothing kept: the memory comes back, and the next call succeeds
  run, check, err = nil, nil, nil
  collectgarbage()
  collectgarbage()
  local after = fa.memory().current
  if after > before then fail(("held %d bytes after the call, %d before"):format(after, before)) end
  local q = fa.randn(1, 2, 4, 8, {seed = 1, device = DEV})
  local ok2, o = pcall(fa.attention, q, q, q, {causal = true})
  if not ok2 then fail("the call after an out-of-memory error failed: " .. tostring(o))
  else
    local ref = fa.attention_reference(q, q, q, {causal = true})
    local e = fa.rel_error(o, ref)
    if not (e < 1e-5) then fail("the call after an out-of-memory error is wrong: rel error " .. e) end
  end
end

-- ---- the run ---------------------------------------------------------------------------------------
local function leak_check()
  for _, t in ipairs(pool) do t:free() end
  pool = {}
  collectgarbage()
  collectgarbage()
  fa.set_memory_limit(BASE_LIMIT)
  local cur = fa.memory().current
  if cur ~= 0 then
    label = "leak check"
    fail(("the engine holds %d bytes with every tensor freed"):format(cur))
  end
end

-- Runs a generator.  Setting a call up uses the API too: an error there
-- fails the run, unless a finalizer freed a pool tensor the setup used.
setup = function(gen)
  local res = table.pack(xpcall(gen, function(e) return VERBOSE and debug.traceback(e) or e end))
  if res[1] then return table.unpack(res, 2, res.n) end
  if not (type(res[2]) == "string" and res[2]:find("has been freed")) then
    fail("setting the call up failed: " .. tostring(res[2]))
  end
  return nil
end

local KERNELS = {gen_attention, gen_attention, gen_attention, gen_softmax, gen_matmul, gen_merge, gen_cost, gen_backward}
local t0 = os.clock()
for i = 1, ITERS do
  iter = i
  local r = math.random()
  if r < 0.03 then
    limit_episode()
  else
    local expect, run, check, inputs, with_opts
    if r < 0.45 then
      expect, run, check, inputs, with_opts = setup(pick(KERNELS))
      -- sometimes the opts come through __index code that frees inputs
      if with_opts and chance(0.06) then
        expect = "any"
        label = label .. " [opts through a freeing __index]"
        run = with_opts(function(o) return wrap_opts_evil(inputs, o) end)
        check = nil
      end
      -- sometimes an input is freed before the call: an error naming it
      if inputs and expect ~= "error" and chance(0.04) then
        local victim = inputs[1]
        if fa.is_tensor(victim) then
          victim:free()
          expect = "error"
          label = label .. " [first input freed]"
        end
      end
      if inputs then for _, t in ipairs(inputs) do if chance(0.3) then remember(t) end end end
    elseif r < 0.6 then expect, run, check = setup(gen_ctor)
    elseif r < 0.8 then expect, run, check = setup(gen_method)
    elseif r < 0.86 then expect, run, check = setup(gen_index)
    elseif r < 0.93 then expect, run, check = setup(gen_arith)
    elseif r < 0.97 then expect, run, check = setup(gen_module)
    else expect, run, check = setup(gen_evil) end
    if run then
      local ok, res = call(expect, run, check)
      if ok then remember(res) end
    end
    -- keep the default device and the limit for the next call
    fa.set_memory_limit(BASE_LIMIT)
    pcall(fa.set_default_device, DEV)
  end
  if chance(0.05) and #pool > 0 then pool[R(#pool)]:free() end
  if chance(0.3) then remember(make(random_shape(R(1, 4), 5), pick(ALL_DTYPES), {wild = chance(0.2)})) end
  if i % 250 == 0 then leak_check() end
end
leak_check()
fa.set_memory_limit(0)
io.stderr:write(("fuzz_lua: %d calls (%d succeeded, %d raised flashattn errors, %d results checked), %d failures, %.1f s CPU; seed %d\n")
  :format(stats.calls, stats.ok, stats.errors, stats.checked, failures, os.clock() - t0, SEED))
os.exit(failures == 0 and 0 or 1, true)
