-- fa.softmax (docs/lua-api.md §2): every algo × dtype × shape against an f64 softmax
-- computed in Lua; overflow of the naive algo; online block sizes; the fused
-- algo's row limit; views and opts.out.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

local ALGOS = {"naive", "safe", "online", "fused", "auto"}
-- rows of 1, 7, 1000 and 4096 elements, 1-D to 4-D
local SHAPES = {
  {1}, {7}, {1000}, {4096},
  {3, 1}, {5, 7}, {2, 1000}, {2, 4096},
  {2, 3, 7}, {2, 2, 1000}, {2, 1, 3, 7}, {1, 2, 2, 1}, {1, 2, 1, 4096},
}

-- Softmax of x (any tensor) over its last dimension, in f64 in Lua, as a
-- CPU f64 tensor of x's shape.
local function lua_softmax(x)
  local shape = x:shape()
  local y = U.lua_softmax_flat(U.flat(x), shape[#shape])
  return U.from_flat(y, shape, "f64", "cpu")
end

local function check_softmax(x, opts, what)
  local ref = lua_softmax(x)
  local dtype = x:dtype()
  local run = U.copy_opts(opts)
  local out
  if run.poison ~= false then
    out = U.poison(x:shape(), dtype, x:device())
    run.out = out
  end
  run.poison = nil
  local y = fa.softmax(x, run)
  lu.assertEquals(y:dtype(), dtype, what .. ": dtype")
  lu.assertEquals(y:device(), x:device(), what .. ": device")
  U.assert_close(y, ref, dtype, what)
  if out then U.assert_close(out, ref, dtype, what .. " (opts.out)") end
  return y
end

TestSoftmax = {}

function TestSoftmax:test_every_algo_dtype_shape()
  local n = 0
  for _, algo in ipairs(ALGOS) do
    for _, dtype in ipairs(U.dtypes) do
      for si, shape in ipairs(SHAPES) do
        n = n + 1
        -- naive holds e^x in the storage dtype: f16 overflows past x ≈ 11.09
        local x = U.randn(shape, dtype, algo == "naive" and 1.5 or 3)
        check_softmax(x, {algo = algo, poison = (n % 2 == 0)},
          ("softmax %s %s %s"):format(algo, dtype, U.shape_str(shape)))
        if si == 1 then x:free() end
      end
    end
  end
end

function TestSoftmax:test_default_algo_is_auto()
  local x = U.randn({4, 33}, "f32", 2)
  local y = fa.softmax(x)
  U.assert_close(y, lua_softmax(x), "f32", "softmax default")
  lu.assertEquals(fa.max_abs_diff(y, fa.softmax(x, {algo = "auto"})), 0)
  lu.assertEquals(fa.max_abs_diff(y, fa.softmax(x, {})), 0)
end

-- e^x without the max overflows in f32 (and bf16, which has f32's range)
-- past x ≈ 88.7 (e^88.7 ≈ 3.4e38), in f16 past x ≈ 11.09 (e^11.09 ≈ 65504,
-- the naive algo holding e^x in the tensor's dtype, as the seeds say), in
-- f64 past 709.8; large negative x underflows the denominator to 0 (0/0).
-- Subtracting the max removes both.
function TestSoftmax:test_naive_overflows_where_the_seeds_say()
  local cases = {}
  for _, dt in ipairs({"f32", "bf16"}) do
    cases[#cases + 1] = {dt, {89, 0, 0}, false}       -- e^89 = 4.5e38 > f32 max
    cases[#cases + 1] = {dt, {80, 79, 0}, true}       -- e^80 = 5.5e34: fine
    cases[#cases + 1] = {dt, {-200, -201}, false}     -- e^-200 = 0 in f32: 0/0
  end
  cases[#cases + 1] = {"f16", {11.125, 0}, false}      -- e^11.125 = 67846 > 65504
  cases[#cases + 1] = {"f16", {12, 0, 0}, false}
  cases[#cases + 1] = {"f16", {11, 10.5, 0}, true}      -- e^11 = 59874: fine
  cases[#cases + 1] = {"f16", {-200, -201}, false}
  if U.dtypes[4] == "f64" then
    cases[#cases + 1] = {"f64", {710, 0}, false}      -- e^710 > f64 max
    cases[#cases + 1] = {"f64", {700, 699}, true}
    cases[#cases + 1] = {"f64", {-800, -801}, false}
  end
  for _, c in ipairs(cases) do
    local dt, row, finite = c[1], c[2], c[3]
    local x = fa.tensor({row}, {dtype = dt, device = dev})
    local y = fa.softmax(x, {algo = "naive"})
    local what = ("naive softmax %s of {%s}"):format(dt, table.concat(row, ", "))
    if finite then
      U.assert_close(y, lua_softmax(x), dt, what)
    else
      lu.assertFalse(y:isfinite(), what .. " should overflow (inf/NaN), gave " .. tostring(y))
    end
    for _, algo in ipairs({"safe", "online", "fused", "auto"}) do
      U.assert_close(fa.softmax(x, {algo = algo}), lua_softmax(x), dt, algo .. " of the same row")
    end
  end
end

function TestSoftmax:test_safe_algos_never_overflow()
  for _, dt in ipairs(U.dtypes) do
    local x = fa.tensor({{1000, 0, -1000}, {-1e4, -1e4 - 1, -1e4 - 2}, {60000, 60000, 60000}},
                        {dtype = dt, device = dev})
    for _, algo in ipairs({"safe", "online", "fused", "auto"}) do
      check_softmax(x, {algo = algo}, ("%s %s extreme rows"):format(algo, dt))
    end
  end
end

function TestSoftmax:test_online_block_sizes()
  for _, dtype in ipairs(U.dtypes) do
    for _, shape in ipairs({{3, 1000}, {2, 4096}, {5, 7}}) do
      local x = U.randn(shape, dtype, 4)
      for _, block in ipairs({1, 3, 16, 256, 1024, 5000}) do
        check_softmax(x, {algo = "online", block = block},
          ("online block %d %s %s"):format(block, dtype, U.shape_str(shape)))
      end
    end
  end
  local x = U.randn({2, 8})
  U.assert_fa_error({"block"}, fa.softmax, x, {algo = "online", block = -1})
  U.assert_fa_error({"block"}, fa.softmax, x, {algo = "online", block = 2.5})
end

-- The fused algo holds a row on chip: past its limit it refuses with a
-- message naming the largest N it supports (that N works, N+1 does not).
function TestSoftmax:test_fused_row_limit()
  for _, dtype in ipairs({"f32", "f16"}) do
    local fail_n, msg
    local n = 1024
    while n <= 2 ^ 22 do
      local x = fa.zeros({1, n}, {dtype = dtype, device = dev})
      local ok, err = pcall(fa.softmax, x, {algo = "fused"})
      x:free()
      if not ok then fail_n, msg = n, tostring(err) break end
      n = n * 2
    end
    if not fail_n then
      lu.fail(("fused softmax (%s) accepted rows of up to %d elements without naming a limit"):format(dtype, 2 ^ 22))
    end
    lu.assertEquals(msg:sub(1, 10), "flashattn:", msg)
    -- the limit named in the message
    local limit
    for num in msg:gmatch("%d+") do
      local m = tonumber(num)
      if m >= fail_n / 2 and m < fail_n then
        local a = fa.randn({2, m}, {dtype = dtype, device = dev, seed = U.next_seed()})
        local b = fa.zeros({1, m + 1}, {dtype = dtype, device = dev})
        local ok_m = pcall(fa.softmax, a, {algo = "fused"})
        local ok_m1 = pcall(fa.softmax, b, {algo = "fused"})
        if ok_m and not ok_m1 then
          limit = m
          -- at the limit the result is right, and auto handles rows past it
          local y = fa.softmax(a, {algo = "fused"})
          U.assert_close(y, fa.softmax(a, {algo = "safe"}):double(), dtype, "fused at its limit " .. m)
          local big = fa.randn({1, m + 1}, {dtype = dtype, device = dev, seed = U.next_seed()})
          U.assert_close(fa.softmax(big), fa.softmax(big, {algo = "online"}):double(), dtype, "auto past the fused limit")
          break
        end
      end
    end
    if not limit then
      lu.fail(("fused softmax (%s) failed at N = %d but its message names no N that works with N+1 failing: %q")
        :format(dtype, fail_n, msg))
    end
  end
end

function TestSoftmax:test_views_as_input()
  for _, dtype in ipairs(U.dtypes) do
    local base = U.randn({6, 9}, dtype, 2)
    local tr = base:transpose(1, 2) -- 9 rows of 6, strided
    lu.assertFalse(tr:is_contiguous())
    local nr = base:narrow(2, 3, 5) -- rows of 5 inside rows of 9
    local b4 = U.randn({2, 5, 3, 7}, dtype):transpose(2, 3)
    for _, algo in ipairs(ALGOS) do
      check_softmax(tr, {algo = algo}, ("softmax %s %s transposed view"):format(algo, dtype))
      check_softmax(nr, {algo = algo}, ("softmax %s %s narrowed view"):format(algo, dtype))
      check_softmax(b4, {algo = algo}, ("softmax %s %s 4-D transposed view"):format(algo, dtype))
    end
    -- the input view is left alone
    lu.assertEquals(fa.max_abs_diff(tr, base:transpose(1, 2)), 0)
  end
end

function TestSoftmax:test_out_into_a_view_and_in_place()
  local x = U.randn({4, 16}, "f32")
  local big = U.poison({4, 32}, "f32")
  local outv = big:narrow(2, 1, 16)
  local ok, err = pcall(fa.softmax, x, {out = outv})
  if not ok then
    lu.assertEquals(tostring(err):sub(1, 10), "flashattn:", tostring(err))
  else
    U.assert_close(outv, lua_softmax(x), "f32", "softmax into a narrowed out")
    lu.assertFalse(big:narrow(2, 17, 16):isfinite(), "softmax wrote outside its out view")
  end
  -- out = x (in place) works as y = softmax(x)
  local ref = lua_softmax(x)
  fa.softmax(x, {out = x, algo = "safe"})
  U.assert_close(x, ref, "f32", "softmax in place")
end

function TestSoftmax:test_nan_only_in_its_row()
  for _, algo in ipairs({"safe", "online", "fused", "auto"}) do
    local x = U.randn({3, 40}, "f32")
    x:set(2, 17, U.NaN)
    local y = fa.softmax(x, {algo = algo})
    for _, r in ipairs({1, 3}) do
      U.assert_close(y:select(1, r), lua_softmax(x:select(1, r)), "f32", algo .. ": a row without NaN")
    end
    lu.assertFalse(y:select(1, 2):isfinite(), algo .. ": the row with NaN gives NaN")
  end
end

function TestSoftmax:test_nan_hidden_among_masked_entries()
  -- a row of -inf with one NaN is NaN throughout, wherever the NaN sits (on
  -- cuda: whichever thread, block or cluster holds it); a row of -inf alone
  -- is zeros.  Lengths that take each of auto's paths on cuda (f32 200000:
  -- a cluster of two-an-SM blocks with a shared-memory stash; 300000: one
  -- 1024-thread block an SM with a stash).
  for _, n in ipairs({2, 40, 5000, 200000, 300000}) do
    local x = fa.full({3, n}, -math.huge, {device = dev})
    x:set(2, n // 2 + 1, U.NaN)
    x:set(3, n, U.NaN)
    for _, algo in ipairs({"safe", "online", "fused", "auto"}) do
      local ok, y = pcall(fa.softmax, x, {algo = algo})
      if ok then
        local what = algo .. " n=" .. n
        lu.assertEquals(y:select(1, 1):max(), 0, what .. ": the row of -inf gives zeros")
        lu.assertEquals(y:select(1, 1):min(), 0, what .. ": the row of -inf gives zeros")
        for r = 2, 3 do
          for _, j in ipairs({1, n // 2 + 1, n}) do
            local v = y:get(r, j)
            lu.assertTrue(v ~= v, what .. (": row %d, element %d should be NaN, is %s"):format(r, j, tostring(v)))
          end
        end
      else
        lu.assertEquals(algo, "fused", tostring(y))
        lu.assertStrContains(tostring(y), "flashattn:")
      end
    end
  end
end

function TestSoftmax:test_masked_entries()
  -- -inf entries get probability 0
  local x = fa.tensor({{-math.huge, 0, 0}, {1, -math.huge, 1}}, {device = dev})
  for _, algo in ipairs({"safe", "online", "fused", "auto"}) do
    local y = fa.softmax(x, {algo = algo})
    lu.assertTrue(U.table_max_diff(y:totable(), {{0, 0.5, 0.5}, {0.5, 0, 0.5}}) < 1e-7, algo)
  end
end

U.run()
