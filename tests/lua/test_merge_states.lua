-- fa.merge_states (docs/lua-api.md §2): two partial attentions over disjoint key sets
-- merged in log space equal the attention over all keys; an empty state
-- (lse = −inf) leaves the other unchanged.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

TestMerge = {}

local function split_and_merge(q, k, v, n1, algo, dim)
  local Lk = k:size(dim)
  local k1, k2 = k:narrow(dim, 1, n1), k:narrow(dim, n1 + 1, Lk - n1)
  local v1, v2 = v:narrow(dim, 1, n1), v:narrow(dim, n1 + 1, Lk - n1)
  local o1, l1 = fa.attention(q, k1, v1, {algo = algo, return_lse = true})
  local o2, l2 = fa.attention(q, k2, v2, {algo = algo, return_lse = true})
  return fa.merge_states(o1, l1, o2, l2)
end

function TestMerge:test_two_halves_make_the_whole()
  local shapes = {
    {{2, 3, 17, 16}, {2, 3, 40, 16}, {2, 3, 40, 8}, 3},  -- 4-D, Dv != D
    {{4, 9, 32}, {2, 33, 32}, {2, 33, 32}, 2},           -- 3-D, GQA
    {{7, 16}, {129, 16}, {129, 16}, 1},                  -- 2-D
    {{1, 1, 1, 64}, {1, 1, 1000, 64}, {1, 1, 1000, 64}, 3}, -- decode, long
  }
  for si, s in ipairs(shapes) do
    for _, dtype in ipairs(U.dtypes) do
      local q, k, v = U.randn(s[1], dtype), U.randn(s[2], dtype), U.randn(s[3], dtype)
      local dim = #s[2] - 1 -- the L dimension of k and v
      local Lk = s[2][dim]
      local ro, rl = U.reference(q, k, v, {})
      for _, n1 in ipairs({1, Lk // 2, Lk - 1}) do
        local algo = U.pick({"flash", "naive", "two_pass", "flash_row", "auto"}, si + n1)
        local o, lse = split_and_merge(q, k, v, n1, algo, dim)
        local what = ("merge %s %s split %d+%d (%s)"):format(dtype, U.shape_str(s[2]), n1, Lk - n1, algo)
        lu.assertEquals(o:dtype(), dtype, what)
        lu.assertEquals(o:device(), dev, what)
        -- lse is f32 (docs/lua-api.md), so the merge weights of f64 states carry f32 rounding
        U.assert_close(o, ro, dtype, what, math.max(U.tol[dtype], 1e-6))
        U.assert_lse(lse, rl, dtype, what .. " lse")
      end
    end
  end
end

function TestMerge:test_three_way_merge_is_associative()
  local q, k, v = U.randn({1, 2, 9, 16}), U.randn({1, 2, 30, 16}), U.randn({1, 2, 30, 16})
  local parts = {}
  for i = 0, 2 do
    local o, l = fa.attention(q, k:narrow(3, i * 10 + 1, 10), v:narrow(3, i * 10 + 1, 10), {return_lse = true})
    parts[i + 1] = {o, l}
  end
  local a, la = fa.merge_states(parts[1][1], parts[1][2], parts[2][1], parts[2][2])
  a, la = fa.merge_states(a, la, parts[3][1], parts[3][2])
  local b, lb = fa.merge_states(parts[2][1], parts[2][2], parts[3][1], parts[3][2])
  b, lb = fa.merge_states(parts[1][1], parts[1][2], b, lb)
  local ro, rl = U.reference(q, k, v, {})
  U.assert_close(a, ro, "f32", "((1,2),3)")
  U.assert_close(b, ro, "f32", "(1,(2,3))")
  U.assert_lse(la, rl, "f32")
  U.assert_lse(lb, rl, "f32")
end

function TestMerge:test_empty_state_leaves_the_other_unchanged()
  for _, dtype in ipairs(U.dtypes) do
    local q, k, v = U.randn({2, 2, 11, 8}, dtype), U.randn({2, 2, 13, 8}, dtype), U.randn({2, 2, 13, 8}, dtype)
    local o1, l1 = fa.attention(q, k, v, {return_lse = true})
    local o_empty = U.randn({2, 2, 11, 8}, dtype) -- whatever it holds, its weight is 0
    local l_empty = fa.full({2, 2, 11}, -math.huge, {dtype = "f32", device = dev})
    local o, lse = fa.merge_states(o1, l1, o_empty, l_empty)
    lu.assertEquals(fa.max_abs_diff(o, o1), 0, dtype .. ": merge(state, empty) = state")
    lu.assertEquals(fa.max_abs_diff(lse, l1), 0, dtype .. ": lse unchanged")
    o, lse = fa.merge_states(o_empty, l_empty, o1, l1)
    lu.assertEquals(fa.max_abs_diff(o, o1), 0, dtype .. ": merge(empty, state) = state")
    lu.assertEquals(fa.max_abs_diff(lse, l1), 0)
    -- both empty: zeros and −inf, no NaN
    local z = fa.zeros({2, 2, 11, 8}, {dtype = dtype, device = dev})
    o, lse = fa.merge_states(z, l_empty, z, l_empty)
    lu.assertTrue(o:isfinite(), dtype .. ": merging two empty states gives NaN")
    lu.assertEquals(o:norm(), 0)
    lu.assertEquals(lse:max(), -math.huge)
  end
end

-- f64 states (on every device) merge by the formula, in f64: checked in plain Lua.
function TestMerge:test_f64_states_follow_the_formula()
  local o1, o2 = U.randn({3, 5}, "f64"), U.randn({3, 5}, "f64")
  local l1 = fa.tensor({0.5, -math.huge, 40}, {dtype = "f64", device = dev})
  local l2 = fa.tensor({-1.25, 3, 40 + 1e-9}, {dtype = "f64", device = dev})
  local o, lse = fa.merge_states(o1, l1, o2, l2)
  lu.assertEquals(o:dtype(), "f64")
  lu.assertEquals(lse:dtype(), "f64")
  local a, b, got, gl = U.flat(o1), U.flat(o2), U.flat(o), U.flat(lse)
  local la, lb = U.flat(l1), U.flat(l2)
  for r = 1, 3 do
    local m = math.max(la[r], lb[r])
    local want_l = m + math.log(math.exp(la[r] - m) + math.exp(lb[r] - m))
    lu.assertAlmostEquals(gl[r], want_l, 1e-12, "lse row " .. r)
    for c = 1, 5 do
      local i = (r - 1) * 5 + c
      local want = math.exp(la[r] - want_l) * a[i] + math.exp(lb[r] - want_l) * b[i]
      lu.assertAlmostEquals(got[i], want, 1e-12, ("o[%d][%d]"):format(r, c))
    end
  end
end

function TestMerge:test_large_lse_weights_from_the_difference()
  -- equal states far from 0: half each (the weights come from lse1 - lse2, not from a rounded
  -- merged lse, whose rounding at 1e30 dropped log 2 and gave both a weight of 1)
  local o = fa.merge_states(fa.full({1, 3}, 1, {device = dev}), fa.tensor({1e30}, {device = dev}),
    fa.full({1, 3}, 3, {device = dev}), fa.tensor({1e30}, {device = dev}))
  lu.assertEquals(o:get(1, 1), 2)
  -- a state of lse +inf takes it whole
  local o2, l2 = fa.merge_states(fa.full({1, 2}, 1, {device = dev}), fa.tensor({math.huge}, {device = dev}),
    fa.full({1, 2}, 3, {device = dev}), fa.tensor({1}, {device = dev}))
  lu.assertEquals({o2:get(1, 1), l2:get(1)}, {1, math.huge})
  -- splits of large scores: the unsplit result (six equal keys: the mean of 0..5)
  local q, k, v = fa.ones({1, 1, 1, 1}, {device = dev}), fa.ones({1, 1, 6, 1}, {device = dev}),
    fa.arange(6, {device = dev}):view(1, 1, 6, 1)
  for _, sc in ipairs({1e10, 1e14}) do
    lu.assertEquals(fa.attention(q, k, v, {scale = sc, splits = 2}):get(1, 1, 1, 1), 2.5, "scale " .. sc)
  end
end

-- A NaN lse beside an empty state (lse = -inf) is a state, not an empty one:
-- the merge keeps it (its o and its NaN lse), as on every device.
function TestMerge:test_nan_lse_beside_an_empty_state()
  local o1, o2 = U.randn({2, 3}), U.randn({2, 3})
  local l1 = fa.tensor({0 / 0, -math.huge}, {device = dev})
  local l2 = fa.tensor({-math.huge, 0 / 0}, {device = dev})
  local o, lse = fa.merge_states(o1, l1, o2, l2)
  lu.assertEquals(fa.max_abs_diff(o:narrow(1, 1, 1), o1:narrow(1, 1, 1)), 0)
  lu.assertEquals(fa.max_abs_diff(o:narrow(1, 2, 1), o2:narrow(1, 2, 1)), 0)
  local l = U.flat(lse)
  lu.assertTrue(l[1] ~= l[1] and l[2] ~= l[2], "the NaN lse is kept")
end

-- Rows that are fully masked in one part (lse = −inf there) merge right.
function TestMerge:test_partially_empty_rows()
  local q, k, v = U.randn({1, 1, 12, 8}), U.randn({1, 1, 12, 8}), U.randn({1, 1, 12, 8})
  -- causal top_left over the whole, split into keys 1..6 and 7..12: rows 1..6
  -- see nothing of the second half
  local m1 = fa.tensor(U.nested({12, 6}, function(i, j) return j <= i end), {device = dev})
  local m2 = fa.tensor(U.nested({12, 6}, function(i, j) return j + 6 <= i end), {device = dev})
  local o1, l1 = fa.attention(q, k:narrow(3, 1, 6), v:narrow(3, 1, 6), {mask = m1, return_lse = true})
  local o2, l2 = fa.attention(q, k:narrow(3, 7, 6), v:narrow(3, 7, 6), {mask = m2, return_lse = true})
  lu.assertEquals(l2:narrow(3, 1, 6):max(), -math.huge)
  local o, lse = fa.merge_states(o1, l1, o2, l2)
  local ro, rl = U.reference(q, k, v, {causal = "top_left"})
  U.assert_close(o, ro, "f32", "merge with empty rows")
  U.assert_lse(lse, rl, "f32")
end

function TestMerge:test_errors()
  local o = U.randn({2, 3, 4})
  local l = U.randn({2, 3})
  U.assert_fa_error({}, fa.merge_states, o, l, U.randn({2, 3, 5}), l)
  U.assert_fa_error({}, fa.merge_states, o, l, o, U.randn({2, 4}))
  U.assert_fa_error({}, fa.merge_states, o, U.randn({2, 3, 4}), o, l)
  U.assert_fa_error({"lse1"}, fa.merge_states, o, nil, o, l)
  U.assert_fa_error({"o2"}, fa.merge_states, o, l, "x", l)
  -- tables: an element is named as such, and a mismatched lse by its own shape
  local ok, err = pcall(fa.merge_states, {o, "x"}, {l, l})
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err), "os[2]")
  lu.assertNil(tostring(err):find("#-", 1, true), tostring(err))
  U.assert_fa_error({"lses[2] is 2x4"}, fa.merge_states, {o, o}, {l, U.randn({2, 4})})
  local f = U.randn({2, 3, 4})
  f:free()
  U.assert_fa_error({}, fa.merge_states, o, l, f, l)
  -- still works
  local m = fa.merge_states(o, l, o, l)
  U.assert_close(m, o:double(), "f32", "merge of a state with itself")
end


-- fa.merge_states(os, lses): any number of states at once (docs/lua-api.md §2), on the keys cut
-- into pieces, some of them empty (lse = -inf, zeros), equals the attention over all keys.
function TestMerge:test_many_states_make_the_whole()
  for _, dtype in ipairs(U.dtypes) do
    local q, k, v = U.randn({2, 3, 5, 16}, dtype), U.randn({2, 3, 40, 16}, dtype), U.randn({2, 3, 40, 8}, dtype)
    local ro, rl = U.reference(q, k, v, {})
    local cuts = {0, 7, 7, 20, 21, 33, 40}
    local os, lses = {}, {}
    for i = 1, #cuts - 1 do
      local n = cuts[i + 1] - cuts[i]
      if n > 0 then
        os[#os + 1], lses[#lses + 1] = fa.attention(q, k:narrow(3, cuts[i] + 1, n), v:narrow(3, cuts[i] + 1, n),
          {return_lse = true})
      else
        os[#os + 1] = fa.zeros({2, 3, 5, 8}, {dtype = dtype, device = dev})
        lses[#lses + 1] = fa.full({2, 3, 5}, -math.huge, {dtype = "f32", device = dev})
      end
    end
    local o, lse = fa.merge_states(os, lses)
    local what = ("merge of %d states %s"):format(#os, dtype)
    lu.assertEquals(o:dtype(), dtype, what)
    lu.assertEquals(o:device(), dev, what)
    U.assert_close(o, ro, dtype, what, math.max(U.tol[dtype], 1e-6))
    U.assert_lse(lse, rl, dtype, what .. " lse")
    -- the two-state form agrees with the table form of two
    local o2, l2 = fa.merge_states(os[1], lses[1], os[4], lses[4])
    local o3, l3 = fa.merge_states({os[1], os[4]}, {lses[1], lses[4]})
    U.assert_close(o3, o2, dtype, what .. " two states", math.max(U.tol[dtype], 1e-6))
    U.assert_close(l3, l2, "f32", what .. " two states lse")
  end
end

-- Empty states are exact: a state merged with any number of empty ones comes back bit for bit
-- (in a fresh tensor), and all-empty gives zeros and -inf.
function TestMerge:test_many_states_empty_ones_exact()
  for _, dtype in ipairs(U.dtypes) do
    local o1, l1 = fa.attention(U.randn({2, 4, 16}, dtype), U.randn({2, 9, 16}, dtype), U.randn({2, 9, 16}, dtype),
      {return_lse = true})
    local e, el = fa.zeros({2, 4, 16}, {dtype = dtype, device = dev}), fa.full({2, 4}, -math.huge, {device = dev})
    local o, lse = fa.merge_states({e, o1, e, e}, {el, l1, el, el})
    lu.assertEquals(fa.max_abs_diff(o, o1), 0, dtype)
    lu.assertEquals(fa.max_abs_diff(lse, l1), 0, dtype)
    local one, lone = fa.merge_states({o1}, {l1})
    lu.assertEquals(fa.max_abs_diff(one, o1), 0, dtype)
    lu.assertFalse(rawequal(one, o1), "a fresh tensor for one state")
    one:fill_(7)
    lu.assertTrue(o1:max() < 7, "the input is untouched")
    local z, lz = fa.merge_states({e, e}, {el, el})
    lu.assertEquals(z:norm(), 0)
    lu.assertEquals(lz:max(), -math.huge)
    lu.assertEquals(lone:dtype(), l1:dtype())
  end
end

function TestMerge:test_many_states_errors()
  local o, l = U.randn({2, 4, 8}, "f32"), fa.zeros({2, 4}, {device = dev})
  U.assert_fa_error({"at least one"}, fa.merge_states, {}, {})
  U.assert_fa_error({"os holds 2", "lses 1"}, fa.merge_states, {o, o}, {l})
  U.assert_fa_error({"os[3]"}, fa.merge_states, {o, o, U.randn({2, 4, 9}, "f32")}, {l, l, l})
  U.assert_fa_error({"lses[2]"}, fa.merge_states, {o, o}, {l, fa.zeros({2, 5}, {device = dev})})
  U.assert_fa_error({"os[2]"}, fa.merge_states, {o, 5}, {l, l})
  U.assert_fa_error({"lses"}, fa.merge_states, {o}, nil)
  -- more arguments than a form takes are refused, not dropped (a third state as two more arguments)
  U.assert_fa_error({"fa.merge_states", "(o1, lse1, o2, lse2)", "got 6", "{o1, o2, ...}"}, fa.merge_states, o, l, o, l, o, l)
  U.assert_fa_error({"fa.merge_states", "(os, lses)", "got 3"}, fa.merge_states, {o, o}, {l, l}, {o})
  lu.assertEquals(U.flat(fa.merge_states(o, l, o, l, nil)), U.flat(fa.merge_states(o, l, o, l)))
  local freed = U.randn({2, 4, 8}, "f32")
  freed:free()
  U.assert_fa_error({"os[2]", "freed"}, fa.merge_states, {o, freed}, {l, l})
  if dev == "cpu" then
    U.assert_fa_error({"dtype"}, fa.merge_states, {o, o:to("f64")}, {l, l})
  end
end

-- A finalizer that empties the tables and frees their tensors while the call runs loses nothing.
function TestMerge:test_many_states_hostile_finalizer()
  local os, lses = {}, {}
  for i = 1, 20 do os[i], lses[i] = U.randn({3, 4, 8}, "f32"), fa.zeros({3, 4}, {device = dev}) end
  local before = fa.memory().current
  for _ = 1, 5 do
    setmetatable({}, {__gc = function()
      for i = 1, #os do os[i]:free(); os[i] = nil; lses[i] = nil end
    end})
  end
  collectgarbage("step", 0)
  local ok, o = pcall(fa.merge_states, os, lses)
  lu.assertTrue(ok or tostring(o):find("^flashattn:") ~= nil, tostring(o))
  collectgarbage()
  lu.assertTrue(fa.memory().current <= before, "nothing kept")
end

U.run()
