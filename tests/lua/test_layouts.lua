-- fa.attention on tensors as hosts hold them (API §6): q, k, v as views
-- whose last dimension is contiguous (a (B, L, H, D) tensor transposed, the
-- narrows of a packed QKV tensor, a head or batch slice) are read where they
-- lie, and opts.out / opts.lse_out views are written through their strides,
-- nothing outside them touched.  Every result is checked against
-- fa.attention_reference of contiguous copies.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

local ALGOS = {"naive", "two_pass", "flash_row", "flash"}
-- Small tiles on the CPU so that the views span several query and key tiles
-- (the CUDA kernels take only their own tile sizes).
local TILE = not U.cuda and {16, 16} or nil
local B, HQ, HKV, LQ, LK = 2, 4, 2, 21, 29 -- GQA: two query heads a KV head
local SENTINEL = 77 -- exact in bf16 too

-- (B, L, H, D) values seen as (B, H, L, D).
local function bhld(b, h, l, d, dtype) return U.randn({b, l, h, d}, dtype):transpose(2, 3) end

-- The engine's peak memory while fn runs, over what it held before (its
-- results kept until the measure is read): on the host, or on device dev.
local function peak_during(fn, dev)
  U.collect()
  local before = fa.memory(dev).current
  fa.reset_peak(dev)
  local kept = {fn()}
  local used = fa.memory(dev).peak - before
  kept = nil
  return used
end

-- Options cycled through the layouts: causal or not, a mask, kv_lens.
local function options(i, b, lq, lk)
  local sets = {
    function() return {} end,
    function() return {causal = true} end,
    function()
      local m = fa.tensor(U.nested({b, 1, lq, lk}, function() return math.random() < 0.7 end), {device = dev})
      return {mask = m}
    end,
    function()
      local lens = {}
      for j = 1, b do lens[j] = math.max(1, lk - 3 * j) end
      return {kv_lens = lens, causal = "top_left"}
    end,
  }
  return U.pick(sets, i)()
end

-- Every algo on q, k, v (lse too, into poisoned outputs) against the
-- reference of contiguous copies.
local function check_algos(q, k, v, opts, what)
  local ref = {U.reference(q:contiguous(), k:contiguous(), v:contiguous(), opts)}
  for _, algo in ipairs(ALGOS) do
    local o = U.copy_opts(opts)
    o.algo, o.tile, o.return_lse = algo, TILE, true
    U.check_attention(q, k, v, o, ("%s %s %s D=%d"):format(what, algo, q:dtype(), q:size(q:dim())), {ref = ref})
  end
end

-- Whether every element of t is the sentinel.
local function untouched(t) return t:min() == SENTINEL and t:max() == SENTINEL end

TestLayouts = {}

function TestLayouts:test_transposed_views()
  local i = 0
  for _, dtype in ipairs(U.dtypes) do
    for _, D in ipairs({64, 40}) do
      i = i + 1
      local q, k, v = bhld(B, HQ, LQ, D, dtype), bhld(B, HKV, LK, D, dtype), bhld(B, HKV, LK, D, dtype)
      lu.assertFalse(q:is_contiguous())
      local before = q:clone()
      check_algos(q, k, v, options(i, B, LQ, LK), "transposed")
      lu.assertEquals(fa.max_abs_diff(q, before), 0, "attention modified its input")
    end
  end
end

-- fa.attention_reference reads f64 views where they lie too: the same
-- values as on contiguous copies, to the bit.
function TestLayouts:test_reference_reads_views()
  local function view(h, l) return U.randn({B, l, h, 40}, "f64", 1, "cpu"):transpose(2, 3) end
  local q, k, v = view(HQ, LQ), view(HKV, LK), view(HKV, LK)
  local opts = {causal = true, return_lse = true}
  local o, lse = fa.attention_reference(q, k, v, opts)
  local oc, lsec = fa.attention_reference(q:contiguous(), k:contiguous(), v:contiguous(), opts)
  lu.assertEquals(fa.max_abs_diff(o, oc), 0)
  lu.assertEquals(fa.max_abs_diff(lse, lsec), 0)
end

-- q, k, v narrowed from one packed (B, L, Hq + 2·Hkv, D) tensor (the heads
-- of (B, L, 3, H, D) side by side), then transposed.
function TestLayouts:test_packed_qkv()
  local i = 0
  for _, dtype in ipairs({"f32", "f16", "bf16"}) do
    for _, D in ipairs({64, 40}) do
      i = i + 1
      local x = U.randn({B, LQ, HQ + 2 * HKV, D}, dtype)
      local q = x:narrow(3, 1, HQ):transpose(2, 3)
      local k = x:narrow(3, HQ + 1, HKV):transpose(2, 3)
      local v = x:narrow(3, HQ + HKV + 1, HKV):transpose(2, 3)
      check_algos(q, k, v, options(i, B, LQ, LQ), "packed qkv")
    end
  end
end

-- A slice of the heads and a slice of the batch of contiguous tensors, and
-- 3-D and 2-D views: (L, H, D) transposed, one head selected from it.
function TestLayouts:test_slices_and_ranks()
  for i, dtype in ipairs({"f32", "bf16"}) do
    local D = i == 1 and 64 or 40
    local q = U.randn({B, HQ + 3, LQ, D}, dtype):narrow(2, 2, HQ)
    local k = U.randn({B + 2, HKV, LK, D}, dtype):narrow(1, 2, B)
    local v = U.randn({B, HKV + 1, LK, D}, dtype):narrow(2, 1, HKV)
    check_algos(q, k, v, options(i + 1, B, LQ, LK), "head and batch slices")
    local q3 = U.randn({LQ, HQ, D}, dtype):transpose(1, 2)
    local k3 = U.randn({LK, HKV, D}, dtype):transpose(1, 2)
    local v3 = U.randn({LK, HKV + 2, D}, dtype):narrow(2, 2, HKV):transpose(1, 2)
    check_algos(q3, k3, v3, {causal = true}, "3-D views")
    local q2 = U.randn({LQ, 3, D}, dtype):select(2, 2)
    local k2, v2 = U.randn({LK, 2, D}, dtype):select(2, 1), U.randn({LK, 5, D}, dtype):select(2, 5)
    check_algos(q2, k2, v2, {}, "2-D views")
  end
end

-- opts.out and opts.lse_out as views of larger (B, L, H, X) buffers: the
-- result lands in the views, the rest of the buffers keeps its sentinel,
-- and the returned tensors are the views themselves.  Rows padded by 5
-- elements, or (D = 128, f16 and bf16) rows on 16 bytes beside a head left
-- out: on Hopper the warp-specialised kernel's persistent form writes those
-- by bulk tensor stores of 16-row boxes through a map of the view (LQ = 21:
-- a box past the last row).
function TestLayouts:test_out_views()
  local cases = {{"f32", 64, 5}, {"f16", 40, 5}, {"bf16", 64, 5}, {"f16", 128, 0}, {"bf16", 128, 0}}
  for _, case in ipairs(cases) do
    local dtype, D, pad = case[1], case[2], case[3]
    local q, k, v = bhld(B, HQ, LQ, D, dtype), bhld(B, HKV, LK, D, dtype), bhld(B, HKV, LK, D, dtype)
    local ro, rl = U.reference(q:contiguous(), k:contiguous(), v:contiguous(), {causal = true})
    local obase = fa.full({B, LQ, HQ + 1, D + pad}, SENTINEL, {dtype = dtype, device = dev})
    local lbase = fa.full({B, LQ, HQ + 2}, SENTINEL, {device = dev})
    local out = obase:narrow(3, 1, HQ):narrow(4, 1, D):transpose(2, 3)
    local lse_out = lbase:narrow(3, 2, HQ):transpose(2, 3)
    for _, algo in ipairs(ALGOS) do
      local what = ("%s %s D = %d out views"):format(algo, dtype, D)
      out:fill_(U.NaN)
      lse_out:fill_(U.NaN)
      local o, lse = fa.attention(q, k, v, {algo = algo, tile = TILE, causal = true, out = out, lse_out = lse_out})
      lu.assertTrue(rawequal(o, out), what .. ": the result is not opts.out")
      lu.assertTrue(rawequal(lse, lse_out), what .. ": the lse is not opts.lse_out")
      U.assert_close(out, ro, dtype, what)
      U.assert_lse(lse_out, rl, dtype, what .. " lse")
      lu.assertTrue((pad == 0 or untouched(obase:narrow(4, D + 1, pad))) and untouched(obase:narrow(3, HQ + 1, 1)),
        what .. ": written outside opts.out")
      lu.assertTrue(untouched(lbase:narrow(3, 1, 1)) and untouched(lbase:narrow(3, HQ + 2, 1)),
        what .. ": written outside opts.lse_out")
    end
  end
  -- 2-D: one head of (L, H, X) buffers
  local q, k, v = U.randn({LQ, 40}), U.randn({LK, 40}), U.randn({LK, 40})
  local ro, rl = U.reference(q, k, v, {})
  local obase = fa.full({LQ, 3, 40}, SENTINEL, {device = dev})
  local lbase = fa.full({LQ, 3}, SENTINEL, {device = dev})
  for _, algo in ipairs(ALGOS) do
    local out, lse_out = obase:select(2, 2), lbase:select(2, 2)
    local o = fa.attention(q, k, v, {algo = algo, out = out, lse_out = lse_out})
    lu.assertTrue(rawequal(o, out), algo .. " 2-D: the result is not opts.out")
    U.assert_close(out, ro, "f32", algo .. " 2-D out view")
    U.assert_lse(lse_out, rl, "f32", algo .. " 2-D lse view")
    lu.assertTrue(untouched(obase:select(2, 1)) and untouched(obase:select(2, 3)), algo .. " 2-D: written outside")
    lu.assertTrue(untouched(lbase:select(2, 1)) and untouched(lbase:select(2, 3)), algo .. " 2-D: lse written outside")
  end
end

-- No keys: zeros and lse = -inf written through the views' strides.
function TestLayouts:test_no_keys_into_out_views()
  local D = 40
  local q = bhld(B, HQ, LQ, D, "f32")
  local k, v = U.randn({B, 0, HKV, D}):transpose(2, 3), U.randn({B, 0, HKV, D}):transpose(2, 3)
  local obase = fa.full({B, LQ, HQ, D + 3}, SENTINEL, {device = dev})
  local lbase = fa.full({B, LQ, HQ + 1}, SENTINEL, {device = dev})
  local out, lse_out = obase:narrow(4, 1, D):transpose(2, 3), lbase:narrow(3, 1, HQ):transpose(2, 3)
  for _, algo in ipairs(ALGOS) do
    out:fill_(U.NaN)
    lse_out:fill_(U.NaN)
    fa.attention(q, k, v, {algo = algo, out = out, lse_out = lse_out})
    lu.assertTrue(out:min() == 0 and out:max() == 0, algo .. ": rows with no key are not zeros")
    lu.assertTrue(lse_out:max() == -U.inf, algo .. ": the lse of rows with no key is not -inf")
    lu.assertTrue(untouched(obase:narrow(4, D + 1, 3)) and untouched(lbase:narrow(3, HQ + 1, 1)),
      algo .. ": written outside the views")
  end
end

-- Outputs that are not written where they lie, in the inputs' storage or
-- in each other's: computed apart and copied in, still right.  (Views with
-- a zero stride go that way too; the binding makes none, fa_tensor_wrap can.)
function TestLayouts:test_out_sharing_storage()
  local H, L, D = 2, 24, 40
  for _, algo in ipairs(ALGOS) do
    -- out = q itself, a transposed view
    local q, k, v = bhld(B, H, L, D, "f32"), bhld(B, H, L, D, "f32"), bhld(B, H, L, D, "f32")
    local ro = U.reference(q:contiguous(), k:contiguous(), v:contiguous(), {causal = true})
    local o = fa.attention(q, k, v, {algo = algo, tile = TILE, causal = true, out = q})
    lu.assertTrue(rawequal(o, q), algo .. ": the result is not opts.out")
    U.assert_close(q, ro, "f32", algo .. " out = q")
    -- out = the v of a packed QKV tensor
    local x = U.randn({B, L, 3 * H, D})
    local xq, xk, xv = x:narrow(3, 1, H):transpose(2, 3), x:narrow(3, H + 1, H):transpose(2, 3),
      x:narrow(3, 2 * H + 1, H):transpose(2, 3)
    ro = U.reference(xq:contiguous(), xk:contiguous(), xv:contiguous(), {})
    fa.attention(xq, xk, xv, {algo = algo, tile = TILE, out = xv})
    U.assert_close(xv, ro, "f32", algo .. " out = packed v")
    -- lse_out beside opts.out in one buffer (disjoint halves)
    q, k, v = bhld(B, H, L, D, "f32"), bhld(B, H, L, D, "f32"), bhld(B, H, L, D, "f32")
    local rl
    ro, rl = U.reference(q:contiguous(), k:contiguous(), v:contiguous(), {})
    local base = U.poison({2 * B, L, H, D})
    local out, lse_out = base:narrow(1, 1, B):transpose(2, 3), base:narrow(1, B + 1, B):select(4, 3):transpose(2, 3)
    fa.attention(q, k, v, {algo = algo, tile = TILE, out = out, lse_out = lse_out})
    U.assert_close(out, ro, "f32", algo .. " out beside lse_out")
    U.assert_lse(lse_out, rl, "f32", algo .. " lse_out beside out")
  end
end

-- Views are read where they lie: a call on transposed inputs into strided
-- outputs holds no more memory than the same call on contiguous tensors, in
-- every dtype; f16/bf16 inputs are widened to f32 a tile at a time, not
-- copied whole, so that what a call holds does not grow with its keys
-- (fixed tiles; the old whole copies grew by 3 x 4 bytes an element).
function TestLayouts:test_views_are_not_copied()
  if U.cuda then return end
  local D = 64
  local function peak(dtype, strided, algo, lk)
    lk = lk or LK
    local q, k, v, out, lse_out
    if strided then
      q, k, v = bhld(B, HQ, LQ, D, dtype), bhld(B, HKV, lk, D, dtype), bhld(B, HKV, lk, D, dtype)
      out = U.poison({B, LQ, HQ, D}, dtype):transpose(2, 3)
      lse_out = U.poison({B, LQ, HQ}, "f32"):transpose(2, 3)
    else
      q, k, v = U.randn({B, HQ, LQ, D}, dtype), U.randn({B, HKV, lk, D}, dtype), U.randn({B, HKV, lk, D}, dtype)
      out, lse_out = U.poison({B, HQ, LQ, D}, dtype), U.poison({B, HQ, LQ}, "f32")
    end
    local opts = {algo = algo, tile = {16, 16}, out = out, lse_out = lse_out}
    return peak_during(function() return fa.attention(q, k, v, opts) end)
  end
  for _, algo in ipairs(ALGOS) do
    for _, dtype in ipairs{"f32", "f16", "bf16"} do
      lu.assertEquals(peak(dtype, true, algo), peak(dtype, false, algo),
        ("%s %s: strided views were copied"):format(algo, dtype))
    end
    if algo ~= "naive" then -- naive holds a whole head's scores, which grow with the keys
      lu.assertEquals(peak("f16", true, algo, 4 * LK), peak("f16", true, algo),
        algo .. ": what an f16 call holds grew with its keys (whole copies)")
    end
  end
end

-- The tiles' widening (src/cpu/stage.c) is exact for every f16 and bf16
-- value: through an attention of one key (weight 1) each of the 65536
-- values of V comes out as it went in (infinities, subnormals and NaN
-- included; a zero's sign is the sum's, 0 + -0).
function TestLayouts:test_every_half_value_is_widened_exactly()
  if U.cuda then return end
  local function f16_value(u)
    local sign, e, m = u >= 0x8000 and -1 or 1, (u >> 10) & 0x1f, u & 0x3ff
    if e == 0 then return sign * m * 2.0 ^ -24 end
    if e == 31 then return m == 0 and sign * math.huge or 0 / 0 end
    return sign * (1 + m / 1024) * 2.0 ^ (e - 15)
  end
  local function bf16_value(u) return (string.unpack("<f", string.pack("<I4", u << 16))) end
  for dtype, value in pairs{f16 = f16_value, bf16 = bf16_value} do
    local rows = {}
    for h = 0, 127 do
      local row = {}
      for d = 0, 511 do row[d + 1] = value(h * 512 + d) end
      rows[h + 1] = {row}
    end
    local v = fa.tensor({rows}, {dtype = dtype}) -- (1, 128, 1, 512)
    local qk = fa.ones({1, 128, 1, 1}, {dtype = dtype})
    for _, algo in ipairs(ALGOS) do
      local o = fa.attention(qk, qk, v, {algo = algo}):float()
      lu.assertEquals(o:dtype(), "f32")
      local got, want = o:reshape({65536}):totable(), v:float():reshape({65536}):totable()
      for i = 1, 65536 do
        local a, b = got[i], want[i]
        if not (a == b or (a ~= a and b ~= b)) then
          lu.fail(("%s %s: bits 0x%04x gave %s, not %s"):format(algo, dtype, i - 1, a, b))
        end
      end
    end
  end
end

-- An f16/bf16 float mask is read where it lies too (its own strides and
-- broadcasts): the same results as the same mask in f32, bit for bit, and no
-- more memory than the f32 mask (which was never copied); every one of the
-- 65536 values reaches the scores exactly (a row of one key of score 0 has
-- lse = its mask value).
function TestLayouts:test_half_mask_read_in_place()
  if U.cuda then return end
  local function same(a, b, what)
    local x, y = a:reshape({a:numel()}):totable(), b:reshape({b:numel()}):totable()
    for i = 1, #x do
      if not (x[i] == y[i] or (x[i] ~= x[i] and y[i] ~= y[i])) then
        lu.fail(("%s: element %d is %s, the f32 mask gives %s"):format(what, i, x[i], y[i]))
      end
    end
  end
  for _, dtype in ipairs{"f16", "bf16"} do
    local q, k, v = bhld(B, HQ, LQ, 8), bhld(B, HKV, LK, 8), bhld(B, HKV, LK, 8)
    local m = U.randn({B, LK, 1, LQ}, dtype):transpose(2, 4) -- (B, LQ, 1, LK) strided, broadcast over heads
    m = m:transpose(2, 3)                                      -- (B, 1, LQ, LK)
    m:set(1, 1, 2, 3, -math.huge)
    for _, algo in ipairs(ALGOS) do
      local opts = {algo = algo, tile = {16, 16}, mask = m, return_lse = true}
      local o, lse = fa.attention(q, k, v, opts)
      opts.mask = m:float()
      local o32, lse32 = fa.attention(q, k, v, opts)
      same(o, o32, dtype .. " mask, " .. algo)
      same(lse, lse32, dtype .. " mask lse, " .. algo)
      opts.mask = m
      local half = peak_during(function() return fa.attention(q, k, v, opts) end)
      opts.mask = U.randn({B, 1, LQ, LK})
      lu.assertEquals(half, peak_during(function() return fa.attention(q, k, v, opts) end),
        dtype .. " mask copied, " .. algo)
    end
    local o, lse = fa.attention(q, k, v, {mask = m, return_lse = true})
    local dout = U.randn({B, HQ, LQ, 8})
    local g = {fa.attention_backward(q, k, v, o, lse, dout, {mask = m})}
    local g32 = {fa.attention_backward(q, k, v, o, lse, dout, {mask = m:float()})}
    for i, name in ipairs{"dq", "dk", "dv"} do same(g[i], g32[i], dtype .. " mask, backward " .. name) end
    -- every value
    local values = fa.zeros({65536}, {dtype = dtype})
    local bits = {}
    for u = 0, 65535 do bits[u + 1] = u end
    local raw = dtype == "f16" and function(u)
      local sign, e, mm = u >= 0x8000 and -1 or 1, (u >> 10) & 0x1f, u & 0x3ff
      if e == 0 then return sign * mm * 2.0 ^ -24 end
      if e == 31 then return mm == 0 and sign * math.huge or 0 / 0 end
      return sign * (1 + mm / 1024) * 2.0 ^ (e - 15)
    end or function(u) return (string.unpack("<f", string.pack("<I4", u << 16))) end
    for i, u in ipairs(bits) do values:set(i, raw(u)) end
    local mask = values:view({1, 1, 65536, 1})
    local z = fa.zeros({1, 1, 65536, 1})
    local one = fa.ones({1, 1, 1, 1})
    local _, l16 = fa.attention(z, one, one, {mask = mask, return_lse = true})
    local _, l32 = fa.attention(z, one, one, {mask = mask:float(), return_lse = true})
    same(l16, l32, dtype .. " mask values")
  end
end

-- Widened tiles take the non-finite paths as f32 operands do: an f16/bf16
-- call with NaN and inf in its operands (strided views) gives what the f32
-- call on the same values gives, NaN where it has NaN, forward (every algo)
-- and backward (whose check for non-finite operands reads the halves'
-- exponent bits).
function TestLayouts:test_halves_with_nan_match_f32()
  if U.cuda then return end
  local function same(got, want, what)
    local a, b = got:float():contiguous():reshape({got:numel()}):totable(), want:reshape({want:numel()}):totable()
    local nans = 0
    for i = 1, #a do
      if a[i] ~= a[i] or b[i] ~= b[i] then
        nans = nans + 1
        lu.assertTrue(a[i] ~= a[i] and b[i] ~= b[i], ("%s: element %d is %s, f32 gives %s"):format(what, i, a[i], b[i]))
      else
        lu.assertTrue(math.abs(a[i] - b[i]) <= 1e-2 * (1 + math.abs(b[i])), ("%s: element %d"):format(what, i))
      end
    end
    lu.assertTrue(nans > 0 and nans < #a, what .. ": the NaN did not reach some rows only")
  end
  for _, dtype in ipairs{"f16", "bf16"} do
    local q, k, v = bhld(1, 2, 40, 16, dtype), bhld(1, 2, 50, 16, dtype), bhld(1, 2, 50, 16, dtype)
    v:set(1, 1, 7, 3, 0 / 0)
    k:set(1, 2, 9, 1, math.huge)
    for _, algo in ipairs(ALGOS) do
      local opts = {algo = algo, causal = true, tile = {16, 16}}
      same(fa.attention(q, k, v, opts), fa.attention(q:float(), k:float(), v:float(), opts), dtype .. " " .. algo)
    end
    local q2, k2, v2 = bhld(1, 2, 40, 16, dtype), bhld(1, 2, 50, 16, dtype), bhld(1, 2, 50, 16, dtype)
    local o, lse = fa.attention(q2, k2, v2, {return_lse = true, causal = true})
    local dout = bhld(1, 2, 40, 16, dtype)
    dout:set(1, 1, 5, 2, 0 / 0)
    local got = {fa.attention_backward(q2, k2, v2, o, lse, dout, {causal = true, tile = {16, 16}})}
    local want = {fa.attention_backward(q2:float(), k2:float(), v2:float(), o:float(), lse, dout:float(),
      {causal = true, tile = {16, 16}})}
    for i, name in ipairs{"dq", "dk", "dv"} do same(got[i], want[i], dtype .. " backward " .. name) end
  end
end

-- The CPU backward reads q, k, v, o and dout where they lie too (API §6):
-- transposed views and a head slice of a packed tensor give the gradients of
-- their contiguous copies, and hold no more memory than those calls; f16
-- operands are widened a tile at a time, not copied whole (the call holds
-- less than the f32 copies of its five operands over the f32 call, which
-- whole copies would take); NaN in a strided dout reaches only the rows of
-- dq it should, as with dense operands.
function TestLayouts:test_backward_reads_views()
  if U.cuda then return end
  local D = 32
  local function inputs(strided, dtype)
    local q, k, v, dout
    if strided then
      q, k, v, dout = bhld(B, HQ, LQ, D, dtype), bhld(B, HKV, LK, D, dtype), bhld(B, HKV, LK, D, dtype),
        bhld(B, HQ, LQ, D, dtype)
    else
      q, k, v = U.randn({B, HQ, LQ, D}, dtype), U.randn({B, HKV, LK, D}, dtype), U.randn({B, HKV, LK, D}, dtype)
      dout = U.randn({B, HQ, LQ, D}, dtype)
    end
    return q, k, v, dout
  end
  for _, opts in ipairs({{}, {causal = true}, {window = {3, 2}, kv_lens = {LK - 2, LK}}}) do
    local q, k, v, dout = inputs(true, "f32")
    local o, lse = fa.attention(q, k, v, {causal = opts.causal, window = opts.window, kv_lens = opts.kv_lens,
      return_lse = true})
    local ot = U.poison({B, LQ, HQ, D}):transpose(2, 3)
    ot:copy_(o)
    local got = {fa.attention_backward(q, k, v, ot, lse, dout, opts)}
    local want = {fa.attention_backward(q:contiguous(), k:contiguous(), v:contiguous(), o, lse, dout:contiguous(), opts)}
    for i, name in ipairs({"dq", "dk", "dv"}) do U.assert_close(got[i], want[i], "f32", name .. " from views") end
  end
  -- head slices of a packed (B, L, Hq + 2·Hkv, D) tensor (GQA)
  local x = U.randn({B, LQ, HQ + 2 * HKV, D})
  local q = x:narrow(3, 1, HQ):transpose(2, 3)
  local k, v = x:narrow(3, HQ + 1, HKV):transpose(2, 3), x:narrow(3, HQ + HKV + 1, HKV):transpose(2, 3)
  local o, lse = fa.attention(q, k, v, {return_lse = true})
  local dout = U.randn({B, HQ, LQ, D})
  local got = {fa.attention_backward(q, k, v, o, lse, dout)}
  local want = {fa.attention_backward(q:contiguous(), k:contiguous(), v:contiguous(), o, lse, dout)}
  for i, name in ipairs({"dq", "dk", "dv"}) do U.assert_close(got[i], want[i], "f32", name .. " from packed QKV") end
  -- no copies of f32 views
  local function peak(dtype, strided)
    local q2, k2, v2, dout2 = inputs(strided, dtype)
    local o2, lse2 = fa.attention(q2, k2, v2, {return_lse = true})
    if strided then
      local ov = U.poison({B, LQ, HQ, D}, dtype):transpose(2, 3)
      ov:copy_(o2)
      o2 = ov
    end
    return peak_during(function() return fa.attention_backward(q2, k2, v2, o2, lse2, dout2) end)
  end
  local dense = peak("f32", false)
  lu.assertEquals(peak("f32", true), dense, "strided f32 operands of the backward were copied")
  lu.assertEquals(peak("f16", true), peak("f16", false), "strided f16 operands of the backward were copied")
  local copies = 4 * D * (3 * B * HQ * LQ + 2 * B * HKV * LK) -- q, o, dout and k, v in f32 (Dv = D)
  local over = peak("f16", true) - dense
  lu.assertTrue(over < copies, ("an f16 backward held %d bytes over f32's: whole copies (%d)"):format(over, copies))
  do -- and its gradients are those of its contiguous operands
    local q2, k2, v2, d2 = inputs(true, "f16")
    local o2, l2 = fa.attention(q2, k2, v2, {return_lse = true, causal = true})
    local got = {fa.attention_backward(q2, k2, v2, o2, l2, d2, {causal = true})}
    local want = {fa.attention_backward(q2:contiguous(), k2:contiguous(), v2:contiguous(), o2, l2, d2:contiguous(),
      {causal = true})}
    for i, name in ipairs({"dq", "dk", "dv"}) do
      lu.assertEquals(got[i]:dtype(), "f16")
      lu.assertEquals(fa.max_abs_diff(got[i], want[i]), 0, name .. " of f16 views")
    end
  end
  -- NaN in a strided dout: the rows of dq that read it, and dk, dv of the keys those rows attend
  local q3, k3, v3, d3 = inputs(true, "f32")
  local o3, l3 = fa.attention(q3, k3, v3, {return_lse = true})
  d3[1][1][2][1] = 0 / 0
  local g3 = {fa.attention_backward(q3, k3, v3, o3, l3, d3)}
  local w3 = {fa.attention_backward(q3:contiguous(), k3:contiguous(), v3:contiguous(), o3, l3, d3:contiguous())}
  for i, name in ipairs({"dq", "dk", "dv"}) do
    local err = U.masked_rel_err(g3[i], w3[i])
    lu.assertTrue(err < 1e-5, name .. ": NaN where the dense call has it, the rest close (" .. tostring(err) .. ")")
  end
end

-- A strided opts.mask (a transposed view, a broadcast over heads) is read
-- where it lies, by the forward and the backward: the results of its
-- contiguous copy, and on the CPU no more memory than with that copy made
-- beforehand.
function TestLayouts:test_mask_views_are_not_copied()
  local D = 16
  local q, k, v = U.randn({B, HQ, LQ, D}), U.randn({B, HKV, LK, D}), U.randn({B, HKV, LK, D})
  local dout = U.randn({B, HQ, LQ, D})
  local bool_view = fa.tensor(U.nested({B, 1, LK, LQ}, function() return math.random() < 0.7 end), {device = U.device})
  bool_view = bool_view:transpose(3, 4) -- (B, 1, LQ, LK), the keys along the slow dimension
  local float_view = U.randn({B, HQ, LK, LQ}):transpose(3, 4)
  for _, m in ipairs({bool_view, float_view}) do
    local mc = m:contiguous()
    local o, lse = fa.attention(q, k, v, {mask = m, return_lse = true})
    local oc, lsec = fa.attention(q, k, v, {mask = mc, return_lse = true})
    U.assert_close(o, oc, "f32", "output with a mask view")
    U.assert_lse(lse, lsec, "f32", "lse with a mask view")
    local g = {fa.attention_backward(q, k, v, o, lse, dout, {mask = m})}
    local gc = {fa.attention_backward(q, k, v, o, lse, dout, {mask = mc})}
    for i, name in ipairs({"dq", "dk", "dv"}) do U.assert_close(g[i], gc[i], "f32", name .. " with a mask view") end
    local function peak(mask)
      return peak_during(function()
        local r = {fa.attention(q, k, v, {mask = mask, return_lse = true})}
        r[3], r[4], r[5] = fa.attention_backward(q, k, v, o, lse, dout, {mask = mask})
        return r
      end)
    end
    if not U.cuda then lu.assertEquals(peak(m), peak(mc), "a strided mask was copied") end
  end
end

-- NaN and inf in a strided V (a transposed (B, L, H, D) tensor) reach only
-- the rows that attend them: on cuda the check of V runs over its rows
-- where they lie, 16 bytes a lane where the rows allow (D = 64, 96, 128 in
-- 16 bits: 8, 12, 16 chunks a row; 40: 5) and an element a lane where they
-- do not (D = 36 in 16 bits: rows of 72 bytes).
function TestLayouts:test_nonfinite_v_views()
  local Lq, Lk = 40, 150
  for _, dtype in ipairs(U.dtypes) do
    for _, D in ipairs({36, 40, 64, 96, 128}) do
      local q, k = bhld(B, HQ, Lq, D, dtype), bhld(B, HKV, Lk, D, dtype)
      local base = U.randn({B, Lk, HKV, D}, dtype)
      base:set(1, 120, 2, 3, U.NaN)
      base:set(2, 30, 1, D, U.inf)
      local v = base:transpose(2, 3)
      for _, algo in ipairs({"flash", "two_pass", "naive"}) do
        for _, opts in ipairs({{causal = true}, {kv_lens = {100, Lk}}, {}}) do
          local o = U.copy_opts(opts)
          o.algo, o.return_lse = algo, true
          U.check_attention(q, k, v, o, ("NaN/inf in a strided v: %s %s D=%d"):format(algo, dtype, D))
        end
      end
    end
  end
end

-- fa.softmax reads rows where they lie too (API §6): a transposed view, a
-- narrow of wider rows and a head slice give the softmax of their
-- contiguous copies, every algo (the online one with blocks and chunks
-- inside a row), and hold only the output (the result), as the contiguous
-- call does, on both backends; opts.out over the input's own memory is
-- never written while rows are still to be read.
function TestLayouts:test_softmax_reads_views()
  local x = U.randn({3, 40, 5, 24}) -- (B, L, H, X)
  local views = {
    x:transpose(2, 3),                        -- (B, H, L, X)
    x:narrow(4, 3, 17),                       -- rows of 17 of 24
    x:select(3, 2),                           -- one head: (B, L, X)
    x:transpose(2, 3):narrow(2, 2, 3):narrow(4, 1, 9),
  }
  for _, algo in ipairs({"naive", "safe", "online", "fused", "auto"}) do
    for vi, v in ipairs(views) do
      local want = fa.softmax(v:contiguous(), {algo = algo, block = 4})
      local got = fa.softmax(v, {algo = algo, block = 4})
      lu.assertEquals(got:shape(), v:shape())
      lu.assertEquals(fa.max_abs_diff(got, want), 0, ("%s, view %d"):format(algo, vi))
    end
  end
  for vi, v in ipairs(views) do
    local c = v:contiguous()
    lu.assertEquals(peak_during(function() return fa.softmax(v) end, U.device),
      peak_during(function() return fa.softmax(c) end, U.device), ("view %d was copied"):format(vi))
  end
  -- out over the input's memory: a strided input's rows are not overwritten before they are read
  -- (exactly on the CPU; cuda's kernels may sum in another order for an out that starts off 16 bytes,
  -- H200: 6e-8)
  local tol = U.cuda and 1e-6 or 0
  local y = U.randn({6, 8})
  local v = y:narrow(2, 1, 4) -- rows 8 apart
  local want = fa.softmax(v:contiguous())
  local out = y:narrow(2, 5, 4) -- beside v's rows, not contiguous: a temporary
  fa.softmax(v, {out = out})
  lu.assertTrue(fa.max_abs_diff(out, want) <= tol, "out beside strided rows")
  local flat = U.randn({32})
  local rows = flat:view({4, 8}):narrow(2, 1, 4)
  local want2 = fa.softmax(rows:contiguous())
  local out2 = flat:narrow(1, 3, 16):view({4, 4}) -- contiguous, overlapping the strided rows
  fa.softmax(rows, {out = out2})
  lu.assertTrue(fa.max_abs_diff(out2, want2) <= tol, "out overlapping strided rows")
end

-- fa.matmul reads its operands where they lie too (API §6): rows of a
-- wider matrix (a narrow of its columns, a row stride past the row) give
-- the contiguous copies' product, every algo, with no more memory on the
-- CPU than the contiguous call (a transposed operand, whose last dimension
-- is not contiguous, is copied: the measure sees it).
function TestLayouts:test_matmul_reads_views()
  local M, K, N = 37, 45, 29
  local dtypes = U.cuda and {"f32", "f64", "f16", "bf16"} or {"f32", "f64"}
  for _, dtype in ipairs(dtypes) do
    local a = U.randn({M, K + 7}, dtype):narrow(2, 4, K)
    local b = U.randn({K, N + 5}, dtype):narrow(2, 2, N)
    for _, algo in ipairs({"naive", "tiled", "blas"}) do
      local what = ("matmul %s %s of row-strided views"):format(algo, dtype)
      local ref = fa.matmul(a:contiguous(), b:contiguous(), {algo = algo})
      local c = fa.matmul(a, b, {algo = algo})
      U.assert_close(c, ref, dtype, what)
      local out = U.poison({M, N}, dtype)
      fa.matmul(a, b, {algo = algo, out = out})
      U.assert_close(out, ref, dtype, what .. " (opts.out)")
      -- a single row, whose stride says nothing
      U.assert_close(fa.matmul(a:narrow(1, 3, 1), b, {algo = algo}), ref:narrow(1, 3, 1), dtype, what .. " (one row)")
    end
  end
  if U.cuda then return end
  local function peak(x, y) return peak_during(function() return fa.matmul(x, y) end) end
  local a, b = U.randn({M, K + 7}):narrow(2, 4, K), U.randn({K, N + 5}):narrow(2, 2, N)
  local dense = peak(a:contiguous(), b:contiguous())
  lu.assertEquals(peak(a, b), dense, "row-strided f32 operands were copied")
  lu.assertTrue(peak(U.randn({K, M}):transpose(1, 2), b) > dense, "the measure does not see a transposed operand's copy")
end

-- fa.merge_states reads its states where they lie (API §6): transposed
-- (B, L, H, Dv) states and a head slice give the contiguous states' merge
-- bit for bit, the two-state and the list form, an empty state (lse =
-- -inf) passing the other through; on the CPU with no more fa.memory()
-- than the contiguous call (the lse, merged in f64, are converted either way).
function TestLayouts:test_merge_states_reads_views()
  local DV = 24
  local dtypes = U.cuda and {"f32", "f16", "bf16", "f64"} or {"f32", "f64"}
  for _, dtype in ipairs(dtypes) do
    local os, ls, dense_os, dense_ls = {}, {}, {}, {}
    for i = 1, 3 do
      os[i] = i == 3 and U.randn({B, LQ, HQ + 2, DV}, dtype):narrow(3, 2, HQ):transpose(2, 3)
        or bhld(B, HQ, LQ, DV, dtype)
      ls[i] = U.randn({B, LQ, HQ}, "f32"):transpose(2, 3)
      dense_os[i], dense_ls[i] = os[i]:contiguous(), ls[i]:contiguous()
    end
    local what = "merge_states of strided " .. dtype .. " states"
    local o, l = fa.merge_states(os[1], ls[1], os[2], ls[2])
    local ro, rl = fa.merge_states(dense_os[1], dense_ls[1], dense_os[2], dense_ls[2])
    lu.assertEquals(o:totable(), ro:totable(), what)
    lu.assertEquals(l:totable(), rl:totable(), what .. " (lse)")
    o, l = fa.merge_states(os, ls)
    ro, rl = fa.merge_states(dense_os, dense_ls)
    lu.assertEquals(o:totable(), ro:totable(), what .. " (list)")
    lu.assertEquals(l:totable(), rl:totable(), what .. " (list, lse)")
    local empty = fa.full({B, HQ, LQ}, -math.huge, {dtype = "f32", device = dev})
    o = fa.merge_states(os[3], ls[3], os[1], empty)
    lu.assertEquals(o:totable(), dense_os[3]:totable(), what .. " (an empty state)")
  end
  if U.cuda then return end
  local function peak(o1, l1, o2, l2) return peak_during(function() return fa.merge_states(o1, l1, o2, l2) end) end
  local o1, o2 = bhld(B, HQ, LQ, DV, "f32"), bhld(B, HQ, LQ, DV, "f32")
  local l1, l2 = U.randn({B, HQ, LQ}, "f32"), U.randn({B, HQ, LQ}, "f32")
  local dense = peak(o1:contiguous(), l1, o2:contiguous(), l2)
  lu.assertEquals(peak(o1, l1, o2, l2), dense, "strided f32 states were copied")
  -- f16/bf16 states are read where they lie too (widened a row at a time): the bits of merging
  -- their f32 copies, and less memory than the f32 call (which keeps no copy either)
  local h1, h2 = bhld(B, HQ, LQ, DV, "f16"), bhld(B, HQ, LQ, DV, "f16")
  local half = peak(h1, l1, h2, l2)
  lu.assertEquals(half, peak(h1:contiguous(), l1, h2:contiguous(), l2), "strided f16 states were copied")
  lu.assertTrue(half < dense, ("f16 states held %d bytes, the f32 call %d: copies"):format(half, dense))
  for _, dtype in ipairs({"f16", "bf16"}) do
    local a, b = bhld(B, HQ, LQ, DV, dtype), bhld(B, HQ, LQ, DV, dtype)
    local empty = fa.full({B, HQ, LQ}, -math.huge)
    for _, ls in ipairs({{l1, l2}, {l1, empty}, {empty, l2}}) do
      local o, l = fa.merge_states(a, ls[1], b, ls[2])
      local ro, rl = fa.merge_states(a:float(), ls[1], b:float(), ls[2])
      lu.assertEquals(o:dtype(), dtype)
      lu.assertEquals(fa.max_abs_diff(o, ro:to(dtype)), 0, dtype .. " states against their f32 copies")
      lu.assertEquals(fa.max_abs_diff(l, rl), 0, dtype .. " states' lse")
    end
    local o = fa.merge_states({a, b, a}, {l1, l2, l1})
    local ro = fa.merge_states({a:float(), b:float(), a:float()}, {l1, l2, l1})
    lu.assertEquals(fa.max_abs_diff(o, ro:to(dtype)), 0, dtype .. " states, a list of three")
  end
end

U.run()
