-- fa.attention_backward and fa.attention_backward_reference (docs/lua-api.md
-- §2, API §10): the reference against central finite differences of
-- fa.attention_reference in f64 (every option, GQA, every rank), the CPU
-- backend against the reference in every dtype, bit-identical runs, errors,
-- rows with no key.  With FLASHATTN_DEVICE=cuda the backend checks run on
-- the GPU (the SIMT kernel at these small head dims; the tensor-core kernels
-- at D = 64 and 128 in test_head_dims) against the reference on the CPU.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu

TestBackward = {}

local function randn(shape, dtype, device)
  return fa.randn(shape, {dtype = dtype or "f64", device = device or "cpu", seed = U.next_seed()})
end

local function with_lse(opts) -- the forward's options of a backward call
  local o = U.copy_opts(opts)
  o.return_lse, o.deterministic = true, nil
  return o
end

-- The option sets every check runs through: {name, Hq, Hkv, Lq, Lk, opts}
-- (opts may be a function of the device, for masks).
local cases = {
  {"plain", 2, 2, 5, 7, {}},
  {"scale", 2, 1, 4, 6, {scale = 0.7}},
  {"causal bottom_right", 2, 2, 4, 7, {causal = true}},
  {"causal top_left", 2, 2, 6, 5, {causal = "top_left"}},
  {"window", 1, 1, 7, 7, {window = {2, 1}}},
  {"kv_lens", 2, 1, 5, 6, {kv_lens = {4, 6}}},
  {"alibi", 4, 2, 5, 6, {alibi = {0.5, 0.25, 0.125, 0.0625}}},
  {"softcap", 2, 2, 5, 6, {softcap = 1.5, scale = 1}},
  {"bool mask", 2, 2, 4, 6, function(dev)
    local m = fa.rand({4, 6}, {device = dev, seed = U.next_seed()}):totable()
    local b = fa.zeros({2, 1, 4, 6}, {dtype = "bool", device = dev})
    for i = 1, 4 do for j = 1, 6 do b:set(1 + (i + j) % 2, 1, i, j, m[i][j] > 0.3 and 1 or 0) end end
    return {mask = b}
  end},
  {"float mask", 4, 1, 5, 6, function(dev) return {mask = randn({1, 4, 1, 6}, "f32", dev), causal = true} end},
  -- variants (API §9): the chain rule through the traced score_mod, mask_mod's keys masked
  {"score_mod bias", 2, 1, 5, 6, {score_mod = function(s, b, h, q, k) return s - 0.25 * h * (q - k):abs() + 0.1 * b end}},
  {"score_mod tanh cap", 2, 2, 4, 7, {score_mod = function(s) return 1.5 * (s / 1.5):tanh() end, scale = 1}},
  {"score_mod nonlinear", 2, 2, 5, 6, {score_mod = function(s, b, h, q, k)
    return fa.where(q:ge(k), s * s:exp() / (1 + s:exp()), s:max(-0.5) * 0.5 + (s * s + 1):sqrt():log())
  end}},
  {"score_mod table and mask_mod document", 2, 1, 6, 6, function(dev)
    local bias = randn({6}, "f64", dev)
    local doc = fa.tensor({1, 1, 1, 2, 2, 2}, {dtype = "f64", device = dev})
    return {score_mod = function(s, b, h, q, k) return s + bias[k] end,
            mask_mod = function(b, h, q, k) return doc[q]:eq(doc[k]) end, causal = true}
  end},
  {"everything", 4, 2, 6, 8, function(dev)
    return {causal = true, window = {3, -1}, kv_lens = {8, 5}, alibi = {0.3, 0.2, 0.1, 0.05}, softcap = 2,
            mask = randn({6, 8}, "f64", dev), scale = 0.9}
  end},
}

local function opts_of(c, dev) return type(c[6]) == "function" and c[6](dev) or c[6] end

-- q, k, v, dout of a case, B = 2, D = 4, Dv = 3.
local function inputs(c, dtype, device)
  local B, Hq, Hkv, Lq, Lk = 2, c[2], c[3], c[4], c[5]
  return randn({B, Hq, Lq, 4}, dtype, device), randn({B, Hkv, Lk, 4}, dtype, device),
         randn({B, Hkv, Lk, 3}, dtype, device), randn({B, Hq, Lq, 3}, dtype, device)
end

-- Central differences of Σ dout ∘ attention_reference at a few elements of x.
local function check_fd(name, q, k, v, dout, opts, grads)
  local h = 1e-5
  local function loss() return (fa.attention_reference(q, k, v, opts) * dout):sum() end
  for ti, x in ipairs({q, k, v}) do
    local g, shape = grads[ti], x:shape()
    for n = 1, 5 do
      local idx = {}
      for d = 1, #shape do idx[d] = math.random(shape[d]) end
      local x0 = x:get(table.unpack(idx))
      idx[#shape + 1] = x0 + h
      x:set(table.unpack(idx))
      local lp = loss()
      idx[#shape + 1] = x0 - h
      x:set(table.unpack(idx))
      local lm = loss()
      idx[#shape + 1] = x0
      x:set(table.unpack(idx))
      idx[#shape + 1] = nil
      local fd, an = (lp - lm) / (2 * h), g:get(table.unpack(idx))
      if not (math.abs(fd - an) <= 1e-6 * math.max(1, math.abs(fd))) then
        lu.fail(("%s: d%s at %s: finite differences %.10g, backward_reference %.10g [%s]")
          :format(name, ({"q", "k", "v"})[ti], table.concat(idx, ","), fd, an, U.seed_note()))
      end
    end
  end
end

function TestBackward:test_reference_matches_finite_differences()
  for _, c in ipairs(cases) do
    local opts = opts_of(c, "cpu")
    local q, k, v, dout = inputs(c)
    local o, lse = fa.attention_reference(q, k, v, with_lse(opts))
    local dq, dk, dv = fa.attention_backward_reference(q, k, v, o, lse, dout, opts)
    lu.assertEquals({dq:dtype(), dk:dtype(), dv:dtype()}, {"f64", "f64", "f64"})
    lu.assertEquals(dk:shape(), k:shape())
    lu.assertEquals(dv:shape(), v:shape())
    check_fd(c[1], q, k, v, dout, opts, {dq, dk, dv})
  end
end

function TestBackward:test_reference_ranks()
  -- 3-D (H, L, D) with GQA and 2-D (L, D): the same as the 4-D call with B = 1
  local q, k, v, dout = randn({4, 5, 4}), randn({2, 7, 4}), randn({2, 7, 3}), randn({4, 5, 3})
  local opts = {causal = true}
  local o, lse = fa.attention_reference(q, k, v, with_lse(opts))
  local g3 = {fa.attention_backward_reference(q, k, v, o, lse, dout, opts)}
  check_fd("3-D", q, k, v, dout, opts, g3)
  local function r4(t) local s = t:shape() return t:reshape({1, s[1], s[2], s[3]}) end
  local g4 = {fa.attention_backward_reference(r4(q), r4(k), r4(v), r4(o), lse:reshape({1, 4, 5}), r4(dout), opts)}
  for i = 1, 3 do
    lu.assertEquals(g3[i]:dim(), 3)
    lu.assertEquals(fa.max_abs_diff(r4(g3[i]), g4[i]), 0)
  end
  local q2, k2, v2, d2 = randn({6, 4}), randn({9, 4}), randn({9, 5}), randn({6, 5})
  local o2, l2 = fa.attention_reference(q2, k2, v2, {return_lse = true, window = {1, 1}})
  local g2 = {fa.attention_backward_reference(q2, k2, v2, o2, l2, d2, {window = {1, 1}})}
  lu.assertEquals(g2[2]:shape(), {9, 4})
  check_fd("2-D", q2, k2, v2, d2, {window = {1, 1}}, g2)
end

local bw_tol = {f32 = 1e-4, f16 = 2e-2, bf16 = 2e-2, f64 = 1e-10}

local function is_variant(opts) return opts.score_mod ~= nil or opts.mask_mod ~= nil end

-- The backward of inputs (on the test's device) against the reference of
-- their CPU copies: dtype, device, shape and values.
-- The backward from the o and lse given against the reference's from the same.
local function check_given(name, q, k, v, o, lse, dout, opts, dtype, tol)
  local r = {fa.attention_backward_reference(q:cpu(), k:cpu(), v:cpu(), o:cpu(), lse:cpu(), dout:cpu(), U.ref_opts(opts))}
  local g = {fa.attention_backward(q, k, v, o, lse, dout, opts)}
  for i, x in ipairs({q, k, v}) do
    lu.assertEquals(g[i]:dtype(), dtype)
    lu.assertEquals(g[i]:device(), x:device())
    lu.assertEquals(g[i]:shape(), x:shape())
    U.assert_close(g[i]:cpu(), r[i], dtype, ("%s %s d%s"):format(name, dtype, ({"q", "k", "v"})[i]), tol or bw_tol[dtype])
  end
end

local function check_backend(name, q, k, v, dout, opts, dtype, tol)
  local o, lse = fa.attention(q, k, v, with_lse(opts))
  check_given(name, q, k, v, o, lse, dout, opts, dtype, tol)
end

-- The backward on the kernel named in opts.kernel (cuda): against the reference where it runs; the
-- "wgmma" kernel off Hopper (the forward's Hopper kernel absent here) a flashattn: error saying so.
local function check_named(name, q, k, v, dout, opts, dtype)
  local t64, hopper = randn({1, 1, 8, 64}, "bf16", U.device), false
  for _, kname in ipairs(fa.kernels(t64, t64, t64)) do hopper = hopper or kname == "wgmma" end
  if opts.kernel == "wgmma" and not hopper then
    local fo = with_lse(opts)
    fo.kernel = nil -- the forward's own choice: its wgmma kernel needs Hopper too
    local o, lse = fa.attention(q, k, v, fo)
    U.assert_fa_error({"wgmma", "Hopper"}, fa.attention_backward, q, k, v, o, lse, dout, opts)
  else
    check_backend(name, q, k, v, dout, opts, dtype, 3e-2)
  end
end

function TestBackward:test_backend_matches_reference()
  for _, dtype in ipairs(U.cuda and U.dtypes or U.all_dtypes) do
    for ci, c in ipairs(cases) do
      local opts = opts_of(c, U.device)
      if ci % 2 == 0 then opts = U.copy_opts(opts) opts.tile = {3, 2} end -- key tiles that split the rows
      local q, k, v, dout = inputs(c, dtype, U.device)
      check_backend(c[1], q, k, v, dout, opts, dtype) -- on cuda these variants' head dims take the SIMT kernels
      if U.cuda and is_variant(opts) then -- the variants have no mma instance
        local o, lse = fa.attention(q, k, v, with_lse(opts))
        local named = U.copy_opts(opts)
        named.kernel = "mma"
        U.assert_fa_error({"opts.kernel", "score_mod", "simt"}, fa.attention_backward, q, k, v, o, lse, dout, named)
      end
    end
  end
end

-- The head dims of the tensor-core kernels on cuda (f16/bf16 at D = Dv = 64
-- and 128, 64-key and 64-row tiles) and of the SIMT kernel around them, with
-- lengths off the tiles, GQA, and the options on partial and full tiles.
function TestBackward:test_head_dims()
  local shapes = { -- {D, Dv, Hq, Hkv, Lq, Lk, opts}
    {64, 64, 4, 2, 130, 200, {}},
    {64, 64, 2, 2, 200, 130, {causal = true}},
    {64, 64, 1, 1, 40, 2100, {}}, -- Hopper: dQ added up by the dK/dV blocks (tiles of 128 query rows at D = 64)
    {64, 64, 1, 1, 40, 2100, {causal = "top_left"}}, -- the same, the rows' keys from the end
    {128, 128, 2, 1, 97, 160, {causal = "top_left", window = {70, 5}}},
    {128, 128, 2, 2, 70, 150, {alibi = {0.05, 0.02}, softcap = 3, kv_lens = {150, 40}}},
    {64, 64, 2, 2, 66, 129, function(dev)
      return {mask = fa.tensor(U.nested({66, 129}, function() return math.random() < 0.8 end), {device = dev}),
              scale = 0.1}
    end},
    {96, 96, 2, 1, 40, 70, {causal = true}}, -- wgmma on Hopper (held as 128 wide), else simt
    {96, 96, 2, 2, 130, 150, {alibi = {0.05, 0.02}, window = {60, 10}}},
    {40, 24, 2, 2, 33, 45, {}},
    {128, 128, 4, 2, 77, 140, function(dev) -- a variant: score_mod's chain rule, mask_mod's keys
      local slopes = fa.tensor({0.1, 0.05, 0.02, 0.01}, {device = dev})
      return {score_mod = function(s, b, h, q, k) return (s / 4):tanh() * 4 - slopes[h] * (q - k):abs() end,
              mask_mod = function(b, h, q, k) return q:ge(k - 20) end, softcap = 6}
    end},
  }
  local dtypes = U.cuda and {"f16", "bf16", "f32"} or {"bf16", "f32"}
  for _, dtype in ipairs(dtypes) do
    for _, c in ipairs(shapes) do
      local D, Dv, Hq, Hkv, Lq, Lk = table.unpack(c, 1, 6)
      local opts = type(c[7]) == "function" and c[7](U.device) or c[7]
      local q, k = randn({2, Hq, Lq, D}, dtype, U.device), randn({2, Hkv, Lk, D}, dtype, U.device)
      local v, dout = randn({2, Hkv, Lk, Dv}, dtype, U.device), randn({2, Hq, Lq, Dv}, dtype, U.device)
      check_backend(("D=%d Dv=%d Lq=%d Lk=%d"):format(D, Dv, Lq, Lk), q, k, v, dout, opts, dtype,
                    dtype == "f32" and 1e-4 or 3e-2)
    end
  end
end

-- The variants on the tensor-core kernels (Hopper's wgmma backward, compiled with the expression;
-- elsewhere the SIMT kernels): mask_mod's tiles of 64 x 64 empty (skipped), full (mask_mod not
-- evaluated) and partial, using b and h or neither, with built-in rules beside them (causal, kv_lens,
-- softcap, alibi, a bool mask), GQA, lengths off the tiles, both of the wgmma schedules
-- (deterministic: the dQ kernel; else dQ added up from the dK/dV blocks).
function TestBackward:test_variants_on_tensor_cores()
  local B, Hq, Hkv, Lq, Lk = 2, 4, 2, 200, 330
  local ids = {}
  for i = 1, Lk do ids[i] = (i - 1) // 70 end -- documents of 70 keys: tiles of every kind
  local ids2 = {}
  for b = 1, B do ids2[b] = {} for i = 1, Lk do ids2[b][i] = (i - 1) // (40 + 50 * b) end end
  local cases = {
    {"window mask_mod", function() return {mask_mod = function(b, h, q, k) return q:ge(k - 130) & (q - k):le(20) end} end},
    {"documents, score_mod, causal", function(dev)
      local doc, bias = fa.tensor(ids, {device = dev}), fa.tensor({0.3, -0.2, 0.1, 0.05}, {device = dev})
      return {mask_mod = function(b, h, q, k) return doc[q + 130]:eq(doc[k]) end,
              score_mod = function(s, b, h, q, k) return s + bias[h] * ((q - k) / 50):tanh() end, causal = true}
    end},
    {"per-batch documents, per-head window, kv_lens", function(dev)
      local doc = fa.tensor(ids2, {device = dev})
      return {mask_mod = function(b, h, q, k) return doc[b][q]:eq(doc[b][k]) | (k - q):abs():le(h * 30) end,
              kv_lens = {330, 150}}
    end},
    -- a relative table read only in range where causal lets a pair attend: the other pairs' reads are out of
    -- range and no error (the tiles' own pass records none; the kernels record the attended pairs')
    {"relative table, causal", function(dev)
      local keep = fa.tensor(U.nested({Lk}, function() return math.random() end), {device = dev})
      return {mask_mod = function(b, h, q, k) return keep[q - k + (Lk - Lq + 1)]:gt(0.15) end, causal = true}
    end},
    {"score_mod with softcap, alibi and a bool mask", function(dev)
      local m = fa.tensor(U.nested({Lq, Lk}, function() return math.random() < 0.9 end), {device = dev})
      return {score_mod = function(s, b, h, q, k) return s * 0.9 + 0.01 * (q % 7) end, softcap = 5,
              alibi = {0.05, 0.02, 0.01, 0.005}, mask = m}
    end},
  }
  for _, dtype in ipairs(U.cuda and {"bf16", "f16"} or {"bf16"}) do
    for _, D in ipairs({64, 128}) do
      local q, k = randn({B, Hq, Lq, D}, dtype, U.device), randn({B, Hkv, Lk, D}, dtype, U.device)
      local v, dout = randn({B, Hkv, Lk, D}, dtype, U.device), randn({B, Hq, Lq, D}, dtype, U.device)
      for ci, c in ipairs(cases) do
        local opts = c[2](U.device)
        opts.deterministic = ci % 2 == 0
        check_backend(("%s D=%d"):format(c[1], D), q, k, v, dout, opts, dtype, 3e-2)
      end
      -- named (cuda): the SIMT kernels take every variant; wgmma where it runs (Hopper)
      for _, kern in ipairs(U.cuda and {"simt", "wgmma"} or {}) do
        local opts = cases[2][2](U.device)
        opts.kernel = kern
        check_named(("kernel %s D=%d"):format(kern, D), q, k, v, dout, opts, dtype)
      end
    end
  end
end

local function same_bits(a, b)
  local x, y = U.flat(a), U.flat(b)
  for i = 1, #x do
    if not (x[i] == y[i] or (x[i] ~= x[i] and y[i] ~= y[i])) then return false end
  end
  return true
end

-- opts.kernel: the backward's own kernels on cuda, each against the
-- reference where it takes the call and refusing, saying why, where it does
-- not; a forward kernel's name leaves the choice to the backward; an unknown
-- name is an error on both devices.
function TestBackward:test_kernels()
  local q, k, v, dout = randn({1, 2, 70, 8}, "f32", U.device), randn({1, 1, 90, 8}, "f32", U.device),
                        randn({1, 1, 90, 8}, "f32", U.device), randn({1, 2, 70, 8}, "f32", U.device)
  local o, lse = fa.attention(q, k, v, {return_lse = true})
  U.assert_fa_error({"opts.kernel", "frobnicate", "simt"}, fa.attention_backward, q, k, v, o, lse, dout,
                    {kernel = "frobnicate"})
  -- names the backward does not have here: the same gradients as without a name
  local plain = {fa.attention_backward(q, k, v, o, lse, dout)}
  for _, name in ipairs(U.cuda and {"decode", "f32", "naive"} or {"cpu_flash", "wgmma", "simt"}) do
    local g = {fa.attention_backward(q, k, v, o, lse, dout, {kernel = name})}
    for i = 1, 3 do lu.assertTrue(same_bits(g[i], plain[i]), "kernel " .. name) end
  end
  if not U.cuda then return end
  U.assert_fa_error({"mma", "f16 or bf16"}, fa.attention_backward, q, k, v, o, lse, dout, {kernel = "mma"})
  check_backend("simt f32", q, k, v, dout, {kernel = "simt", causal = true}, "f32")
  local q48 = randn({1, 2, 10, 48}, "bf16", U.device)
  local o48, l48 = fa.attention(q48, q48, q48, {return_lse = true})
  U.assert_fa_error({"wgmma", "D = Dv = 64, 96 or 128"}, fa.attention_backward, q48, q48, q48, o48, l48, q48,
                    {kernel = "wgmma"})
  for _, dtype in ipairs({"bf16", "f16"}) do
    for _, D in ipairs({64, 128}) do
      local qq, kk = randn({2, 4, 150, D}, dtype, U.device), randn({2, 2, 130, D}, dtype, U.device)
      local vv, dd = randn({2, 2, 130, D}, dtype, U.device), randn({2, 4, 150, D}, dtype, U.device)
      for _, kern in ipairs({"wgmma", "mma", "simt"}) do
        for _, opts in ipairs({{causal = true}, {alibi = {0.1, 0.2, 0.3, 0.4}, window = {40, 3}}}) do
          opts = U.copy_opts(opts)
          opts.kernel = kern
          check_named(("kernel %s D=%d"):format(kern, D), qq, kk, vv, dd, opts, dtype)
        end
      end
    end
  end
end

function TestBackward:test_runs_are_bit_identical()
  local shapes = {{16, 8, "f32"}, {16, 8, "bf16"}, {64, 64, "bf16"}, {128, 128, "f16"}}
  for _, s in ipairs(shapes) do
    local D, Dv, dtype, dev = s[1], s[2], s[3], U.device
    local q, k, v, dout = randn({2, 8, 70, D}, dtype, dev), randn({2, 2, 90, D}, dtype, dev),
                          randn({2, 2, 90, Dv}, dtype, dev), randn({2, 8, 70, Dv}, dtype, dev)
    local opts = {causal = true, deterministic = true}
    local o, lse = fa.attention(q, k, v, {causal = true, return_lse = true})
    local a = {fa.attention_backward(q, k, v, o, lse, dout, opts)}
    local b = {fa.attention_backward(q, k, v, o, lse, dout, opts)}
    for i = 1, 3 do lu.assertTrue(same_bits(a[i], b[i]), ("%s D=%d run-to-run"):format(dtype, D)) end
    -- without the key dq may be summed with atomics (cuda's wgmma kernel: its last bits vary), and
    -- dk, dv by another schedule (bit-identical from run to run all the same)
    local c = {fa.attention_backward(q, k, v, o, lse, dout, {causal = true})}
    local d = {fa.attention_backward(q, k, v, o, lse, dout, {causal = true})}
    for i = 2, 3 do lu.assertTrue(same_bits(c[i], d[i]), ("%s D=%d default dk, dv run-to-run"):format(dtype, D)) end
    for i = 1, 3 do
      lu.assertTrue(fa.rel_error(c[i]:cpu(), a[i]:cpu()) < (dtype == "f32" and 1e-6 or 1e-2),
                    ("%s D=%d default against deterministic"):format(dtype, D))
    end
  end
end

-- The CPU runs a call of fewer (batch, KV head) tasks than threads in two passes (dK and dV a key tile
-- at a time, then dQ a query tile at a time), each element summed in the task's order: the same bits as
-- the one-pass schedule.  A call of one batch (one task: two passes wherever there are 2 threads or more)
-- against the same data as the first of a batch of many (tasks enough for 2 threads: one pass), every
-- dtype, GQA, causal, a mask, NaN in V (zero weights skipped), rows with no key.
function TestBackward:test_cpu_schedules_give_the_same_bits()
  if U.device ~= "cpu" then return end
  for _, dtype in ipairs({"f32", "f64", "f16", "bf16"}) do
    for ci, c in ipairs({{Hq = 4, Hkv = 1, Lq = 50, Lk = 300, opts = {causal = true}},
                         {Hq = 2, Hkv = 1, Lq = 130, Lk = 200, opts = {window = {40, 3}, kv_lens = {150}}},
                         {Hq = 1, Hkv = 1, Lq = 70, Lk = 260, opts = {softcap = 2, nan = true}}}) do
      local B = 8
      local q, k = randn({B, c.Hq, c.Lq, 32}, dtype), randn({B, c.Hkv, c.Lk, 32}, dtype)
      local v, dout = randn({B, c.Hkv, c.Lk, 16}, dtype), randn({B, c.Hq, c.Lq, 16}, dtype)
      local opts = U.copy_opts(c.opts, {nan = true})
      if c.opts.nan then v:set(1, 1, 10, 3, U.NaN) end
      local many = U.copy_opts(opts)
      if opts.kv_lens then
        many.kv_lens = {}
        for b = 1, B do many.kv_lens[b] = opts.kv_lens[1] end
      end
      local one = function(t) return t:narrow(1, 1, 1):contiguous() end
      local o, lse = fa.attention(q, k, v, with_lse(many))
      local all = {fa.attention_backward(q, k, v, o, lse, dout, many)}
      local first = {fa.attention_backward(one(q), one(k), one(v), one(o), one(lse), one(dout), opts)}
      for i, name in ipairs({"dq", "dk", "dv"}) do
        lu.assertTrue(same_bits(first[i], one(all[i])), ("%s case %d %s: the two schedules' bits"):format(dtype, ci, name))
      end
    end
  end
end

-- cuda's deterministic calls at D = 96 and 128 of several key tiles (blocks of 128 keys adding dq in
-- fixed point: test_fixed_point_deterministic_dq), causal and not, on both sides of 1024 keys (up to which
-- causal calls added in the key tiles' order until 2026-12-02), GQA: bit-identical twice, and close to
-- the default's atomics.
function TestBackward:test_deterministic_calls_of_several_key_tiles()
  if not U.cuda then return end -- the CPU's deterministic call has one owner an element (above)
  for _, D in ipairs({96, 128}) do
    for _, c in ipairs({{700, true}, {2100, true}, {700, false}}) do
      local L, causal = c[1], c[2]
      local q, k, v = randn({1, 4, L, D}, "bf16", U.device), randn({1, 2, L, D}, "bf16", U.device),
                      randn({1, 2, L, D}, "bf16", U.device)
      local dout = randn({1, 4, L, D}, "bf16", U.device)
      local o, lse = fa.attention(q, k, v, {causal = causal, return_lse = true})
      local opts = {causal = causal, deterministic = true}
      local a = {fa.attention_backward(q, k, v, o, lse, dout, opts)}
      local b = {fa.attention_backward(q, k, v, o, lse, dout, opts)}
      local d = {fa.attention_backward(q, k, v, o, lse, dout, {causal = causal})}
      local what = ("D=%d L=%d causal=%s"):format(D, L, tostring(causal))
      for i = 1, 3 do
        lu.assertTrue(same_bits(a[i], b[i]), what .. " run-to-run")
        lu.assertTrue(fa.rel_error(a[i]:cpu(), d[i]:cpu()) < 1e-2, what .. " against the default")
      end
    end
  end
end

-- cuda's causal calls on the fused kernel whose grid takes its last (batch, KV head)s key tile by key
-- tile and the others head by head (bwg_tail: the last ceil(2·SMs / key tiles) heads; 64 here against
-- 44 on a GPU of 132 SMs), GQA, both dtypes' instances at D = 64 and 128, default and deterministic:
-- every head's gradients against the SIMT kernel's, and the deterministic call bit-identical twice.
function TestBackward:test_causal_grid_in_two_orders()
  if not U.cuda then return end -- (the CPU has no grid)
  for _, c in ipairs({{64, "bf16"}, {128, "f16"}}) do
    local D, dtype = c[1], c[2]
    local q, k, v = randn({4, 32, 768, D}, dtype, U.device), randn({4, 16, 768, D}, dtype, U.device),
                    randn({4, 16, 768, D}, dtype, U.device)
    local dout = randn({4, 32, 768, D}, dtype, U.device)
    local o, lse = fa.attention(q, k, v, {causal = true, return_lse = true})
    local s = {fa.attention_backward(q, k, v, o, lse, dout, {causal = true, kernel = "simt"})}
    for _, det in ipairs({false, true}) do
      local opts = {causal = true, kernel = "wgmma", deterministic = det}
      local a = {fa.attention_backward(q, k, v, o, lse, dout, opts)}
      local what = ("D=%d %s deterministic=%s"):format(D, dtype, tostring(det))
      for i = 1, 3 do
        lu.assertTrue(fa.rel_error(a[i]:cpu(), s[i]:cpu()) < 1e-2, what .. " against simt, " .. ({"dq", "dk", "dv"})[i])
      end
      if det then
        local b = {fa.attention_backward(q, k, v, o, lse, dout, opts)}
        for i = 1, 3 do lu.assertTrue(same_bits(a[i], b[i]), what .. " run-to-run") end
      end
    end
  end
end

-- cuda's deterministic calls at D = 64, 96 and 128 (D = 64 on tiles of 128 query rows, each warpgroup
-- adding its 64, the second past Lq = 130 in call 1) add dq as int32
-- multiples of a power of two a query row, from a bound on the row's partial sums (max|K|, max|V|,
-- Σ|dO_i|, max|O_i|: bw_fixed_mult).  Values far from 1 (the multipliers follow them), the score
-- rules' instance, GQA, short and long calls: against the reference, bit-identical twice, close to
-- the default, an lse under the forward's; NaN in v or inf in o hand the call to the SIMT kernels,
-- whose bits it then has.  On the CPU the same calls against the reference.
function TestBackward:test_fixed_point_deterministic_dq()
  local dev = U.device
  local far = {bf16 = {2 ^ 40, 2 ^ -60}, f16 = {2 ^ 6, 2 ^ -12}} -- v's and dout's factors
  local long = U.cuda and 1100 or 150 -- several key tiles on cuda (the CPU: one owner an element)
  local calls = {{130, 300, {}}, {long, long, {causal = true}},
                 {90, 200, {window = {50, 20}, alibi = {0.1, 0.2, 0.3, 0.4}, softcap = 5, kv_lens = {170}}}}
  for _, dtype in ipairs({"bf16", "f16"}) do
    for _, D in ipairs({64, 96, 128}) do
      for ci, c in ipairs(calls) do
        local Lq, Lk = c[1], c[2]
        local q, k = randn({1, 4, Lq, D}, dtype, dev), randn({1, 2, Lk, D}, dtype, dev)
        local v = randn({1, 2, Lk, D}, dtype, dev) * (ci == 1 and far[dtype][1] or 1)
        local dout = randn({1, 4, Lq, D}, dtype, dev) * (ci == 1 and far[dtype][2] or 1)
        local opts = U.copy_opts(c[3])
        opts.deterministic = true
        local what = ("%s D=%d call %d"):format(dtype, D, ci)
        check_backend(what, q, k, v, dout, opts, dtype)
        local o, lse = fa.attention(q, k, v, with_lse(opts))
        local a = {fa.attention_backward(q, k, v, o, lse, dout, opts)}
        local b = {fa.attention_backward(q, k, v, o, lse, dout, opts)}
        local d = {fa.attention_backward(q, k, v, o, lse, dout, c[3])}
        for i = 1, 3 do
          lu.assertTrue(same_bits(a[i], b[i]), what .. " run-to-run")
          lu.assertTrue(fa.rel_error(a[i]:cpu(), d[i]:cpu()) < 1e-2, what .. " against the default")
        end
        if ci == 1 then
          -- an lse log 8 under the forward's (each row's probabilities sum to 8): within the multipliers'
          -- headroom (log 16), as the reference computes it from the same lse
          check_given(what .. " lse - log 8", q, k, v, o, lse - math.log(8), dout, opts, dtype)
          if D == 128 then
            -- the bound met: q = 0 (uniform attention), k and v +1 on the first half of the keys and -1 on the
            -- second, dout = 1, so that o = 0 and every dq element is scale · D · (the probabilities' sum),
            -- the bound times that sum; with lse log 8 under the forward's, 8 times the bound (it would wrap
            -- 32-bit sums without the headroom)
            local Lt = 256
            local half = fa.ones({1, 2, Lt, D}, {dtype = dtype, device = dev}) -- k and v
            half:narrow(3, Lt // 2 + 1, Lt // 2):fill_(-1)
            local at = {dtype = dtype, device = dev}
            local q0, d1 = fa.zeros({1, 4, 64, D}, at), fa.ones({1, 4, 64, D}, at)
            local ot, lt = fa.attention(q0, half, half, with_lse(opts))
            check_given(what .. " the bound met", q0, half, half, ot, lt - math.log(8), d1, opts, dtype)
          end
          -- non-finite v, then o: the SIMT kernels' result, bit for bit
          local simt = U.copy_opts(opts)
          simt.kernel = "simt"
          local v2 = v:clone()
          v2:set(1, 2, 7, 3, 0 / 0)
          local o2, lse2 = fa.attention(q, k, v2, with_lse(opts))
          local o3 = o:clone()
          o3:set(1, 3, 5, 1, math.huge)
          for _, inputs in ipairs({{v2, o2, lse2}, {v, o3, lse}}) do
            local x = {fa.attention_backward(q, k, inputs[1], inputs[2], inputs[3], dout, opts)}
            local y = {fa.attention_backward(q, k, inputs[1], inputs[2], inputs[3], dout, simt)}
            for i = 1, 3 do lu.assertTrue(same_bits(x[i], y[i]), what .. " non-finite: as the SIMT kernels") end
          end
        end
      end
    end
  end
end

-- NaN and inf in q, k, v or dout reach only the gradients the reference's pairs connect them to: a
-- masked pair (a key past kv_lens, a causal key after the row) passes nothing, where a tile product's
-- 0 · NaN would be NaN.  Wherever the reference is finite the backend is finite and close to it.
function TestBackward:test_nonfinite_inputs_stay_in_their_pairs()
  local dev = U.device
  local kinds = U.cuda and {{"f32", 16}, {"bf16", 64}, {"f16", 128}} or {{"f64", 16}, {"f32", 16}}
  local nan, inf = 0 / 0, math.huge
  local setups = {
    -- keys 6..8 (1-based) past kv_lens: nobody attends them; NaN in their K and V, inf in one V
    {opts = {kv_lens = {5}}, put = function(t) t.k:set(1, 1, 7, 2, nan); t.k:set(1, 1, 8, 1, nan); t.v:set(1, 1, 6, 1, inf) end},
    -- causal: the first query row attends key 1 only; NaN in its q and dout rows
    {opts = {causal = true}, put = function(t) t.q:set(1, 2, 1, 3, nan); t.dout:set(1, 2, 1, 1, nan) end},
    -- a window: key 2 is attended by rows 1..3 only; inf in its K
    {opts = {window = {1, 1}}, put = function(t) t.k:set(1, 1, 2, 1, inf) end},
    -- the same through a variant (on cuda its compiled tensor-core kernels, then the guard's SIMT ones)
    {opts = {mask_mod = function(b, h, q, k) return q:ge(k) & (q - k):le(1) end},
     put = function(t) t.k:set(1, 1, 2, 1, inf); t.q:set(1, 2, 1, 3, nan) end},
    -- causal through a float mask of -inf: the first query row of head 2 attends key 1 only, NaN in its
    -- dout; keys 2..8 stay finite (the reference once added 0 · NaN there)
    {mask_of = function(dtype, dev)
       local m = fa.zeros({1, 1, 8, 8}, {dtype = "f64"})
       for i = 1, 8 do for j = i + 1, 8 do m:set(1, 1, i, j, -inf) end end
       return m:to(dtype, dev)
     end,
     put = function(t) t.dout:set(1, 2, 1, 2, nan) end, finite_keys = {2, 8}},
  }
  for _, kd in ipairs(kinds) do
    local dtype, D = kd[1], kd[2]
    for si, st in ipairs(setups) do
      local t = {q = randn({1, 2, 8, D}, "f64"), k = randn({1, 1, 8, D}, "f64"), v = randn({1, 1, 8, D}, "f64"),
                 dout = randn({1, 2, 8, D}, "f64")}
      st.put(t)
      for name, x in pairs(t) do t[name] = x:to(dtype, dev) end
      if st.mask_of then st.opts = {mask = st.mask_of(dtype, dev)} end
      local o, lse = fa.attention(t.q, t.k, t.v, with_lse(st.opts))
      local got = {fa.attention_backward(t.q, t.k, t.v, o, lse, t.dout, st.opts)}
      local ref_opts = st.mask_of and {mask = st.opts.mask:cpu()} or st.opts -- the reference runs on the cpu
      local ref = {fa.attention_backward_reference(t.q:cpu(), t.k:cpu(), t.v:cpu(), o:cpu(), lse:cpu(), t.dout:cpu(),
                                                   ref_opts)}
      local tol = ({f64 = 1e-9, f32 = 1e-4, bf16 = 3e-2, f16 = 1e-2})[dtype]
      for gi, gname in ipairs({"dq", "dk", "dv"}) do
        local n = ref[gi]:numel()
        local av, rv = got[gi]:cpu():double():reshape({n}):totable(), ref[gi]:reshape({n}):totable()
        local finite, worst, scale = 0, 0, 0
        for _, x in ipairs(rv) do if x == x and math.abs(x) < inf then scale = math.max(scale, math.abs(x)) end end
        for e = 1, #rv do
          local x, y = rv[e], av[e]
          if x == x and math.abs(x) < inf then
            finite = finite + 1
            lu.assertTrue(y == y and math.abs(y) < inf, ("%s D=%d setup %d %s[%d]: %s where the reference is %g"):format(
              dtype, D, si, gname, e, tostring(y), x))
            worst = math.max(worst, math.abs(y - x))
          end
        end
        lu.assertTrue(finite > 0, ("setup %d %s: the reference has finite entries"):format(si, gname))
        if st.finite_keys and gname ~= "dq" then -- rows of keys no NaN reaches: finite in both
          for e = (st.finite_keys[1] - 1) * D + 1, st.finite_keys[2] * D do
            lu.assertTrue(rv[e] == rv[e] and math.abs(rv[e]) < inf and av[e] == av[e] and math.abs(av[e]) < inf,
              ("%s D=%d setup %d %s[%d]: %s (reference %s), expected finite"):format(dtype, D, si, gname, e,
                tostring(av[e]), tostring(rv[e])))
          end
        end
        lu.assertTrue(worst <= tol * math.max(scale, 1), ("%s D=%d setup %d %s: off by %g (scale %g)"):format(
          dtype, D, si, gname, worst, scale))
      end
    end
  end
end

-- On cuda the built-in rules' calls check the gradients they write for NaN and inf instead of passing over
-- q and k first: whatever NaN or inf the tensor cores took in from q or k shows in some gradient (with
-- determinism, dK or dV: its dQ sums are integers), and hands the call to the SIMT kernels, whose result it then
-- is, bit for bit.  So does a default call's gradient that overflows f16 from finite inputs (the check cannot
-- tell the two apart).  Two key tiles and a part, GQA.
function TestBackward:test_nonfinite_gradients_take_the_simt_kernels()
  if not U.cuda then lu.skip("cuda: the tensor-core kernels' check of their gradients") end
  local nan, inf = 0 / 0, math.huge
  local puts = {
    {"inf in q", function(t) t.q:set(1, 3, 150, 5, inf) end},
    {"-inf in k, a key late rows attend", function(t) t.k:set(1, 2, 190, 7, -inf) end},
    {"NaN in q, a row attending one key", function(t) t.q:set(1, 1, 1, 1, nan) end},
    {"NaN in k and inf in q", function(t) t.k:set(1, 1, 3, 2, nan); t.q:set(1, 4, 77, 1, -inf) end},
    {"dq past f16's range", function(t, D) -- q = 0: uniform P; dS ~ 4e2, K ~ 1e3 over 200 keys
       t.q = fa.zeros({1, 4, 200, D}, {dtype = "f64"})
       t.k, t.v, t.dout = t.k * 1000, t.v * 100, t.dout * 100
     end, "f16"},
  }
  for _, c in ipairs({{"bf16", 128}, {"f16", 64}, {"bf16", 96}, {"f16", 128}}) do
    local dtype, D = c[1], c[2]
    for _, put in ipairs(puts) do
      if not put[3] or put[3] == dtype then
        local t = {q = randn({1, 4, 200, D}), k = randn({1, 2, 200, D}), v = randn({1, 2, 200, D}),
                   dout = randn({1, 4, 200, D})}
        put[2](t, D)
        for name, x in pairs(t) do t[name] = x:to(dtype, "cuda") end
        local o, lse = fa.attention(t.q, t.k, t.v, with_lse({causal = true}))
        if put[3] then lu.assertTrue(o:isfinite() and lse:isfinite(), put[1] .. ": a finite forward") end
        local simt = {fa.attention_backward(t.q, t.k, t.v, o, lse, t.dout, {causal = true, kernel = "simt"})}
        if put[3] then lu.assertFalse(simt[1]:isfinite(), put[1] .. ": dq overflows") end
        for _, det in ipairs(put[3] and {false} or {false, true}) do
          local what = ("%s D=%d %s%s"):format(dtype, D, put[1], det and ", deterministic" or "")
          local got = {fa.attention_backward(t.q, t.k, t.v, o, lse, t.dout, {causal = true, deterministic = det})}
          for i, g in ipairs({"dq", "dk", "dv"}) do
            lu.assertTrue(same_bits(got[i], simt[i]), what .. ": " .. g .. " as the SIMT kernels'")
          end
        end
      end
    end
  end
end

-- score_mod terms free of s pass no derivative, even where their own
-- would not be finite: sqrt(k - k) adds 0 and d/ds of it is 0, not 0/0
-- (the CPU's forward mode once gave NaN there); the gradients are those of
-- the plain call, on every backend and the reference.
function TestBackward:test_score_mod_terms_free_of_s()
  local q, k, v, dout = randn({1, 2, 40, 16}, "f32", U.device), randn({1, 2, 50, 16}, "f32", U.device),
                        randn({1, 2, 50, 16}, "f32", U.device), randn({1, 2, 40, 16}, "f32", U.device)
  local o, lse = fa.attention(q, k, v, {return_lse = true})
  local mod = {score_mod = function(s, b, h, q, k) return s + (k - k):sqrt() * (q + 3):log() end}
  local plain = {fa.attention_backward(q, k, v, o, lse, dout)}
  local got = {fa.attention_backward(q, k, v, o, lse, dout, mod)}
  local ref = {fa.attention_backward_reference(q, k, v, o, lse, dout, mod)}
  for i = 1, 3 do
    lu.assertTrue(got[i]:isfinite(), "finite gradients")
    U.assert_close(got[i], plain[i], "f32", "score_mod free of s: gradient " .. i)
    U.assert_close(ref[i]:float():to(U.device), plain[i], "f32", "reference: gradient " .. i)
  end
end

function TestBackward:test_rows_with_no_key()
  -- kv_lens = 0 for batch 2: every row of it attends nothing (lse = -inf); on cuda the gradients come
  -- from fresh device memory, so every zero here was written by a kernel
  local dt, dev = U.cuda and "f32" or "f64", U.device
  for _, D in ipairs(U.cuda and {4, 64, 128} or {4}) do
    local qdt = D >= 64 and "bf16" or dt -- D = 64, 128 in bf16: the tensor-core kernels (128: dq by atomics on Hopper)
    local q, k, v, dout = randn({2, 2, 3, D}, qdt, dev), randn({2, 1, 5, D}, qdt, dev), randn({2, 1, 5, D}, qdt, dev),
                          randn({2, 2, 3, D}, qdt, dev)
    local opts = {kv_lens = {5, 0}}
    local o, lse = fa.attention(q, k, v, with_lse(opts))
    lu.assertEquals(lse:get(2, 1, 1), -math.huge)
    for _, f in ipairs({fa.attention_backward_reference, fa.attention_backward}) do
      local dq, dk, dv = f(q, k, v, o, lse, dout, opts)
      for _, g in ipairs({dq, dk, dv}) do
        lu.assertTrue(g:isfinite())
        lu.assertEquals(g:narrow(1, 2, 1):norm(), 0)
        lu.assertTrue(g:narrow(1, 1, 1):norm() > 0)
      end
    end
    -- no keys at all, and no queries
    local k0, v0 = randn({2, 1, 0, D}, qdt, dev), randn({2, 1, 0, D}, qdt, dev)
    local o0, l0 = fa.attention(q, k0, v0, {return_lse = true})
    local dq, dk, dv = fa.attention_backward(q, k0, v0, o0, l0, dout, {})
    lu.assertEquals(dq:norm(), 0)
    lu.assertEquals(dk:shape(), {2, 1, 0, D})
    lu.assertEquals(dv:shape(), {2, 1, 0, D})
    local qe, de = randn({2, 2, 0, D}, qdt, dev), randn({2, 2, 0, D}, qdt, dev)
    local oe, le = fa.attention(qe, k, v, {return_lse = true})
    for _, f in ipairs({fa.attention_backward_reference, fa.attention_backward}) do
      dq, dk, dv = f(qe, k, v, oe, le, de, {})
      lu.assertEquals(dk:norm() + dv:norm(), 0)
      lu.assertEquals(dq:shape(), {2, 2, 0, D})
    end
    -- no batch: empty gradients (on cuda at D = 128 the default is the atomic dq schedule)
    local qb, kb, vb = randn({0, 2, 3, D}, qdt, dev), randn({0, 1, 5, D}, qdt, dev), randn({0, 1, 5, D}, qdt, dev)
    local ob, lb = fa.attention(qb, kb, vb, {return_lse = true})
    dq, dk, dv = fa.attention_backward(qb, kb, vb, ob, lb, randn({0, 2, 3, D}, qdt, dev), {})
    lu.assertEquals(dq:shape(), {0, 2, 3, D})
    lu.assertEquals(dk:shape(), {0, 1, 5, D})
    lu.assertEquals(dv:shape(), {0, 1, 5, D})
  end
end

function TestBackward:test_strided_layouts()
  -- q, k, v, dout as (B, L, H, D) tensors seen through transposes: the same gradients as contiguous copies
  local function bhld(B, L, H, D, dtype) return randn({B, L, H, D}, dtype, U.device):transpose(2, 3) end
  local shapes = U.cuda and {{8, 6, "f32"}, {64, 64, "bf16"}, {128, 128, "f16"}} or {{8, 6, "f32"}, {8, 6, "f64"}}
  for _, s in ipairs(shapes) do
    local D, Dv, dtype = s[1], s[2], s[3]
    local q, k, v, dout = bhld(2, 75, 4, D, dtype), bhld(2, 77, 2, D, dtype), bhld(2, 77, 2, Dv, dtype),
                          bhld(2, 75, 4, Dv, dtype)
    -- without deterministic: on cuda's wgmma kernel dq is summed with atomics, here one key block's
    -- add onto zeros (77 keys), so that the bits are still the same
    local opts = {causal = true, deterministic = false}
    local o, lse = fa.attention(q, k, v, {causal = true, return_lse = true})
    local a = {fa.attention_backward(q, k, v, o, lse, dout, opts)}
    local b = {fa.attention_backward(q:clone(), k:clone(), v:clone(), o, lse, dout:clone(), opts)}
    for i = 1, 3 do lu.assertTrue(same_bits(a[i], b[i]), dtype .. " strided") end
  end
end

function TestBackward:test_errors()
  local dt = U.cuda and "f32" or "f64"
  local q, k, v, dout = randn({1, 2, 3, 4}, dt, U.device), randn({1, 1, 5, 4}, dt, U.device),
                        randn({1, 1, 5, 2}, dt, U.device), randn({1, 2, 3, 2}, dt, U.device)
  local o, lse = fa.attention(q, k, v, {return_lse = true})
  if U.cuda then
    local q64 = randn({1, 2, 3, 4}, "f64", U.device)
    U.assert_fa_error({"=q", "f64", "cuda"}, fa.attention_backward, q64, q64, q64, q64, q64:narrow(4, 1, 1):reshape({1, 2, 3}),
                      q64)
    U.assert_fa_error({"head dims", "256"}, fa.attention_backward, randn({1, 1, 3, 300}, dt, U.device),
                      randn({1, 1, 5, 300}, dt, U.device), v:narrow(2, 1, 1), o:narrow(2, 1, 1), lse:narrow(2, 1, 1),
                      dout:narrow(2, 1, 1))
    U.assert_fa_error({"=dout", "device"}, fa.attention_backward, q, k, v, o, lse, dout:cpu())
  end
  U.assert_fa_error({"=o", "shape"}, fa.attention_backward, q, k, v, dout:narrow(3, 1, 2), lse, dout)
  U.assert_fa_error({"=lse", "shape"}, fa.attention_backward, q, k, v, o, o, dout)
  U.assert_fa_error({"=dout", "shape"}, fa.attention_backward, q, k, v, o, lse, randn({1, 2, 3, 3}))
  U.assert_fa_error({"=dout", "dtype"}, fa.attention_backward, q, k, v, o, lse, dout:to(U.cuda and "f16" or "f32"))
  U.assert_fa_error({"=o", "float"}, fa.attention_backward, q, k, v, fa.zeros({1, 2, 3, 2}, {dtype = "bool"}), lse,
                    dout)
  U.assert_fa_error({"=k", "dtype"}, fa.attention_backward, q, k:to(U.cuda and "f16" or "f32"), v, o, lse, dout)
  U.assert_fa_error({"=dout"}, fa.attention_backward, q, k, v, o, lse, nil)
  U.assert_fa_error({"opts.causal"}, fa.attention_backward, q, k, v, o, lse, dout, {causal = "x"})
  U.assert_fa_error({"frobnicate"}, fa.attention_backward, q, k, v, o, lse, dout, {frobnicate = 1})
  U.assert_fa_error({"deterministic"}, fa.attention_backward, q, k, v, o, lse, dout, {deterministic = 1})
  U.assert_fa_error({"kv_lens"}, fa.attention_backward_reference, q, k, v, o, lse, dout, {kv_lens = {9}})
  -- the reference takes o and dout of any float dtype (fa.attention_reference gives f64)
  local dq = fa.attention_backward_reference(q:float(), k:float(), v:float(), o, lse:float(), dout)
  lu.assertEquals(dq:dtype(), "f64")
  lu.assertEquals(dq:device(), "cpu")
end

U.run()
