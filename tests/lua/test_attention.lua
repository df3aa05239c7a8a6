-- fa.attention (docs/lua-api.md §2): every algo × dtype × option against
-- fa.attention_reference (f64, CPU), and the reference itself against a
-- hand-written Lua attention.  Sizes are sampled (L of 1, 7, 129, 1000; D of
-- 1, 3, 64, 80, 128, 256), not crossed in full, to keep the suite fast under
-- the sanitizers.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

local ALGOS = {"naive", "two_pass", "flash_row", "flash", "auto"}
local TILED = {"two_pass", "flash"}

local function qkv(B, Hq, Hkv, Lq, Lk, D, Dv, dtype, scale)
  scale = scale or 1
  local q = U.randn({B, Hq, Lq, D}, dtype, scale)
  local k = U.randn({B, Hkv, Lk, D}, dtype, scale)
  local v = U.randn({B, Hkv, Lk, Dv or D}, dtype)
  return q, k, v
end

-- a dtype other than f32 for this test, cycling through the rest
local other_dtype_i = 0
local function other_dtype()
  other_dtype_i = other_dtype_i + 1
  local rest = {}
  for _, d in ipairs(U.dtypes) do if d ~= "f32" then rest[#rest + 1] = d end end
  return U.pick(rest, other_dtype_i)
end

local function desc(opts)
  local p = {}
  for k, v in pairs(opts) do
    local s
    if type(v) == "table" then
      local e = {}
      for i, x in ipairs(v) do e[i] = tostring(x) end
      s = "{" .. table.concat(e, ",") .. "}"
    elseif type(v) == "userdata" then
      s = "tensor " .. U.shape_str(v:shape()) .. " " .. v:dtype()
    else
      s = tostring(v)
    end
    p[#p + 1] = k .. "=" .. s
  end
  table.sort(p)
  return "{" .. table.concat(p, " ") .. "}"
end

-- Checks every algo (each in f32 and one other dtype, poisoned outputs and
-- lse) on inputs made by mk(dtype) -> q, k, v, opts.
local function check_all_algos(mk, what, dtypes)
  dtypes = dtypes or {"f32", other_dtype()}
  for _, dtype in ipairs(dtypes) do
    local q, k, v, opts = mk(dtype)
    opts = opts or {}
    local ref = {U.reference(q, k, v, opts)}
    for _, algo in ipairs(ALGOS) do
      local o = U.copy_opts(opts)
      o.algo = algo
      o.return_lse = true
      U.check_attention(q, k, v, o, ("%s %s %s %s"):format(what, algo, dtype, desc(opts)), {ref = ref})
    end
  end
end

-- ---------------------------------------------------------------------------
TestReference = {}

local function lua_rows(t) return t:cpu():double():totable() end

-- The definitions of docs/lua-api.md §2 (scale, causal variants, window, masks,
-- kv_lens, alibi, softcap, lse) written out in Lua agree with
-- fa.attention_reference, and with every algo, on small 2-D problems.
function TestReference:test_reference_matches_lua_definitions()
  for _, dims in ipairs({{5, 7, 3, 4}, {7, 5, 3, 2}, {6, 6, 4, 4}, {1, 9, 2, 3}}) do
    local Lq, Lk, D, Dv = dims[1], dims[2], dims[3], dims[4]
    local q = U.randn({Lq, D}, "f64", 1, "cpu")
    local k = U.randn({Lk, D}, "f64", 1, "cpu")
    local v = U.randn({Lk, Dv}, "f64", 1, "cpu")
    local Q, K, V = lua_rows(q), lua_rows(k), lua_rows(v)
    local bm = U.nested({Lq, Lk}, function() return math.random() < 0.7 end)
    local fm = U.nested({Lq, Lk}, function() return math.random() < 0.2 and -math.huge or math.random() * 2 - 1 end)
    local cases = {
      {{}, {}},
      {{scale = 1}, {scale = 1}},
      {{scale = 0.37}, {scale = 0.37}},
      {{causal = false}, {}},
      {{causal = true}, {causal = true}},
      {{causal = "bottom_right"}, {causal = "bottom_right"}},
      {{causal = "top_left"}, {causal = "top_left"}},
      {{window = {2, 1}}, {window = {2, 1}}},
      {{window = {-1, 0}}, {window = {-1, 0}}},
      {{window = {1, -1}}, {window = {1, -1}}},
      {{window = {0, 0}}, {window = {0, 0}}},
      {{causal = true, window = {2, -1}}, {causal = true, window = {2, -1}}},
      {{softcap = 1.5}, {softcap = 1.5}},
      {{softcap = 0.3, scale = 2}, {softcap = 0.3, scale = 2}},
      {{alibi = {0.3}}, {alibi = 0.3}},
      {{alibi = {0.3}, causal = true}, {alibi = 0.3, causal = true}},
      {{mask = fa.tensor(bm, {device = "cpu"})}, {bmask = bm}},
      {{mask = fa.tensor(fm, {dtype = "f64", device = "cpu"})}, {fmask = fm}},
      {{kv_lens = {math.max(1, Lk - 2)}}, {kv_len = math.max(1, Lk - 2)}},
      {{kv_lens = {0}}, {kv_len = 0}},
      {{softcap = 2, alibi = {0.1}, mask = fa.tensor(fm, {dtype = "f64", device = "cpu"})},
       {softcap = 2, alibi = 0.1, fmask = fm}},
    }
    for _, c in ipairs(cases) do
      local opts, lopts = c[1], c[2]
      local what = ("reference %dx%d·%dx%d %s"):format(Lq, D, Lk, D, desc(opts))
      local O, LSE = U.lua_attention(Q, K, V, lopts)
      local ro = U.from_flat((function() local f = {} for i = 1, Lq do for d = 1, Dv do f[#f + 1] = O[i][d] end end return f end)(),
        {Lq, Dv}, "f64", "cpu")
      local rl = U.from_flat(LSE, {Lq}, "f64", "cpu")
      local o = U.copy_opts(opts)
      o.return_lse = true
      local fo, fl = fa.attention_reference(q, k, v, o)
      lu.assertEquals(fo:shape(), {Lq, Dv}, what)
      lu.assertEquals(fo:dtype(), "f64", what)
      U.assert_close(fo, ro, "f64", what)
      lu.assertEquals(fl:shape(), {Lq}, what .. " lse shape")
      local a, b = U.flat(fl), LSE
      for i = 1, Lq do
        local ok = (a[i] == b[i]) or math.abs(a[i] - b[i]) <= 1e-12 * math.max(1, math.abs(b[i]))
        lu.assertTrue(ok, ("%s: lse[%d] = %s, Lua gives %s"):format(what, i, tostring(a[i]), tostring(b[i])))
      end
      -- every algo gives the same in f64 (CPU) and f32 (device under test)
      for _, algo in ipairs(ALGOS) do
        local ro_ = {ro, rl}
        local oa = U.copy_opts(opts)
        oa.algo = algo
        oa.return_lse = true
        if U.dtypes[4] == "f64" then
          U.check_attention(q, k, v, oa, what .. " " .. algo .. " f64", {ref = ro_})
        end
        local q32, k32, v32 = q:to(dev):float(), k:to(dev):float(), v:to(dev):float()
        local o32 = U.copy_opts(oa)
        if type(o32.mask) == "userdata" then
          o32.mask = o32.mask:to(dev)
          if o32.mask:dtype() ~= "bool" then o32.mask = o32.mask:float() end
        end
        U.check_attention(q32, k32, v32, o32, what .. " " .. algo .. " f32")
      end
    end
  end
end

-- The seeds' formula O = softmax(QKᵀ)V (no scale) is scale = 1.
function TestReference:test_seed_formula_is_scale_1()
  local Lq, Lk, D = 6, 9, 4
  local q = U.randn({Lq, D}, "f64", 1, "cpu")
  local k = U.randn({Lk, D}, "f64", 1, "cpu")
  local v = U.randn({Lk, D}, "f64", 1, "cpu")
  local Q, K, V = lua_rows(q), lua_rows(k), lua_rows(v)
  local O = {}
  for i = 1, Lq do
    local x = {}
    for j = 1, Lk do
      local s = 0
      for d = 1, D do s = s + Q[i][d] * K[j][d] end
      x[j] = s
    end
    local p = U.lua_softmax_flat(x, Lk)
    for d = 1, D do
      local acc = 0
      for j = 1, Lk do acc = acc + p[j] * V[j][d] end
      O[#O + 1] = acc
    end
  end
  local ref = U.from_flat(O, {Lq, D}, "f64", "cpu")
  U.assert_close(fa.attention_reference(q, k, v, {scale = 1}), ref, "f64", "reference, scale = 1")
  for _, algo in ipairs(ALGOS) do
    local o = fa.attention(q:to(dev):float(), k:to(dev):float(), v:to(dev):float(), {scale = 1, algo = algo})
    U.assert_close(o, ref, "f32", "seeds' formula " .. algo)
  end
  -- and the default scale is 1/√D
  local d1 = fa.attention_reference(q, k, v)
  local d2 = fa.attention_reference(q, k, v, {scale = 1 / math.sqrt(D)})
  lu.assertTrue(fa.max_abs_diff(d1, d2) < 1e-15)
end

-- ---------------------------------------------------------------------------
TestAttention = {}

-- {B, Hq, Hkv, Lq, Lk, D, Dv, heavy}
local CONFIGS = {
  {1, 1, 1, 1, 1, 1, 1},
  {2, 2, 2, 7, 7, 3, 3},
  {1, 2, 2, 129, 129, 64, 64},
  {1, 1, 1, 7, 129, 80, 80},
  {1, 2, 1, 129, 7, 128, 128},
  {1, 1, 1, 1, 1000, 64, 64},
  {1, 1, 1, 129, 129, 256, 256},
  {2, 1, 1, 7, 1, 3, 3},
  {1, 1, 1, 1000, 129, 64, 64, true},
  {1, 1, 1, 1000, 1000, 64, 64, true},
  {1, 1, 1, 129, 1000, 128, 128, true},
}

function TestAttention:test_every_algo_dtype_size()
  for ci, c in ipairs(CONFIGS) do
    local B, Hq, Hkv, Lq, Lk, D, Dv, heavy = table.unpack(c, 1, 8)
    for di, dtype in ipairs(U.dtypes) do
      -- heavy sizes: one dtype per config, rotating
      if not heavy or (ci + di) % #U.dtypes == 0 then
        local q, k, v = qkv(B, Hq, Hkv, Lq, Lk, D, Dv, dtype)
        local ref = {U.reference(q, k, v, {})}
        for ai, algo in ipairs(ALGOS) do
          local lse = (ai + ci + di) % 2 == 0
          local poison = (ai + ci) % 3 ~= 0
          U.check_attention(q, k, v, {algo = algo, return_lse = lse or nil},
            ("attention %s %s B=%d Hq=%d Hkv=%d Lq=%d Lk=%d D=%d Dv=%d"):format(algo, dtype, B, Hq, Hkv, Lq, Lk, D, Dv),
            {ref = ref, poison = poison})
        end
        q:free(); k:free(); v:free()
      end
    end
  end
end

function TestAttention:test_default_algo_is_auto()
  local q, k, v = qkv(1, 2, 2, 33, 41, 16, 16, "f32")
  local a = fa.attention(q, k, v)
  local b = fa.attention(q, k, v, {algo = "auto"})
  lu.assertEquals(fa.max_abs_diff(a, b), 0)
  U.assert_close(a, U.reference(q, k, v, {}), "f32", "attention default algo")
end

-- 2-D (L, D), 3-D (H, L, D) and 4-D inputs; the output has q's rank.
function TestAttention:test_ranks()
  for _, dtype in ipairs({"f32", other_dtype()}) do
    local q4, k4, v4 = qkv(1, 3, 3, 17, 23, 8, 5, dtype)
    for _, algo in ipairs(ALGOS) do
      local o4, l4 = fa.attention(q4, k4, v4, {algo = algo, return_lse = true})
      lu.assertEquals(o4:shape(), {1, 3, 17, 5})
      lu.assertEquals(l4:shape(), {1, 3, 17})
      local o3, l3 = U.check_attention(q4[1], k4[1], v4[1], {algo = algo, return_lse = true}, "3-D " .. algo)
      lu.assertEquals(o3:shape(), {3, 17, 5})
      lu.assertEquals(l3:shape(), {3, 17})
      local o2, l2 = U.check_attention(q4[1][2], k4[1][2], v4[1][2], {algo = algo, return_lse = true}, "2-D " .. algo)
      lu.assertEquals(o2:shape(), {17, 5})
      lu.assertEquals(l2:shape(), {17})
      -- the same numbers as the matching slice of the 4-D call (up to rounding)
      U.assert_close(o3, o4[1]:double(), dtype, "3-D vs 4-D " .. algo, U.tol[dtype] * 2)
      U.assert_close(o2, o4[1][2]:double(), dtype, "2-D vs 4-D " .. algo, U.tol[dtype] * 2)
    end
    -- GQA in 3-D
    local q3, k3, v3 = U.randn({4, 9, 8}, dtype), U.randn({2, 11, 8}, dtype), U.randn({2, 11, 8}, dtype)
    for _, algo in ipairs(ALGOS) do U.check_attention(q3, k3, v3, {algo = algo}, "3-D GQA " .. algo) end
  end
end

function TestAttention:test_lq_differs_from_lk()
  check_all_algos(function(dt) return qkv(2, 2, 2, 5, 67, 32, 32, dt) end, "Lq<Lk")
  check_all_algos(function(dt) return qkv(1, 2, 2, 67, 5, 32, 32, dt) end, "Lq>Lk")
  check_all_algos(function(dt) return qkv(1, 1, 1, 1, 129, 64, 64, dt) end, "decode Lq=1")
end

-- GQA / MQA: query head h uses key/value head floor(h / (Hq/Hkv)), as if
-- k and v were repeated along the head dimension.
function TestAttention:test_gqa_mqa()
  for _, heads in ipairs({{8, 2}, {4, 1}, {6, 3}}) do
    local Hq, Hkv = heads[1], heads[2]
    check_all_algos(function(dt) return qkv(2, Hq, Hkv, 13, 21, 16, 16, dt) end, ("GQA %d/%d"):format(Hq, Hkv))
    -- the grouping convention, on the reference
    local q, k, v = qkv(2, Hq, Hkv, 5, 7, 4, 3, "f64", 1)
    q, k, v = q:cpu(), k:cpu(), v:cpu()
    local g = Hq // Hkv
    local kr = fa.zeros({2, Hq, 7, 4}, {dtype = "f64", device = "cpu"})
    local vr = fa.zeros({2, Hq, 7, 3}, {dtype = "f64", device = "cpu"})
    for b = 1, 2 do
      for h = 1, Hq do
        local src = (h - 1) // g + 1
        kr:select(1, b):select(1, h):copy_(k:select(1, b):select(1, src))
        vr:select(1, b):select(1, h):copy_(v:select(1, b):select(1, src))
      end
    end
    lu.assertTrue(fa.max_abs_diff(fa.attention_reference(q, k, v), fa.attention_reference(q, kr, vr)) < 1e-14,
      "GQA grouping: query head h uses kv head floor(h / (Hq/Hkv))")
    lu.assertTrue(fa.max_abs_diff(fa.attention(q:to(dev):float(), k:to(dev):float(), v:to(dev):float()):double(),
      fa.attention_reference(q, kr, vr)) < 1e-5)
  end
end

-- Calls of a few query rows whose query heads share key heads (decoding): on the CPU the heads of a group
-- are one tile's rows (GQA packing, each key tile read once for them), each head with its own rules
-- (alibi slope, mask rows, lse rows, output rows through opts.out views); every option against the
-- reference, and against the same call with k and v repeated over the query heads (one head a tile).
function TestAttention:test_gqa_decode_rows()
  local B, Hq, Hkv, D = 2, 8, 2, 16
  local slopes = {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625}
  for _, dtype in ipairs(U.dtypes) do
    for _, Lq in ipairs({1, 3, 16}) do
      for _, Lk in ipairs({1, 37, 200}) do
        local q, k, v = qkv(B, Hq, Hkv, Lq, Lk, D, D, dtype)
        local krep = fa.zeros({B, Hq, Lk, D}, {dtype = "f64"})
        local vrep = fa.zeros({B, Hq, Lk, D}, {dtype = "f64"})
        for h = 1, Hq do
          krep:narrow(2, h, 1):copy_(k:cpu():double():narrow(2, (h - 1) // (Hq // Hkv) + 1, 1))
          vrep:narrow(2, h, 1):copy_(v:cpu():double():narrow(2, (h - 1) // (Hq // Hkv) + 1, 1))
        end
        krep, vrep = krep:to(dev):to(dtype), vrep:to(dev):to(dtype)
        local sets = {
          {}, {causal = true}, {causal = "top_left"}, {window = {5, 2}}, {alibi = slopes, causal = true},
          {softcap = 2, scale = 0.3}, {kv_lens = {Lk, (Lk + 1) // 2}, causal = true},
          {mask = U.randn({B, Hq, Lq, Lk}, dtype)},
          {mask = fa.tensor(U.nested({1, 1, Lq, Lk}, function() return math.random() < 0.7 end), {device = dev})},
        }
        for i, opts in ipairs(sets) do
          opts.return_lse = true
          local what = ("GQA decode %s Lq %d Lk %d set %d"):format(dtype, Lq, Lk, i)
          local o, lse = U.check_attention(q, k, v, opts, what)
          local o2, lse2 = fa.attention(q, krep, vrep, U.copy_opts(opts))
          U.assert_close(o, o2:cpu():double(), dtype, what .. " against repeated heads")
          U.assert_lse(lse, lse2:cpu():double(), dtype, what .. " lse against repeated heads")
        end
      end
    end
    -- a tile the call names is run as asked, one head's rows a tile (no packing): the same bits as the call
    -- with k and v repeated over the heads and the same tile (on the CPU; the GPU kernels take their own paths)
    if dev == "cpu" then
      local q, k, v = qkv(B, Hq, Hkv, 4, 50, D, D, dtype)
      local rep = Hq // Hkv
      local krep = fa.zeros({B, Hq, 50, D}, {dtype = dtype})
      local vrep = fa.zeros({B, Hq, 50, D}, {dtype = dtype})
      for h = 1, Hq do
        krep:narrow(2, h, 1):copy_(k:narrow(2, (h - 1) // rep + 1, 1))
        vrep:narrow(2, h, 1):copy_(v:narrow(2, (h - 1) // rep + 1, 1))
      end
      for _, algo in ipairs({"flash", "two_pass"}) do
        local opts = {tile = {2, 16}, algo = algo, causal = true}
        lu.assertEquals(fa.max_abs_diff(fa.attention(q, k, v, opts), fa.attention(q, krep, vrep, opts)), 0,
          ("%s %s: opts.tile's query tiles are one head's"):format(dtype, algo))
      end
    end
    -- NaN in a value of key 5 reaches exactly the heads whose mask rows keep that key, also where its
    -- weight is 0 (head 3: -1e30 added; the packed tile's rows take the zero-skipping loops, each asking its
    -- own head's rules whether the key is kept)
    local q, k, v = qkv(B, Hq, Hkv, 2, 9, D, D, dtype)
    v:set(1, 1, 5, 3, U.NaN)
    local m = fa.tensor(U.nested({1, Hq, 2, 9}, function(_, h, _, j)
      if j ~= 5 or h > 3 then return 0 end
      return h == 3 and -1e30 or -math.huge
    end), {device = dev})
    local o = fa.attention(q, k, v, {mask = m})
    for h = 1, Hq do
      local row = o:select(1, 1):select(1, h):cpu():double()
      local finite = row:isfinite()
      lu.assertEquals(finite, h <= 2 or h > 4, ("%s NaN reaches head %d"):format(dtype, h))
    end
    lu.assertTrue(o:select(1, 2):isfinite(), dtype .. " NaN of batch 1 reached batch 2")
  end
end

function TestAttention:test_dv_differs_from_d()
  for _, dd in ipairs({{64, 32}, {16, 80}, {3, 1}, {1, 7}}) do
    check_all_algos(function(dt) return qkv(1, 2, 2, 19, 27, dd[1], dd[2], dt) end, ("D=%d Dv=%d"):format(dd[1], dd[2]))
  end
end

function TestAttention:test_scale()
  for _, s in ipairs({0.3, 1, 2.5, 0}) do
    check_all_algos(function(dt)
      local q, k, v = qkv(1, 2, 2, 17, 19, 16, 16, dt)
      return q, k, v, {scale = s}
    end, "scale " .. s)
  end
  -- a scale of no sign or a negative one on partial key tiles (the causal
  -- diagonal, a window's edges): the fast kernels scale s before the tile's
  -- maximum there, where a positive scale leaves s raw
  for _, s in ipairs({0, -0.7}) do
    check_all_algos(function(dt)
      local q, k, v = qkv(1, 2, 2, 37, 45, 16, 16, dt)
      return q, k, v, {scale = s, causal = true, window = {9, -1}}
    end, "scale " .. s .. " causal")
  end
  -- default = 1/√D
  local q, k, v = qkv(1, 1, 1, 9, 9, 64, 64, "f32")
  for _, algo in ipairs(ALGOS) do
    local a = fa.attention(q, k, v, {algo = algo})
    local b = fa.attention(q, k, v, {algo = algo, scale = 1 / 8})
    lu.assertTrue(fa.max_abs_diff(a, b) <= 1e-6, "default scale is 1/sqrt(D) for " .. algo)
  end
end

function TestAttention:test_causal_variants()
  for _, L in ipairs({{17, 40}, {40, 17}, {23, 23}, {1, 9}, {129, 130}}) do
    local Lq, Lk = L[1], L[2]
    for _, causal in ipairs({true, "bottom_right", "top_left", false}) do
      check_all_algos(function(dt)
        local q, k, v = qkv(1, 2, 2, Lq, Lk, 16, 16, dt)
        return q, k, v, {causal = causal}
      end, ("causal Lq=%d Lk=%d"):format(Lq, Lk))
    end
    -- true is bottom_right; bottom_right and top_left differ unless Lq = Lk
    local q, k, v = qkv(1, 2, 2, Lq, Lk, 16, 16, "f32")
    for _, algo in ipairs(ALGOS) do
      local t = fa.attention(q, k, v, {algo = algo, causal = true})
      local br = fa.attention(q, k, v, {algo = algo, causal = "bottom_right"})
      local tl = fa.attention(q, k, v, {algo = algo, causal = "top_left"})
      local none = fa.attention(q, k, v, {algo = algo})
      lu.assertEquals(fa.max_abs_diff(t, br), 0, algo .. ": causal = true is bottom_right")
      if Lq == Lk then
        lu.assertEquals(fa.max_abs_diff(br, tl), 0, algo .. ": the two alignments agree when Lq = Lk")
      elseif Lq > 1 then
        lu.assertTrue(fa.max_abs_diff(br, tl) > 1e-3, ("%s: bottom_right and top_left should differ (Lq=%d Lk=%d)")
          :format(algo, Lq, Lk))
      end
      if Lk > 1 then lu.assertTrue(fa.max_abs_diff(none, tl) > 1e-3, algo .. ": causal masks something") end
    end
  end
end

function TestAttention:test_window()
  for _, L in ipairs({{37, 37}, {20, 50}, {50, 20}}) do
    for _, w in ipairs({{2, 3}, {-1, 0}, {0, 0}, {4, -1}, {0, -1}, {-1, -1}, {5, 5}}) do
      check_all_algos(function(dt)
        local q, k, v = qkv(1, 1, 1, L[1], L[2], 16, 16, dt)
        return q, k, v, {window = w}
      end, ("window Lq=%d Lk=%d"):format(L[1], L[2]), {"f32"})
    end
    -- with causal (bottom-right) too
    check_all_algos(function(dt)
      local q, k, v = qkv(1, 2, 2, L[1], L[2], 16, 16, dt)
      return q, k, v, {window = {3, -1}, causal = true}
    end, "window + causal")
    -- {-1, 0} is causal (bottom-right); {-1, -1} is no window
    local q, k, v = qkv(1, 1, 1, L[1], L[2], 16, 16, "f32")
    for _, algo in ipairs(ALGOS) do
      local a = fa.attention(q, k, v, {algo = algo, window = {-1, 0}})
      local b = fa.attention(q, k, v, {algo = algo, causal = true})
      lu.assertTrue(fa.max_abs_diff(a, b) <= 1e-6, algo .. ": window {-1, 0} is causal")
      local c = fa.attention(q, k, v, {algo = algo, window = {-1, -1}})
      local d = fa.attention(q, k, v, {algo = algo})
      lu.assertTrue(fa.max_abs_diff(c, d) <= 1e-6, algo .. ": window {-1, -1} is no window")
    end
  end
end

-- Bool and float masks of every broadcastable shape.
function TestAttention:test_masks_broadcast()
  local B, Hq, Lq, Lk = 2, 3, 19, 23
  local shapes = {{Lq, Lk}, {1, 1, Lq, Lk}, {B, 1, 1, Lk}, {B, Hq, Lq, Lk}, {1, Hq, 1, 1}, {B, 1, Lq, Lk},
                  {Lk}, {Hq, Lq, Lk}, {Lq, 1}}
  for si, shape in ipairs(shapes) do
    for _, kind in ipairs({"bool", "float"}) do
      check_all_algos(function(dt)
        local q, k, v = qkv(B, Hq, Hq, Lq, Lk, 16, 16, dt)
        local m
        if kind == "bool" then
          local p = (#shape == 4 and shape[4] == 1) and 0.8 or 0.7
          m = fa.tensor(U.nested(shape, function() return math.random() < p end), {device = dev})
          lu.assertEquals(m:dtype(), "bool")
        else
          m = fa.tensor(U.nested(shape, function()
            return math.random() < 0.1 and -math.huge or 2 * math.random() - 1
          end), {dtype = dt, device = dev})
        end
        return q, k, v, {mask = m}
      end, ("%s mask %s"):format(kind, U.shape_str(shape)), si % 2 == 0 and {"f32"} or nil)
    end
  end
  -- a 2-D problem with a 2-D mask
  check_all_algos(function(dt)
    local q, k, v = U.randn({11, 8}, dt), U.randn({13, 8}, dt), U.randn({13, 8}, dt)
    local m = fa.tensor(U.nested({11, 13}, function() return math.random() < 0.6 end), {device = dev})
    return q, k, v, {mask = m}
  end, "2-D with bool mask")
  -- an all-true bool mask and an all-zero float mask change nothing
  local q, k, v = qkv(B, Hq, Hq, Lq, Lk, 16, 16, "f32")
  local plain = fa.attention(q, k, v)
  local t = fa.tensor(U.nested({Lq, Lk}, function() return true end), {device = dev})
  lu.assertTrue(fa.max_abs_diff(fa.attention(q, k, v, {mask = t}), plain) <= 1e-6)
  lu.assertTrue(fa.max_abs_diff(fa.attention(q, k, v, {mask = fa.zeros({Lq, Lk}, {device = dev})}), plain) <= 1e-6)
end

function TestAttention:test_kv_lens()
  local B, H, Lq, Lk = 3, 2, 9, 20
  local lens = {20, 5, 0}
  for _, form in ipairs({"table", "tensor"}) do
    check_all_algos(function(dt)
      local q, k, v = qkv(B, H, H, Lq, Lk, 16, 16, dt)
      local kl = form == "table" and lens or fa.tensor(lens, {device = dev})
      return q, k, v, {kv_lens = kl}
    end, "kv_lens " .. form)
  end
  -- the same as a (B, 1, 1, Lk) key-padding mask
  local q, k, v = qkv(B, H, H, Lq, Lk, 16, 16, "f32")
  local m = fa.tensor(U.nested({B, 1, 1, Lk}, function(b, _, _, j) return j <= lens[b] end), {device = dev})
  for _, algo in ipairs(ALGOS) do
    local a = fa.attention(q, k, v, {algo = algo, kv_lens = lens})
    local b = fa.attention(q, k, v, {algo = algo, mask = m})
    lu.assertTrue(fa.max_abs_diff(a, b) <= 1e-6, algo .. ": kv_lens equals a key-padding mask")
    lu.assertEquals(a[3]:norm(), 0, algo .. ": kv_len 0 gives zero rows")
  end
  -- with causal and a float mask on top
  check_all_algos(function(dt)
    local q2, k2, v2 = qkv(B, H, H, Lq, Lk, 16, 16, dt)
    return q2, k2, v2, {kv_lens = {17, 9, 1}, causal = "top_left",
                        mask = fa.tensor(U.nested({Lq, Lk}, function() return math.random() - 0.5 end),
                          {dtype = dt, device = dev})}
  end, "kv_lens + causal + float mask")
end

-- ALiBi adds −slope_h·|i + Lk − Lq − j|.
function TestAttention:test_alibi()
  local B, H, Lq, Lk = 1, 4, 13, 29
  local slopes = {0.5, 0.25, 0.125, 0.0625}
  for _, form in ipairs({"table", "tensor"}) do
    check_all_algos(function(dt)
      local q, k, v = qkv(B, H, H, Lq, Lk, 16, 16, dt)
      return q, k, v, {alibi = form == "table" and slopes or fa.tensor(slopes, {device = dev})}
    end, "alibi " .. form)
  end
  check_all_algos(function(dt)
    local q, k, v = qkv(2, H, 2, Lk, Lq, 16, 16, dt)
    return q, k, v, {alibi = slopes, causal = true}
  end, "alibi + causal + GQA, Lq > Lk")
  -- D = 128 over several key tiles, Lq < Lk (Hopper: the tiles to one side of every row's diagonal
  -- take the bias as two FMAs a score, those across it the general pass)
  for _, causal in ipairs({false, true}) do
    check_all_algos(function(dt)
      local q, k, v = qkv(1, 2, 2, 200, 456, 128, 128, dt)
      return q, k, v, {alibi = {0.5, 0.03}, causal = causal}
    end, "alibi D=128 " .. (causal and "causal" or "not causal"), {other_dtype()})
  end
  -- the reference's alibi is the float bias written out
  local q, k, v = qkv(B, H, H, Lq, Lk, 8, 8, "f64", 1)
  q, k, v = q:cpu(), k:cpu(), v:cpu()
  local bias = fa.tensor(U.nested({1, H, Lq, Lk}, function(_, h, i, j)
    return -slopes[h] * math.abs((i - 1) + Lk - Lq - (j - 1))
  end), {dtype = "f64", device = "cpu"})
  lu.assertTrue(fa.max_abs_diff(fa.attention_reference(q, k, v, {alibi = slopes}),
    fa.attention_reference(q, k, v, {mask = bias})) < 1e-14, "alibi = −slope·|i + Lk − Lq − j|")
end

-- f32 with alibi and causal top_left over long keys: every attended key lies about Lk from alibi's
-- diagonal, so every score is near -slope·Lk. two_pass's output pass once took m + ln l as one f32
-- offset, rounded at that magnitude (cuda: 3.6e-4 from the f64 reference where the one-pass kernel
-- had 1.4e-4, Lk = 16k; oracle seed 6105, case 849). Every algorithm is held to the one-pass error.
function TestAttention:test_f32_two_pass_under_large_alibi_biases()
  local Lk = dev == "cuda" and 16384 or 4096
  local q, k, v = qkv(1, 4, 1, 2, Lk, 128, 128, "f32")
  local opts = {alibi = {0.7071, 0.25, 0.1768, 0.0625}, causal = "top_left"}
  local ref = fa.attention_reference(q:cpu():double(), k:cpu():double(), v:cpu():double(), opts)
  local function err(algo)
    opts.algo = algo
    return fa.max_abs_diff(fa.attention(q, k, v, opts):cpu():double(), ref)
  end
  local flash = err("flash")
  for _, algo in ipairs({"two_pass", "naive", "flash_row"}) do
    local e = err(algo)
    lu.assertTrue(e <= 1.25 * flash + 1e-6, ("%s: %.3g from the reference, flash %.3g"):format(algo, e, flash))
  end
end

function TestAttention:test_softcap()
  for _, c in ipairs({5, 0.5, 30}) do
    check_all_algos(function(dt)
      local q, k, v = qkv(1, 2, 2, 21, 33, 16, 16, dt, 2)
      return q, k, v, {softcap = c}
    end, "softcap " .. c)
  end
  check_all_algos(function(dt)
    local q, k, v = qkv(1, 2, 2, 21, 33, 16, 16, dt, 2)
    return q, k, v, {softcap = 1, causal = true, alibi = {0.1, 0.2}}
  end, "softcap + causal + alibi")
end

-- softcap at the ends of its range (any finite c > 0): past f32's range it
-- is the identity there, far below it every score is about 0; never NaN
-- (c·tanh(s/c) in f32 had inf·0 and 0/0).  D = 64 reaches the fast kernels.
function TestAttention:test_softcap_range_ends()
  for _, c in ipairs({1e300, 3e38, 1e-300, 1e-40}) do
    for _, D in ipairs({16, 64}) do
      check_all_algos(function(dt)
        local q, k, v = qkv(1, 2, 2, 70, 131, D, D, dt)
        return q, k, v, {softcap = c}
      end, ("softcap %g D=%d"):format(c, D))
    end
  end
end

function TestAttention:test_return_lse_shapes()
  local q, k, v = qkv(2, 3, 3, 7, 9, 8, 8, "f32")
  for _, algo in ipairs(ALGOS) do
    local o, lse = fa.attention(q, k, v, {algo = algo, return_lse = true})
    lu.assertEquals(lse:shape(), {2, 3, 7})
    lu.assertEquals(lse:dtype(), "f32")
    lu.assertEquals(lse:device(), dev)
    lu.assertEquals(o:shape(), {2, 3, 7, 8})
    local o2, none = fa.attention(q, k, v, {algo = algo})
    lu.assertNil(none, algo .. ": no lse without return_lse")
    lu.assertEquals(fa.max_abs_diff(o, o2), 0)
    lse = select(2, fa.attention(q, k, v, {algo = algo, return_lse = false}))
    lu.assertNil(lse)
  end
end

-- Causal rows ending on either side of a key tile's middle: key counts 64
-- either side of the query count (two query tiles of 128 rows) move where a
-- consumer warpgroup's 64 rows end in their query tile's last key tile (of
-- 128, the fast kernels' default at D = 64 and 128), first half or second,
-- the boundary on which a kernel that skipped the unused half would turn
-- (session 96 tried one: docs/perf/README.md); with windows, kv_lens, a
-- negative scale and, at D = 64, alibi and softcap.
function TestAttention:test_causal_ends_across_half_tiles()
  local Lq, dtype = 256, other_dtype()
  for _, D in ipairs({64, 128}) do
    for _, off in ipairs({-65, -64, -63, -1, 0, 1, 63, 64, 65, 127, 129}) do
      local Lk = Lq + off
      local q, k, v = qkv(1, 2, 1, Lq, Lk, D, D, dtype)
      local what = ("%s D=%d Lq=%d Lk=%d"):format(dtype, D, Lq, Lk)
      local cases = {
        {causal = true},
        {causal = "top_left"},
        {causal = true, window = {100, -1}},
        {causal = true, kv_lens = {Lk - 30}},
        {causal = true, scale = -0.5},
      }
      if D == 64 then
        cases[#cases + 1] = {causal = true, alibi = {0.5, 0.25}}
        cases[#cases + 1] = {causal = "top_left", softcap = 3}
      end
      for _, opts in ipairs(cases) do
        local o = U.copy_opts(opts)
        o.algo, o.return_lse = "flash", true
        U.check_attention(q, k, v, o, what .. " " .. desc(opts))
      end
    end
  end
end

-- "flash" and "two_pass" at D = Dv = 64 and 128 with the default tile, in
-- f32 and one other dtype (on cuda the fast kernels: register-tiled f32,
-- kernels/attention/attention_f32.cu, and tensor cores for f16/bf16, each with the two
-- passes of two_pass): sizes that are not multiples of their tiles, Lq below
-- and above Lk, GQA (Hq = 4, Hkv = 2), lse, every option (softcap and alibi
-- alone take the kernels' instances without mask code); fully masked rows;
-- NaN and inf in V behind a causal mask reach only the rows that attend
-- them.
function TestAttention:test_fast_paths_head_dims()
  local B, Hq, Hkv = 2, 4, 2
  local function bmask(shape, p)
    return fa.tensor(U.nested(shape, function() return math.random() < p end), {device = dev})
  end
  local function fmask(shape, dtype)
    return fa.tensor(U.nested(shape, function() return math.random() < 0.1 and -math.huge or 2 * math.random() - 1 end),
      {dtype = dtype, device = dev})
  end
  for _, run in ipairs({{"flash", "f32"}, {"two_pass", "f32"}, {"flash", other_dtype()}, {"two_pass", other_dtype()}}) do
    local algo, dtype = run[1], run[2]
    for _, D in ipairs({64, 96, 128, 256}) do
      for _, L in ipairs({{70, 131}, {131, 70}}) do
        local Lq, Lk = L[1], L[2]
        local q, k, v = qkv(B, Hq, Hkv, Lq, Lk, D, D, dtype)
        local what = ("%s %s D=%d Lq=%d Lk=%d"):format(dtype, algo, D, Lq, Lk)
        local cases = {
          {},
          {causal = true, scale = 0.3},
          {causal = true, scale = -0.3},
          {causal = "top_left", kv_lens = {Lk - 9, 40}},
          {window = {20, 5}},
          {window = {7, -1}, causal = true},
          {mask = bmask({1, Hq, Lq, Lk}, 0.7), causal = "top_left"},
          {mask = bmask({B, 1, 1, Lk}, 0.8)},
          {mask = fmask({Hq, 1, Lk}, dtype)},
          {mask = fmask({B, 1, Lq, Lk}, dtype), alibi = {0.5, 0.25, 0.125, 0.0625}},
          {softcap = 2},
          {alibi = {0.5, 0.25, 0.125, 0.0625}, causal = true},
          {softcap = 5, alibi = {0.1, 0.2, 0.3, 0.4}, causal = true, kv_lens = {Lk, 33}, mask = fmask({Lq, Lk}, dtype)},
        }
        for _, opts in ipairs(cases) do
          local o = U.copy_opts(opts)
          o.algo, o.return_lse = algo, true
          U.check_attention(q, k, v, o, what .. " " .. desc(opts))
        end
        -- row 5 masked off entirely, and batch 2 with no key: zeros and lse = -inf
        local m = fa.tensor(U.nested({Lq, Lk}, function(i) return i ~= 5 and math.random() < 0.9 end), {device = dev})
        local o, lse = U.check_attention(q, k, v, {algo = algo, mask = m, kv_lens = {Lk, 0}, return_lse = true},
          what .. " fully masked rows")
        lu.assertTrue(o:isfinite())
        lu.assertEquals(o:select(3, 5):norm(), 0)
        lu.assertEquals(o[2]:norm(), 0)
        lu.assertEquals(lse:select(3, 5):max(), -math.huge)
        lu.assertEquals(lse[2]:max(), -math.huge)
        -- NaN and inf in V (one batch: 3-D inputs): only the rows whose causal
        -- range holds those keys see them; the others are finite and right
        local vn = v[1]:clone()
        vn:set(2, Lk - 40, 3, U.NaN)
        vn:set(1, Lk - 10, 7, U.inf)
        local causal = Lq < Lk and true or "top_left"
        U.check_attention(q[1], k[1], vn, {algo = algo, causal = causal, return_lse = true},
          ("%s NaN/inf in v, causal=%s"):format(what, tostring(causal)))
        -- NaN in the scores (V finite): a NaN row of q, and a NaN key that only
        -- the last rows attend
        local qn, kn = q[1]:clone(), k[1]:clone()
        qn:set(3, 3, 5, U.NaN)
        kn:set(2, Lk - 5, 9, U.NaN)
        U.check_attention(qn, kn, v[1], {algo = algo, causal = causal, return_lse = true},
          ("%s NaN in q and k, causal=%s"):format(what, tostring(causal)))
      end
    end
  end
end

-- D = 256 with rows of more than 1024 keys: on Hopper cuda (f16/bf16) the
-- warp-specialised kernel's key tiles of 80 (its automatic choice there,
-- and given as {128, 80}), whose last tile is partial (1100 = 13 * 80 + 60),
-- beside the default {128, 64}; every score rule, two query tiles (the
-- second partial), GQA; and 16500 keys, which the persistent form takes.
function TestAttention:test_long_rows_at_d256()
  local dtype = other_dtype()
  local Lq, Lk = 130, 1100
  local q, k, v = qkv(1, 2, 1, Lq, Lk, 256, 256, dtype)
  local mask = fa.tensor(U.nested({Lq, Lk}, function(i, j) return (i * 7 + j * 3) % 10 ~= 0 end), {device = dev})
  local cases = {
    {}, {causal = true}, {softcap = 5}, {alibi = {0.05, 0.01}, causal = true}, {kv_lens = {1037}},
    {window = {1000, 100}}, {mask = mask}, {causal = "top_left"},
  }
  for _, opts in ipairs(cases) do
    for _, tile in ipairs({false, {128, 80}, {128, 64}}) do
      local o = U.copy_opts(opts)
      o.return_lse = true
      if tile then o.tile = tile end
      U.check_attention(q, k, v, o, ("D=256 Lk=%d %s %s tile %s"):format(Lk, dtype, desc(opts),
        tile and (tile[1] .. "x" .. tile[2]) or "auto"))
    end
  end
  -- from 16384 keys the persistent form (a block an SM walking the query
  -- tiles) with tiles of 80, the last partial (16500 = 206 * 80 + 20)
  local q2, k2, v2 = qkv(1, 1, 1, 129, 16500, 256, 256, dtype)
  for _, opts in ipairs({{}, {causal = true, softcap = 5}}) do
    local o = U.copy_opts(opts)
    o.return_lse = true
    U.check_attention(q2, k2, v2, o, ("D=256 Lk=16500 %s %s"):format(dtype, desc(opts)))
  end
end

-- NaN and inf in V with no causal and no window, where the CUDA fast kernels
-- check V themselves (each block a share of the key tiles: Lq and Lk span
-- several query and key tiles, so that the tiles with NaN fall to a block
-- other than the first): a bool mask that hides a key from some rows, keys
-- past kv_lens (never read), and every row attending the key.
function TestAttention:test_fast_paths_nonfinite_v_without_causal()
  local B, Hq, Hkv, Lq, Lk = 2, 4, 2, 200, 300
  for _, run in ipairs({{"flash", "f32"}, {"two_pass", "f32"}, {"flash", other_dtype()}, {"two_pass", other_dtype()}}) do
    local algo, dtype = run[1], run[2]
    for _, D in ipairs({64, 96, 128, 256}) do
      local q, k, v = qkv(B, Hq, Hkv, Lq, Lk, D, D, dtype)
      local what = ("%s %s D=%d"):format(dtype, algo, D)
      local vn = v:clone()
      vn:set(1, 2, 250, 3, U.NaN) -- key tile 7 of 32 (f32), 1 of 128 (f16/bf16)
      vn:set(2, 1, 290, 7, U.inf)
      vn:set(2, 2, 140, 1, -U.inf)
      local mask = fa.tensor(U.nested({B, 1, Lq, Lk}, function() return math.random() < 0.8 end), {device = dev})
      for _, opts in ipairs({{mask = mask}, {kv_lens = {Lk, 120}}, {}, {softcap = 3, kv_lens = {260, Lk}}}) do
        local o = U.copy_opts(opts)
        o.algo, o.return_lse = algo, true
        U.check_attention(q, k, vn, o, what .. " NaN/inf in v " .. desc(opts))
      end
      -- the flag of one call does not reach the next: finite V gives finite rows
      U.check_attention(q, k, v, {algo = algo, mask = mask}, what .. " finite v after")
    end
  end
end

function TestAttention:test_tiles()
  -- {128, 64} and {128, 128} at D = 64 are the Hopper kernel's tiles on cuda (f16/bf16)
  local tiles = {{16, 16}, {32, 32}, {64, 64}, {16, 64}, {64, 16}, {128, 32}, {32, 128}, {128, 64}, {128, 128}}
  for _, algo in ipairs(TILED) do
    for _, dtype in ipairs({"f32", other_dtype()}) do
      for ti, tile in ipairs(tiles) do
        local causal = U.pick({false, true, "top_left"}, ti)
        local q, k, v = qkv(1, 2, 2, 129, 100, 64, 64, dtype)
        U.check_attention(q, k, v, {algo = algo, tile = tile, causal = causal, return_lse = true},
          ("%s tile {%d,%d} %s causal=%s"):format(algo, tile[1], tile[2], dtype, tostring(causal)))
        -- small problems (L below the tile)
        local q2, k2, v2 = qkv(1, 1, 1, 3, 5, 8, 8, dtype)
        U.check_attention(q2, k2, v2, {algo = algo, tile = tile}, ("%s tile {%d,%d} small"):format(algo, tile[1], tile[2]))
      end
    end
  end
  local q, k, v = qkv(1, 1, 1, 16, 16, 16, 16, "f32")
  for _, algo in ipairs(TILED) do
    for _, bad in ipairs({{0, 16}, {16, 0}, {-16, 16}, {16.5, 16}, {16}, {16, 16, 16}, {}, "16", 16}) do
      U.assert_fa_error({"tile"}, fa.attention, q, k, v, {algo = algo, tile = bad})
    end
  end
end

-- f32 at D = 64 and 128: the default tile (on Hopper cuda {64, 32}, the
-- exact-f32 kernel) given explicitly, and {64, 64} (honoured by the SIMT
-- kernel), at key lengths from one to five key tiles of 32, whole and
-- partial (1, 32, 33, 64, 95, 130), so that the kernel's pipeline (the first
-- tile's S alone, the last tile's P·V alone, double-buffered K and V) starts
-- and ends at each phase; flash and two_pass, causal in both alignments or
-- not, and softcap with kv_lens.
function TestAttention:test_f32_kernel_tiles_and_key_counts()
  for _, D in ipairs({64, 128}) do
    for _, Lk in ipairs({1, 32, 33, 64, 95, 130}) do
      local q, k, v = qkv(1, 2, 1, 70, Lk, D, D, "f32")
      for _, tile in ipairs({{64, 32}, {64, 64}}) do
        for _, algo in ipairs(TILED) do
          local causal = U.pick({false, true, "top_left"}, Lk)
          local what = ("f32 D=%d Lk=%d %s tile {%d,%d} causal=%s"):format(D, Lk, algo, tile[1], tile[2], tostring(causal))
          U.check_attention(q, k, v, {algo = algo, tile = tile, causal = causal, return_lse = true}, what)
          U.check_attention(q, k, v, {algo = algo, tile = tile, softcap = 3, kv_lens = {math.max(Lk - 3, 0)},
            return_lse = true}, what .. " softcap kv_lens")
        end
      end
    end
  end
end

function TestAttention:test_reference_out_and_lse_out()
  -- the reference writes f64 CPU outputs, views included, and returns them
  local q, k, v = qkv(1, 2, 2, 5, 7, 8, 8, "f32")
  local canvas = fa.full({1, 2, 5, 12}, 7, {dtype = "f64", device = "cpu"})
  local out = canvas:narrow(4, 3, 8)
  local lse_out = fa.zeros({1, 2, 5}, {dtype = "f64", device = "cpu"})
  local o, l = fa.attention_reference(q, k, v, {out = out, lse_out = lse_out, return_lse = true, causal = true})
  lu.assertTrue(rawequal(o, out) and rawequal(l, lse_out))
  local ro, rl = fa.attention_reference(q, k, v, {return_lse = true, causal = true})
  lu.assertEquals(fa.max_abs_diff(out, ro), 0)
  lu.assertEquals(fa.max_abs_diff(lse_out, rl), 0)
  lu.assertEquals(canvas:narrow(4, 1, 2):min(), 7) -- untouched around the view
  U.assert_fa_error({"opts.out", "f64"}, fa.attention_reference, q, k, v, {out = fa.zeros({1, 2, 5, 8})})
end

function TestAttention:test_bool_tensors_are_no_slopes_or_lengths()
  local q = fa.randn({1, 2, 3, 4}, {seed = 1})
  U.assert_fa_error({"opts.alibi", "bool"}, fa.attention, q, q, q, {alibi = fa.tensor({true, false})})
  U.assert_fa_error({"opts.kv_lens", "bool"}, fa.attention, q, q, q, {kv_lens = fa.tensor({true})})
end

function TestAttention:test_kv_lens_range_errors()
  -- an integer past int64 (math.maxinteger read as a double) is out of range, not "not an integer"
  local q = fa.randn({1, 1, 2, 4}, {seed = 1})
  U.assert_fa_error({"opts.kv_lens[1]", "expected 0 to Lk"}, fa.attention, q, q, q, {kv_lens = {math.maxinteger}})
  U.assert_fa_error({"opts.kv_lens[1]", "expected 0 to Lk"}, fa.attention, q, q, q, {kv_lens = {1e300}})
  U.assert_fa_error({"opts.kv_lens[1]", "expected 0 to Lk"}, fa.attention, q, q, q, {kv_lens = {3}})
  U.assert_fa_error({"opts.kv_lens[1]", "expected an integer"}, fa.attention, q, q, q, {kv_lens = {1.5}})
  U.assert_fa_error({"opts.kv_lens[1]", "expected an integer"}, fa.attention, q, q, q, {kv_lens = {0 / 0}})
end

function TestAttention:test_one_opts_table_for_both_passes()
  -- fa.attention takes the backward's `deterministic`, so that the same opts serve both (API §10)
  local q, k, v = qkv(1, 2, 2, 5, 7, 8, 8, "f32")
  local opts = {causal = true, deterministic = true, return_lse = true}
  local o, lse = fa.attention(q, k, v, opts)
  U.assert_close(o, U.reference(q, k, v, {causal = true}), "f32", "deterministic forward")
  local dq = fa.attention_backward(q, k, v, o, lse, o, opts)
  lu.assertEquals(dq:dim(), 4)
  U.assert_fa_error({"deterministic", "boolean"}, fa.attention, q, k, v, {deterministic = 1})
end

function TestAttention:test_out_and_lse_out()
  local q, k, v = qkv(2, 2, 2, 11, 13, 8, 8, "f32")
  for _, algo in ipairs(ALGOS) do
    local out = U.poison({2, 2, 11, 8}, "f32")
    local lse_out = U.poison({2, 2, 11}, "f32")
    local o, lse = fa.attention(q, k, v, {algo = algo, out = out, lse_out = lse_out, return_lse = true})
    local ro, rl = U.reference(q, k, v, {})
    U.assert_close(out, ro, "f32", algo .. " opts.out")
    U.assert_lse(lse_out, rl, "f32", algo .. " opts.lse_out")
    lu.assertEquals(fa.max_abs_diff(o, out), 0)
    lu.assertEquals(fa.max_abs_diff(lse, lse_out), 0)
  end
end

-- A query row with no key to attend: zeros and lse = −inf, never NaN.
function TestAttention:test_fully_masked_rows()
  local B, H, Lq, Lk = 2, 2, 6, 9
  for _, dtype in ipairs(U.dtypes) do
    local q, k, v = qkv(B, H, H, Lq, Lk, 8, 8, dtype)
    local bm = fa.tensor(U.nested({Lq, Lk}, function(i) return i ~= 2 and math.random() < 0.8 or false end),
      {device = dev})
    local fm = fa.tensor(U.nested({Lq, Lk}, function(i) return i == 4 and -math.huge or 0 end), {dtype = dtype, device = dev})
    local cases = {
      {{mask = bm}, function(o) return o:select(3, 2) end},
      {{mask = fm}, function(o) return o:select(3, 4) end},
      {{kv_lens = {9, 0}}, function(o) return o[2] end},
      {{window = {0, 0}}, nil},
    }
    local qb, kb, vb = qkv(B, H, H, 12, 5, 8, 8, dtype)
    for _, algo in ipairs(ALGOS) do
      for _, c in ipairs(cases) do
        local opts = U.copy_opts(c[1])
        opts.algo = algo
        opts.return_lse = true
        local o = U.check_attention(q, k, v, opts, ("fully masked %s %s %s"):format(algo, dtype, desc(c[1])))
        lu.assertTrue(o:isfinite(), "NaN in a fully masked row")
        if c[2] then lu.assertEquals(c[2](o):norm(), 0, "a fully masked row is zero") end
      end
      -- Lq > Lk, bottom-right causal: the first Lq − Lk rows see nothing
      local o, lse = U.check_attention(qb, kb, vb, {algo = algo, causal = true, return_lse = true},
        ("fully masked %s %s causal Lq>Lk"):format(algo, dtype))
      lu.assertEquals(o:narrow(3, 1, 7):norm(), 0)
      lu.assertEquals(lse:narrow(3, 1, 7):max(), -math.huge)
      -- everything masked
      local none = fa.tensor(U.nested({12, 5}, function() return false end), {device = dev})
      o, lse = fa.attention(qb, kb, vb, {algo = algo, mask = none, return_lse = true})
      lu.assertEquals(o:norm(), 0)
      lu.assertTrue(o:isfinite())
      lu.assertEquals(lse:max(), -math.huge)
    end
  end
end

-- Bool masks with structure: documents (block-diagonal), a run of rows
-- that keep nothing, a key-padding row broadcast over the queries: whole
-- key tiles and whole query tiles that keep nothing, which a kernel that
-- skips such tiles must get right (zeros and lse = -inf where a row keeps
-- nothing).  D = 64 and 128 in f16/bf16 reach the tensor-core kernels on
-- cuda; L = 700 leaves partial tiles at both ends of the documents.  NaN
-- and inf of V in keys no row keeps reach no row.
function TestAttention:test_bool_mask_documents()
  local L, docs = 700, {150, 260, 40, 250}
  local doc_of = {}
  local at = 0
  for d, n in ipairs(docs) do
    for i = at + 1, at + n do doc_of[i] = d end
    at = at + n
  end
  -- rows (1-based) that keep nothing: a whole query tile of 128 (rows 385-512) among them, which the
  -- kernels that narrow a tile's keys to those its rows keep (every tensor-core form, the persistent
  -- one included) visit with no key tile at all
  local empty_lo, empty_hi = 380, 520
  local documents = fa.tensor(U.nested({L, L}, function(i, j)
    return doc_of[i] == doc_of[j] and not (i >= empty_lo and i <= empty_hi)
  end), {device = dev})
  local padding = fa.tensor(U.nested({1, 1, 1, L}, function(_, _, _, j) return j <= 530 end), {device = dev})
  for ci, D in ipairs({64, 128}) do
    local dtype = other_dtype()
    local q, k, v = qkv(1 + ci % 2, 2, 2, L, L, D, D, dtype)
    -- NaN and inf of V in keys that padding hides from every row: one in a
    -- key tile some row keeps (key 600), one in a tile none keeps (key 690)
    local vp = v:clone()
    vp:set(1, 1, 600, 3, U.NaN)
    vp:set(1, 2, 690, 5, U.inf)
    for _, causal in ipairs({false, true}) do
      for _, m in ipairs({{documents, "documents", v}, {padding, "padding", vp}}) do
        local o, lse = U.check_attention(q, k, m[3], {mask = m[1], causal = causal, return_lse = true},
          ("bool mask %s D=%d %s causal=%s"):format(m[2], D, dtype, tostring(causal)))
        lu.assertTrue(o:isfinite(), "NaN with a structured bool mask")
        if m[2] == "documents" then
          lu.assertEquals(o:narrow(3, empty_lo, empty_hi - empty_lo + 1):norm(), 0, "rows that keep nothing are zero")
          lu.assertEquals(lse:narrow(3, empty_lo, empty_hi - empty_lo + 1):max(), -math.huge)
        end
      end
    end
  end
end

-- Lq >> Lk with bottom-right alignment: the first Lq - Lk rows attend
-- nothing, so a head has many whole query tiles with no key at all (issue
-- 21: the Hopper kernel returned rows of Q there, a different set each run,
-- because such a block skipped the key loop and its wait for Q's copies).
-- Every algo, with the default tile and small ones (several empty tiles a
-- head), GQA; each call twice: bit-identical, and zeros / lse = -inf on
-- every empty row.  D = 64 and 128 reach the tensor-core kernels on cuda.
function TestAttention:test_many_empty_query_tiles()
  local shapes = { -- B, Hq, Hkv, Lq, Lk, D
    {2, 3, 1, 799, 3, 32}, {1, 2, 2, 520, 64, 64}, {2, 3, 3, 300, 1, 128},
  }
  for si, s in ipairs(shapes) do
    local B, Hq, Hkv, Lq, Lk, D = table.unpack(s)
    local dtype = si == 1 and "f32" or other_dtype()
    local q, k, v = qkv(B, Hq, Hkv, Lq, Lk, D, D, dtype)
    local lens = B == 2 and {Lk, 1} or {1}
    for _, opts in ipairs({{causal = true}, {window = {0, 0}}, {causal = true, kv_lens = lens}}) do
      local ref = {U.reference(q, k, v, opts)}
      for _, algo in ipairs(ALGOS) do
        for _, tile in ipairs({false, {16, 16}}) do
          local o = U.copy_opts(opts)
          o.algo, o.return_lse = algo, true
          if tile and (algo == "flash" or algo == "two_pass") then o.tile = tile end
          local what = ("Lq>>Lk %s %s %s %s"):format(algo, dtype, desc(opts), tile and "tile 16" or "default tile")
          local o1, l1 = U.check_attention(q, k, v, o, what, {ref = ref})
          local o2, l2 = fa.attention(q, k, v, U.copy_opts(o))
          lu.assertEquals(fa.max_abs_diff(o1, o2), 0, what .. ": not bit-identical when run twice")
          local empty = Lq - Lk
          lu.assertEquals(o1:narrow(3, 1, empty):norm(), 0, what .. ": rows with no key")
          for _, l in ipairs({l1, l2}) do
            lu.assertEquals(l:narrow(3, 1, empty):max(), -math.huge, what .. ": lse of rows with no key")
          end
          if not opts.kv_lens then -- (kv_lens empties rows past the first Lq - Lk too: lse -inf there)
            lu.assertEquals(fa.max_abs_diff(l1:narrow(3, empty + 1, Lk), l2:narrow(3, empty + 1, Lk)), 0,
              what .. ": lse not bit-identical when run twice")
          end
        end
      end
    end
  end
end

local function row_filled(t, dims, value)
  -- t[dims...] (a row, via select) filled with value, on a copy
  local c = t:clone()
  local r = c
  for _, d in ipairs(dims) do r = r:select(1, d) end
  r:fill_(value)
  return c
end

-- NaN in the inputs reaches only the rows that use it.
function TestAttention:test_nan_in_q_only_its_row()
  for _, dtype in ipairs({"f32", other_dtype()}) do
    local q, k, v = qkv(1, 2, 2, 16, 24, 16, 16, dtype)
    q:set(1, 2, 5, 3, U.NaN)
    local ro = U.reference(q, k, v, {})
    local ref_clean = row_filled(ro, {1, 2, 5}, 0)
    for _, algo in ipairs(ALGOS) do
      local o = fa.attention(q, k, v, {algo = algo, out = U.poison({1, 2, 16, 16}, dtype)})
      local row = o:select(1, 1):select(1, 2):select(1, 5)
      lu.assertFalse(row:isfinite(), algo .. ": the NaN row of q gives a NaN row")
      U.assert_close(row_filled(o, {1, 2, 5}, 0), ref_clean, dtype, algo .. ": rows without NaN")
    end
  end
end

-- rows i < j never see key j under top-left causal: finite and right; rows
-- i >= j attend it: NaN.  Every algo (and tile) is tried; the failures are
-- listed together.
local function check_nan_key(which)
  local L, j = 40, 23
  local bad = {}
  for _, dtype in ipairs({"f32", other_dtype()}) do
    local q, k, v = qkv(1, 1, 1, L, L, 16, 16, dtype)
    if which == "k" then k:set(1, 1, j, 2, U.NaN) else v:set(1, 1, j, 2, U.NaN) end
    local ro = U.reference(q, k, v, {causal = "top_left"})
    for _, algo in ipairs(ALGOS) do
      for _, tile in ipairs((algo == "flash" or algo == "two_pass") and {{16, 16}, false} or {false}) do
        local label = ("%s %s%s"):format(algo, dtype, tile and " tile {16,16}" or "")
        local o = fa.attention(q, k, v, {algo = algo, causal = "top_left", tile = tile or nil})
        local ok, err = pcall(U.assert_close, o:narrow(3, 1, j - 1), ro:narrow(3, 1, j - 1), dtype, label)
        if not ok then
          bad[#bad + 1] = label .. ": rows 1.." .. (j - 1) .. " (which mask key " .. j .. ") are not right: " ..
            (tostring(err):match("FAILURE: ([^\n]*)") or tostring(err):match("[^\n]*"))
        end
        for i = j, L do
          if o:select(3, i):isfinite() then
            bad[#bad + 1] = ("%s: row %d attends %s row %d (NaN) but is finite"):format(label, i, which, j)
            break
          end
        end
      end
    end
  end
  if #bad > 0 then
    lu.fail(("NaN in %s row %d: %d problem(s):\n  %s"):format(which, j, #bad, table.concat(bad, "\n  ")))
  end
end

function TestAttention:test_nan_in_k_only_rows_that_attend_it() check_nan_key("k") end
function TestAttention:test_nan_in_v_only_rows_that_attend_it() check_nan_key("v") end

-- Non-contiguous views as inputs: (B, L, H, D) transposed to (B, H, L, D).
function TestAttention:test_views_as_inputs()
  for _, dtype in ipairs({"f32", other_dtype()}) do
    local B, L, H, D = 2, 37, 3, 16
    local xq = U.randn({B, L, H, D}, dtype)
    local xk = U.randn({B, L + 5, H, D}, dtype)
    local xv = U.randn({B, L + 5, H, D}, dtype)
    local q, k, v = xq:transpose(2, 3), xk:transpose(2, 3), xv:transpose(2, 3)
    lu.assertFalse(q:is_contiguous())
    local qc, kc, vc = q:contiguous(), k:contiguous(), v:contiguous()
    local before = xq:clone()
    for _, algo in ipairs(ALGOS) do
      local ro, rl = U.reference(qc, kc, vc, {causal = true})
      U.check_attention(q, k, v, {algo = algo, causal = true, return_lse = true},
        ("%s %s transposed views"):format(algo, dtype), {ref = {ro, rl}})
      -- narrowed views along L and D
      local qn, kn, vn = q:narrow(3, 3, 20), k:narrow(3, 2, 30), v:narrow(3, 2, 30):narrow(4, 5, 8)
      U.check_attention(qn, kn, vn, {algo = algo}, ("%s %s narrowed views"):format(algo, dtype))
    end
    lu.assertEquals(fa.max_abs_diff(xq, before), 0, "attention modified its input")
  end
end


-- opts.out that is one of the inputs: computed apart, then copied in
function TestAttention:test_out_is_an_input()
  for _, algo in ipairs(ALGOS) do
    for _, which in ipairs({"q", "v"}) do
      local q, k, v = qkv(1, 2, 2, 24, 24, 8, 8, "f32")
      local ref = U.reference(q, k, v, {})
      local out = which == "q" and q or v
      local o = fa.attention(q, k, v, {algo = algo, out = out})
      U.assert_close(o, ref, "f32", algo .. " out = " .. which)
    end
  end
end

U.run()
