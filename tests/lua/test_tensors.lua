-- Tensors (docs/lua-api.md §1): constructors, methods, metamethods, views, dtype
-- conversions, reductions, arithmetic, freeing, comparison helpers.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

local function f32(x) return (string.unpack("f", string.pack("f", x))) end

local function assert_fa_error(words, f, ...) return U.assert_fa_error(words, f, ...) end

TestConstructors = {}

function TestConstructors:test_tensor_from_nested_table()
  local t = fa.tensor({{1, 2, 3}, {4, 5, 6}}, {device = dev})
  lu.assertEquals(t:shape(), {2, 3})
  lu.assertEquals(t:dim(), 2)
  lu.assertEquals(t:numel(), 6)
  lu.assertEquals(#t, 2)
  lu.assertEquals(t:size(1), 2)
  lu.assertEquals(t:size(2), 3)
  lu.assertEquals(t:dtype(), "f32")
  lu.assertEquals(t:device(), dev)
  lu.assertEquals(t:totable(), {{1, 2, 3}, {4, 5, 6}})
  lu.assertEquals(t:get(2, 3), 6)
  -- 1-D, 3-D, 4-D
  lu.assertEquals(fa.tensor({7, 8}, {device = dev}):totable(), {7, 8})
  local t3 = fa.tensor({{{1, 2}}, {{3, 4}}}, {device = dev})
  lu.assertEquals(t3:shape(), {2, 1, 2})
  local t4 = fa.tensor({{{{1}, {2}}}}, {device = dev})
  lu.assertEquals(t4:shape(), {1, 1, 2, 1})
  lu.assertEquals(t4:get(1, 1, 2, 1), 2)
end

function TestConstructors:test_tensor_ragged_and_bad_tables()
  assert_fa_error({}, fa.tensor, {{1, 2}, {3}})
  assert_fa_error({}, fa.tensor, {{1, 2}, 3})
  assert_fa_error({}, fa.tensor, {1, "x"})
  assert_fa_error({}, fa.tensor, {{{{{1}}}}}) -- 5 dimensions
  assert_fa_error({}, fa.tensor, 3)
  -- holes and keys outside 1..n are errors, not dropped elements
  assert_fa_error({"ragged", "key 4"}, fa.tensor, {{1, 2}, {3, 4, [4] = 9}})
  assert_fa_error({"ragged", "key 4"}, fa.tensor, {{1, 2}, {3, 4}, [4] = {5, 6}})
  assert_fa_error({"ragged", "'x'"}, fa.tensor, {1, 2, x = 3})
  -- every constructor takes the opts {dtype=, device=, seed=} (seed used by rand and randn)
  lu.assertEquals(fa.zeros(3, {seed = 2}):sum(), 0)
  lu.assertEquals(fa.tensor({1, 2}, {seed = 2}):sum(), 3)
  lu.assertEquals(fa.arange(3, {seed = 2}):sum(), 3)
  assert_fa_error({"seed", "integer"}, fa.zeros, 3, {seed = 1.5})
  -- messages that name what stands where
  assert_fa_error({"value", "string"}, fa.full, 2, "x")
  assert_fa_error({"dtype", "bool"}, fa.rand, 3, {dtype = "bool"})
  assert_fa_error({"3 indices and a value"}, function() return fa.zeros(2, 2, 2):set(1, 1, 1) end)
  assert_fa_error({"rtol", ">= 0"}, fa.allclose, fa.ones(2), fa.ones(2), -1)
  assert_fa_error({"atol", ">= 0"}, fa.allclose, fa.ones(2), fa.ones(2), 0, 0 / 0)
end

function TestConstructors:test_tensor_dtypes_and_aliases()
  for alias, canon in pairs({f32 = "f32", float = "f32", f16 = "f16", half = "f16", bf16 = "bf16",
                             bfloat16 = "bf16", f64 = "f64", double = "f64"}) do
    local t = fa.tensor({1, 2}, {dtype = alias, device = dev})
    lu.assertEquals(t:dtype(), canon, alias)
    lu.assertEquals(fa.zeros(3, {dtype = alias, device = dev}):dtype(), canon, alias)
  end
  assert_fa_error({"dtype"}, fa.zeros, 3, {dtype = "f8"})
  assert_fa_error({"device"}, fa.zeros, 3, {device = "tpu"})
end

function TestConstructors:test_bool_from_table_of_booleans()
  local m = fa.tensor({{true, false}, {false, true}}, {device = dev})
  lu.assertEquals(m:dtype(), "bool")
  lu.assertEquals(m:shape(), {2, 2})
  local m2 = fa.tensor({1, 0}, {dtype = "bool", device = dev})
  lu.assertEquals(m2:dtype(), "bool")
end

function TestConstructors:test_zeros_ones_full_shapes()
  for _, mk in ipairs({
    function(o) return fa.zeros(2, 3, o) end,
    function(o) return fa.zeros({2, 3}, o) end,
  }) do
    local t = mk({dtype = "f16", device = dev})
    lu.assertEquals(t:shape(), {2, 3})
    lu.assertEquals(t:dtype(), "f16")
    lu.assertEquals(t:sum(), 0)
  end
  local o = fa.ones(4, 5, {device = dev})
  lu.assertEquals(o:shape(), {4, 5})
  lu.assertEquals(o:sum(), 20)
  lu.assertEquals(fa.ones({2, 2, 2, 2}, {dtype = "f64", device = dev}):sum(), 16)
  local f = fa.full({2, 3}, 2.5, {device = dev})
  lu.assertEquals(f:totable(), {{2.5, 2.5, 2.5}, {2.5, 2.5, 2.5}})
  lu.assertEquals(fa.full({3}, -1, {dtype = "bf16", device = dev}):totable(), {-1, -1, -1})
  lu.assertEquals(fa.zeros(3):dtype(), "f32") -- default dtype
  assert_fa_error({}, fa.zeros, 1, 2, 3, 4, 5)
  assert_fa_error({}, fa.zeros, {2, -3})
  assert_fa_error({}, fa.zeros, {})
  assert_fa_error({}, fa.zeros, "x")
  assert_fa_error({}, fa.full, {2}, "x")
end

function TestConstructors:test_arange()
  lu.assertEquals(fa.arange(5, {device = dev}):totable(), {0, 1, 2, 3, 4})
  local a = fa.arange(300, {dtype = "f16", device = dev})
  lu.assertEquals(a:dtype(), "f16")
  lu.assertEquals(a:get(300), 299)
  lu.assertEquals(fa.arange(1):totable(), {0})
end

function TestConstructors:test_rand_and_randn()
  local r = fa.rand({100, 100}, {device = dev, seed = 11})
  lu.assertTrue(r:min() >= 0)
  lu.assertTrue(r:max() < 1)
  local mean = r:sum() / r:numel()
  lu.assertTrue(math.abs(mean - 0.5) < 0.02, "uniform mean " .. mean)
  local n = fa.randn({100, 100}, {device = dev, seed = 12})
  local nm = n:sum() / n:numel()
  local sd = n:norm() / math.sqrt(n:numel())
  lu.assertTrue(math.abs(nm) < 0.04, "normal mean " .. nm)
  lu.assertTrue(math.abs(sd - 1) < 0.04, "normal sd " .. sd)
  -- same seed, same values; another seed, others; no seed, fresh values
  lu.assertEquals(fa.max_abs_diff(fa.randn({50}, {seed = 5, device = dev}), fa.randn({50}, {seed = 5, device = dev})), 0)
  lu.assertTrue(fa.max_abs_diff(fa.randn({50}, {seed = 5, device = dev}), fa.randn({50}, {seed = 6, device = dev})) > 0)
  lu.assertTrue(fa.max_abs_diff(fa.randn({50}, {device = dev}), fa.randn({50}, {device = dev})) > 0)
  lu.assertTrue(fa.max_abs_diff(fa.rand({50}, {device = dev}), fa.rand({50}, {device = dev})) > 0)
  -- [0, 1) in every dtype: values f32, f16, bf16 would round up to 1 are kept below it
  for _, dt in ipairs({"f16", "bf16"}) do
    lu.assertTrue(fa.rand(100000, {seed = 11, dtype = dt, device = dev}):max() < 1, dt)
  end
  lu.assertEquals(fa.rand(1, {seed = -4844470182302707374, device = dev}):get(1), 1 - 2 ^ -24)
end

-- the same seed gives the same values on every dtype (and device), up to
-- rounding to the dtype
function TestConstructors:test_random_same_across_dtypes_and_devices()
  local seed = U.next_seed()
  for _, kind in ipairs({"randn", "rand"}) do
    local ref = fa[kind]({7, 33}, {seed = seed, dtype = "f64", device = "cpu"})
    local rv = U.flat(ref)
    for _, dt in ipairs(U.all_dtypes) do
      local devices = {dev}
      if dev ~= "cpu" then devices[2] = "cpu" end
      for _, d in ipairs(devices) do
        local t = fa[kind]({7, 33}, {seed = seed, dtype = dt, device = d})
        local tv = U.flat(t)
        local rel = ({f64 = 1e-15, f32 = 2 ^ -21, f16 = 2 ^ -10, bf16 = 2 ^ -7})[dt]
        for i = 1, #rv do
          local tolx = rel * math.max(math.abs(rv[i]), dt == "f16" and 2 ^ -14 or 1e-30) + 1e-300
          if math.abs(tv[i] - rv[i]) > tolx then
            lu.fail(("%s seed %d: %s on %s element %d = %.9g, f64 gives %.9g"):format(kind, seed, dt, d, i, tv[i], rv[i]))
          end
        end
      end
    end
  end
end

TestMethods = {}

function TestMethods:test_shape_is_a_new_table()
  local t = fa.zeros(2, 3, {device = dev})
  local s = t:shape()
  s[1] = 99
  lu.assertEquals(t:shape(), {2, 3})
end

function TestMethods:test_get_set_and_bounds()
  local t = fa.zeros({2, 3, 4}, {device = dev})
  t:set(2, 3, 4, 7.5)
  t:set(1, 1, 1, -2)
  lu.assertEquals(t:get(2, 3, 4), 7.5)
  lu.assertEquals(t:get(1, 1, 1), -2)
  lu.assertEquals(t:sum(), 5.5)
  assert_fa_error({}, t.get, t, 3, 1, 1)
  assert_fa_error({}, t.get, t, 0, 1, 1)
  assert_fa_error({}, t.get, t, 1, 1)        -- too few indices
  assert_fa_error({}, t.get, t, 1, 1, 1, 1)  -- too many
  assert_fa_error({}, t.set, t, 1, 1, 5, 1)
  assert_fa_error({}, t.set, t, 1, 1, 1, "x")
end

function TestMethods:test_index_1d_is_number_nd_is_view()
  local t = fa.tensor({{1, 2, 3}, {4, 5, 6}}, {device = dev})
  local row = t[2]
  lu.assertEquals(type(row), "userdata")
  lu.assertEquals(row:shape(), {3})
  lu.assertEquals(row:totable(), {4, 5, 6})
  lu.assertEquals(row[3], 6)
  lu.assertEquals(type(row[3]), "number")
  -- a write through the view shows in the base
  row:set(1, 40)
  lu.assertEquals(t:get(2, 1), 40)
  row:fill_(9)
  lu.assertEquals(t:totable(), {{1, 2, 3}, {9, 9, 9}})
  -- 4-D: t[i] is 3-D
  local t4 = fa.zeros({2, 3, 4, 5}, {device = dev})
  lu.assertEquals(t4[2]:shape(), {3, 4, 5})
  t4[2][3][4]:fill_(1)
  lu.assertEquals(t4:sum(), 5)
  lu.assertEquals(t4:get(2, 3, 4, 5), 1)
  -- reads past either end are nil, as in a Lua sequence (tests/lua/test_iteration.lua)
  lu.assertNil(t[3])
  lu.assertNil(t[0])
  -- methods still reachable through __index
  lu.assertEquals(type(t.shape), "function")
end

function TestMethods:test_views_share_storage()
  local t = fa.arange(24, {device = dev}):view(2, 3, 4)
  lu.assertEquals(t:shape(), {2, 3, 4})
  lu.assertEquals(t:get(2, 1, 1), 12)
  local v = t:view({6, 4})
  lu.assertEquals(v:shape(), {6, 4})
  v:set(6, 4, -1)
  lu.assertEquals(t:get(2, 3, 4), -1)
  -- select removes the dimension
  local s = t:select(2, 3)
  lu.assertEquals(s:shape(), {2, 4})
  lu.assertEquals(s:totable(), {{8, 9, 10, 11}, {20, 21, 22, -1}})
  s:set(1, 1, 100)
  lu.assertEquals(t:get(1, 3, 1), 100)
  -- narrow keeps it, 1-based start
  local n = t:narrow(3, 2, 2)
  lu.assertEquals(n:shape(), {2, 3, 2})
  lu.assertEquals(n:get(1, 1, 1), 1)
  lu.assertEquals(n:get(2, 3, 2), 22)
  lu.assertFalse(n:is_contiguous())
  n:fill_(0)
  lu.assertEquals(t:get(1, 1, 2), 0)
  lu.assertEquals(t:get(1, 1, 1), 0) -- untouched element stays (it was 0)
  lu.assertEquals(t:get(1, 1, 4), 3)
  -- transpose
  local tr = t:transpose(1, 3)
  lu.assertEquals(tr:shape(), {4, 3, 2})
  lu.assertFalse(tr:is_contiguous())
  lu.assertEquals(tr:get(4, 2, 1), t:get(1, 2, 4))
  tr:set(4, 2, 1, 55)
  lu.assertEquals(t:get(1, 2, 4), 55)
  lu.assertTrue(t:is_contiguous())
  -- bad arguments
  assert_fa_error({}, t.view, t, 5, 5)
  assert_fa_error({}, t.select, t, 4, 1)
  assert_fa_error({}, t.select, t, 1, 3)
  assert_fa_error({}, t.narrow, t, 3, 4, 2)
  assert_fa_error({}, t.narrow, t, 3, 0, 1)
  assert_fa_error({}, t.transpose, t, 1, 5)
end

function TestMethods:test_view_of_noncontiguous_errors_reshape_copies()
  local t = fa.arange(6, {device = dev}):view(2, 3)
  local tr = t:transpose(1, 2)
  assert_fa_error({}, tr.view, tr, 6)
  local r = tr:reshape(6)
  lu.assertEquals(r:totable(), {0, 3, 1, 4, 2, 5})
  r:set(1, 42) -- a copy: the base is untouched
  lu.assertEquals(t:get(1, 1), 0)
  -- reshape of a contiguous tensor is a view
  local r2 = t:reshape({3, 2})
  r2:set(1, 1, 42)
  lu.assertEquals(t:get(1, 1), 42)
end

function TestMethods:test_view_and_reshape_of_compatible_strides()
  -- a narrow's rows split, or a transpose's last dimension split: views (PyTorch's rule)
  local base = fa.zeros({4, 6}, {device = dev})
  local r = base:narrow(2, 1, 3):reshape(2, 2, 3)
  r:fill_(1)
  lu.assertEquals(base:sum(), 12)
  local t = fa.arange(24, {device = dev}):view(2, 3, 4):transpose(1, 2) -- 3x2x4
  local v = t:view(3, 2, 2, 2)
  v:set(2, 1, 2, 1, 99)
  lu.assertEquals(t:get(2, 1, 3), 99)
  -- a column of a row-major matrix: any shape of its elements
  local col = fa.arange(12, {device = dev}):view(3, 4):select(2, 2)
  lu.assertEquals(col:view(3, 1):totable(), {{1}, {5}, {9}})
  -- flattening a narrow's rows needs a copy: reshape makes one, view refuses
  local flat = base:narrow(2, 1, 3):reshape(12)
  flat:fill_(5)
  lu.assertEquals(base:sum(), 12)
  assert_fa_error({"reshape"}, function() return base:narrow(2, 1, 3):view(12) end)
end

function TestMethods:test_contiguous()
  local t = fa.arange(12, {device = dev}):view(3, 4)
  lu.assertTrue(rawequal(t:contiguous(), t) or t:contiguous():is_contiguous())
  local tr = t:transpose(1, 2)
  local c = tr:contiguous()
  lu.assertTrue(c:is_contiguous())
  lu.assertEquals(c:totable(), tr:totable())
  lu.assertEquals(c:shape(), {4, 3})
end

function TestMethods:test_to_returns_self_when_nothing_changes()
  local t = fa.ones(3, {device = dev})
  lu.assertTrue(rawequal(t:to("f32"), t), "t:to('f32') on f32")
  lu.assertTrue(rawequal(t:to(dev), t), "t:to(device) on that device")
  lu.assertTrue(rawequal(t:float(), t), "t:float() on f32")
  local h = t:half()
  lu.assertFalse(rawequal(h, t))
  lu.assertEquals(h:dtype(), "f16")
  lu.assertTrue(rawequal(h:half(), h))
  lu.assertEquals(t:double():dtype(), "f64")
  lu.assertEquals(t:bf16():dtype(), "bf16")
  lu.assertEquals(t:to("half"):dtype(), "f16")
  lu.assertEquals(t:cpu():device(), "cpu")
  lu.assertEquals(t:to("bfloat16"):totable(), {1, 1, 1})
  assert_fa_error({}, t.to, t, "f8")
  -- a converted copy is independent
  local d = t:double()
  d:fill_(3)
  lu.assertEquals(t:sum(), 3)
end

function TestMethods:test_clone_copy_fill()
  local t = fa.arange(6, {device = dev}):view(2, 3)
  local c = t:clone()
  c:fill_(1)
  lu.assertEquals(t:sum(), 15)
  lu.assertEquals(c:sum(), 6)
  -- copy_ across dtypes (and from the CPU)
  local h = fa.zeros({2, 3}, {dtype = "f16", device = dev})
  h:copy_(t)
  lu.assertEquals(h:totable(), {{0, 1, 2}, {3, 4, 5}})
  local src = fa.tensor({{6, 5, 4}, {3, 2, 1}}, {dtype = "f64", device = "cpu"})
  h:copy_(src)
  lu.assertEquals(h:totable(), {{6, 5, 4}, {3, 2, 1}})
  -- copy_ of a transposed view
  local d = fa.zeros({3, 2}, {device = dev})
  d:copy_(t:transpose(1, 2))
  lu.assertEquals(d:totable(), {{0, 3}, {1, 4}, {2, 5}})
  -- copy_ into a view
  t:select(1, 1):copy_(fa.tensor({7, 8, 9}, {device = dev}))
  lu.assertEquals(t:totable(), {{7, 8, 9}, {3, 4, 5}})
  assert_fa_error({}, h.copy_, h, fa.zeros(3, 2, {device = dev}))
  assert_fa_error({}, h.copy_, h, 5)
  lu.assertEquals(fa.zeros(2, {dtype = "bf16", device = dev}):fill_(0.5):totable(), {0.5, 0.5})
end

function TestMethods:test_totable_of_views_and_dtypes()
  local t = fa.arange(8, {dtype = "bf16", device = dev}):view(2, 2, 2)
  lu.assertEquals(t:totable(), {{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}})
  lu.assertEquals(t:transpose(1, 3):totable(), {{{0, 4}, {2, 6}}, {{1, 5}, {3, 7}}})
end

function TestMethods:test_tostring()
  local t = fa.tensor({{1, 2, 3}, {4, 5, 6}}, {device = dev})
  local s = tostring(t)
  lu.assertStrContains(s, "[flashattn.Tensor f32 " .. dev .. " 2x3]")
  lu.assertStrContains(s, "5")
  local h = fa.zeros({2, 3, 4, 5}, {dtype = "bf16", device = dev})
  lu.assertStrContains(tostring(h), "[flashattn.Tensor bf16 " .. dev .. " 2x3x4x5]")
  -- large tensors are elided in the middle
  local big = fa.arange(100000, {device = dev})
  local bs = tostring(big)
  lu.assertTrue(#bs < 4000, "tostring of 100000 elements has " .. #bs .. " characters")
  lu.assertStrContains(bs, "[flashattn.Tensor f32 " .. dev .. " 100000]")
  lu.assertStrContains(bs, "99999")
end

-- dtype conversions: rounding to nearest even, f16 range, inf and NaN kept
TestConversions = {}

local function roundtrip(x, dtype)
  return fa.tensor({x}, {dtype = "f64", device = "cpu"}):to(dev):to(dtype):get(1)
end

function TestConversions:test_f16()
  lu.assertEquals(roundtrip(65504, "f16"), 65504)
  lu.assertEquals(roundtrip(65519, "f16"), 65504) -- below the halfway point
  lu.assertEquals(roundtrip(65520, "f16"), math.huge) -- halfway to 2^16: even -> inf
  lu.assertEquals(roundtrip(1e6, "f16"), math.huge)
  lu.assertEquals(roundtrip(-1e6, "f16"), -math.huge)
  lu.assertEquals(roundtrip(math.huge, "f16"), math.huge)
  lu.assertTrue(U.is_nan(roundtrip(U.NaN, "f16")))
  lu.assertEquals(roundtrip(1 + 2 ^ -11, "f16"), 1)              -- tie -> even
  lu.assertEquals(roundtrip(1 + 3 * 2 ^ -11, "f16"), 1 + 2 ^ -9)  -- tie -> even
  lu.assertEquals(roundtrip(1 + 2 ^ -11 + 2 ^ -20, "f16"), 1 + 2 ^ -10)
  lu.assertEquals(roundtrip(0.1, "f16"), 0.0999755859375)
  lu.assertEquals(roundtrip(2 ^ -24, "f16"), 2 ^ -24)              -- smallest subnormal
  lu.assertEquals(roundtrip(2 ^ -25, "f16"), 0)                    -- tie -> even (0)
  lu.assertEquals(roundtrip(3 * 2 ^ -25, "f16"), 2 ^ -23)          -- tie -> even
  lu.assertEquals(roundtrip(-2.5, "f16"), -2.5)
  lu.assertEquals(fa.full({2}, 70000, {dtype = "f16", device = dev}):max(), math.huge)
end

function TestConversions:test_bf16()
  lu.assertEquals(roundtrip(1 + 2 ^ -8, "bf16"), 1)                -- tie -> even
  lu.assertEquals(roundtrip(1 + 3 * 2 ^ -8, "bf16"), 1 + 2 ^ -6)   -- tie -> even
  lu.assertEquals(roundtrip(1 + 2 ^ -8 + 2 ^ -16, "bf16"), 1 + 2 ^ -7)
  local near_max = roundtrip(3.0e38, "bf16")
  lu.assertTrue(math.abs(near_max - 3.0e38) / 3.0e38 < 2 ^ -8, "bf16(3e38) = " .. near_max)
  lu.assertEquals(roundtrip(1e39, "bf16"), math.huge)
  lu.assertEquals(roundtrip(65520, "bf16"), 65536)
  lu.assertTrue(U.is_nan(roundtrip(U.NaN, "bf16")))
  lu.assertEquals(roundtrip(-math.huge, "bf16"), -math.huge)
  lu.assertEquals(roundtrip(0.1, "bf16"), 0.10009765625)
  -- bf16 keeps f32's range: 1e30 stays finite and close
  local big = roundtrip(1e30, "bf16")
  lu.assertTrue(math.abs(big - 1e30) / 1e30 < 2 ^ -8)
end

function TestConversions:test_f32_and_f64()
  lu.assertEquals(roundtrip(0.1, "f32"), f32(0.1))
  lu.assertEquals(roundtrip(0.1, "f64"), 0.1)
  lu.assertEquals(roundtrip(1e39, "f32"), math.huge)
  lu.assertEquals(roundtrip(1 + 2 ^ -24, "f32"), 1)  -- tie -> even
  lu.assertEquals(roundtrip(1 + 3 * 2 ^ -24, "f32"), 1 + 2 ^ -22)
  lu.assertTrue(U.is_nan(roundtrip(U.NaN, "f32")))
  lu.assertEquals(fa.tensor({1 / 3}, {dtype = "f64", device = dev}):get(1), 1 / 3)
  -- set rounds to the dtype too
  local t = fa.zeros(1, {dtype = "f16", device = dev})
  t:set(1, 65519)
  lu.assertEquals(t:get(1), 65504)
end

function TestConversions:test_conversion_chain_keeps_values()
  local x = U.randn({5, 7}, "f64", 3)
  for _, dt in ipairs({"f32", "f16", "bf16"}) do
    local y = x:to(dt)
    -- converting back to f64 and down again gives the same values
    lu.assertEquals(fa.max_abs_diff(y:double():to(dt):double(), y:double()), 0)
    local rel = ({f32 = 2 ^ -24, f16 = 2 ^ -11, bf16 = 2 ^ -8})[dt]
    local xv, yv = U.flat(x), U.flat(y)
    for i = 1, #xv do
      lu.assertTrue(math.abs(xv[i] - yv[i]) <= rel * math.abs(xv[i]) + 2 ^ -24, dt .. " element " .. i)
    end
  end
end

TestReductions = {}

function TestReductions:test_sum_max_min_norm()
  local t = fa.tensor({{1, -2, 3}, {4, -5, 6}}, {device = dev})
  lu.assertEquals(t:sum(), 7)
  lu.assertEquals(t:max(), 6)
  lu.assertEquals(t:min(), -5)
  lu.assertAlmostEquals(t:norm(), math.sqrt(1 + 4 + 9 + 16 + 25 + 36), 1e-12)
  -- on a view
  local v = t:narrow(2, 2, 2)
  lu.assertEquals(v:sum(), 2)
  lu.assertEquals(v:max(), 6)
  lu.assertEquals(v:min(), -5)
  -- NaN shows in the reductions
  local n = fa.tensor({1, U.NaN, 3}, {device = dev})
  lu.assertTrue(U.is_nan(n:sum()))
end

function TestReductions:test_accumulated_in_f64()
  -- 10^6 copies of f32(0.1): an f32 accumulator cannot land within 1e-6 of
  -- the exact sum 100000.00149011612
  local t = fa.full({1000, 1000}, 0.1, {dtype = "f32", device = dev})
  local exact = 1e6 * f32(0.1)
  lu.assertTrue(math.abs(t:sum() - exact) < 1e-6, ("sum %.12f, exact %.12f"):format(t:sum(), exact))
  lu.assertTrue(math.abs(t:norm() - math.sqrt(1e6) * f32(0.1)) < 1e-7)
  -- f16 elements summed exactly
  local h = fa.full({4096}, 1 / 3, {dtype = "f16", device = dev})
  local one = h:get(1)
  lu.assertTrue(math.abs(h:sum() - 4096 * one) < 1e-9)
end

TestArithmetic = {}

function TestArithmetic:test_scalar_and_tensor_ops()
  local a = fa.tensor({1, 2, 4}, {device = dev})
  local b = fa.tensor({2, 2, 2}, {device = dev})
  lu.assertEquals((a + 1):totable(), {2, 3, 5})
  lu.assertEquals((1 + a):totable(), {2, 3, 5})
  lu.assertEquals((a - 1):totable(), {0, 1, 3})
  lu.assertEquals((2 - a):totable(), {1, 0, -2})
  lu.assertEquals((a * 3):totable(), {3, 6, 12})
  lu.assertEquals((3 * a):totable(), {3, 6, 12})
  lu.assertEquals((a / 2):totable(), {0.5, 1, 2})
  lu.assertEquals((2 / a):totable(), {2, 1, 0.5})
  lu.assertEquals((-a):totable(), {-1, -2, -4})
  lu.assertEquals((a + b):totable(), {3, 4, 6})
  lu.assertEquals((a - b):totable(), {-1, 0, 2})
  lu.assertEquals((a * b):totable(), {2, 4, 8})
  lu.assertEquals((a / b):totable(), {0.5, 1, 2})
  lu.assertEquals(a:add(1):totable(), {2, 3, 5})
  lu.assertEquals(a:sub(b):totable(), {-1, 0, 2})
  lu.assertEquals(a:mul(b):totable(), {2, 4, 8})
  lu.assertEquals(a:div(2):totable(), {0.5, 1, 2})
  -- one operand: a second is refused, not dropped (Torch7's a:add(value, y) is a + value * y)
  U.assert_fa_error({"t:add", "one operand", "got 2", "value * y"}, function() return a:add(2, b) end)
  for _, m in ipairs({"sub", "mul", "div"}) do
    U.assert_fa_error({"t:" .. m, "one operand", "got 2"}, function() return a[m](a, b, 2) end)
  end
  lu.assertEquals(a:add(1, nil):totable(), {2, 3, 5})
  -- new tensors: a is untouched, dtype kept
  lu.assertEquals(a:totable(), {1, 2, 4})
  local h = a:half() * 2
  lu.assertEquals(h:dtype(), "f16")
  lu.assertEquals(h:device(), dev)
  -- division by zero gives inf, 0/0 NaN
  local z = a / 0
  lu.assertEquals(z:get(1), math.huge)
  lu.assertFalse(z:isfinite())
  -- on views
  local m = fa.arange(6, {device = dev}):view(2, 3)
  lu.assertEquals((m:transpose(1, 2) * 1):totable(), {{0, 3}, {1, 4}, {2, 5}})
  lu.assertEquals((m:select(1, 2) + m:select(1, 1)):totable(), {3, 5, 7})
  -- shape mismatch and bad operands
  assert_fa_error({}, function() return a + fa.ones(4, {device = dev}) end)
  assert_fa_error({}, function() return a + "x" end)
  assert_fa_error({}, function() return a * {} end)
  assert_fa_error({}, a.add, a, nil)
end

function TestArithmetic:test_number_on_the_left()
  -- s - t and s / t per element in f64, rounded once to t's dtype
  local m = fa.tensor({true, false, true}, {device = dev})
  lu.assertEquals((1 - m):totable(), {0, 1, 0})
  lu.assertEquals((1 - m):dtype(), "bool")
  lu.assertEquals((100000 / fa.full(1, 4, {dtype = "f16", device = dev})):get(1), 24992) -- 25000 in f16
  lu.assertEquals((1e39 / fa.full(1, 1e30, {device = dev})):get(1), f32(1e9))
  lu.assertEquals((3 - fa.tensor({1, 2.5}, {device = dev})):totable(), {2, 0.5})
  lu.assertEquals((1 / fa.tensor({4, -0.5}, {device = dev})):totable(), {0.25, -2})
end

function TestArithmetic:test_other_operators_are_flashattn_errors()
  -- the operators tensors do not define raise an error naming them (Lua's own said "attempt to perform
  -- arithmetic on a userdata value"); == stays identity
  local t = U.randn({2, 3})
  local cases = {
    {"%", function() return t % 2 end}, {"^", function() return 2 ^ t end}, {"//", function() return t // 2 end},
    {"&", function() return t & 1 end}, {"|", function() return 1 | t end}, {"~", function() return ~t end},
    {"<<", function() return t << 1 end}, {">>", function() return t >> 1 end},
    {"..", function() return "t = " .. t end}, {"<", function() return t < t end},
    {"<=", function() return t <= t end}, {"<", function() return t > t end},
  }
  for _, c in ipairs(cases) do U.assert_fa_error({"operator " .. c[1] .. " is not defined"}, c[2]) end
  lu.assertTrue(t == t)
  lu.assertFalse(t == t:clone())
end

function TestArithmetic:test_isfinite()
  lu.assertTrue(fa.ones(5, {device = dev}):isfinite())
  lu.assertFalse(fa.tensor({1, U.NaN}, {device = dev}):isfinite())
  lu.assertFalse(fa.tensor({1, math.huge}, {device = dev}):isfinite())
  lu.assertFalse(fa.tensor({-math.huge, 1}, {dtype = "f16", device = dev}):isfinite())
  lu.assertFalse(fa.tensor({1, U.NaN}, {dtype = "bf16", device = dev}):isfinite())
  lu.assertTrue(fa.tensor({65504}, {dtype = "f16", device = dev}):isfinite())
end

-- Freeing: free(), <close>, __gc; every later use is a flashattn error.
TestFree = {}

local function methods_on(t, other)
  return {
    shape = function() return t:shape() end,
    size = function() return t:size(1) end,
    dim = function() return t:dim() end,
    numel = function() return t:numel() end,
    len = function() return #t end,
    dtype = function() return t:dtype() end,
    device = function() return t:device() end,
    to = function() return t:to("f16") end,
    to_same = function() return t:to("f32") end,
    cpu = function() return t:cpu() end,
    float = function() return t:float() end,
    half = function() return t:half() end,
    bf16 = function() return t:bf16() end,
    double = function() return t:double() end,
    clone = function() return t:clone() end,
    copy_into = function() return t:copy_(other) end,
    copy_from = function() return other:copy_(t) end,
    fill_ = function() return t:fill_(1) end,
    get = function() return t:get(1, 1) end,
    set = function() return t:set(1, 1, 2) end,
    index = function() return t[1] end,
    view = function() return t:view(6) end,
    reshape = function() return t:reshape(6) end,
    select = function() return t:select(1, 1) end,
    narrow = function() return t:narrow(1, 1, 1) end,
    transpose = function() return t:transpose(1, 2) end,
    contiguous = function() return t:contiguous() end,
    is_contiguous = function() return t:is_contiguous() end,
    totable = function() return t:totable() end,
    sum = function() return t:sum() end,
    max = function() return t:max() end,
    min = function() return t:min() end,
    norm = function() return t:norm() end,
    add = function() return t:add(1) end,
    sub = function() return t:sub(other) end,
    mul = function() return t:mul(2) end,
    div = function() return t:div(2) end,
    op_add = function() return t + 1 end,
    op_radd = function() return other + t end,
    op_sub = function() return 2 - t end,
    op_mul = function() return t * other end,
    op_div = function() return t / 2 end,
    op_unm = function() return -t end,
    isfinite = function() return t:isfinite() end,
    softmax = function() return fa.softmax(t) end,
    max_abs_diff = function() return fa.max_abs_diff(t, other) end,
    rel_error = function() return fa.rel_error(other, t) end,
    allclose = function() return fa.allclose(t, other) end,
  }
end

function TestFree:test_every_use_after_free_is_an_error()
  local t = fa.ones(2, 3, {device = dev})
  local other = fa.ones(2, 3, {device = dev})
  t:free()
  t:free() -- idempotent
  for name, f in pairs(methods_on(t, other)) do
    local ok, msg = pcall(f)
    if ok then lu.fail("use after free succeeded: " .. name) end
    if tostring(msg):sub(1, 10) ~= "flashattn:" then
      lu.fail(("use after free (%s): message %q does not start with 'flashattn:'"):format(name, tostring(msg)))
    end
  end
  -- tostring of a freed tensor does not crash (a string, or a flashattn error)
  local ok, s = pcall(tostring, t)
  lu.assertTrue(ok and type(s) == "string" or tostring(s):sub(1, 10) == "flashattn:")
  -- the other tensor is untouched
  lu.assertEquals(other:sum(), 6)
end

function TestFree:test_free_releases_memory()
  local m0 = U.mem_current()
  local t = fa.zeros({256, 256}, {device = dev})
  local m1 = fa.memory().current
  lu.assertTrue(m1 - m0 >= 256 * 256 * 4, ("memory grew by %d"):format(m1 - m0))
  t:free()
  lu.assertEquals(fa.memory().current, m0)
end

function TestFree:test_close_releases()
  local m0 = U.mem_current()
  local escaped
  do
    local t <close> = fa.zeros({128, 128}, {device = dev})
    escaped = t
    lu.assertTrue(fa.memory().current > m0)
  end
  lu.assertEquals(fa.memory().current, m0)
  U.assert_fa_error({}, function() return escaped:sum() end)
  -- closing after an explicit free is harmless
  do
    local t <close> = fa.zeros(4, {device = dev})
    t:free()
  end
end

function TestFree:test_gc_releases()
  local m0 = U.mem_current()
  do
    for _ = 1, 10 do local _t = fa.zeros({64, 64}, {device = dev}) end
  end
  lu.assertEquals(U.mem_current(), m0)
end

function TestFree:test_views_keep_storage_alive()
  local m0 = U.mem_current()
  local t = fa.arange(12, {device = dev}):view(3, 4)
  local v = t:select(1, 2)
  local tr = t:transpose(1, 2)
  t:free()
  U.assert_fa_error({}, function() return t:sum() end)
  -- the views are other tensors: they still work and hold the values
  lu.assertEquals(v:totable(), {4, 5, 6, 7})
  lu.assertEquals(tr:get(4, 3), 11)
  v:free()
  tr:free()
  lu.assertEquals(U.mem_current(), m0)
end

TestCompare = {}

function TestCompare:test_helpers()
  local a = fa.tensor({1, 2, 3}, {device = dev})
  local b = fa.tensor({1, 2, 3.5}, {device = dev})
  lu.assertAlmostEquals(fa.max_abs_diff(a, b), 0.5, 1e-15)
  lu.assertAlmostEquals(fa.rel_error(a, b), 0.5 / math.sqrt(1 + 4 + 12.25), 1e-15)
  lu.assertEquals(fa.rel_error(a, a), 0)
  lu.assertTrue(fa.allclose(a, a))
  lu.assertTrue(fa.allclose(a, b, 0, 0.6))
  lu.assertFalse(fa.allclose(a, b, 0, 0.4))
  lu.assertTrue(fa.allclose(a, b, 0.15, 0))   -- |a−b| <= atol + rtol·|b|
  lu.assertFalse(fa.allclose(a, b, 0.14, 0))
  -- NaN never compares close; rel_error with NaN is NaN
  local n = fa.tensor({1, 2, U.NaN}, {device = dev})
  lu.assertFalse(fa.allclose(n, n))
  lu.assertFalse(fa.allclose(n, a, 1, 1))
  lu.assertTrue(U.is_nan(fa.rel_error(n, a)))
  -- f64 values whose squares overflow or vanish
  local F = {dtype = "f64"}
  lu.assertAlmostEquals(fa.rel_error(fa.tensor({2e300, 0}, F), fa.tensor({1e300, 0}, F)), 1, 1e-15)
  lu.assertAlmostEquals(fa.rel_error(fa.tensor({2e-300}, F), fa.tensor({1e-300}, F)), 1, 1e-15)
  lu.assertAlmostEquals(fa.rel_error(fa.tensor({3e200, 4e200}, F), fa.tensor({0, 5e200}, F)), math.sqrt(10) / 5,
    1e-15)
  lu.assertTrue(U.is_nan(fa.max_abs_diff(n, a)))
  -- across dtypes, computed in f64
  lu.assertEquals(fa.max_abs_diff(a:half(), a:double()), 0)
  -- shape mismatch is an error
  U.assert_fa_error({}, fa.max_abs_diff, a, fa.ones(4, {device = dev}))
  U.assert_fa_error({}, fa.rel_error, a, "x")
end

TestDevices = {}

function TestDevices:test_default_device_and_moves()
  local t = fa.zeros(3)
  local env = os.getenv("FLASHATTN_DEVICE")
  local has_cuda = false
  for _, b in ipairs(fa.backends()) do if b == "cuda" then has_cuda = true end end
  if env and env ~= "" then
    lu.assertEquals(t:device(), env)
  else
    lu.assertEquals(t:device(), has_cuda and "cuda" or "cpu")
  end
  if has_cuda then
    local c = fa.arange(5, {device = "cpu"}):cuda()
    lu.assertEquals(c:device(), "cuda")
    lu.assertEquals(c:cpu():totable(), {0, 1, 2, 3, 4})
    lu.assertEquals(c:to("cpu"):device(), "cpu")
  else
    U.assert_fa_error({"cuda"}, function() return fa.zeros(3, {device = "cpu"}):cuda() end)
    U.assert_fa_error({"opts.device", "'cuda' is not available"}, fa.zeros, 3, {device = "cuda"})
    -- every GPU name is refused naming its argument, also by the calls that only read figures
    -- (fa.memory("cuda") was {0, 0}, and set_memory_limit stored a limit for it)
    for _, name in ipairs({"cuda", "cuda:0", "gpu"}) do
      U.assert_fa_error({"argument #1 (device)", "not available"}, fa.memory, name)
      U.assert_fa_error({"argument #1 (device)", "not available"}, fa.reset_peak, name)
      U.assert_fa_error({"argument #1 (device)", "not available"}, fa.memory_limit, name)
      U.assert_fa_error({"argument #2 (device)", "not available"}, fa.set_memory_limit, 100, name)
      U.assert_fa_error({"argument #2 (device)", "not available"}, fa.softmax_fused_max_n, "f32", name)
      U.assert_fa_error({"argument #1 (device)", "not available"}, fa.set_default_device, name)
    end
    lu.assertEquals(fa.memory_limit("cpu"), fa.memory_limit())
  end
end

function TestDevices:test_cuda_index_names()
  -- "cuda:N" is the current GPU when N is its index; other indices are errors that say so
  local has_cuda = false
  for _, b in ipairs(fa.backends()) do has_cuda = has_cuda or b == "cuda" end
  if has_cuda then
    lu.assertEquals(fa.zeros(2, {device = "cuda:0"}):device(), "cuda")
    lu.assertEquals(fa.zeros(2, {device = "cpu"}):to("cuda:0"):device(), "cuda")
    lu.assertEquals(fa.zeros(2, {device = "cpu"}):cuda(0):device(), "cuda")
  else
    U.assert_fa_error({"not available"}, fa.zeros, 2, {device = "cuda:0"})
  end
  U.assert_fa_error({"cuda:7", has_cuda and "one GPU" or "no usable GPU"}, fa.zeros, 2, {device = "cuda:7"})
  U.assert_fa_error({"cuda:7"}, function() return fa.zeros(2, {device = "cpu"}):to("cuda:7") end)
  U.assert_fa_error({"device"}, function() return fa.zeros(2, {device = "cpu"}):cuda(-1) end)
  U.assert_fa_error({"cuda:N"}, fa.zeros, 2, {device = "cuda:x"})
end

function TestDevices:test_set_default_device()
  local before = fa.zeros(1):device()
  fa.set_default_device("cpu")
  lu.assertEquals(fa.zeros(1):device(), "cpu")
  fa.set_default_device(before)
  lu.assertEquals(fa.zeros(1):device(), before)
  U.assert_fa_error({}, fa.set_default_device, "tpu")
end

U.run()
