-- Attention variants written in Lua (API §9, docs/variants.md): opts.score_mod
-- and opts.mask_mod, traced once into an expression, on the CPU backend (every
-- algo) and fa.attention_reference (any device).  Each of §9's five examples is
-- checked against the same function built from §2's options or dense masks.
-- On cuda the variants are compiled into the kernels at run time (NVRTC): each
-- case runs on every kernel that takes it (fa.kernels: wgmma_tma, wgmma, mma, simt).
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

TestVariants = {}

local algos = {"naive", "two_pass", "flash_row", "flash"}
local cpu_dtypes = {"f32", "f64"}

local function merged(a, b)
  local r = U.copy_opts(a)
  for key, val in pairs(b or {}) do r[key] = val end
  return r
end

-- mod: the options with the variant; builtin: the same function from §2's
-- options.  The reference of both must agree (f64), and fa.attention with the
-- variant must match the builtin reference for every algo (cuda: every kernel
-- that takes the call, each by name, and the automatic choice).
local function check_variant(q, k, v, mod, builtin, what, extra)
  local ro, rl = U.reference(q, k, v, builtin)
  local mo, ml = U.reference(q, k, v, mod)
  U.assert_close(mo, ro, "f64", what .. " (reference)")
  local a, b = U.flat(ml), U.flat(rl)
  for i = 1, #b do
    if not (a[i] == b[i] or math.abs(a[i] - b[i]) <= 1e-9 * math.max(1, math.abs(b[i]))) then
      lu.fail(("%s (reference lse): entry %d is %s, expected %s; %s"):format(what, i, a[i], b[i], U.seed_note()))
    end
  end
  if U.cuda then
    local names = fa.kernels(q, k, v, merged(mod, extra))
    lu.assertTrue(#names >= 1, what)
    names[#names + 1] = "auto"
    for _, name in ipairs(names) do
      local o = name == "auto" and {} or {kernel = name}
      U.check_attention(q, k, v, merged(mod, merged(merged(o, {return_lse = true}), extra)),
        what .. " " .. name .. " " .. q:dtype(), {ref = {ro, rl}})
    end
    return
  end
  for _, algo in ipairs(algos) do
    U.check_attention(q, k, v, merged(mod, merged({algo = algo, return_lse = true}, extra)),
      what .. " " .. algo .. " " .. q:dtype(), {ref = {ro, rl}})
  end
end

local function inputs(dtype, B, Hq, Hkv, Lq, Lk, D)
  return U.randn({B, Hq, Lq, D}, dtype), U.randn({B, Hkv, Lk, D}, dtype), U.randn({B, Hkv, Lk, D}, dtype)
end

-- A dense bool mask (1, 1, Lq, Lk) from f(q, k) with 1-based positions.
local function dense(Lq, Lk, f)
  local m = {}
  for i = 1, Lq do
    m[i] = {}
    for j = 1, Lk do m[i][j] = f(i, j) end
  end
  return fa.tensor({{m}}, {dtype = "bool", device = dev})
end

local function dtypes() return U.cuda and {"f32", "f16"} or cpu_dtypes end

-- "naive", "two_pass" and "flash_row" with variants (on cuda their kernels compiled with the expressions: naive's
-- row kernel between cuBLAS's products, the SIMT passes, the one-row recurrence): score_mod, mask_mod over a
-- captured tensor, both, a tile option, GQA, Lq != Lk, against the f64 reference
function TestVariants:test_naive_two_pass_and_flash_row()
  for _, dtype in ipairs(dtypes()) do
    local q, k, v = inputs(dtype, 2, 4, 2, 45, 70, 16)
    local slopes = fa.tensor({0.5, 0.25, 0.125, 0.0625}, {device = dev})
    local docs = {}
    for j = 1, 70 do docs[j] = j <= 20 and 1 or j <= 52 and 2 or 3 end
    local doc = fa.tensor(docs, {device = dev})
    local sm = function(s, b, h, i, j) return s - slopes[h] * (i - j):abs() + (s / 5):tanh() end
    local mm = function(b, h, i, j) return doc[j]:eq(doc[i + 25]) & (i + 25):ge(j) end
    for _, o in ipairs({{score_mod = sm}, {mask_mod = mm}, {score_mod = sm, mask_mod = mm, causal = true},
                        {mask_mod = mm, tile = {16, 32}, softcap = 4}}) do
      local ro, rl = fa.attention_reference(q, k, v, merged(o, {return_lse = true}))
      for _, algo in ipairs({"naive", "two_pass", "flash_row"}) do
        U.check_attention(q, k, v, merged(o, {algo = algo, return_lse = true}), algo .. " " .. dtype, {ref = {ro, rl}})
      end
    end
    -- rows past 2048 keys: naive's row kernel takes a block a row there
    local ql, kl, vl = inputs(dtype, 1, 2, 1, 3, 2100, 16)
    local long = {score_mod = function(s, b, h, i, j) return s - (j % 7) * 0.05 end,
                  mask_mod = function(b, h, i, j) return (j % 11):ne(3) end, return_lse = true}
    local lo, ll = fa.attention_reference(ql, kl, vl, long)
    U.check_attention(ql, kl, vl, merged(long, {algo = "naive"}), "naive, long rows " .. dtype, {ref = {lo, ll}})
  end
end

function TestVariants:test_alibi()
  for _, dtype in ipairs(dtypes()) do
    local q, k, v = inputs(dtype, 2, 4, 2, 37, 37, 16) -- GQA
    local slopes = fa.tensor({0.5, 0.25, 0.125, 0.0625}, {device = dev})
    local alibi = function(s, b, h, q, k) return s - slopes[h] * (q - k):abs() end
    check_variant(q, k, v, {score_mod = alibi}, {alibi = slopes}, "alibi")
    check_variant(q, k, v, {score_mod = alibi, causal = true}, {alibi = slopes, causal = true}, "alibi causal")
    -- as the alibi option (src/expr_alibi.c): a factor and another order of the factors
    local twice = function(s, b, h, q, k) return s + (k - q):abs() * slopes[h] * -2 end
    check_variant(q, k, v, {score_mod = twice}, {alibi = {1, 0.5, 0.25, 0.125}}, "alibi x 2")
    -- Lq ~= Lk: |q - k| is not the option's distance, so the expression runs compiled
    local q2, k2, v2 = inputs(dtype, 1, 4, 2, 29, 41, 16)
    check_variant(q2, k2, v2, {score_mod = alibi}, {score_mod = alibi}, "alibi, Lq ~= Lk")
  end
end

function TestVariants:test_softcap()
  for _, dtype in ipairs(dtypes()) do
    local q, k, v = inputs(dtype, 1, 2, 2, 29, 41, 8)
    local softcap = function(s) return (s / 30):tanh() * 30 end
    check_variant(q, k, v, {score_mod = softcap, scale = 4}, {softcap = 30, scale = 4}, "softcap")
    -- score_mod applies before the built-in softcap (docs/variants.md)
    local twice = function(s) return s * 2 end
    check_variant(q, k, v, {score_mod = twice, softcap = 3}, {scale = 2 / 8 ^ 0.5, softcap = 3}, "order")
  end
end

function TestVariants:test_sliding()
  local L, W = 45, 6
  for _, dtype in ipairs(dtypes()) do
    local q, k, v = inputs(dtype, 1, 4, 1, L, L, 16) -- MQA
    local sliding = function(b, h, q, k) return q:ge(k) & (q - k):le(1024) end -- §9 as written
    check_variant(q, k, v, {mask_mod = sliding}, {mask = dense(L, L, function(i, j) return i >= j end)}, "sliding 1024")
    local narrow = function(b, h, q, k) return q:ge(k) & (q - k):le(W) end
    check_variant(q, k, v, {mask_mod = narrow}, {mask = dense(L, L, function(i, j) return i >= j and i - j <= W end)},
      "sliding", {tile = {8, 8}})
    check_variant(q, k, v, {mask_mod = narrow}, {window = {W, 0}}, "sliding as window")
    -- a symmetric and a shifted band (they run as the window option: src/expr_window.c)
    check_variant(q, k, v, {mask_mod = function(b, h, q, k) return (q - k):abs():le(3) end}, {window = {3, 3}},
      "symmetric window")
    check_variant(q, k, v, {mask_mod = function(b, h, q, k) return (k - q):lt(3) & (q - k):le(W) end},
      {window = {W, 2}}, "band")
  end
end

-- an expression's numbers are arguments of each launch on cuda (src/variant_codegen.c): a sweep over a
-- prefix length and a softcap runs one compiled kernel a form, each value giving its own result, and
-- the tiles mask_mod leaves empty or full are the value's (the kept spans once came from the first value:
-- prefixes that crossed a key tile of 128 lost its keys)
function TestVariants:test_numbers_swept()
  local L = U.cuda and 300 or 40
  for _, dtype in ipairs(U.cuda and {"bf16", "f32"} or {"f32"}) do
    local q, k, v = inputs(dtype, 1, 2, 2, L, L, U.cuda and dtype == "bf16" and 128 or 16)
    for _, P in ipairs(U.cuda and {1, 130, 129, 270} or {1, 7, 20, 39}) do
      check_variant(q, k, v, {mask_mod = function(b, h, q, k) return k:le(P) | q:ge(k) end},
        {mask = dense(L, L, function(i, j) return j <= P or i >= j end)}, "prefix " .. P)
    end
    for _, c in ipairs({2, 5.5, 30, 100}) do
      check_variant(q, k, v, {score_mod = function(s) return (s / c):tanh() * c end}, {softcap = c}, "softcap " .. c)
    end
  end
end

function TestVariants:test_document()
  local L = 40
  local ids = {}
  for i = 1, L do ids[i] = i <= 7 and 1 or i <= 20 and 2 or i <= 21 and 3 or 4 end
  local doc = fa.tensor(ids, {device = dev})
  local document = function(b, h, q, k) return doc[q]:eq(doc[k]) & q:ge(k) end
  local m = dense(L, L, function(i, j) return ids[i] == ids[j] and i >= j end)
  for _, dtype in ipairs(dtypes()) do
    local q, k, v = inputs(dtype, 2, 2, 2, L, L, 8)
    check_variant(q, k, v, {mask_mod = document}, {mask = m}, "document")
    -- causal combined with mask_mod (here redundant), and with a window
    check_variant(q, k, v, {mask_mod = document, causal = true}, {mask = m}, "document causal")
    check_variant(q, k, v, {mask_mod = document, window = {3, 0}}, {mask = m, window = {3, 0}}, "document window")
  end
end

function TestVariants:test_prefix_lm()
  local L, prefix = 33, 9
  for _, dtype in ipairs(dtypes()) do
    local q, k, v = inputs(dtype, 1, 2, 2, L, L, 16)
    local prefix_lm = function(b, h, q, k) return k:le(prefix) | q:ge(k) end -- prefix: a number
    check_variant(q, k, v, {mask_mod = prefix_lm}, {mask = dense(L, L, function(i, j) return j <= prefix or i >= j end)},
      "prefix_lm")
  end
end

-- b, h, q, k are 1-based (t[i]'s numbering), also with Lq ~= Lk; chained
-- indexing bias[h][q]; fa.where; the numeric methods.
function TestVariants:test_positions_and_methods()
  local B, H, Lq, Lk = 2, 3, 7, 19
  local q, k, v = inputs(U.cuda and "f32" or "f64", B, H, H, Lq, Lk, 8) -- f64 does not run on cuda
  local bias = U.randn({H, Lq}, "f32")
  local f = U.nested({B, H, Lq, Lk}, function(b, h, i, j)
    local x = 0.1 * b + 0.01 * h + 0.05 * (i - j) + bias:get(h, i)
    x = x + (j % 3 == 0 and math.sqrt(j) or math.exp(-j / 10)) + math.min(i, 4) - math.floor(j / 4)
    return x + math.log(j) + math.tanh(i / 5) + 2 ^ (i % 3) + (-j) % 5
  end)
  local fmask = fa.tensor(f, {dtype = "f64", device = dev})
  local mod = function(s, b, h, q, k)
    local x = s + b * 0.1 + h * 0.01 + (q - k) * 0.05 + bias[h][q]
    x = x + fa.where((k % 3):eq(0), k:sqrt(), (-k / 10):exp()) + q:min(4) - (k / 4):floor()
    return x + k:log() + (q / 5):tanh() + 2 ^ (q % 3) + (-k) % 5
  end
  check_variant(q, k, v, {score_mod = mod}, {mask = fmask}, "positions")
  -- mask_mod by batch and head: b = 2, h = 3 attends nothing (zeros, lse = -inf)
  local mm = function(b, h, q, k) return ~(b:eq(2) & h:eq(3)) & (k - q):ne(1) end
  local bm = U.nested({B, H, Lq, Lk}, function(b, h, i, j) return not (b == 2 and h == 3) and j - i ~= 1 end)
  check_variant(q, k, v, {mask_mod = mm}, {mask = fa.tensor(bm, {dtype = "bool", device = dev})}, "batch head mask")
end

function TestVariants:test_fully_masked_rows()
  local L = 12
  for _, dtype in ipairs(dtypes()) do
    local q, k, v = inputs(dtype, 1, 2, 2, L, L, 8)
    local mm = function(b, h, q, k) return q:gt(3) & k:le(q) end -- rows 1..3 attend nothing
    local opts = {mask_mod = mm, return_lse = true}
    local calls = {{fa.attention_reference, "reference"}}
    for _, algo in ipairs(algos) do
      calls[#calls + 1] = {function(a, b, c, o) return fa.attention(a, b, c, merged(o, {algo = algo})) end, algo}
    end
    for _, c in ipairs(calls) do
      local o, lse = c[1](q, k, v, opts)
      for i = 1, 3 do
        for h = 1, 2 do
          lu.assertEquals(lse:get(1, h, i), -math.huge, c[2])
          for d = 1, 8 do lu.assertEquals(o:get(1, h, i, d), 0, c[2]) end
        end
      end
      lu.assertTrue(lse:get(1, 1, 4) > -math.huge, c[2])
    end
    -- a mask_mod that returns a constant
    check_variant(q, k, v, {mask_mod = function() return true end}, {}, "constant true")
    check_variant(q, k, v, {score_mod = function() return 0 end}, {scale = 0}, "constant score")
  end
end

-- NaN from score_mod propagates to its row only, as NaN scores do.
function TestVariants:test_nan()
  local q, k, v = inputs("f32", 1, 1, 1, 6, 6, 4)
  local mod = function(s, b, h, q, k) return fa.where(q:eq(2) & k:eq(3), (s - s - 1):sqrt(), s) end
  for _, f in ipairs({fa.attention_reference, fa.attention}) do
    local o = f(q, k, v, {score_mod = mod})
    lu.assertTrue(U.is_nan(o:get(1, 1, 2, 1)))
    lu.assertFalse(U.is_nan(o:get(1, 1, 1, 1)))
    lu.assertFalse(U.is_nan(o:get(1, 1, 3, 1)))
  end
end

function TestVariants:test_errors()
  local q, k, v = inputs("f32", 1, 2, 2, 8, 8, 4)
  local att = fa.attention
  local slopes = fa.tensor({1, 2}, {device = dev})
  local function E(words, opts) U.assert_fa_error(words, att, q, k, v, opts) end
  E({"score_mod", "unknown method", "foo"}, {score_mod = function(s) return s:foo() end})
  E({"score_mod", "'bar'"}, {score_mod = function(s) return s.bar end})
  E({"score_mod", "indexing an expression"}, {score_mod = function(s) return s[1] end})
  E({"mask_mod", "'=='", ":eq"}, {mask_mod = function(b, h, q, k) return q == k end})
  E({"mask_mod", "<", ":lt"}, {mask_mod = function(b, h, q, k) return q < k end})
  local tbl = {1, 2}
  E({"score_mod", "table", "tbl"}, {score_mod = function(s, b, h) return s + tbl[h] end})
  E({"score_mod", "nil"}, {score_mod = function(s, b, h) return s + (_G.no_such_global or {})[h] end})
  E({"score_mod", "returned nil"}, {score_mod = function(s) end})
  E({"mask_mod", "returned a number"}, {mask_mod = function(b, h, q, k) return q - k end})
  E({"score_mod", "returned a boolean"}, {score_mod = function(s, b, h, q, k) return q:ge(k) end})
  E({"score_mod", "returned", "string"}, {score_mod = function(s) return "s" end})
  E({"mask_mod", "'&'", "boolean"}, {mask_mod = function(b, h, q, k) return q & k end})
  E({"mask_mod", "'|'", "boolean"}, {mask_mod = function(b, h, q, k) return q:ge(k) | 1 end})
  E({"score_mod", "'+'", "number"}, {score_mod = function(s, b, h, q, k) return s + q:ge(k) end})
  E({"mask_mod", "where", "condition"}, {mask_mod = function(b, h, q, k) return fa.where(q, true, false) end})
  E({"score_mod", "raised an error", "boom"}, {score_mod = function(s) error("boom") end})
  E({"score_mod", "raised an error", "table value"}, {score_mod = function(s) error({}) end})
  E({"score_mod", "too large", "4096"}, {score_mod = function(s)
    for _ = 1, 5000 do s = s + 1 end
    return s
  end})
  E({"score_mod", "slopes[(h + 1)]", "index 3 out of range 1..2"},
    {score_mod = function(s, b, h) return s + slopes[h + 1] end})
  E({"score_mod", "not an integer"}, {score_mod = function(s, b, h) return s + slopes[h / 2] end})
  E({"score_mod", "tostring"}, {score_mod = function(s)
    local _ = tostring(s)
    return s
  end})
  E({"score_mod", "print"}, {score_mod = function(s)
    print(s)
    return s
  end})
  E({"score_mod", "sin", "number expected"}, {score_mod = function(s) return math.sin(s) end})
  E({"score_mod", "=opts.score_mod", "function"}, {score_mod = 3})
  local bias = fa.zeros({2, 8}, {device = dev})
  E({"score_mod", "1 of its 2 dimensions"}, {score_mod = function(s, b, h) return s + bias[h] end})
  local kept
  U.assert_fa_error({"score_mod", "after the call"}, function()
    att(q, k, v, {score_mod = function(s) kept = s return s end})
    return kept + 1
  end)
  E({"score_mod", "after the call"}, {score_mod = function(s) return s + kept end})
  -- an output that is a tensor the expression reads is computed apart, then copied in
  local bias = U.randn({1, 1, 8, 8}, "f32")
  local q8, k8, v8 = U.randn({1, 1, 8, 8}, "f32"), U.randn({1, 1, 8, 8}, "f32"), U.randn({1, 1, 8, 8}, "f32")
  local want = att(q8, k8, v8, {score_mod = function(s, b, h, i, j) return s + bias:clone()[b][h][i][j] end})
  for _, algo in ipairs({"flash", "naive", "two_pass", "flash_row"}) do
    local canvas = bias:clone()
    local alias_mod = function(s, b, h, i, j) return s + canvas[b][h][i][j] end
    local got = att(q8, k8, v8, {score_mod = alias_mod, out = canvas, algo = algo})
    lu.assertTrue(rawequal(got, canvas))
    U.assert_close(got, want, "f32", algo .. ": out is the captured tensor")
  end
  -- the same where score_mod is ALiBi's form and its slopes tensor becomes opts.alibi itself (f64 on the CPU)
  if dev == "cpu" then
    local buf = fa.randn({1, 4, 8, 4}, {dtype = "f64", device = "cpu", seed = 5})
    local slopes = buf:view(-1):narrow(1, 29, 4)
    local qa, ka, va = fa.randn({1, 4, 8, 4}, {dtype = "f64", seed = 6}), fa.randn({1, 4, 8, 4}, {dtype = "f64", seed = 7}),
      fa.randn({1, 4, 8, 4}, {dtype = "f64", seed = 8})
    local kept = slopes:clone()
    local want_a = att(qa, ka, va, {score_mod = function(s, b, h, i, j) return s - kept[h] * (i - j):abs() end})
    local got_a = att(qa, ka, va, {score_mod = function(s, b, h, i, j) return s - slopes[h] * (i - j):abs() end, out = buf})
    lu.assertTrue(fa.max_abs_diff(got_a, want_a) < 1e-12, "alibi slopes in out")
  end
  -- out-of-range reads name the index: past int64's range, NaN and fractions said as such
  local ft = fa.tensor({1, 2, 3, 4}, {device = dev})
  if dev == "cpu" then
    E({"ft[", "+inf or past 9e18", "1..4"}, {score_mod = function(s, b, h, q) return s + ft[q * 1e300] end})
    E({"ft[", "dimension 1 is NaN"}, {score_mod = function(s, b, h, q) return s + ft[(q - q) / 0] end})
    E({"ft[", "not an integer"}, {score_mod = function(s, b, h, q) return s + ft[q * 0.5] end})
  end
  -- an out-of-range read that fa.where discards is no error
  local o = att(q, k, v, {score_mod = function(s, b, h) return fa.where(h:lt(2), s + slopes[h + 1], s) end})
  lu.assertTrue(o:isfinite())
  -- splits: the pieces count k as the whole call does, on both backends
  local doc = function(b, h, q, k) return (q % 5):eq(k % 5) end
  U.assert_close(fa.attention(q, k, v, {splits = 2, mask_mod = doc}), fa.attention(q, k, v, {mask_mod = doc}), "f32",
    "mask_mod with splits")
end

-- fa.block_mask: the states of every tile against a brute force in Lua.
local function expected_states(f, B, H, Lq, Lk, Br, Bc)
  local counts = {empty = 0, full = 0, partial = 0}
  local states = {}
  for b = 1, B do
    for h = 1, H do
      for qi = 1, (Lq + Br - 1) // Br do
        for ki = 1, (Lk + Bc - 1) // Bc do
          local any, all = false, true
          for i = (qi - 1) * Br + 1, math.min(qi * Br, Lq) do
            for j = (ki - 1) * Bc + 1, math.min(ki * Bc, Lk) do
              if f(b, h, i, j) then any = true else all = false end
            end
          end
          local st = all and "full" or any and "partial" or "empty"
          counts[st] = counts[st] + 1
          states[#states + 1] = {b, h, qi, ki, st}
        end
      end
    end
  end
  return counts, states
end

local function check_block_mask(bm, f, B, H, Lq, Lk, Br, Bc, what)
  local counts, states = expected_states(f, B, H, Lq, Lk, Br, Bc)
  local e, fu, p = bm:counts()
  lu.assertEquals({e, fu, p}, {counts.empty, counts.full, counts.partial}, what)
  for _, s in ipairs(states) do lu.assertEquals(bm:tile(s[1], s[2], s[3], s[4]), s[5], what) end
  lu.assertEquals({bm:sizes()}, {B, H, Lq, Lk, Br, Bc}, what)
end

-- a read out of range is found after the kernels ran: the caller's opts.out and opts.lse_out are
-- left as they were (they held the failed call's rows), on every algo and with either rule
function TestVariants:test_failed_call_writes_no_output()
  local q, k, v = inputs("f32", 1, 2, 2, 8, 8, 4)
  local doc = fa.zeros({6}, {device = dev})
  local mods = {
    score_mod = function(s, b, h, qi) return s + doc[qi] end,
    mask_mod = function(b, h, qi, ki) return doc[qi]:eq(0) end,
  }
  for key, mod in pairs(mods) do
    for _, algo in ipairs({"auto", "naive", "two_pass", "flash_row", "flash"}) do
      local out = fa.full({1, 2, 8, 4}, 7, {device = dev})
      local lse_out = fa.full({1, 2, 8}, 7, {device = dev})
      U.assert_fa_error({key, "doc[q]", "out of range"}, fa.attention, q, k, v,
        {[key] = mod, algo = algo, out = out, lse_out = lse_out})
      lu.assertEquals({out:min(), out:max(), lse_out:min(), lse_out:max()}, {7, 7, 7, 7}, key .. " " .. algo)
    end
  end
end

function TestVariants:test_block_mask_counts()
  -- causal, tiles 16x16 over L = 64: per (b, h) 4 diagonal tiles partial, 6 below full, 6 above empty
  local causal = function(b, h, q, k) return q:ge(k) end
  local bm = fa.block_mask(causal, 2, 3, 64, 64, {tile = {16, 16}})
  lu.assertEquals({bm:counts()}, {36, 36, 24})
  lu.assertEquals(bm:tile(1, 1, 1, 1), "partial")
  lu.assertEquals(bm:tile(2, 3, 4, 1), "full")
  lu.assertEquals(bm:tile(1, 2, 1, 4), "empty")
  lu.assertStrContains(tostring(bm), "36 empty, 36 full, 24 partial")
  check_block_mask(bm, function(b, h, i, j) return i >= j end, 2, 3, 64, 64, 16, 16, "causal")
  -- a document mask over ragged tiles, the tensor on the device under test
  local ids = {}
  for i = 1, 50 do ids[i] = i <= 13 and 1 or i <= 14 and 2 or i <= 40 and 3 or 4 end
  local doc = fa.tensor(ids, {device = dev})
  local document = function(b, h, q, k) return doc[q]:eq(doc[k]) & (q:ge(k) | h:eq(2)) end
  bm = fa.block_mask(document, 1, 2, 50, 50, {tile = {8, 16}})
  check_block_mask(bm, function(b, h, i, j) return ids[i] == ids[j] and (i >= j or h == 2) end, 1, 2, 50, 50, 8, 16,
    "document")
  -- more than 256 key tiles a query tile (the device's chunks), reads decided
  -- a tile at a time (documents of ragged lengths, a bool tensor, a NaN
  -- among the ids: its tiles evaluated pair by pair)
  local L2, ids2, keep = 1100, {}, {}
  for i = 1, L2 do
    ids2[i] = (i * 7) // 97 + (i > 700 and 1 or 0)
    keep[i] = i % 13 ~= 0
  end
  local docs2 = fa.tensor(ids2, {dtype = "f16", device = dev})
  local nan_ids = {}
  for i = 1, L2 do nan_ids[i] = i == 555 and 0 / 0 or ids2[i] end
  local nan_doc = fa.tensor(nan_ids, {device = dev})
  local kept = fa.tensor(keep, {device = dev})
  local ragged = function(b, h, q, k)
    return (docs2[q]:eq(docs2[k]) & q:ge(k) & kept[k]) | (h:eq(2) & nan_doc[k]:lt(nan_doc[q]))
  end
  bm = fa.block_mask(ragged, 1, 2, 40, L2, {tile = {16, 4}})
  check_block_mask(bm, function(b, h, i, j)
    return (ids2[i] == ids2[j] and i >= j and keep[j]) or (h == 2 and nan_ids[j] < nan_ids[i])
  end, 1, 2, 40, L2, 16, 4, "ragged documents")
  -- the default tile is the CPU's
  local _, _, _, _, br, bc = fa.block_mask(causal, 1, 1, 5, 5):sizes()
  lu.assertTrue(br >= 1 and bc >= 1)
end

function TestVariants:test_block_mask_results()
  local Lq, Lk = 40, 57
  local ids = {}
  for i = 1, Lk do ids[i] = (i - 1) // 9 end
  local doc = fa.tensor(ids, {device = dev})
  local document = function(b, h, q, k) return doc[q]:le(doc[k] + 1) end
  local bm = fa.block_mask(document, 2, 4, Lq, Lk, {tile = {8, 16}})
  for _, dtype in ipairs(dtypes()) do
    local q, k, v = inputs(dtype, 2, 4, 2, Lq, Lk, 8)
    for _, extra in ipairs({{}, {causal = true}, {window = {20, 3}}}) do
      local builtin = merged(extra, {mask = dense(Lq, Lk, function(i, j) return ids[i] <= ids[j] + 1 end)})
      -- with the block mask and its own mask_mod, or with both given
      check_variant(q, k, v, merged(extra, {block_mask = bm}), builtin, "block_mask", {tile = {8, 16}})
      check_variant(q, k, v, merged(extra, {block_mask = bm, mask_mod = document}), builtin, "block_mask+mask_mod",
        {tile = {8, 16}})
    end
  end
  -- the references take a block mask of any tile (they evaluate mask_mod on every pair), but only for
  -- the call's sizes, as the other calls
  local q, k, v = inputs("f32", 2, 4, 2, Lq, Lk, 8)
  local other_tile = fa.block_mask(document, 2, 4, Lq, Lk, {tile = {16, 8}})
  U.assert_close(fa.attention_reference(q, k, v, {block_mask = other_tile}),
    fa.attention_reference(q, k, v, {mask_mod = document}), "f64", "reference, block mask of another tile")
  local shorter = fa.block_mask(document, 2, 4, Lq - 1, Lk, {tile = {8, 16}})
  U.assert_fa_error({"opts.block_mask", "made for"}, fa.attention_reference, q, k, v, {block_mask = shorter})
  local o, lse = fa.attention_reference(q, k, v, {mask_mod = document, return_lse = true})
  U.assert_fa_error({"opts.block_mask", "made for"}, fa.attention_backward_reference, q, k, v, o, lse, o,
    {block_mask = shorter})
  U.assert_fa_error({"opts.block_mask", "made for"}, fa.attention, q, k, v, {block_mask = shorter})
  if U.cuda then return end
  -- the tiles are really skipped: a block mask is believed by "flash" and "two_pass" (empty
  -- tiles skipped, full tiles not masked), while "naive" and "flash_row" evaluate mask_mod
  -- everywhere.  Seen through a captured tensor whose values change after the block mask was
  -- made (the expression, which the call checks, stays the same)
  local q, k, v = inputs("f32", 1, 1, 1, 32, 32, 8)
  local flag = fa.tensor({0}, {device = dev})
  local gate = function(b, h, q, k) return flag[b]:eq(1) | q:ge(k) end
  local causal_only = fa.block_mask(gate, 1, 1, 32, 32, {tile = {8, 8}}) -- flag 0: the causal tiles
  flag:set(1, 1)
  local all = fa.block_mask(gate, 1, 1, 32, 32, {tile = {8, 8}}) -- flag 1: every tile full
  lu.assertEquals({all:counts()}, {0, 16, 0})
  lu.assertEquals({causal_only:counts()}, {6, 6, 4})
  local plain = fa.attention(q, k, v, {})
  for _, algo in ipairs(algos) do
    local skips = algo == "flash" or algo == "two_pass"
    -- flag 1 now: mask_mod attends everything, the block mask still says causal
    local o = fa.attention(q, k, v, {mask_mod = gate, block_mask = causal_only, tile = {8, 8}, algo = algo})
    if skips then
      lu.assertTrue(fa.max_abs_diff(o, plain) > 1e-3, algo .. ": the empty tiles were skipped")
    else
      U.assert_close(o, plain, "f32", algo)
    end
    flag:set(1, 0) -- mask_mod causal, the block mask full: "flash" and "two_pass" do not mask
    o = fa.attention(q, k, v, {mask_mod = gate, block_mask = all, tile = {8, 8}, algo = algo})
    if skips then U.assert_close(o, plain, "f32", algo) end
    flag:set(1, 1)
  end
  -- a mask_mod of another expression than the block mask's is an error
  U.assert_fa_error({"block_mask", "another mask_mod"}, fa.attention, q, k, v,
    {mask_mod = function(b, h, q, k) return q:le(k) end, block_mask = all, tile = {8, 8}})
  -- and so is one of the same text over other captured tensors (another batch's document
  -- ids): its tiles are not the block mask's, which would skip keys the call attends
  local function document(ids) return function(b, h, q, k) return ids[q]:eq(ids[k]) end end
  local two = fa.tensor({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                         2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}, {device = dev})
  local bm = fa.block_mask(document(two), 1, 1, 32, 32, {tile = {8, 8}})
  U.assert_fa_error({"block_mask", "another mask_mod"}, fa.attention, q, k, v,
    {mask_mod = document(fa.ones({32}, {device = dev})), block_mask = bm, tile = {8, 8}})
  -- the same tensor captured again (another closure, a view of the same elements) is the same mask
  U.assert_close(fa.attention(q, k, v, {mask_mod = document(two:narrow(1, 1, 32)), block_mask = bm, tile = {8, 8}}),
    fa.attention(q, k, v, {mask_mod = document(two), tile = {8, 8}}), "f32", "block mask, same tensor")
end

function TestVariants:test_block_mask_errors()
  local causal = function(b, h, q, k) return q:ge(k) end
  U.assert_fa_error({"mask_mod", "function"}, fa.block_mask, 3, 1, 1, 8, 8)
  U.assert_fa_error({"=lk"}, fa.block_mask, causal, 1, 1, 8)
  U.assert_fa_error({"block_mask", "mask_mod", "returned a number"}, fa.block_mask, function(b, h, q, k) return q end,
    1, 1, 8, 8)
  U.assert_fa_error({"tile", "{0, 8}"}, fa.block_mask, causal, 1, 1, 8, 8, {tile = {0, 8}})
  U.assert_fa_error({"unknown option", "tiles"}, fa.block_mask, causal, 1, 1, 8, 8, {tiles = {8, 8}})
  U.assert_fa_error({"=B", "H", "Lq", "Lk"}, fa.block_mask, causal, 0, 1, 8, 8)
  local doc = fa.tensor({1, 2}, {device = dev})
  U.assert_fa_error({"block_mask", "doc[(q + 1)]", "index 3 out of range"}, fa.block_mask,
    function(b, h, q, k) return doc[q + 1]:eq(1) end, 1, 1, 3, 3)
  local bm = fa.block_mask(causal, 1, 2, 16, 16, {tile = {8, 8}})
  U.assert_fa_error({"out of range"}, bm.tile, bm, 1, 3, 1, 1)
  local q, k, v = inputs("f32", 1, 2, 2, 16, 16, 8)
  if U.cuda then -- checked against the call's shape, then not used: the kernels evaluate mask_mod
    U.assert_fa_error({"block_mask", "(1, 2, 16, 16)", "(1, 2, 17, 16)"}, fa.attention,
      U.randn({1, 2, 17, 8}, "f32"), k, v, {block_mask = bm})
    U.assert_close(fa.attention(q, k, v, {block_mask = bm}), fa.attention(q, k, v, {causal = "top_left"}), "f32",
      "cuda block_mask")
    return
  end
  U.assert_fa_error({"block_mask", "tile {8, 8}", "tile {16, 16}"}, fa.attention, q, k, v,
    {block_mask = bm, tile = {16, 16}})
  local q2 = U.randn({1, 2, 17, 8}, "f32")
  U.assert_fa_error({"block_mask", "(1, 2, 16, 16)", "(1, 2, 17, 16)"}, fa.attention, q2, k, v,
    {block_mask = bm, tile = {8, 8}})
  U.assert_fa_error({"block_mask", "BlockMask"}, fa.attention, q, k, v, {block_mask = {}})
  -- the reference ignores a block mask
  local o = fa.attention_reference(q, k, v, {block_mask = bm})
  U.assert_close(o, fa.attention_reference(q, k, v, {causal = "top_left"}), "f64", "reference")
end

-- An error inside the traced function leaves nothing behind, and traces in a
-- loop leak nothing (the captured tensors are released with the expression).
function TestVariants:test_gc_stress()
  local q, k, v = inputs("f32", 1, 2, 2, 8, 8, 4)
  local att = fa.attention
  att(q, k, v, {score_mod = function(s) return s end})
  local base = U.mem_current()
  for i = 1, 200 do
    local slopes = fa.tensor({i, i + 1}, {device = dev})
    if i % 3 == 0 then
      pcall(att, q, k, v, {score_mod = function(s, b, h) slopes:free() return s + slopes[h] end})
    elseif i % 3 == 1 then
      pcall(att, q, k, v, {score_mod = function(s, b, h) local x = s + slopes[h] error("x") end})
    else
      att(q, k, v, {score_mod = function(s, b, h) return s - slopes[h] * 0.01 end})
    end
    if i % 10 == 0 then
      local shift = fa.tensor({i % 7}, {device = dev})
      local bm = fa.block_mask(function(b, h, q, k) return q:ge(k + shift[1] - 3) end, 1, 2, 8, 8, {tile = {4, 4}})
      att(q, k, v, {block_mask = bm, tile = {4, 4}})
    end
    if i % 50 == 0 then collectgarbage() end
  end
  lu.assertEquals(U.mem_current(), base)
end

-- cuda: §9's examples on the tensor-core kernels (bf16 at D = 128, f16 at
-- D = 64), with rows that do not fill a tile, GQA, and q, k, v given as
-- transposed (B, L, H, D) views (the kernels' strided instances).
function TestVariants:test_cuda_tensor_cores()
  if not U.cuda then return end
  local L, W, prefix = 200, 48, 70
  local ids = {}
  for i = 1, L do ids[i] = (i - 1) // 37 end
  local doc = fa.tensor(ids, {device = dev})
  local slopes = fa.tensor({0.5, 0.25, 0.125, 0.0625}, {device = dev})
  local cases = {
    {{score_mod = function(s, b, h, q, k) return s - slopes[h] * (q - k):abs() end}, {alibi = slopes}, "alibi"},
    {{score_mod = function(s) return (s / 30):tanh() * 30 end, scale = 0.5}, {softcap = 30, scale = 0.5}, "softcap"},
    {{mask_mod = function(b, h, q, k) return q:ge(k) & (q - k):le(W) end}, {window = {W, 0}}, "sliding"},
    {{mask_mod = function(b, h, q, k) return doc[q]:eq(doc[k]) & q:ge(k) end},
      {mask = dense(L, L, function(i, j) return ids[i] == ids[j] and i >= j end)}, "document"},
    {{mask_mod = function(b, h, q, k) return k:le(prefix) | q:ge(k) end},
      {mask = dense(L, L, function(i, j) return j <= prefix or i >= j end)}, "prefix_lm"},
    {{score_mod = function(s, b, h, q, k) return s - slopes[h] * (q - k):abs() end,
      mask_mod = function(b, h, q, k) return q:ge(k) & (q - k):le(W) end}, {alibi = slopes, window = {W, 0}},
      "alibi + sliding"},
  }
  for _, c in ipairs({{"bf16", 128}, {"f16", 64}, {"f16", 256}}) do -- wgmma_tma at 128 and 256
    local dtype, D = c[1], c[2]
    local q, k, v = inputs(dtype, 1, 4, 2, L, L, D)
    local function view(h) return U.randn({1, L, h, D}, dtype):transpose(2, 3) end
    local qt, kt, vt = view(4), view(2), view(2)
    for _, x in ipairs(cases) do
      check_variant(q, k, v, x[1], x[2], x[3])
      check_variant(qt, kt, vt, x[1], x[2], x[3] .. " (views)")
      -- wgmma_tma's key tiles of 176 (a row's keys past 32 bits)
      if D == 128 then check_variant(q, k, v, x[1], x[2], x[3] .. " (tile 176)", {tile = {128, 176}}) end
    end
    -- NaN and inf in V (the warp-specialised kernel sees them in its outputs, the others' scan of V
    -- from the side stream: the flag set, the SIMT fallback rewrites the call): only the rows that
    -- attend those keys see them, though rows of the same key tiles that do not attend them visit
    -- them too, and the next call is clean
    local vn = v:clone()
    vn:set(1, 2, 150, 3, U.NaN)
    vn:set(1, 1, 60, 5, U.inf)
    for _, x in ipairs({cases[3], cases[4], cases[6]}) do
      check_variant(q, k, vn, x[1], x[2], x[3] .. " NaN/inf in v")
      check_variant(q, k, v, x[1], x[2], x[3] .. " finite v after")
    end
  end
end

-- tiles the interval check must leave partial: infinite ends of + - * (inf - inf, 0 · inf inside
-- the tile) and % past 2^53; the calls must match the dense rule, and the block mask brute force
function TestVariants:test_tiles_with_infinities_and_huge_values()
  local cases = {
    {function(b, h, q, k) return ((q - k) * math.huge):ge(-math.huge) end, function(i, j) return i ~= j end},
    {function(b, h, q, k) return ((q + 2 ^ 60) % 3):eq(0) | q:ge(k) end, function(i, j) return (i + 2 ^ 60) % 3 == 0 or i >= j end},
    {function(b, h, q, k) return ((k + math.huge) % 2):ge(0) | q:lt(k) end, function(i, j) return i < j end},
  }
  for n, c in ipairs(cases) do
    local q, k, v = inputs(U.cuda and "f16" or "f64", 1, 1, 1, 32, 32, 16)
    local bm = fa.block_mask(c[1], 1, 1, 32, 32, {tile = {16, 16}})
    for qi = 1, 2 do
      for ki = 1, 2 do
        local any, all = false, true
        for i = (qi - 1) * 16 + 1, qi * 16 do
          for j = (ki - 1) * 16 + 1, ki * 16 do
            local keep = c[2](i, j)
            any, all = any or keep, all and keep
          end
        end
        local state = bm:tile(1, 1, qi, ki)
        if all then lu.assertTrue(state == "full" or state == "partial", ("case %d tile %d %d"):format(n, qi, ki)) end
        if not any then lu.assertTrue(state == "empty" or state == "partial", ("case %d tile %d %d"):format(n, qi, ki)) end
        if any and not all then lu.assertEquals(state, "partial", ("case %d tile %d %d"):format(n, qi, ki)) end
      end
    end
    local mask = dense(32, 32, c[2])
    local ro = U.reference(q, k, v, {mask = mask})
    U.check_attention(q, k, v, {mask_mod = c[1], tile = not U.cuda and {16, 16} or nil}, ("tiles case %d"):format(n),
      {ref = {ro, select(2, U.reference(q, k, v, {mask = mask, return_lse = true}))}})
  end
end

U.run()
