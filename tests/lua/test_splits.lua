-- opts.splits for fa.attention (docs/lua-api.md §5): the keys cut into s
-- contiguous pieces, each attended, the states merged: the same result as
-- the unsplit call within rounding, lse too, with every rule of the
-- attention (causal bottom-right, window, kv_lens, alibi, softcap, mask)
-- measured on the whole key sequence; causal = "top_left" and the variants
-- too, on both backends.  "auto" (the default) is 1 here (the decode kernel
-- chooses its own, and so does cuda's f32 kernel: test_f32_key_chunks, and
-- the CPU's "flash" and "two_pass" where the tiles are fewer than the
-- threads: test_key_chunks_every_rule; CTest runs this file a second time
-- with 8 threads, lua_splits_8_threads).
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

TestSplits = {}

local function rule_sets(B, Hq, Lq, Lk)
  local alibi = {}
  for h = 1, Hq do alibi[h] = 0.25 * h end
  local kv = {}
  for b = 1, B do kv[b] = (b * 7) % (Lk + 1) end
  return {
    {},
    {causal = true},
    {causal = "bottom_right", window = {3, 0}},
    {window = {5, 2}},
    {kv_lens = kv},
    {kv_lens = kv, causal = true},
    {alibi = alibi},
    {alibi = alibi, causal = true, softcap = 3},
    {softcap = 2, scale = 0.7},
    {mask = U.rand({1, 1, Lq, Lk}, "f32"):to("f32", dev) - 0.5},
  }
end

function TestSplits:test_equal_to_the_unsplit_call()
  local shapes = {
    {{2, 4, 1, 32}, {2, 2, 50, 32}, {2, 2, 50, 16}}, -- decode, GQA, Dv != D
    {{1, 2, 16, 16}, {1, 2, 37, 16}, {1, 2, 37, 16}}, -- speculative Lq = 16
    {{3, 5, 24}, {3, 19, 24}, {3, 19, 24}},           -- 3-D, Lq < Lk
    {{9, 8}, {9, 8}, {9, 8}},                         -- 2-D
  }
  for si, s in ipairs(shapes) do
    for _, dtype in ipairs(U.dtypes) do
      local q, k, v = U.randn(s[1], dtype), U.randn(s[2], dtype), U.randn(s[3], dtype)
      local B = #s[1] == 4 and s[1][1] or 1
      local Hq = #s[1] >= 3 and s[1][#s[1] - 2] or 1
      local Lq, Lk = s[1][#s[1] - 1], s[2][#s[2] - 1]
      for ri, rules in ipairs(rule_sets(B, Hq, Lq, Lk)) do
        local skip = (#s[1] < 4 and rules.kv_lens) or (rules.alibi and #rules.alibi ~= Hq)
        if not skip then
          local base = U.copy_opts(rules)
          base.return_lse = true
          local o1, l1 = fa.attention(q, k, v, base)
          for _, sp in ipairs({2, 3, Lk + 5}) do
            local opts = U.copy_opts(rules)
            opts.return_lse = true
            opts.splits = sp
            opts.algo = U.pick({"flash", "naive", "two_pass", "flash_row", "auto"}, si + ri + sp)
            local o, l = fa.attention(q, k, v, opts)
            local what = ("splits=%d %s %s rules #%d"):format(sp, dtype, U.shape_str(s[2]), ri)
            lu.assertEquals(o:dtype(), dtype, what)
            lu.assertEquals(o:device(), dev, what)
            U.assert_close(o, o1, dtype, what, math.max(U.tol[dtype], 1e-6))
            U.assert_lse(l, l1, dtype, what .. " lse")
          end
        end
      end
    end
  end
end

function TestSplits:test_against_the_reference()
  local q, k, v = U.randn({2, 4, 3, 16}), U.randn({2, 2, 41, 16}), U.randn({2, 2, 41, 16})
  local opts = {causal = true, window = {9, -1}, kv_lens = {41, 30}, alibi = {0.1, 0.2, 0.3, 0.4}, splits = 4,
                return_lse = true}
  local ro, rl = U.reference(q, k, v, opts)
  local o, l = fa.attention(q, k, v, opts)
  U.assert_close(o, ro, "f32", "splits vs reference")
  U.assert_lse(l, rl, "f32", "splits vs reference lse")
end

function TestSplits:test_f64_pieces_merge_in_f64()
  -- an f64 call's pieces keep their lse in f64 until the merge: the split call equals the
  -- reference to f64 rounding, as the unsplit one does (the lse handed back is f32)
  if dev ~= "cpu" then return end -- no f64 attention on cuda
  local q = fa.randn({2, 2, 3, 16}, {seed = 1, dtype = "f64", device = "cpu"})
  local k = fa.randn({2, 1, 300, 16}, {seed = 2, dtype = "f64", device = "cpu"})
  local v = fa.randn({2, 1, 300, 16}, {seed = 3, dtype = "f64", device = "cpu"})
  for _, algo in ipairs({"naive", "two_pass", "flash_row", "flash"}) do
    local opts = {splits = 5, algo = algo, causal = true, window = {100, 0}, return_lse = true}
    local o, l = fa.attention(q, k, v, opts)
    local ro, rl = fa.attention_reference(q, k, v, opts)
    lu.assertTrue(fa.max_abs_diff(o, ro) < 1e-14, algo)
    lu.assertEquals(l:dtype(), "f32")
    lu.assertTrue(fa.max_abs_diff(l, rl:float()) == 0, algo .. " lse")
  end
end

function TestSplits:test_f32_pieces_merge_without_rounding_their_lse()
  -- every score 8192 plus a few 64ths (q of ones, keys 128 + k/64: exact in f32, so the only error
  -- is the softmax's), every key of like weight: the pieces' lse, 8192 + log of a piece's sum, once
  -- went to the merge as f32, half an ulp of 8192 (5e-4) on each piece's weight, 4e-5 on the output
  -- where the unsplit call is within 1e-7; the pieces now keep their lse in f64 to the merge
  local q, k, v = U.scores_near_8192(1, 70, 64, 12345, dev)
  local ref = fa.attention_reference(q, k, v, {scale = 1})
  for _, algo in ipairs({"flash", "two_pass", "naive", "flash_row"}) do
    for _, s in ipairs({1, 2, 7}) do
      local e = fa.max_abs_diff(fa.attention(q, k, v, {scale = 1, splits = s, algo = algo}):cpu():double(), ref)
      lu.assertTrue(e < 1e-6, ("%s, %d pieces: %.3g from the reference"):format(algo, s, e))
    end
  end
end

function TestSplits:test_half_pieces_merge_in_f32()
  -- on the CPU an f16/bf16 call's pieces hand their o to the merge in f32, so that the split call
  -- rounds once, at the end: it equals the same split call on the f32 values, rounded (pieces in
  -- f16 were rounded twice, 4.9e-4 off at (1, 1, 4, 8) with 6 keys); kv_cache:attend too
  if dev ~= "cpu" then return end -- the cuda kernels write their pieces in the inputs' dtype
  for _, dtype in ipairs({"f16", "bf16"}) do
    for seed = 1, 8 do
      local q = fa.randn({1, 2, 4, 8}, {seed = 10 * seed, dtype = dtype})
      local k = fa.randn({1, 2, 6 + seed, 8}, {seed = 10 * seed + 1, dtype = dtype})
      local v = fa.randn({1, 2, 6 + seed, 8}, {seed = 10 * seed + 2, dtype = dtype})
      for _, algo in ipairs({"flash", "two_pass", "naive", "flash_row"}) do
        for _, s in ipairs({2, 3}) do
          local opts = {splits = s, algo = algo}
          local got, want = fa.attention(q, k, v, opts), fa.attention(q:float(), k:float(), v:float(), opts)
          lu.assertEquals(fa.max_abs_diff(got, want:to(dtype)), 0, ("%s %s, %d pieces"):format(dtype, algo, s))
        end
      end
    end
    local c16 = fa.kv_cache({batch = 1, heads = 2, dim = 8, capacity = 32, page_size = 4, dtype = dtype})
    local c32 = fa.kv_cache({batch = 1, heads = 2, dim = 8, capacity = 32, page_size = 4})
    local k = fa.randn({1, 2, 13, 8}, {seed = 5, dtype = dtype})
    local v = fa.randn({1, 2, 13, 8}, {seed = 6, dtype = dtype})
    c16:append(k, v)
    c32:append(k:float(), v:float())
    local q = fa.randn({1, 2, 3, 8}, {seed = 7, dtype = dtype})
    local got, want = c16:attend(q, {splits = 3}), c32:attend(q:float(), {splits = 3})
    lu.assertEquals(fa.max_abs_diff(got, want:to(dtype)), 0, dtype .. " kv_cache:attend, 3 pieces")
  end
end

function TestSplits:test_empty_rows_and_no_keys()
  -- kv_lens 0: every piece empty: zeros and lse = -inf
  local q, k, v = U.randn({2, 1, 2, 8}), U.randn({2, 1, 10, 8}), U.randn({2, 1, 10, 8})
  local o, l = fa.attention(q, k, v, {kv_lens = {0, 10}, splits = 3, return_lse = true})
  local t = U.flat(l)
  lu.assertEquals(t[1], -math.huge)
  lu.assertEquals(t[2], -math.huge)
  lu.assertEquals(o:select(1, 1):norm(), 0)
  -- Lk = 0: nothing to split
  local k0, v0 = U.randn({2, 1, 0, 8}), U.randn({2, 1, 0, 8})
  local o0, l0 = fa.attention(q, k0, v0, {splits = 4, return_lse = true})
  lu.assertEquals(o0:norm(), 0)
  lu.assertEquals(U.flat(l0)[1], -math.huge)
end

function TestSplits:test_out_and_lse_out()
  local q, k, v = U.randn({1, 2, 3, 8}), U.randn({1, 2, 20, 8}), U.randn({1, 2, 20, 8})
  local ro, rl = fa.attention(q, k, v, {return_lse = true})
  local out, lse_out = U.poison({1, 2, 3, 8}, "f32"), U.poison({1, 2, 3}, "f32")
  local o, l = fa.attention(q, k, v, {splits = 5, out = out, lse_out = lse_out})
  lu.assertTrue(rawequal(o, out))
  lu.assertTrue(rawequal(l, lse_out))
  U.assert_close(out, ro, "f32", "out")
  U.assert_lse(lse_out, rl, "f32", "lse_out")
  -- out aliasing q: the inputs are read before out is written
  local qq = q:clone()
  local o2 = fa.attention(qq, k, v, {splits = 3, out = qq})
  U.assert_close(o2, ro, "f32", "out = q")
end

function TestSplits:test_auto_and_errors()
  local q, k, v = U.randn({1, 1, 2, 8}), U.randn({1, 1, 9, 8}), U.randn({1, 1, 9, 8})
  local ro = fa.attention(q, k, v)
  U.assert_close(fa.attention(q, k, v, {splits = "auto"}), ro, "f32", "auto")
  for _, bad in ipairs({0, -1, 1.5, "many", true}) do
    local ok, err = pcall(fa.attention, q, k, v, {splits = bad})
    lu.assertFalse(ok)
    lu.assertStrContains(err, "flashattn: opts.splits")
  end
  -- past the largest count: the message names the range, not just ">= 1"
  U.assert_fa_error({"opts.splits", "1 to 2147483647", "2147483648"}, fa.attention, q, k, v, {splits = 2 ^ 31})
  -- top_left: the pieces count keys from their start on both backends, and so does cuda's decode kernel
  -- (f16/bf16, Lq <= 16, D 64/128/...)
  U.assert_close(fa.attention(q, k, v, {splits = 2, causal = "top_left"}), fa.attention(q, k, v, {causal = "top_left"}),
    "f32", "top_left splits")
  do -- more query rows than keys, a window and kv_lens beside top_left, and a 16-bit call on the tensor-core kernels
    local q2, k2, v2 = U.randn({2, 2, 70, 32}), U.randn({2, 2, 50, 32}), U.randn({2, 2, 50, 32})
    for _, o in ipairs({{causal = "top_left"}, {causal = "top_left", window = {6, 0}}, {causal = "top_left", kv_lens = {31, 50}}}) do
      for _, s in ipairs({2, 3, 7}) do
        local os = {splits = s}
        for key, val in pairs(o) do os[key] = val end
        U.assert_close(fa.attention(q2, k2, v2, os), fa.attention(q2, k2, v2, o), "f32", "top_left splits " .. s)
      end
    end
    local qh, kh, vh = U.randn({1, 4, 200, 64}, "bf16"), U.randn({1, 4, 300, 64}, "bf16"), U.randn({1, 4, 300, 64}, "bf16")
    local ref = fa.attention_reference(qh, kh, vh, {causal = "top_left"})
    U.assert_close(fa.attention(qh, kh, vh, {splits = 3, causal = "top_left"}), ref, "bf16", "top_left splits, bf16")
  end
  if dev ~= "cpu" then
    local qd, kd, vd = U.randn({1, 2, 3, 64}, "bf16"), U.randn({1, 2, 40, 64}, "bf16"), U.randn({1, 2, 40, 64}, "bf16")
    U.assert_close(fa.attention(qd, kd, vd, {splits = 3, causal = "top_left"}),
      fa.attention(qd, kd, vd, {causal = "top_left"}), "bf16", "top_left splits, decode kernel")
  end
  do -- the variants' k counts the whole call's keys in every piece, on both backends
    local mm = function(b, h, i, j) return ((i + j) % 3):ne(0) & i:ge(j) | j:le(i * 2) end
    local sm = function(s, b, h, i, j) return s - (i - j):abs() * 0.1 + j * 0.01 end
    U.assert_close(fa.attention(q, k, v, {splits = 3, mask_mod = mm, score_mod = sm}),
      fa.attention(q, k, v, {mask_mod = mm, score_mod = sm}), "f32", "variants splits")
    -- 16-bit: the tensor-core kernels and mask_mod's tiles (spans) on cuda; a captured tensor read at k
    local qh, kh, vh = U.randn({1, 2, 100, 64}, "bf16"), U.randn({1, 2, 300, 64}, "bf16"), U.randn({1, 2, 300, 64}, "bf16")
    local docs = {}
    for j = 1, 300 do docs[j] = j <= 70 and 1 or j <= 210 and 2 or 3 end
    local doc = fa.tensor(docs, {dtype = "f32", device = dev})
    local dm = function(b, h, i, j) return doc[j]:ne(2) | (i * 3):ge(j) end
    local ds = function(s, b, h, i, j) return s + doc[j] * 0.25 - j * 0.002 end
    for _, o in ipairs({{mask_mod = dm}, {score_mod = ds}, {mask_mod = dm, score_mod = ds}}) do
      local ref = fa.attention_reference(qh, kh, vh, o)
      for _, n in ipairs({2, 5}) do
        local os = {splits = n}
        for key, val in pairs(o) do os[key] = val end
        U.assert_close(fa.attention(qh, kh, vh, os), ref, "bf16", "variants splits " .. n .. ", bf16")
      end
    end
  end
  if dev == "cpu" then
    -- a block mask is the unsplit call's: the pieces evaluate mask_mod themselves
    local causal = function(b, h, i, j) return i:ge(j) end
    local bm = fa.block_mask(causal, 1, 1, 2, 9, {tile = {2, 4}})
    U.assert_close(fa.attention(q, k, v, {splits = 3, mask_mod = causal, block_mask = bm, tile = {2, 4}}),
      fa.attention(q, k, v, {mask_mod = causal}), "f32", "block mask with splits")
  end
  -- top_left with one piece still runs; the reference ignores splits
  fa.attention(q, k, v, {splits = 1, causal = "top_left"})
  fa.attention_reference(q, k, v, {splits = 3, causal = "top_left"})
end

function TestSplits:test_hostile_finalizer_frees_inputs()
  local q, k, v = U.randn({1, 2, 2, 8}), U.randn({1, 2, 30, 8}), U.randn({1, 2, 30, 8})
  local ro = fa.attention(q, k, v)
  local kk, vv = k:clone(), v:clone()
  local opts = setmetatable({}, {__index = function(_, key)
    if key == "splits" then kk:free(); vv:free(); collectgarbage() return 3 end
  end})
  local o = fa.attention(q, kk, vv, opts) -- pinned before the opts run
  U.assert_close(o, ro, "f32", "hostile")
end


-- cuda's f32 kernel ("flash", D = Dv = 64 or 128) cuts the keys into chunks of one launch where its
-- query tiles are too few to fill the GPU ("auto"; splits = 1: none), merging the chunks' (m, l):
-- the same result as one chunk within rounding (nearer the reference: shorter sums), under every
-- rule, bit-identical from run to run; chunks with no key (kv_lens, a window, causal rows) weigh
-- nothing, and NaN or inf of V at keys no row attends stays out.  On the CPU the same holds where
-- "flash" cuts a call's keys over the threads (with 2 threads: none of these; with 8: four chunks).
function TestSplits:test_f32_key_chunks()
  local Lk = 2000 -- 63 key tiles of 32: three chunks of 21 where one or two query tiles a head run
  for _, D in ipairs({64, 128}) do
    for _, Lq in ipairs({1, 5, 70}) do
      local q, k = U.randn({2, 2, Lq, D}), U.randn({2, 1, Lk, D})
      local v = U.randn({2, 1, Lk, D})
      local keep = fa.tensor(U.nested({1, 1, 1, Lk}, function(_, _, _, j) return j % 7 ~= 0 and j < 1800 end),
        {device = dev})
      for ri, rules in ipairs({{}, {causal = true}, {window = {300, 0}, causal = true}, {kv_lens = {1500, 0}},
                               {mask = keep}, {alibi = {0.01, 0.02}, softcap = 20},
                               {mask = U.rand({1, 1, Lq, Lk}, "f32"):to("f32", dev) - 0.5}}) do
        local what = ("f32 chunks D=%d Lq=%d rules #%d"):format(D, Lq, ri)
        local auto = U.copy_opts(rules)
        auto.return_lse = true
        local one = U.copy_opts(auto)
        one.splits = 1
        local o, l = fa.attention(q, k, v, auto)
        local o1, l1 = fa.attention(q, k, v, one)
        U.assert_close(o, o1, "f32", what, 1e-6)
        U.assert_lse(l, l1, "f32", what .. " lse")
        local ro, rl = U.reference(q, k, v, auto)
        U.assert_close(o, ro, "f32", what .. " vs reference")
        U.assert_lse(l, rl, "f32", what .. " lse vs reference")
        local o2, l2 = fa.attention(q, k, v, auto)
        lu.assertEquals(fa.max_abs_diff(o, o2), 0, what .. " run twice")
        lu.assertEquals(U.flat(l2), U.flat(l), what .. " lse run twice")
      end
      -- NaN and inf of V where no row looks: past the first batch's kv_lens, and in keys the mask drops
      local vb = v:clone()
      vb:set(1, 1, 1700, 2, U.NaN)
      vb:set(2, 1, 7, 3, U.inf)
      local o = fa.attention(q, k, vb, {kv_lens = {1500, 2000}, mask = keep})
      lu.assertTrue(o:isfinite(), ("f32 chunks D=%d Lq=%d: NaN or inf of V no row attends"):format(D, Lq))
    end
  end
end

-- Long f32 dot products: the outside oracle's seed 8401 case 632 (f32, D = 256, Dv = 128, 10223 keys,
-- 64 splits, scale 1, bottom-right) in one head. Scores of D = 256 at scale 1 reach tens, so every f32
-- rounding of a score moves its weight. The bound is 4e-5 max|ref64|: the CPU's "flash" and "two_pass"
-- reach 1.7e-5 over 40 random inputs (over 1e-5, the oracle's floor, in 6 of their 80 calls), and a
-- 16-bit accumulation or a wrong merge of the 64 splits is off by 1e-3 and more. The 1 % by which cuda's
-- SIMT kernel, one FMA chain a score before e2e19b9, missed the oracle's limit is the oracle's to catch.
function TestSplits:test_f32_long_dot_products()
  local q, k, v = U.randn({1, 1, 16, 256}), U.randn({1, 1, 10223, 256}), U.randn({1, 1, 10223, 128})
  local opts = {causal = "bottom_right", splits = 64, scale = 1}
  local ref = U.reference(q, k, v, opts)
  local bound = 4e-5 * math.max(ref:max(), -ref:min())
  for _, algo in ipairs({"flash", "two_pass"}) do
    opts.algo = algo
    local err = fa.max_abs_diff(fa.attention(q, k, v, opts), ref)
    lu.assertTrue(err <= bound, ("f32 D=256 10223 keys 64 splits %s: max err %.3g > %.3g"):format(algo, err, bound))
  end
end

-- "auto" on a call of fewer tiles than threads and 1024 keys or more: the CPU's "flash" and "two_pass"
-- cut each tile's keys into chunks of whole key tiles, one a thread, and merge the chunks' states as
-- fa.merge_states does (cuda: the decode kernel's chunks where it takes the call).  Every rule against
-- the reference and against splits = 1, the same bits run twice, GQA rows packed into one tile, rows
-- some chunks leave empty (top_left, a window, kv_lens), rows no chunk attends (zeros, lse = -inf),
-- NaN of V reaching exactly the rows that attend its key, and outputs written through views.
function TestSplits:test_key_chunks_every_rule()
  local Lk, D = 1300, 16
  local docs = {}
  for j = 1, Lk do docs[j] = j // 400 end
  local doc = fa.tensor(docs, {dtype = "f32", device = dev})
  local shapes = {{B = 1, Hq = 4, Hkv = 1, Lq = 1}, {B = 1, Hq = 4, Hkv = 1, Lq = 3}, {B = 1, Hq = 1, Hkv = 1, Lq = 5}}
  for si, sh in ipairs(shapes) do
    for di, dtype in ipairs(U.dtypes) do
      local q = U.randn({sh.B, sh.Hq, sh.Lq, D}, dtype)
      local k, v = U.randn({sh.B, sh.Hkv, Lk, D}, dtype), U.randn({sh.B, sh.Hkv, Lk, D}, dtype)
      local slopes = {}
      for h = 1, sh.Hq do slopes[h] = 0.002 * h end
      local sets = {
        {}, {causal = true}, {causal = "top_left"}, {window = {600, 20}}, {kv_lens = {700}, causal = true},
        {alibi = slopes, softcap = 3}, {kv_lens = {0}},
        {mask = U.randn({1, sh.Hq, sh.Lq, Lk}, dtype)},
        {mask = fa.tensor(U.nested({1, 1, sh.Lq, Lk}, function(_, _, i, j) return (i + j) % 5 ~= 0 and j > 300 end),
          {device = dev})},
        {mask_mod = function(b, h, i, j) return doc[j]:eq(doc[i * 250]) | j:le(i * 7) end},
        {score_mod = function(s, b, h, i, j) return s - (i - j):abs() * 0.001 + doc[j] * 0.1 end},
      }
      for ri, rules in ipairs(sets) do
        local algo = U.pick({"flash", "two_pass", "auto"}, si + di + ri)
        local what = ("chunks %s Hq %d Lq %d rules #%d %s"):format(dtype, sh.Hq, sh.Lq, ri, algo)
        local auto = U.copy_opts(rules)
        auto.return_lse, auto.algo = true, algo
        local one = U.copy_opts(auto)
        one.splits = 1
        local o, l = fa.attention(q, k, v, auto)
        local o1, l1 = fa.attention(q, k, v, one)
        U.assert_close(o, o1, dtype, what .. " vs splits = 1", math.max(U.tol[dtype], 1e-6))
        U.assert_lse(l, l1, dtype, what .. " lse vs splits = 1")
        local ro, rl = U.reference(q, k, v, auto)
        U.assert_close(o, ro, dtype, what .. " vs reference", math.max(U.tol[dtype], 1e-6))
        U.assert_lse(l, rl, dtype, what .. " lse vs reference")
        local o2, l2 = fa.attention(q, k, v, auto)
        lu.assertEquals(fa.max_abs_diff(o, o2), 0, what .. " run twice")
        lu.assertEquals(U.flat(l2), U.flat(l), what .. " lse run twice")
        if rules.kv_lens and rules.kv_lens[1] == 0 then
          lu.assertEquals(o:norm(), 0, what .. ": no key, zeros")
          for _, x in ipairs(U.flat(l)) do lu.assertEquals(x, -math.huge, what .. ": no key, lse = -inf") end
        end
      end
      -- NaN of V at key 1100 (a late chunk) reaches the rows whose mask keeps it, zero weight included
      local vn = v:clone()
      vn:set(1, 1, 1100, 2, U.NaN)
      local m = fa.tensor(U.nested({1, sh.Hq, sh.Lq, Lk}, function(_, h, _, j)
        if j ~= 1100 or h == 1 then return 0 end
        return h == 2 and -1e30 or -math.huge
      end), {dtype = dtype == "f64" and "f64" or "f32", device = dev})
      local on = fa.attention(q, k, vn, {mask = m})
      for h = 1, sh.Hq do
        lu.assertEquals(on:select(2, h):isfinite(), h > 2,
          ("chunks %s Hq %d Lq %d: NaN reaches head %d"):format(dtype, sh.Hq, sh.Lq, h))
      end
      -- outputs through views: o a narrow of wider rows, lse a column of a matrix
      local wide = U.poison({sh.B, sh.Hq, sh.Lq, D + 5}, dtype)
      local out = wide:narrow(4, 3, D)
      local lwide = U.poison({sh.B, sh.Hq, sh.Lq, 2}, "f32")
      local lout = lwide:select(4, 2)
      fa.attention(q, k, v, {causal = true, out = out, lse_out = lout})
      local ro, rl = U.reference(q, k, v, {causal = true, return_lse = true})
      U.assert_close(out, ro, dtype, "chunks into a view", math.max(U.tol[dtype], 1e-6))
      U.assert_lse(lout, rl, dtype, "chunks lse into a view")
      lu.assertTrue(U.is_nan(U.flat(wide:narrow(4, 1, 2))[1]), "chunks wrote outside the view")
    end
  end
  -- a paged cache: each sequence's keys cut at the same places as the call over contiguous K and V
  if dev == "cpu" then
    local cache <close> = fa.kv_cache{batch = 2, heads = 1, dim = D, capacity = 2048, page_size = 16}
    local kc, vc = U.randn({2, 1, 1500, D}), U.randn({2, 1, 1500, D})
    cache:append(kc, vc, {1500, 900})
    local qc = U.randn({2, 4, 1, D})
    local o, l = cache:attend(qc, {return_lse = true})
    local ro, rl = U.reference(qc, kc, vc, {kv_lens = {1500, 900}, return_lse = true})
    U.assert_close(o, ro, "f32", "chunks through the page table")
    U.assert_lse(l, rl, "f32", "chunks through the page table lse")
    lu.assertEquals(fa.max_abs_diff(o, fa.attention(qc, kc, vc, {kv_lens = {1500, 900}})), 0,
      "chunks through the page table: the contiguous call's bits")
    -- as many chunks as keys over many rows: an out-of-memory error, nothing held after, the engine usable
    local qb, kb, vb = U.randn({4, 16, 1000, 16}), U.randn({4, 16, 3000, 16}), U.randn({4, 16, 3000, 16})
    local limit0 = fa.memory_limit("cpu")
    U.collect()
    local held = fa.memory("cpu").current
    fa.set_memory_limit(held + 64 * 2 ^ 20, "cpu")
    local ok, err = pcall(fa.attention, qb, kb, vb, {splits = 2 ^ 31 - 1})
    fa.set_memory_limit(limit0, "cpu")
    lu.assertFalse(ok)
    lu.assertStrContains(tostring(err), "flashattn: out of memory")
    U.collect()
    lu.assertEquals(fa.memory("cpu").current, held, "key chunks: memory held after the error")
    U.assert_close(fa.attention(qb, kb, vb, {splits = 3}), fa.attention(qb, kb, vb, {splits = 1}), "f32",
      "key chunks after the error")
  end
end

U.run()
