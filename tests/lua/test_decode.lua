-- The decode kernel (API §8; cuda only): a few query rows per key head, the
-- query heads of a key head packed together, the keys cut into chunks
-- (opts.splits) merged in one more launch; the paged cache read through its
-- page table.  On the CPU: the registry does not offer it and naming it is
-- an error naming the kernels that take the call.  On cuda: it is the
-- automatic choice for the calls it takes, and its results equal the f64
-- reference with every score rule, every chunk count, NaN/inf in values no
-- row attends, and through the paged cache.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

TestDecode = {}

local function contains(list, name)
  for _, n in ipairs(list) do if n == name then return true end end
  return false
end

local function qkv(dtype, B, Hq, Hkv, Lq, Lk, D)
  return U.randn({B, Hq, Lq, D}, dtype), U.randn({B, Hkv, Lk, D}, dtype), U.randn({B, Hkv, Lk, D}, dtype)
end

function TestDecode:test_cpu_refuses()
  local q, k, v = qkv("f32", 1, 4, 2, 1, 50, 64)
  q, k, v = q:cpu(), k:cpu(), v:cpu()
  lu.assertFalse(contains(fa.kernels(q, k, v), "decode"))
  U.assert_fa_error({"opts.kernel", '"decode"', "cuda", '"cpu_flash"'}, fa.attention, q, k, v, {kernel = "decode"})
end

function TestDecode:test_registry_on_cuda()
  if dev ~= "cuda" then lu.skip("cuda only") end
  local q, k, v = qkv("bf16", 2, 8, 2, 4, 300, 128)
  lu.assertEquals(fa.kernels(q, k, v)[1], "decode")
  -- what it does not take: f32, D = 96, more than 64 rows a key head, a tile, algo two_pass
  local f, fk, fv = qkv("f32", 1, 8, 2, 1, 300, 64)
  lu.assertFalse(contains(fa.kernels(f, fk, fv), "decode"))
  U.assert_fa_error({"opts.kernel", '"decode"', "f32"}, fa.attention, f, fk, fv, {kernel = "decode"})
  local w, wk, wv = qkv("f16", 1, 8, 2, 1, 300, 96)
  U.assert_fa_error({"opts.kernel", '"decode"', "D = 96"}, fa.attention, w, wk, wv, {kernel = "decode"})
  local m, mk, mv = qkv("f16", 1, 4, 1, 20, 300, 64) -- 80 rows a key head at Lq = 20
  lu.assertFalse(contains(fa.kernels(m, mk, mv), "decode"))
  U.assert_fa_error({"opts.kernel", '"decode"', "80 query rows", "Lq up to 16"}, fa.attention, m, mk, mv,
    {kernel = "decode"})
  -- D = 256: at most 32 rows a key head (two row groups)
  local g, gk, gv = qkv("bf16", 1, 16, 8, 16, 300, 256) -- 32 rows
  lu.assertEquals(fa.kernels(g, gk, gv)[1], "decode")
  local g2, gk2, gv2 = qkv("bf16", 1, 8, 2, 16, 300, 256) -- 64 rows
  lu.assertFalse(contains(fa.kernels(g2, gk2, gv2), "decode"))
  U.assert_fa_error({"opts.kernel", '"decode"', "64 query rows", "D = 256", "at most 32"}, fa.attention, g2, gk2, gv2,
    {kernel = "decode"})
  local m2, mk2, mv2 = qkv("f16", 1, 16, 1, 5, 300, 64) -- 80 rows a key head at Lq = 5: blocks of 64 rows
  lu.assertEquals(fa.kernels(m2, mk2, mv2)[1], "decode")
  U.assert_fa_error({"opts.kernel", '"decode"', "tile"}, fa.attention, q, k, v, {kernel = "decode", tile = {64, 64}})
  U.assert_fa_error({"opts.kernel", '"decode"', "two_pass"}, fa.attention, q, k, v,
    {kernel = "decode", algo = "two_pass"})
  -- a refusal given as a fixed reason is named too (it once printed an unfilled buffer)
  local d, dk, dv = qkv("f64", 1, 8, 2, 1, 30, 64)
  U.assert_fa_error({"opts.kernel", '"wgmma"', "f64 inputs"}, fa.attention, d, dk, dv, {kernel = "wgmma"})
end

function TestDecode:test_results_on_cuda()
  if dev ~= "cuda" then lu.skip("cuda only") end
  local cases = {
    {"bf16", 2, 8, 2, 1, 3000, 128, {}},
    {"f16", 2, 8, 2, 1, 3000, 128, {splits = 7, return_lse = true}},
    {"bf16", 1, 8, 1, 4, 1029, 64, {splits = 1}},
    {"f16", 2, 8, 2, 16, 700, 64, {causal = true, alibi = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8}, softcap = 20,
                                   kv_lens = {650, 9}, return_lse = true}},
    {"bf16", 1, 4, 1, 4, 1000, 128, {causal = "top_left", window = {100, 0}, splits = 5}},
    {"bf16", 2, 4, 4, 2, 5000, 128, {window = {300, 20}, splits = 64}},
    {"f16", 3, 4, 2, 3, 5, 128, {causal = true}},
    -- four row groups (33-64 rows a key head: wgmma on Hopper) at D = 128
    {"bf16", 2, 8, 2, 12, 1500, 128, {causal = true, return_lse = true}},
    {"f16", 1, 32, 8, 16, 2000, 128, {}},
    -- short caches (at most 256 keys: one chunk, no merge)
    {"bf16", 2, 8, 2, 1, 256, 128, {}},
    {"f16", 1, 8, 8, 1, 130, 64, {window = {40, 0}, causal = true, return_lse = true}},
    {"bf16", 2, 16, 4, 2, 200, 128, {alibi = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6,
                                              0.7, 0.8}, softcap = 30, kv_lens = {200, 70}}},
    -- slopes of 0 for some heads: a thread's two packed rows of heads with and without ALiBi (Lq = 4:
    -- rows 0-7 are heads 0 and 1 of a key head, rows 8-15 heads 2 and 3)
    {"bf16", 1, 8, 2, 4, 900, 128, {alibi = {0, 0, 0.3, 0.4, 0, 0, 0.7, 0.8}}},
    {"f16", 1, 8, 2, 4, 900, 64, {alibi = {0.3, 0.4, 0, 0, 0.7, 0.8, 0, 0}, causal = true}},
    -- rows whose range is empty past the chunk's end (kv_lens and a window's left side): zeros, lse -inf
    {"f16", 1, 1, 1, 4, 128, 64, {kv_lens = {126}, window = {0, -1}, return_lse = true}},
    {"bf16", 2, 4, 2, 3, 700, 128, {kv_lens = {650, 300}, window = {48, -1}, splits = 3, return_lse = true}},
    -- many rows (B·Hq·Lq = 1536, eight an SM and more) and at most 16 chunks: the merge takes a warp a
    -- row; a batch without keys (every chunk empty: zeros, lse -inf)
    {"bf16", 3, 32, 8, 16, 1100, 128, {kv_lens = {1100, 0, 517}, return_lse = true}},
    {"f16", 3, 32, 8, 16, 2000, 64, {splits = 16, causal = true, return_lse = true}},
    -- more than 64 rows a key head (Lq up to 16): blocks of 64 packed rows, the last part-filled
    {"bf16", 2, 16, 2, 16, 3000, 128, {return_lse = true}},
    {"f16", 1, 16, 1, 5, 1500, 64, {causal = true, kv_lens = {1400}, return_lse = true}},
    {"bf16", 2, 64, 1, 3, 700, 128, {window = {200, 0}, causal = true, splits = 3,
                                     alibi = (function() local t = {} for h = 1, 64 do t[h] = 0.01 * (h % 9) end return t end)()}},
    -- D = 256 (Gemma's head dim): one and two row groups, Q's fragments from shared memory
    {"bf16", 2, 16, 8, 1, 3000, 256, {causal = true, return_lse = true}},
    {"f16", 1, 16, 8, 16, 1500, 256, {causal = true, kv_lens = {1400}, return_lse = true}},
    {"bf16", 2, 4, 4, 3, 700, 256, {window = {200, 0}, causal = true, softcap = 30, alibi = {0.1, 0.2, 0.3, 0.4},
                                    splits = 3}},
    {"f16", 1, 8, 1, 2, 200, 256, {}},
  }
  for i, c in ipairs(cases) do
    local q, k, v = qkv(c[1], c[2], c[3], c[4], c[5], c[6], c[7])
    local what = ("decode case %d (%s, B %d, Hq %d, Hkv %d, Lq %d, Lk %d, D %d)"):format(i, table.unpack(c, 1, 7))
    U.check_attention(q, k, v, c[8], what)
    -- the same with the kernel named, and run twice: bit-identical
    local opts = U.copy_opts(c[8])
    opts.kernel = "decode"
    local o1, o2 = fa.attention(q, k, v, opts), fa.attention(q, k, v, opts)
    lu.assertEquals(fa.max_abs_diff(o1, o2), 0, what .. " run twice")
  end
  -- kv_lens in the kernel's parameters (batches up to 64) and read from the device (65 and more)
  for _, B in ipairs({64, 65}) do
    local lens = {}
    for b = 1, B do lens[b] = (b * 37) % 301 end
    local q, k, v = qkv("bf16", B, 4, 1, 2, 300, 64)
    U.check_attention(q, k, v, {kv_lens = lens, causal = true, return_lse = true}, ("decode kv_lens, B %d"):format(B))
  end
  -- a bool mask, broadcast over heads
  local q, k, v = qkv("bf16", 2, 8, 2, 2, 400, 64)
  local keep = U.nested({2, 1, 2, 400}, function(b, _, i, j) return (b * 7 + i * 3 + j * 5) % 11 ~= 0 end)
  U.check_attention(q, k, v, {mask = fa.tensor(keep, {dtype = "bool", device = dev})}, "decode bool mask")
end

-- Every contiguous decode instance (U.decode_instances), as test_kv_cache's test_decode_instances does for the
-- paged ones: with and without a score rule; one chunk of 5 tiles and two of 3 (so that the loop's copies of the
-- next tiles run, under the evict-first policy: K and V are small).  A miscompiled instance (session 75: ptxas
-- left some copies' registers unset in four paged ones) is an illegal instruction for the calls that reach it.
function TestDecode:test_instances_on_cuda()
  if dev ~= "cuda" then lu.skip("cuda only") end
  for _, inst in ipairs(U.decode_instances()) do
    local D, G, Lq, dtype = table.unpack(inst)
    local q, k, v = qkv(dtype, 2, G, 1, Lq, 320, D)
    local what = ("decode instance D %d G %d Lq %d %s"):format(D, G, Lq, dtype)
    U.check_attention(q, k, v, {causal = true, splits = 1, return_lse = true}, what .. " 1 split")
    U.check_attention(q, k, v, {softcap = 2, kv_lens = {320, 250}, splits = 2}, what .. " softcap, 2 splits")
  end
end

function TestDecode:test_nonfinite_values_on_cuda()
  if dev ~= "cuda" then lu.skip("cuda only") end
  local k = U.randn({2, 2, 300, 128}, "bf16")
  local vt = U.randn({2, 2, 300, 128}, "f32"):cpu():totable()
  vt[1][1][290][5], vt[2][2][200][7], vt[1][2][250][1] = 0 / 0, 1 / 0, -1 / 0
  local v = fa.tensor(vt, {dtype = "bf16", device = dev})
  -- a short cache (one chunk): NaN and inf past kv_lens in tiles that are attended in part
  local k2 = U.randn({2, 2, 200, 128}, "bf16")
  local vt2 = U.randn({2, 2, 200, 128}, "f32"):cpu():totable()
  vt2[1][1][190][5], vt2[2][2][170][7] = 0 / 0, 1 / 0
  local v2 = fa.tensor(vt2, {dtype = "bf16", device = dev})
  U.check_attention(U.randn({2, 4, 2, 128}, "bf16"), k2, v2, {kv_lens = {180, 150}}, "decode NaN/inf, short cache")
  -- NaN in a query row, with the keys cut into chunks: that row NaN (its chunks' states NaN), the others not
  local qt = U.randn({1, 4, 1, 128}, "f32"):cpu():totable()
  qt[1][3][1][9] = 0 / 0
  local qn = fa.tensor(qt, {dtype = "bf16", device = dev})
  local kn, vn = U.randn({1, 2, 2000, 128}, "bf16"), U.randn({1, 2, 2000, 128}, "bf16")
  for _, s in ipairs({1, 4, "auto"}) do
    U.check_attention(qn, kn, vn, {splits = s, return_lse = true}, ("decode NaN in q, splits %s"):format(s))
  end
  -- the same where the merge takes a warp a row (1536 rows)
  local qm = U.randn({3, 32, 16, 128}, "f32"):cpu():totable()
  qm[2][5][7][3] = 0 / 0
  local km, vm = U.randn({3, 8, 1500, 128}, "bf16"), U.randn({3, 8, 1500, 128}, "bf16")
  U.check_attention(fa.tensor(qm, {dtype = "bf16", device = dev}), km, vm, {splits = 6, return_lse = true},
    "decode NaN in q, 1536 rows, splits 6")
  -- NaN and inf in V at the last keys, causal: the query rows that attend them are NaN or inf, the rows before
  -- them finite (the block's second pass, with every P·V exact, gives both)
  local vc = U.randn({1, 2, 700, 128}, "f32"):cpu():totable()
  vc[1][1][700][3], vc[1][2][699][11], vc[1][2][698][4] = 0 / 0, 1 / 0, -1 / 0
  local kc, vcn = U.randn({1, 2, 700, 128}, "bf16"), fa.tensor(vc, {dtype = "bf16", device = dev})
  for _, qs in ipairs({{1, 8, 4, 128}, {1, 8, 16, 128}}) do
    local q = U.randn(qs, "bf16")
    for _, s in ipairs({"auto", 1, 3}) do
      U.check_attention(q, kc, vcn, {causal = true, splits = s},
        ("decode NaN/inf in V at attended keys, Lq %d, splits %s"):format(qs[3], s))
    end
  end
  -- the same at D = 256 (Q's fragments from shared memory in both passes)
  local vd = U.randn({1, 2, 700, 256}, "f32"):cpu():totable()
  vd[1][1][700][3], vd[1][2][699][201] = 0 / 0, 1 / 0
  local kd, vdn = U.randn({1, 2, 700, 256}, "bf16"), fa.tensor(vd, {dtype = "bf16", device = dev})
  for _, qs in ipairs({{1, 4, 4, 256}, {1, 4, 16, 256}}) do
    local q = U.randn(qs, "bf16")
    for _, s in ipairs({"auto", 1}) do
      U.check_attention(q, kd, vdn, {causal = true, splits = s},
        ("decode D 256 NaN/inf in V at attended keys, Lq %d, splits %s"):format(qs[3], s))
    end
  end
  -- 4 rows a key head, and 64 (four row groups: wgmma on Hopper)
  for _, qs in ipairs({{2, 4, 2, 128}, {2, 8, 16, 128}}) do
    local q = U.randn(qs, "bf16")
    for _, s in ipairs({"auto", 1, 5}) do -- past kv_lens: no row attends them, the output stays finite
      U.check_attention(q, k, v, {kv_lens = {280, 150}, splits = s},
        ("decode NaN/inf past kv_lens, Hq %d Lq %d, splits %s"):format(qs[2], qs[3], s))
    end
  end
end

-- Each sequence b of a paged cache's causal attend (o) against the f64 reference over the first lens[b]
-- rows of k and v (what the cache was given), aligned to its own length; an empty sequence gives zeros.
local function assert_sequences(o, q, k, v, lens, dtype, what)
  for b, n in ipairs(lens) do
    local ob, label = o:narrow(1, b, 1), ("%s seq %d"):format(what, b)
    if n > 0 then
      local kb = k:narrow(1, b, 1):narrow(3, 1, n):cpu():double()
      local vb = v:narrow(1, b, 1):narrow(3, 1, n):cpu():double()
      local ro = fa.attention_reference(q:narrow(1, b, 1):cpu():double(), kb, vb, {causal = true})
      U.assert_close(ob, ro, dtype, label)
    else
      local zeros = fa.zeros(ob:shape(), {dtype = "f64", device = "cpu"})
      lu.assertEquals(fa.max_abs_diff(ob:cpu():double(), zeros), 0, label .. ": zeros")
    end
  end
end

function TestDecode:test_paged_cache_on_cuda()
  if dev ~= "cuda" then lu.skip("cuda only") end
  do -- a short cache (at most 256 keys: one chunk) in pages of 16, ragged
    local cache <close> = fa.kv_cache{batch = 2, heads = 2, dim = 128, capacity = 256, page_size = 16, dtype = "bf16",
                                      device = dev}
    local k, v = U.randn({2, 2, 240, 128}, "bf16"), U.randn({2, 2, 240, 128}, "bf16")
    cache:append(k, v, {240, 37})
    local q = U.randn({2, 8, 1, 128}, "bf16")
    assert_sequences(cache:attend(q, {causal = true}), q, k, v, {240, 37}, "bf16", "paged short cache")
  end
  do -- D = 256 in pages of 16, ragged, Lq 1 and 8 (16 rows a key head)
    local cache <close> = fa.kv_cache{batch = 2, heads = 2, dim = 256, capacity = 900, page_size = 16, dtype = "f16",
                                      device = dev}
    local k, v = U.randn({2, 2, 900, 256}, "f16"), U.randn({2, 2, 900, 256}, "f16")
    cache:append(k, v, {900, 413})
    for _, lq in ipairs({1, 8}) do
      local q = U.randn({2, 4, lq, 256}, "f16")
      assert_sequences(cache:attend(q, {causal = true}), q, k, v, {900, 413}, "f16", ("paged D 256 Lq %d"):format(lq))
    end
  end
  for _, B in ipairs({64, 65}) do -- the lengths in the kernel's parameters (up to 64), and read from the device
    local cache <close> = fa.kv_cache{batch = B, heads = 1, dim = 64, capacity = 80, page_size = 16, dtype = "f16",
                                      device = dev}
    local lens = {}
    for b = 1, B do lens[b] = (b * 29) % 81 end
    lens[3] = 0 -- an empty sequence: zeros
    local k, v = U.randn({B, 1, 80, 64}, "f16"), U.randn({B, 1, 80, 64}, "f16")
    cache:append(k, v, lens)
    local q = U.randn({B, 4, 1, 64}, "f16")
    assert_sequences(cache:attend(q, {causal = true}), q, k, v, lens, "f16", ("paged B %d"):format(B))
  end
  for _, ps in ipairs({16, 5, 48}) do -- runs of 16 a page entry (16, 48), a row an entry (5)
    local B, H, Hq, D, cap = 3, 2, 8, 64, 600
    local cache = fa.kv_cache{batch = B, heads = H, dim = D, capacity = cap, page_size = ps, dtype = "bf16", device = dev}
    local keys = fa.zeros({B, H, cap, D}, {dtype = "f64", device = "cpu"})
    local vals = fa.zeros({B, H, cap, D}, {dtype = "f64", device = "cpu"})
    local lens = {0, 0, 0}
    for _, st in ipairs({{200, {200, 17, 90}}, {40, nil}, {300, {3, 300, 0}}, {1, nil}}) do
      local n = st[1]
      local k, v = U.randn({B, H, n, D}, "bf16"), U.randn({B, H, n, D}, "bf16")
      cache:append(k, v, st[2])
      for b = 1, B do
        local m = st[2] and st[2][b] or n
        if m > 0 then
          keys:narrow(1, b, 1):narrow(3, lens[b] + 1, m):copy_(k:narrow(1, b, 1):narrow(3, 1, m):cpu():double())
          vals:narrow(1, b, 1):narrow(3, lens[b] + 1, m):copy_(v:narrow(1, b, 1):narrow(3, 1, m):cpu():double())
        end
        lens[b] = lens[b] + m
      end
    end
    lu.assertEquals(cache:lengths(), lens)
    -- Lq 4 and 16 (16 and 64 rows a key head)
    for _, c in ipairs({{{}, 16}, {{causal = true, splits = 3}, 4}, {{window = {50, 0}, causal = true, return_lse = true}, 16}}) do
      local opts, lq = c[1], c[2]
      local q = U.randn({B, Hq, lq, D}, "bf16")
      local o, lse = cache:attend(q, opts)
      for b = 1, B do -- each sequence against its own keys, aligned to its own length
        local r = U.copy_opts(opts)
        r.return_lse = true
        local ro, rl = fa.attention_reference(q:narrow(1, b, 1):cpu():double(),
          keys:narrow(1, b, 1):narrow(3, 1, lens[b]), vals:narrow(1, b, 1):narrow(3, 1, lens[b]), r)
        local what = ("paged ps %d seq %d (len %d)"):format(ps, b, lens[b])
        U.assert_close(o:narrow(1, b, 1), ro, "bf16", what)
        if opts.return_lse then U.assert_lse(lse:narrow(1, b, 1), rl, "bf16", what .. " lse") end
      end
    end
    cache:free()
  end
end

U.run()
