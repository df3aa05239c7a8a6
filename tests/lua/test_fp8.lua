-- The FP8 forward (issue 25): opts.kernel = "wgmma_fp8" rounds q, k and v
-- to e4m3 with a scale a tile of 128 rows (128 keys for k and v), and P to
-- e4m3 before P·V.  It is taken only when named and listed by fa.kernels
-- only then. Its results are checked against the f64 reference of the
-- e4m3-rounded operands (emulated here), which leaves P's rounding as
-- the difference, and against the plain reference with an FP8 bound.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device
-- lse of the FP8 kernel against the rounded operands' reference: the products
-- Q8·K8ᵀ come from the tensor cores' FP8 sums, which are not f32-exact (H200:
-- up to 6e-4 relative)
U.lse_tol.fp8 = 2e-3

TestFp8 = {}

-- x rounded to the nearest e4m3 value (ties to even), saturated to ±448.
local function e4m3(x)
  if x ~= x or x == 0 then return x end
  local a, s = math.abs(x), x < 0 and -1 or 1
  if a >= 448 then return s * 448 end
  local step
  if a < 2 ^ -6 then
    step = 2 ^ -9 -- subnormals
  else
    local e = math.floor(math.log(a, 2))
    while 2 ^ e > a do e = e - 1 end
    while 2 ^ (e + 1) <= a do e = e + 1 end
    step = 2 ^ (e - 3)
  end
  local n = a / step
  local f = math.floor(n)
  local r = n - f
  if r > 0.5 or (r == 0.5 and f % 2 == 1) then f = f + 1 end
  return s * math.min(f * step, 448)
end

-- t (B, H, L, D) as the kernel sees it: each tile of 128 rows of a head
-- rounded to e4m3 at the scale amax / 448 (f32 arithmetic as on the device),
-- then scaled back; f64 on the CPU.
local function fp8_view(t)
  local shape = t:shape()
  local B, H, L, D = shape[1], shape[2], shape[3], shape[4]
  local x = U.flat(t)
  local f32 = function(v) return string.unpack("f", string.pack("f", v)) end
  for bh = 0, B * H - 1 do
    for t0 = 0, L - 1, 128 do
      local base, rows = (bh * L + t0) * D, math.min(128, L - t0)
      local amax = 0
      for i = 1, rows * D do amax = math.max(amax, math.abs(x[base + i])) end
      local scale, inv = 1, 1
      if amax > 0 then scale, inv = f32(amax / 448), f32(448 / amax) end
      for i = 1, rows * D do x[base + i] = e4m3(f32(x[base + i] * inv)) * scale end
    end
  end
  return U.from_flat(x, shape, "f64", "cpu")
end

local function names_of(list)
  local set = {}
  for _, n in ipairs(list) do set[n] = true end
  return set
end

function TestFp8:test_e4m3_rounding()
  lu.assertEquals(e4m3(1.0), 1.0)
  lu.assertEquals(e4m3(1.0625), 1.0)    -- a tie, to even
  lu.assertEquals(e4m3(1.1875), 1.25)   -- a tie, to even
  lu.assertEquals(e4m3(-300), -288)
  lu.assertEquals(e4m3(1000), 448)
  lu.assertEquals(e4m3(2 ^ -9 * 3.4), 2 ^ -9 * 3)
end

function TestFp8:test_named_only()
  local q, k, v = U.randn({1, 2, 40, 128}, "bf16", 1, dev), U.randn({1, 2, 50, 128}, "bf16", 1, dev),
    U.randn({1, 2, 50, 128}, "bf16", 1, dev)
  lu.assertNil(names_of(fa.kernels(q, k, v)).wgmma_fp8)
  if dev ~= "cuda" then
    U.assert_fa_error({"opts.kernel", '"wgmma_fp8"', "cuda"}, fa.attention, q, k, v, {kernel = "wgmma_fp8"})
    return
  end
  lu.assertTrue(names_of(fa.kernels(q, k, v, {kernel = "wgmma_fp8"})).wgmma_fp8)
  local q64 = U.randn({1, 2, 40, 64}, "bf16", 1, dev)
  U.assert_fa_error({"opts.kernel", '"wgmma_fp8"', "D = 64", "128"}, fa.attention, q64, q64, q64,
    {kernel = "wgmma_fp8"})
  local qf = U.randn({1, 2, 40, 128}, "f32", 1, dev)
  U.assert_fa_error({"opts.kernel", '"wgmma_fp8"', "f32"}, fa.attention, qf, qf, qf, {kernel = "wgmma_fp8"})
  U.assert_fa_error({"opts.kernel", '"wgmma_fp8"', "opts.softcap"}, fa.attention, q, k, v,
    {kernel = "wgmma_fp8", softcap = 30})
  U.assert_fa_error({"opts.kernel", '"wgmma_fp8"', "opts.alibi"}, fa.attention, q, k, v,
    {kernel = "wgmma_fp8", alibi = {0.5, 0.25}})
  -- the engine stays usable
  local o = fa.attention(q, k, v, {kernel = "wgmma_fp8"})
  lu.assertEquals(o:shape(), {1, 2, 40, 128})
end

-- Against the reference of the rounded operands (only P's rounding and the
-- order of the sums differ) and against the plain reference (FP8's bound).
local CASES = {
  {name = "plain", B = 2, Hq = 4, Hkv = 2, Lq = 300, Lk = 333, opts = {}},
  {name = "causal", B = 1, Hq = 2, Hkv = 2, Lq = 257, Lk = 257, opts = {causal = true}},
  {name = "causal bottom_right", B = 1, Hq = 4, Hkv = 1, Lq = 70, Lk = 390,
    opts = {causal = "bottom_right"}},
  {name = "window", B = 1, Hq = 2, Hkv = 1, Lq = 400, Lk = 400, opts = {causal = true, window = {100, 0}}},
  {name = "kv_lens", B = 3, Hq = 2, Hkv = 2, Lq = 130, Lk = 300, opts = {kv_lens = {300, 1, 0}}},
  {name = "decode", B = 2, Hq = 8, Hkv = 2, Lq = 1, Lk = 700, opts = {}},
  {name = "f16, scale", B = 1, Hq = 2, Hkv = 2, Lq = 128, Lk = 256, opts = {scale = 0.2}, dtype = "f16"},
  -- each piece's keys quantized from the piece's start: the plain reference only
  {name = "splits", B = 2, Hq = 4, Hkv = 2, Lq = 4, Lk = 1000, opts = {splits = 3}, plain_only = true},
}

function TestFp8:test_against_rounded_reference()
  if dev ~= "cuda" then lu.skip("cuda only") end
  for _, c in ipairs(CASES) do
    local dt = c.dtype or "bf16"
    local q = U.randn({c.B, c.Hq, c.Lq, 128}, dt, 1, dev)
    local k = U.randn({c.B, c.Hkv, c.Lk, 128}, dt, 1, dev)
    local v = U.randn({c.B, c.Hkv, c.Lk, 128}, dt, 1, dev)
    local opts = U.copy_opts(c.opts)
    opts.kernel, opts.return_lse = "wgmma_fp8", true
    local o, lse = fa.attention(q, k, v, opts)
    local o2, lse2 = fa.attention(q, k, v, opts)
    lu.assertEquals(fa.max_abs_diff(o2, o), 0, c.name .. ": run twice")
    lu.assertEquals(fa.max_abs_diff(lse2, lse), 0, c.name .. ": lse, run twice")
    local r = U.ref_opts(c.opts)
    r.return_lse = true
    local ro, rl = fa.attention_reference(fp8_view(q), fp8_view(k), fp8_view(v), r)
    local po, pl = fa.attention_reference(q:cpu(), k:cpu(), v:cpu(), r)
    local e_rounded, e_plain = c.plain_only and 0 or U.masked_rel_err(o, ro), U.masked_rel_err(o, po)
    -- P in e4m3 (H200: 0.013-0.023 from the rounded operands' reference, 0.044-0.071 from the plain
    -- one, bf16's kernel 0.0002-0.002; scale 0.2 sharpens the scores' errors); lse from P's sums in
    -- f32, unrounded
    lu.assertTrue(e_rounded <= 0.04, ("%s: %.3g from the rounded operands' reference"):format(c.name, e_rounded))
    lu.assertTrue(e_plain <= 0.12, ("%s: %.3g from the reference"):format(c.name, e_plain))
    if not c.plain_only then U.assert_lse(lse, rl, "fp8", c.name .. ": lse") end
  end
end

-- Random shapes and rules (an H200 ran 70 such cases: at most 0.024 from the rounded operands' reference,
-- 0.056 from the plain one, docs/perf/2026-12-03-fp8-checks-h200.json).
function TestFp8:test_random_shapes()
  if dev ~= "cuda" then lu.skip("cuda only") end
  for i = 1, 6 do
    local G, Hkv, B = U.pick({1, 2, 4}, math.random(3)), math.random(2), math.random(2)
    local Lq, Lk = math.random(1, 300), math.random(1, 400)
    local opts, rule = {}, math.random(5)
    if rule == 1 then opts.causal = true
    elseif rule == 2 then opts.causal = "bottom_right"
    elseif rule == 3 then opts.causal, opts.window = true, {math.random(0, 200), 0}
    elseif rule == 4 then
      opts.kv_lens = {}
      for b = 1, B do opts.kv_lens[b] = math.random(0, Lk) end
    end
    local dt = U.pick({"bf16", "f16"}, i)
    local q, k = U.randn({B, Hkv * G, Lq, 128}, dt, 1, dev), U.randn({B, Hkv, Lk, 128}, dt, 1, dev)
    local v = U.randn({B, Hkv, Lk, 128}, dt, 1, dev)
    local named = U.copy_opts(opts)
    named.kernel = "wgmma_fp8"
    local o = fa.attention(q, k, v, named)
    local r = U.ref_opts(opts)
    local what = ("case %d: %s B%d H%d/%d Lq %d Lk %d rule %d"):format(i, dt, B, Hkv * G, Hkv, Lq, Lk, rule)
    local e_rounded = U.masked_rel_err(o, fa.attention_reference(fp8_view(q), fp8_view(k), fp8_view(v), r))
    local e_plain = U.masked_rel_err(o, fa.attention_reference(q:cpu(), k:cpu(), v:cpu(), r))
    lu.assertTrue(e_rounded <= 0.05, ("%s: %.3g from the rounded operands' reference"):format(what, e_rounded))
    lu.assertTrue(e_plain <= 0.15, ("%s: %.3g from the reference"):format(what, e_plain))
  end
end

function TestFp8:test_strided_operands()
  if dev ~= "cuda" then lu.skip("cuda only") end
  -- (B, L, H, D) held, viewed as (B, H, L, D)
  local q = U.randn({2, 200, 4, 128}, "bf16", 1, dev):transpose(2, 3)
  local k = U.randn({2, 150, 2, 128}, "bf16", 1, dev):transpose(2, 3)
  local v = U.randn({2, 150, 2, 128}, "bf16", 1, dev):transpose(2, 3)
  local o = fa.attention(q, k, v, {kernel = "wgmma_fp8"})
  local oc = fa.attention(q:contiguous(), k:contiguous(), v:contiguous(), {kernel = "wgmma_fp8"})
  lu.assertEquals(fa.max_abs_diff(o, oc), 0)
end

-- NaN or inf anywhere in q, k or v: the call is computed exactly, as the SIMT kernel computes it.
function TestFp8:test_nonfinite_inputs_fall_back()
  if dev ~= "cuda" then lu.skip("cuda only") end
  for _, which in ipairs({"q", "k", "v"}) do
    local x = {q = U.randn({1, 2, 130, 128}, "bf16", 1, "cpu"), k = U.randn({1, 2, 140, 128}, "bf16", 1, "cpu"),
      v = U.randn({1, 2, 140, 128}, "bf16", 1, "cpu")}
    x[which][1][2][5][7] = which == "k" and math.huge or 0 / 0
    local q, k, v = x.q:to(dev), x.k:to(dev), x.v:to(dev)
    local o = fa.attention(q, k, v, {kernel = "wgmma_fp8", causal = true})
    local s = fa.attention(q, k, v, {kernel = "simt", causal = true})
    lu.assertEquals(U.masked_rel_err(o, s), 0, which)
  end
end

os.exit(U.run())
