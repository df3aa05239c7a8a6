-- fa.shard, fa.unshard and fa.ring_attention (API §11, docs/ring.md): the
-- layouts' pieces, round trips, the ring against fa.attention on the
-- unsharded tensors, every error.  On FLASHATTN_DEVICE=cuda the shards are
-- cuda tensors of one device.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

TestShard = {}

-- the positions (0-based) each shard of L over n holds, by the layouts' rules
local function expected_positions(L, n, layout)
  local function chunks(m)
    local c, start = {}, 0
    for j = 0, m - 1 do
      local len = L // m + ((j < L % m) and 1 or 0)
      c[j] = {start, len}
      start = start + len
    end
    return c
  end
  local out = {}
  if layout == "zigzag" then
    local c = chunks(2 * n)
    for i = 0, n - 1 do
      local p = {}
      for _, j in ipairs({i, 2 * n - 1 - i}) do
        for x = c[j][1], c[j][1] + c[j][2] - 1 do p[#p + 1] = x end
      end
      out[i + 1] = p
    end
  else
    local c = chunks(n)
    for i = 0, n - 1 do
      local p = {}
      for x = c[i][1], c[i][1] + c[i][2] - 1 do p[#p + 1] = x end
      out[i + 1] = p
    end
  end
  return out
end

function TestShard:test_pieces_and_round_trips()
  for _, layout in ipairs({"contiguous", "zigzag"}) do
    for _, L in ipairs({1, 2, 5, 7, 8, 13}) do
      local maxn = layout == "zigzag" and L // 2 or L
      for n = 1, math.min(maxn, 6) do
        -- (2, L, 3): the value at position x of row b, column c is 100·b + 10·x + c
        local t = fa.arange(2 * L * 3, {device = dev, dtype = "f64"}):view({2, L, 3})
        local shards = fa.shard(t, n, {layout = layout})
        local what = ("%s L=%d n=%d"):format(layout, L, n)
        lu.assertEquals(#shards, n, what)
        local want = expected_positions(L, n, layout)
        for i, s in ipairs(shards) do
          lu.assertEquals(s:device(), dev, what)
          lu.assertEquals(s:size(1), 2, what)
          lu.assertEquals(s:size(3), 3, what)
          lu.assertEquals(s:size(2), #want[i], what .. " shard " .. i)
          for p, x in ipairs(want[i]) do
            lu.assertEquals(s:get(2, p, 3), t:get(2, x + 1, 3), what .. " shard " .. i)
          end
        end
        if layout == "contiguous" then -- sizes differ by at most one, the larger first
          for i = 2, n do
            local a, b = shards[i - 1]:size(2), shards[i]:size(2)
            lu.assertTrue(a == b or a == b + 1, what)
          end
        end
        local back = fa.unshard(shards, {layout = layout})
        lu.assertEquals(back:shape(), t:shape(), what)
        lu.assertEquals(fa.max_abs_diff(back, t), 0, what)
      end
    end
  end
end

function TestShard:test_contiguous_shards_are_views_zigzag_are_copies()
  local t = fa.zeros({6, 2}, {device = dev})
  local c = fa.shard(t, 2)
  c[2]:fill_(1)
  lu.assertEquals(t:sum(), 6, "a contiguous shard shares t's storage")
  local z = fa.shard(t, 2, {layout = "zigzag"})
  z[1]:fill_(5)
  lu.assertEquals(t:sum(), 6, "a zigzag shard is a new tensor")
end

function TestShard:test_dims_and_dtypes()
  for _, dtype in ipairs(U.all_dtypes) do
    local t = U.randn({3, 5, 7, 2}, dtype)
    for _, dim in ipairs({1, 2, 3, 4, -1, -2, -3, -4}) do
      local L = t:size(dim > 0 and dim or 5 + dim)
      for _, layout in ipairs({"contiguous", "zigzag"}) do
        local n = layout == "zigzag" and math.max(1, L // 2) or L
        local s = fa.shard(t, n, {dim = dim, layout = layout})
        lu.assertEquals(s[1]:dtype(), dtype)
        local back = fa.unshard(s, {dim = dim, layout = layout})
        lu.assertEquals(fa.max_abs_diff(back, t), 0, ("%s dim %d %s"):format(dtype, dim, layout))
      end
    end
  end
  -- the default dimension is the sequence's: -2 of 2-D and 3-D tensors too
  local t2 = U.randn({9, 4})
  lu.assertEquals(fa.shard(t2, 3)[1]:shape(), {3, 4})
  lu.assertEquals(fa.shard(U.randn({2, 9, 4}), 2, {layout = "zigzag"})[2]:shape(), {2, 4, 4})
  -- opts.device naming the tensor's own device is accepted
  lu.assertEquals(#fa.shard(t2, 2, {device = dev}), 2)
end

function TestShard:test_errors()
  local t = U.randn({2, 5, 4})
  U.assert_fa_error({"n", "1"}, fa.shard, t, 0)
  U.assert_fa_error({"n", "5"}, fa.shard, t, 6)
  U.assert_fa_error({"n = 536870911"}, fa.shard, t, 536870911) -- refused before n boxes are made
  U.assert_fa_error({"zigzag", "2n"}, fa.shard, t, 3, {layout = "zigzag"})
  U.assert_fa_error({"layout", "contiguous", "zigzag", "diagonal"}, fa.shard, t, 2, {layout = "diagonal"})
  U.assert_fa_error({"=t", "tensor"}, fa.shard, {1, 2, 3}, 2)
  U.assert_fa_error({"=n"}, fa.shard, t, "two")
  U.assert_fa_error({"=n"}, fa.shard, t, 1.5)
  U.assert_fa_error({"dim"}, fa.shard, t, 2, {dim = 4})
  U.assert_fa_error({"dim"}, fa.shard, t, 2, {dim = 0})
  U.assert_fa_error({"unknown option", "dims"}, fa.shard, t, 2, {dims = 1})
  U.assert_fa_error({"device", "cuda:1"}, fa.shard, t, 2, {device = "cuda:1"})
  local other = dev == "cpu" and "cuda" or "cpu"
  local usable = false
  for _, b in ipairs(fa.backends()) do usable = usable or b == other end
  U.assert_fa_error({"device", usable and "this version" or "not available"}, fa.shard, t, 2, {device = other})
  local freed = U.randn({4, 2})
  freed:free()
  U.assert_fa_error({"freed"}, fa.shard, freed, 2)

  U.assert_fa_error({"shards", "table"}, fa.unshard, t)
  U.assert_fa_error({"shards", "at least one"}, fa.unshard, {})
  U.assert_fa_error({"shards[2]"}, fa.unshard, {t, 3})
  U.assert_fa_error({"shards[2]", "shape"}, fa.unshard, {t, U.randn({2, 5, 3})})
  U.assert_fa_error({"shards[2]", "f64"}, fa.unshard, {t, U.randn({2, 5, 4}, "f64")})
  U.assert_fa_error({"zigzag", "length"}, fa.unshard, {U.randn({2, 3, 4}), U.randn({2, 1, 4})}, {layout = "zigzag"})
  U.assert_fa_error({"zigzag", "2n"}, fa.unshard, {U.randn({2, 1, 4}), U.randn({2, 1, 4})}, {layout = "zigzag"})
  U.assert_fa_error({"layout"}, fa.unshard, {t}, {layout = 1})
end

TestRing = {}

local function shard3(q, k, v, n, layout)
  return fa.shard(q, n, {layout = layout}), fa.shard(k, n, {layout = layout}), fa.shard(v, n, {layout = layout})
end

-- ring_attention over n shards against fa.attention on the whole tensors
local function check_ring(q, k, v, n, opts, what)
  local layout = opts.layout or "contiguous"
  local qs, ks, vs = shard3(q, k, v, n, layout)
  local ro = U.copy_opts(opts, {layout = true})
  ro.return_lse = true
  local want, want_lse = fa.attention(q, k, v, ro)
  local ring_opts = U.copy_opts(opts)
  ring_opts.return_lse = true
  local os_, ls = fa.ring_attention(qs, ks, vs, ring_opts)
  lu.assertEquals(#os_, n, what)
  lu.assertEquals(#ls, n, what)
  for i = 1, n do
    lu.assertEquals(os_[i]:dtype(), q:dtype(), what)
    lu.assertEquals(os_[i]:device(), dev, what)
    lu.assertEquals(os_[i]:size(os_[i]:dim() - 1), qs[i]:size(qs[i]:dim() - 1), what)
    lu.assertEquals(ls[i]:dtype(), "f32", what)
  end
  local o = fa.unshard(os_, {layout = layout})
  local lse = fa.unshard(ls, {layout = layout, dim = -1})
  local dtype = q:dtype()
  U.assert_close(o, want, dtype, what .. " vs fa.attention")
  U.assert_lse(lse, want_lse, dtype, what .. " lse")
  if dtype == "f16" or dtype == "bf16" then -- and both against the f64 reference
    local ref = U.reference(q, k, v, U.copy_opts(opts, {layout = true}))
    U.assert_close(o, ref, dtype, what .. " vs reference")
  end
  -- without return_lse: one table
  local only = table.pack(fa.ring_attention(qs, ks, vs, U.copy_opts(opts, {return_lse = true})))
  lu.assertEquals(only.n, 1, what)
  lu.assertEquals(fa.max_abs_diff(fa.unshard(only[1], {layout = layout}), o), 0, what)
end

function TestRing:test_zigzag_shards_remember_their_layout()
  -- API §11: causal with zig-zag shards made by fa.shard equals one-device attention, opts.layout given nowhere else
  local q, k, v = U.randn({1, 2, 32, 8}, "f32"), U.randn({1, 2, 32, 8}, "f32"), U.randn({1, 2, 32, 8}, "f32")
  local zz = {layout = "zigzag"}
  local os = fa.ring_attention(fa.shard(q, 4, zz), fa.shard(k, 4, zz), fa.shard(v, 4, zz), {causal = true})
  U.assert_close(fa.unshard(os), fa.attention(q, k, v, {causal = true}), "f32", "zigzag, layout remembered")
  -- opts.layout still wins: contiguous shards read as zig-zag are another sequence
  local cs = {fa.shard(q, 4), fa.shard(k, 4), fa.shard(v, 4)}
  local wrong = fa.unshard(fa.ring_attention(cs[1], cs[2], cs[3], {causal = true, layout = "zigzag"}), zz)
  lu.assertTrue(fa.max_abs_diff(wrong, fa.attention(q, k, v, {causal = true})) > 1e-3)
end

function TestRing:test_equals_single_device_attention()
  local shapes = {
    {{1, 2, 13, 8}, {1, 2, 13, 8}, {1, 2, 13, 8}},   -- MHA, odd length
    {{2, 4, 16, 8}, {2, 2, 16, 8}, {2, 2, 16, 4}},   -- GQA, Dv != D
    {{3, 11, 16}, {1, 11, 16}, {1, 11, 16}},         -- 3-D, MQA
  }
  local count = 0
  for si, s in ipairs(shapes) do
    for _, dtype in ipairs(U.dtypes) do
      local q, k, v = U.randn(s[1], dtype), U.randn(s[2], dtype), U.randn(s[3], dtype)
      local L = s[1][#s[1] - 1]
      for _, layout in ipairs({"contiguous", "zigzag"}) do
        for _, causal in ipairs({false, true}) do
          for n = 1, 4 do
            if not (layout == "zigzag" and 2 * n > L) then
              count = count + 1
              local algo = U.pick({"auto", "flash", "two_pass", "naive", "flash_row"}, count)
              local what = ("%s %s %s causal=%s n=%d %s"):format(dtype, U.shape_str(s[1]), layout, tostring(causal), n,
                algo)
              check_ring(q, k, v, n, {layout = layout, causal = causal, algo = algo}, what)
            end
          end
        end
      end
    end
    lu.assertTrue(si >= 1)
  end
end

function TestRing:test_f32_states_merge_without_rounding_their_lse()
  -- every score 8192 plus a few 64ths (q of ones, keys 128 + k/64: exact in f32), every key of like
  -- weight: each step's lse, 8192 + log of a sum, once went to the merge as f32, half an ulp of 8192
  -- (5e-4) on each state's weight; the pieces' lse and the running lse stay in f64 between merges
  local q, k, v = U.scores_near_8192(48, 48, 64, 777, dev)
  for _, causal in ipairs({false, true}) do
    local ref = fa.attention_reference(q, k, v, {scale = 1, causal = causal})
    for _, n in ipairs({2, 4}) do
      for _, layout in ipairs({"contiguous", "zigzag"}) do
        local sh = {layout = layout}
        local os_ = fa.ring_attention(fa.shard(q, n, sh), fa.shard(k, n, sh), fa.shard(v, n, sh),
          {scale = 1, causal = causal, layout = layout})
        local e = fa.max_abs_diff(fa.unshard(os_, sh):cpu():double(), ref)
        lu.assertTrue(e < 1e-6, ("causal=%s, %d %s shards: %.3g from the reference"):format(tostring(causal), n, layout, e))
      end
    end
  end
end

function TestRing:test_options_pass_through()
  local q, k, v = U.randn({1, 2, 12, 8}), U.randn({1, 2, 12, 8}), U.randn({1, 2, 12, 8})
  for _, opts in ipairs({
    {scale = 0.3, layout = "zigzag", causal = true},
    {softcap = 2.0, layout = "contiguous", causal = "bottom_right"},
    {causal = "top_left", layout = "zigzag", algo = "flash", tile = {4, 4}},
    {softcap = 1.5, scale = 1, causal = true},
  }) do
    for _, n in ipairs({2, 3}) do
      check_ring(q, k, v, n, opts, ("opts %s n=%d"):format(tostring(opts.causal), n))
    end
  end
  -- 2-D shards (L, D)
  local q2, k2, v2 = U.randn({10, 8}), U.randn({10, 8}), U.randn({10, 8})
  check_ring(q2, k2, v2, 3, {causal = true}, "2-D contiguous")
  check_ring(q2, k2, v2, 2, {causal = true, layout = "zigzag"}, "2-D zigzag")
end

function TestRing:test_rules_count_the_whole_sequence()
  -- window, alibi, kv_lens and masks at the positions of the whole sequence: each pair's call is padded
  -- until its diagonal is the pieces' distance (src/ring.c, attend_pair); every layout and shard count
  local B, Hq, Hkv, L, D = 2, 4, 2, 19, 8
  local slopes = {0.5, 0.25, 0.125, 1}
  local rows = fa.rand({B, 1, L, L}, {seed = 41}):totable()
  for b = 1, B do
    for i = 1, L do
      for j = 1, L do rows[b][1][i][j] = rows[b][1][i][j] > 0.4 and not (i == 5) end -- row 5 sees no key
    end
  end
  local bools = fa.tensor(rows, {device = dev})
  local keys_bias = (fa.rand({L}, {seed = 42, device = dev}) - 0.5) * 4
  local head_bias = (fa.rand({B, Hq, 1, L}, {seed = 43, device = dev}) - 0.5) * 4
  local query_bias = (fa.rand({B, 1, L, 1}, {seed = 44, device = dev}) - 0.5) * 4
  local cases = {
    {window = {3, 2}},
    {window = {4, -1}, causal = true},
    {window = {0, 0}},
    {window = {-1, 5}},
    {window = {1e15, 1e15}, alibi = slopes}, -- wider than the sequence
    {alibi = slopes},
    {alibi = slopes, causal = true, window = {6, 0}},
    {kv_lens = {0, 13}, causal = true}, -- batch 1 has no key: zeros, lse -inf
    {kv_lens = {19, 4}, alibi = slopes, window = {5, 5}},
    {mask = bools},
    {mask = bools, causal = true, alibi = slopes},
    {mask = keys_bias, window = {4, 4}},
    {mask = head_bias, kv_lens = {11, 19}},
    {mask = query_bias, alibi = slopes, softcap = 3},
  }
  local count = 0
  for _, dtype in ipairs(U.dtypes) do
    local q, k, v = U.randn({B, Hq, L, D}, dtype), U.randn({B, Hkv, L, D}, dtype), U.randn({B, Hkv, L, D}, dtype)
    for ci, c in ipairs(cases) do
      for _, layout in ipairs({"contiguous", "zigzag"}) do
        for _, n in ipairs({1, 2, 4}) do
          count = count + 1
          local opts = U.copy_opts(c)
          opts.layout, opts.algo = layout, U.pick({"auto", "flash", "two_pass", "naive", "flash_row"}, count)
          check_ring(q, k, v, n, opts, ("%s case %d %s n=%d %s"):format(dtype, ci, layout, n, opts.algo))
        end
      end
    end
  end
  -- an empty batch: empty outputs, no error
  local e = U.randn({0, 2, 8, 4})
  local eo = fa.ring_attention(fa.shard(e, 2), fa.shard(e, 2), fa.shard(e, 2), {window = {2, 0}, kv_lens = {}})
  lu.assertEquals(#eo, 2)
  lu.assertEquals(eo[1]:shape(), {0, 2, 4, 4})
  -- 2-D and 3-D shards
  check_ring(U.randn({13, 8}), U.randn({13, 8}), U.randn({13, 8}), 3, {window = {2, 1}, alibi = {0.3}}, "2-D")
  check_ring(U.randn({3, 13, 8}), U.randn({1, 13, 8}), U.randn({1, 13, 4}), 3,
    {layout = "zigzag", causal = "top_left", alibi = {0.3, 0.2, 0.1}, mask = keys_bias:narrow(1, 1, 13)}, "3-D, MQA")
end

function TestRing:test_errors()
  local q, k, v = U.randn({1, 2, 8, 4}), U.randn({1, 2, 8, 4}), U.randn({1, 2, 8, 4})
  local qs, ks, vs = shard3(q, k, v, 2, "contiguous")
  U.assert_fa_error({"qs", "table"}, fa.ring_attention, q, ks, vs)
  U.assert_fa_error({"qs", "at least one"}, fa.ring_attention, {}, {}, {})
  U.assert_fa_error({"ks", "table"}, fa.ring_attention, qs, k, vs)
  U.assert_fa_error({"ks", "2"}, fa.ring_attention, qs, {ks[1]}, vs)
  U.assert_fa_error({"vs", "2"}, fa.ring_attention, qs, ks, {vs[1], vs[2], vs[1]})
  U.assert_fa_error({"qs[2]"}, fa.ring_attention, {qs[1], 7}, ks, vs)
  for _, key in ipairs({"splits", "kernel", "out", "lse_out"}) do
    local values = {splits = 2, kernel = "flash", out = q, lse_out = q}
    U.assert_fa_error({"opts." .. key, "not in this version"}, fa.ring_attention, qs, ks, vs, {[key] = values[key]})
  end
  -- the options that count positions are checked against the whole sequence (L = 8), not a shard (4)
  U.assert_fa_error({"opts.kv_lens[1]", "Lk = 8", "9"}, fa.ring_attention, qs, ks, vs, {kv_lens = {9}})
  U.assert_fa_error({"opts.kv_lens", "1 entries"}, fa.ring_attention, qs, ks, vs, {kv_lens = {4, 4}})
  U.assert_fa_error({"opts.mask", "(1, 2, 8, 8)"}, fa.ring_attention, qs, ks, vs,
    {mask = fa.ones({4, 4}, {dtype = "bool", device = dev})})
  U.assert_fa_error({"opts.alibi", "2 slopes"}, fa.ring_attention, qs, ks, vs, {alibi = {0.5}})
  U.assert_fa_error({"opts.window"}, fa.ring_attention, qs, ks, vs, {window = {-2, 0}})
  U.assert_fa_error({"unknown option", "causel"}, fa.ring_attention, qs, ks, vs, {causel = true})
  U.assert_fa_error({"layout"}, fa.ring_attention, qs, ks, vs, {layout = "ring"})
  U.assert_fa_error({"causal"}, fa.ring_attention, qs, ks, vs, {causal = "diagonal"})
  -- lengths: q, k and v of a shard differ; zigzag lengths not fa.shard's
  local ks_odd = fa.shard(k, 2, {layout = "zigzag"})
  ks_odd[1] = U.randn({1, 2, 3, 4})
  U.assert_fa_error({"shard 1", "lengths"}, fa.ring_attention, qs, ks_odd, vs)
  local zq = {U.randn({1, 2, 5, 4}), U.randn({1, 2, 3, 4})}
  U.assert_fa_error({"qs[1]", "zigzag"}, fa.ring_attention, zq, {zq[1], zq[2]}, {zq[1], zq[2]}, {layout = "zigzag"})
  -- dtype, shapes and heads
  U.assert_fa_error({"ks[2]", "dtype"}, fa.ring_attention, qs, {ks[1], ks[2]:double()}, vs)
  U.assert_fa_error({"qs[2]", "shape"}, fa.ring_attention, {qs[1], U.randn({1, 3, 4, 4})}, ks, vs)
  U.assert_fa_error({"ks[1]", "dimensions"}, fa.ring_attention, qs, {U.randn({2, 4, 4}), U.randn({2, 4, 4})}, vs)
  local k3 = fa.shard(U.randn({1, 3, 8, 4}), 2)
  U.assert_fa_error({"h"}, fa.ring_attention, qs, k3, fa.shard(U.randn({1, 3, 8, 4}), 2))
  -- the shape checks between q, k and v name the shards (they named fa.attention's q, k, v)
  local shards_as = "ring_attention: qs[1], ks[1], vs[1] as q, k, v"
  U.assert_fa_error({shards_as, "head dimension"}, fa.ring_attention, qs, fa.shard(U.randn({1, 2, 8, 3}), 2), vs)
  U.assert_fa_error({shards_as, "batch"}, fa.ring_attention, qs, fa.shard(U.randn({2, 2, 8, 4}), 2),
    fa.shard(U.randn({2, 2, 8, 4}), 2))
  U.assert_fa_error({shards_as, "heads"}, fa.ring_attention, qs, ks, fa.shard(U.randn({1, 1, 8, 4}), 2))
  -- shards of q and of k, v cut by different layouts (of equal lengths: 2n divides L) were read as one,
  -- a causal result off by 1.27
  local zs = fa.shard(q, 2, {layout = "zigzag"})
  U.assert_fa_error({"ks", "zigzag", "contiguous", "one layout"}, fa.ring_attention, zs, ks, vs, {causal = true})
  U.assert_fa_error({"vs", "contiguous", "zigzag"}, fa.ring_attention, qs, ks, fa.shard(v, 2, {layout = "zigzag"}))
  local ints = fa.shard(fa.ones({1, 2, 8, 4}, {dtype = "bool", device = dev}), 2)
  U.assert_fa_error({"dtype"}, fa.ring_attention, ints, ints, ints)
  local freed = U.randn({1, 2, 4, 4})
  freed:free()
  U.assert_fa_error({"freed"}, fa.ring_attention, {qs[1], freed}, ks, vs)
end

function TestRing:test_device_mix_refused()
  if not fa.backends()[2] then return end -- one backend: nothing to mix
  local q = U.randn({1, 1, 8, 4})
  local qs = fa.shard(q, 2)
  local other = dev == "cpu" and "cuda" or "cpu"
  local ks = {qs[1], qs[2]:to(other)}
  U.assert_fa_error({"ks[2]", "device"}, fa.ring_attention, qs, ks, qs)
end

-- API §9's variants count q and k in the whole sequence, as fa.attention on the
-- unsharded tensors: each pair's call takes them shifted by its pieces' first
-- positions; pairs mask_mod leaves empty are skipped.
function TestRing:test_variants_count_the_whole_sequence()
  local L = 46
  local q, k, v = U.randn({2, 4, L, 8}), U.randn({2, 2, L, 8}), U.randn({2, 2, L, 8})
  local d = {}
  for i = 1, L do d[i] = (i - 1) // 9 end
  local doc = fa.tensor(d, {device = dev})
  local slopes = fa.tensor({0.5, 0.25, 0.125, 0.0625}, {device = dev})
  local cases = {
    {"document", {mask_mod = function(b, h, i, j) return doc[i]:eq(doc[j]) & i:ge(j) end}},
    {"alibi", {score_mod = function(s, b, h, i, j) return s - slopes[h] * (i - j):abs() end}},
    {"softcap + document", {score_mod = function(s) return (s / 5):tanh() * 5 end,
                            mask_mod = function(b, h, i, j) return doc[i]:eq(doc[j]) end}},
    {"sliding window, causal", {causal = true, mask_mod = function(b, h, i, j) return (i - j):le(6) end}},
    {"prefix-LM", {mask_mod = function(b, h, i, j) return j:le(11) | i:ge(j) end}},
    -- built-in window and alibi pad a pair's shorter side: the padding must not read past doc
    {"window, score_mod reading doc[q]", {window = {7, 0}, score_mod = function(s, b, h, i, j) return s + doc[i] * 0.1 end}},
    {"alibi, causal, document", {alibi = {0.1, 0.2, 0.3, 0.4}, causal = true,
                                 mask_mod = function(b, h, i, j) return doc[i]:eq(doc[j]) end}},
  }
  for _, c in ipairs(cases) do
    for _, layout in ipairs({"contiguous", "zigzag"}) do
      for _, n in ipairs({1, 3}) do
        local opts = U.copy_opts(c[2])
        opts.layout = layout
        check_ring(q, k, v, n, opts, c[1] .. ", " .. layout .. ", " .. n)
      end
    end
  end
  -- a block mask made for the whole sequence is checked and left to the pairs' own tiles
  local mm = cases[1][2].mask_mod
  local bm = fa.block_mask(mm, 2, 4, L, L)
  check_ring(q, k, v, 2, {layout = "zigzag", mask_mod = mm, block_mask = bm}, "block_mask")
  U.assert_fa_error({"opts.block_mask"}, fa.ring_attention, fa.shard(q, 2), fa.shard(k, 2), fa.shard(v, 2),
    {mask_mod = mm, block_mask = fa.block_mask(mm, 2, 4, L - 1, L - 1)})
  -- a read out of range is told as the whole call tells it: the read as written, its index in the sequence
  local short = fa.tensor({1, 2, 3}, {device = dev})
  local bad = {mask_mod = function(b, h, i, j) return short[i]:eq(1) end}
  local ok, whole = pcall(fa.attention, q, k, v, bad)
  lu.assertFalse(ok)
  U.assert_fa_error({"opts.mask_mod", "short[q]", "index 4 out of range"}, fa.ring_attention, fa.shard(q, 2),
    fa.shard(k, 2), fa.shard(v, 2), bad)
  lu.assertStrContains(whole, "short[q]: index 4 out of range")
end

function TestRing:test_nothing_kept()
  local q, k, v = U.randn({1, 2, 9, 4}), U.randn({1, 2, 9, 4}), U.randn({1, 2, 9, 4})
  local qs, ks, vs = shard3(q, k, v, 3, "zigzag")
  local before = U.mem_current()
  for _ = 1, 3 do
    local o, l = fa.ring_attention(qs, ks, vs, {causal = true, layout = "zigzag", return_lse = true})
    o, l = nil, nil
    pcall(fa.ring_attention, qs, {ks[1], ks[2], U.randn({1, 2, 2, 4})}, vs, {layout = "zigzag"})
    pcall(fa.shard, q, 5, {layout = "zigzag"})
  end
  lu.assertTrue(U.mem_current() <= before, "nothing kept")
end

U.run()
