-- scripts/seeds.lua at CI sizes: the seed notes' claims that must hold on this
-- engine do (overflow and underflow points, traffic ratios of the cost model,
-- memory growth exponents, equality up to rounding), and the ones that do not
-- hold as stated are reported with the figures that show it.  Timings are
-- measured by the script but never checked here.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu

local seeds = assert(loadfile("scripts/seeds.lua"))({module = true})

-- The claims run once, at CI sizes with one timing repetition.
local results, ctx
local function result(id)
  if not results then
    local list
    list, ctx = seeds.run({form = "ci", device = U.device, rep = 1, seed = U.next_seed()})
    results = {}
    for _, r in ipairs(list) do results[r.id] = r end
  end
  local r = results[id]
  lu.assertNotNil(r, "no claim " .. id)
  lu.assertNotEquals(r.verdict, "error", id .. ": " .. tostring(r.measured))
  return r
end

TestSeeds = {}

function TestSeeds:test_every_claim_runs_and_is_described()
  result("f16_range")
  lu.assertEquals(#seeds.claims, 17)
  for _, c in ipairs(seeds.claims) do
    local r = result(c.id)
    for _, f in ipairs({"claim", "seeds", "claimed", "measured", "verdict"}) do
      lu.assertEquals(type(r[f]), "string", c.id .. "." .. f)
    end
    lu.assertEquals(type(r.holds), "boolean", c.id)
  end
end

function TestSeeds:test_f16_range()
  local v = result("f16_range").values
  lu.assertEquals(v.f16_max, 65504)
  lu.assertEquals(v.e_11_1_in_f16, math.huge)
end

function TestSeeds:test_naive_overflow_points()
  local r = result("f16_naive_overflow")
  lu.assertTrue(r.holds, r.measured)
  -- the first f16 value whose e^x rounds to inf: ln 65520 = 11.0900
  lu.assertTrue(r.values.last_finite < 11.09 and r.values.first_overflow >= 11.09, r.measured)
  lu.assertTrue(r.values.first_overflow - r.values.last_finite <= 2 ^ -7 + 1e-12)
  r = result("f32_naive_overflow")
  lu.assertTrue(r.holds, r.measured)
  lu.assertTrue(math.abs(r.values.first_overflow - 88.7228) < 2e-3, r.measured)
  lu.assertEquals(r.values.bf16_first_overflow, 89)
  lu.assertTrue(result("safe_no_overflow").holds, result("safe_no_overflow").measured)
end

function TestSeeds:test_inf_makes_only_the_overflowed_entry_nan()
  local r = result("inf_then_nan")
  lu.assertFalse(r.holds)
  lu.assertEquals({r.values.nan, r.values.zero, r.values.n}, {1, 7, 8})
end

function TestSeeds:test_underflow_points()
  local r = result("naive_underflow")
  lu.assertTrue(r.holds, r.measured)
  -- e^x rounds to 0 below 2^-150 (f32; below 2^-126 where the device flushes
  -- subnormals to zero, as CUDA's fast exp does) and 2^-25 (f16)
  local x32 = r.values.f32_underflow
  lu.assertTrue(math.abs(x32 - (-150 * math.log(2))) < 0.05 or math.abs(x32 - (-126 * math.log(2))) < 0.05, r.measured)
  lu.assertTrue(math.abs(r.values.f16_underflow - (-25 * math.log(2))) < 0.05, r.measured)
end

function TestSeeds:test_traffic_ratios()
  local r = result("softmax_passes")
  lu.assertTrue(r.holds, r.measured)
  lu.assertEquals(r.values.reads, {safe = 3, online = 2, fused = 1})
  r = result("softmax_traffic")
  lu.assertEquals(r.values.moved, {naive = 3, safe = 4, online = 3, fused = 2})
  lu.assertTrue(math.abs(r.values.op_by_op - 8) < 0.01)
  lu.assertTrue(r.values.online_ok)
  r = result("attention_traffic")
  lu.assertTrue(r.holds, r.measured)
  local e = r.values.exponents
  lu.assertTrue(math.abs(e.flash - 1) < 0.05 and math.abs(e.two_pass - 1) < 0.05, r.measured)
  lu.assertTrue(math.abs(e.flash_row - 2) < 0.05 and math.abs(e.naive - 2) < 0.2, r.measured)
end

function TestSeeds:test_fused_limit_and_any_n()
  local r = result("fused_row_limit")
  lu.assertTrue(r.holds, r.measured)
  lu.assertEquals(r.values.max_n, fa.softmax_fused_max_n("f32", U.device))
  r = result("online_any_n")
  lu.assertTrue(r.holds, r.measured)
end

function TestSeeds:test_equal_up_to_rounding()
  local r = result("online_block_size")
  lu.assertTrue(r.holds, r.measured)
  lu.assertTrue(r.values.max_abs_diff_vs_safe <= 1e-6, r.measured)
  r = result("blockwise_bitwise")
  lu.assertTrue(r.values.close, r.measured)
  r = result("exact_rewrite")
  lu.assertTrue(r.holds, r.measured)
  lu.assertTrue(r.values.f64_error <= 1e-12 and r.values.f32_error <= 1e-5, r.measured)
  r = result("one_pass")
  lu.assertTrue(r.values.correct, r.measured)
  r = result("tiled_matmul")
  lu.assertTrue(r.values.tiled_error <= 1e-5, r.measured)
end

function TestSeeds:test_memory_growth_exponents()
  local r = result("attention_memory")
  lu.assertTrue(r.holds, r.measured)
  lu.assertTrue(math.abs(r.values.naive_workspace_exponent - 2) < 0.15, r.measured)
  lu.assertTrue(r.values.flash_exponent <= 1.15, r.measured)
end

function TestSeeds:test_table_and_json()
  result("f16_range")
  local list = {}
  for _, c in ipairs(seeds.claims) do list[#list + 1] = results[c.id] end
  local out = {text = ""}
  function out:write(...) for _, s in ipairs({...}) do self.text = self.text .. s end end
  seeds.print_table(list, out)
  for _, r in ipairs(list) do lu.assertStrContains(out.text, r.claimed:sub(1, 12)) end
  lu.assertStrContains(out.text, "Notes")
  local path = os.tmpname()
  seeds.write_json(list, ctx, path)
  local f = assert(io.open(path))
  local doc = require("cjson").decode(f:read("a"))
  f:close()
  os.remove(path)
  lu.assertEquals(doc.form, "ci")
  lu.assertEquals(#doc.claims, #list)
  lu.assertEquals(doc.claims[1].id, list[1].id)
end

U.run()
