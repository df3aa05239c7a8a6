-- seeds.lua: each claim of the seed notes (the project's founding notes on
-- softmax and attention, in Chinese, kept outside this repository: each claim
-- is restated in its `claim` and `claimed` fields below) measured on this engine, printed as a table with the measured figure
-- beside the claimed one and a verdict that says where a claim does not hold
-- as stated.
--
--   lua5.4 scripts/seeds.lua [--ci | --full] [--device D] [--json FILE] [--only id,id] [--seed S]
--
-- A bad argument is a one-line error on stderr and exit status 1; the JSON
-- has the commit, the command line and the seed base S (default 0).
--
-- --ci (the default) runs small sizes in a few seconds on a CPU (CTest's
-- tests/lua/test_seeds.lua checks the claims that must hold at these sizes);
-- --full runs sizes meant for a GPU.  The softmax claims run on --device (the
-- default device); attention and matmul run there too when the device has
-- every algo the claims use, else on the CPU, and the table says so.  Traffic figures come from the engine's cost model
-- (fa.cost), times from fa.bench: timings are reported, never asserted.
--
-- Loaded with loadfile(path)({module = true}) it returns its table of claims
-- instead of running (the test does that).
local fa = require "flashattn"

local S = {}
local sweep -- flashattn.sweep, loaded by main() (the module form needs only the engine)

-- ---- sizes ---------------------------------------------------------------------
S.FORMS = {
  ci = {traffic = {M = 256, N = 4096}, block = {M = 16, N = 16384, sizes = {16, 64, 256, 1024, 4096, 16384}},
        any_n = {12, 14, 16, 18}, attn = {H = 1, D = 32, L = {128, 256, 512, 1024}}, one_pass = {H = 1, D = 32, L = 256},
        bitwise = {H = 1, D = 32, L = 128}, matmul = {n = 256, tiles = {16, 32, 64}}, rep = 3},
  full = {traffic = {M = 8192, N = 4096}, block = {M = 64, N = 1 << 20, sizes = {64, 256, 1024, 4096, 16384, 65536}},
          any_n = {14, 16, 18, 20, 22}, attn = {H = 8, D = 64, L = {512, 1024, 2048, 4096, 8192}},
          one_pass = {H = 8, D = 64, L = 2048, gpu_dtype = "bf16"}, bitwise = {H = 2, D = 64, L = 512},
          matmul = {n = 1024, tiles = {16, 32, 64, 128}}, rep = 10},
}

-- ---- helpers -------------------------------------------------------------------
local function collect()
  collectgarbage("collect")
  collectgarbage("collect")
end

local function finite(v) return v == v and v ~= math.huge and v ~= -math.huge end

local function flat(t) return t:reshape({ t:numel() }):cpu():totable() end

-- Median time of fn(out): the first call makes the output, the timed ones
-- write into it, so that allocation is not timed.
local function median_ms(fn, ctx)
  local out = fn()
  local ms = fa.bench(function() fn(out) end, {warmup = 1, rep = ctx.rep, flush_cache = true}).median_ms
  out:free()
  return ms
end

-- Peak engine memory on `device` while fn runs, beyond what is held before.
local function peak_of(fn, device)
  collect()
  local before = fa.memory(device).current
  fa.reset_peak(device)
  local r = fn()
  fa.sync()
  return fa.memory(device).peak - before, r
end

-- Least-squares slope of log(y) against log(x): the growth exponent.
local function exponent(xs, ys)
  local n, sx, sy, sxx, sxy = #xs, 0, 0, 0, 0
  for i = 1, n do
    local lx, ly = math.log(xs[i]), math.log(ys[i])
    sx, sy, sxx, sxy = sx + lx, sy + ly, sxx + lx * lx, sxy + lx * ly
  end
  return (n * sxy - sx * sy) / (n * sxx - sx * sx)
end

local function fmt(v, f) return (f or "%.3g"):format(v) end

local function join(list, sep) return table.concat(list, sep or ", ") end

-- Runs algo's softmax on rows built by make_row(x) for each x in xs; returns
-- for each row whether every output is finite.
local function finite_rows(xs, make_row, dtype, device, algo)
  local rows = {}
  for i, x in ipairs(xs) do rows[i] = make_row(x) end
  local t = fa.tensor(rows, {dtype = dtype, device = device})
  local y = fa.softmax(t, {algo = algo}):cpu():totable()
  local ok = {}
  for i, r in ipairs(y) do
    ok[i] = true
    for _, v in ipairs(r) do if not finite(v) then ok[i] = false end end
  end
  return ok
end

local function steps(a, b, h)
  local xs = {}
  for i = 0, math.floor((b - a) / h + 0.5) do xs[#xs + 1] = a + i * h end
  return xs
end

-- The first x (ascending) whose row is not finite, and the one before it.
local function first_overflow(xs, ok)
  for i = 1, #xs do if not ok[i] then return xs[i], xs[i - 1] end end
end

-- The largest x whose row is not finite (underflow: rows fail below it).
local function last_underflow(xs, ok)
  local last
  for i = 1, #xs do if not ok[i] then last = i end end
  if last then return xs[last], xs[last + 1] end
end

-- Inputs are seeded: S.seed_base (opts.seed of S.run) shifts every seed.
S.seed_base = 0

local function randn(shape, seed, dtype, device)
  return fa.randn(shape, {seed = S.seed_base + seed, dtype = dtype or "f32", device = device})
end

local function attention_inputs(L, H, D, device, dtype)
  return randn({1, H, L, D}, 11, dtype, device), randn({1, H, L, D}, 12, dtype, device),
         randn({1, H, L, D}, 13, dtype, device)
end

-- ---- the claims ------------------------------------------------------------------
-- Each: id, seeds (which notes say it), claim, claimed (the figure), and
-- run(ctx) -> {measured = text, verdict = text, holds = bool, values = {...},
-- note = text}.
S.claims = {}
local function claim(c) S.claims[#S.claims + 1] = c end

claim{id = "f16_range", seeds = "000 #3.1, 002 #1",
  claim = "f16's largest value is about 65504 and e^11.1 already exceeds it",
  claimed = "max 65504; e^11.1 > 65504",
  run = function(ctx)
    local t = fa.tensor({65504, 65519, 65520, math.exp(11.1)}, {dtype = "f16", device = ctx.device}):cpu():totable()
    local holds = t[1] == 65504 and t[2] == 65504 and t[3] == math.huge and t[4] == math.huge
    return {measured = ("65504 kept, 65519 -> %s, 65520 -> %s; e^11.1 = %.0f -> %s in f16"):format(t[2], t[3],
              math.exp(11.1), t[4]),
            verdict = holds and "holds" or "does not hold", holds = holds,
            values = {f16_max = t[1], e_11_1_in_f16 = t[4]},
            note = "f16 rounds to nearest: values from 65520 up become inf, so e^x overflows for x >= ln 65520 = 11.0900."}
  end}

claim{id = "f16_naive_overflow", seeds = "000 #3.1, 002 #1",
  claim = "naive softmax overflows in f16 past e^11.1; safe and online do not",
  claimed = "overflow from x = 11.1 (ln 65504 = 11.09)",
  run = function(ctx)
    local xs = steps(10.5, 11.5, 2 ^ -7) -- every f16 value in the range
    local row = function(x) return {x, 0} end
    local first, last_ok = first_overflow(xs, finite_rows(xs, row, "f16", ctx.device, "naive"))
    local stable = {}
    for _, algo in ipairs({"safe", "online", "fused"}) do
      local ok = finite_rows({11.1, 20, 60000}, row, "f16", ctx.device, algo)
      stable[#stable + 1] = (ok[1] and ok[2] and ok[3]) and algo or (algo .. " NOT")
    end
    local stable_ok = not join(stable):find("NOT")
    local holds = first ~= nil and math.abs(first - 11.09) < 0.01 and stable_ok
    return {measured = ("naive: first non-finite row at x = %.4f (last finite %.4f); %s finite up to x = 60000")
              :format(first or 0 / 0, last_ok or 0 / 0, join(stable, "/")),
            verdict = holds and "holds" or "does not hold", holds = holds,
            values = {first_overflow = first, last_finite = last_ok, stable_ok = stable_ok},
            note = "Rows {x, 0} in f16; the engine's naive holds e^x in the tensor's dtype, as the seeds assume. " ..
                   "The threshold sits on the f16 grid (step 2^-7 near 11)."}
  end}

claim{id = "inf_then_nan", seeds = "002 #1",
  claim = "once a component reaches Inf, everything after becomes NaN",
  claimed = "the whole row NaN",
  run = function(ctx)
    local y = flat(fa.softmax(fa.tensor({{12, 0, 1, 2, 3, 4, 5, 6}}, {dtype = "f16", device = ctx.device}),
                              {algo = "naive"}))
    local nan, zero = 0, 0
    for _, v in ipairs(y) do
      if v ~= v then nan = nan + 1 elseif v == 0 then zero = zero + 1 end
    end
    local holds = nan == #y
    return {measured = ("row {12, 0..6} in f16: %d of %d outputs NaN, %d are 0"):format(nan, #y, zero),
            verdict = holds and "holds" or "does not hold as stated", holds = holds,
            values = {nan = nan, zero = zero, n = #y},
            note = "The sum becomes inf, so the overflowing entry is inf/inf = NaN but every other entry is " ..
                   "finite/inf = 0: the whole row is wrong, yet only the overflowed entries are NaN."}
  end}

claim{id = "f32_naive_overflow", seeds = "002 #1",
  claim = "f32 overflows near e^88",
  claimed = "about 88",
  run = function(ctx)
    local row = function(x) return {x, 0} end
    local xs = steps(88, 89, 2 ^ -10)
    local first = first_overflow(xs, finite_rows(xs, row, "f32", ctx.device, "naive"))
    local bxs = steps(86, 90, 0.5) -- bf16 has f32's range and a coarse grid
    local bfirst = first_overflow(bxs, finite_rows(bxs, row, "bf16", ctx.device, "naive"))
    local safe_ok = finite_rows({89, 1000, 1e30}, row, "f32", ctx.device, "safe")
    local holds = first ~= nil and math.abs(first - 88.72) < 0.01 and safe_ok[1] and safe_ok[2] and safe_ok[3]
    return {measured = ("f32 naive: first non-finite at x = %.3f (ln FLT_MAX = 88.723); bf16 at x = %s; safe finite " ..
                        "to 1e30"):format(first or 0 / 0, tostring(bfirst)),
            verdict = holds and "holds" or "does not hold", holds = holds,
            values = {first_overflow = first, bf16_first_overflow = bfirst}, note = nil}
  end}

claim{id = "safe_no_overflow", seeds = "000 #3.1, 001 #3, 002 #2",
  claim = "subtracting the max removes overflow (and gives the right answer)",
  claimed = "e^(x-m) in (0, 1]: no overflow",
  run = function(ctx)
    -- rows of spread-out values around an offset where e^x overflows the dtype
    local errs, worst, naive_bad = {}, 0, true
    for _, case in ipairs({{"f32", 1000}, {"f16", 30}, {"bf16", 1000}}) do
      local dtype, offset = case[1], case[2]
      local x = (randn({16, 256}, 21, "f32", ctx.device) * 2 + offset):to(dtype)
      local ref = fa.softmax(x:cpu():double(), {algo = "safe"})
      naive_bad = naive_bad and not fa.softmax(x, {algo = "naive"}):isfinite()
      local parts = {}
      for _, algo in ipairs({"safe", "online", "fused"}) do
        local y = fa.softmax(x, {algo = algo})
        local e = y:isfinite() and fa.rel_error(y:cpu():double(), ref) or math.huge
        worst = math.max(worst, e / (dtype == "f32" and 1e-5 or 2e-2))
        parts[#parts + 1] = ("%s %.1e"):format(algo, e)
      end
      errs[#errs + 1] = ("%s x = %g + 2N(0,1): %s"):format(dtype, offset, join(parts, " "))
    end
    local holds = worst <= 1 and naive_bad
    return {measured = join(errs, "; ") .. (naive_bad and "; naive inf/NaN on all three" or "; naive finite?"),
            verdict = holds and "holds" or "does not hold", holds = holds,
            values = {worst_error_over_tolerance = worst, naive_overflows = naive_bad},
            note = "Relative error against an f64 softmax of the same (rounded) inputs; tolerance 1e-5 for f32, " ..
                   "2e-2 for f16/bf16."}
  end}

claim{id = "naive_underflow", seeds = "002 #1",
  claim = "large negative inputs underflow the naive denominator to 0",
  claimed = "all x_j very negative -> 0/0",
  run = function(ctx)
    local row = function(x) return {x, x, x, x} end
    local xs = steps(-110, -80, 2 ^ -6)
    local x32, ok32 = last_underflow(xs, finite_rows(xs, row, "f32", ctx.device, "naive"))
    local hs = steps(-20, -15, 2 ^ -6)
    local x16, ok16 = last_underflow(hs, finite_rows(hs, row, "f16", ctx.device, "naive"))
    local y = flat(fa.softmax(fa.tensor({row(-1000)}, {device = ctx.device}), {algo = "safe"}))
    local safe_ok = math.abs(y[1] - 0.25) < 1e-7
    local holds = x32 ~= nil and x16 ~= nil and safe_ok
    local ftz = x32 ~= nil and x32 > -95 -- subnormal results flushed to zero
    return {measured = ("naive NaN for rows of equal x <= %.3f in f32%s (first finite %.3f), <= %.3f in f16 " ..
                        "(first finite %.3f); safe gives 1/N at x = -1000"):format(x32 or 0 / 0,
                        ftz and ", subnormals flushed" or "", ok32 or 0 / 0, x16 or 0 / 0, ok16 or 0 / 0),
            verdict = holds and "holds" or "does not hold", holds = holds,
            values = {f32_underflow = x32, f16_underflow = x16, safe_ok = safe_ok},
            note = "e^x rounds to 0 below half the smallest subnormal: ln(2^-150) = -103.97 in f32, " ..
                   "ln(2^-25) = -17.33 in f16 (the engine's naive holds e^x in the tensor's dtype). A device " ..
                   "whose exp flushes subnormal results to zero (CUDA's fast exp) underflows from " ..
                   "ln(2^-126) = -87.34 in f32."}
  end}

-- Elements moved per input element, by the engine's cost model.
local function moved(x, algo)
  local c = fa.cost.softmax(x, {algo = algo})
  return c.bytes / (x:numel() * (x:dtype() == "f64" and 8 or (x:dtype() == "f32" and 4 or 2)))
end

claim{id = "softmax_passes", seeds = "000 #3.2-3.3, 003",
  claim = "three-pass safe softmax reads the input 3 times, online 2, fused 1",
  claimed = "reads 3 / 2 / 1",
  run = function(ctx)
    local f = ctx.form.traffic
    local x = randn({f.M, f.N}, 31, "f32", ctx.device)
    local reads, times = {}, {}
    for _, algo in ipairs({"safe", "online", "fused"}) do
      reads[algo] = moved(x, algo) - 1 -- one write
      times[algo] = median_ms(function(out) return fa.softmax(x, {algo = algo, out = out}) end, ctx)
    end
    local holds = reads.safe == 3 and reads.online == 2 and reads.fused == 1
    return {measured = ("model reads %g / %g / %g; times %.3f / %.3f / %.3f ms (%dx%d f32)"):format(reads.safe,
              reads.online, reads.fused, times.safe, times.online, times.fused, f.M, f.N),
            verdict = holds and "holds (model); times reported" or "does not hold", holds = holds,
            values = {reads = reads, times_ms = times},
            note = "Reads are the algorithms' schedules (fa.cost.softmax), not hardware counters. On a CPU the " ..
                   "rows stay in cache between passes and exp dominates, so the three take about the same time; " ..
                   "the pass count matters where memory bandwidth is the limit (a GPU)."}
  end}

claim{id = "softmax_traffic", seeds = "003",
  claim = "memory traffic: naive softmax 5MN+2M reads (8MN+4M in all) -> fused 2MN; online 2MN reads + MN writes",
  claimed = "8MN -> 2MN (4x); online 3MN",
  run = function(ctx)
    local f = ctx.form.traffic
    local x = randn({f.M, f.N}, 32, "f32", ctx.device)
    local m = {}
    for _, algo in ipairs({"naive", "safe", "online", "fused"}) do m[algo] = moved(x, algo) end
    local M_, N_ = f.M, f.N
    local unfused = (8 * M_ * N_ + 4 * M_) / (M_ * N_) -- max, x-m, exp, sum, divide as five kernels
    local online_ok = m.online == 3 and m.fused == 2
    return {measured = ("engine model per MN: naive %g, safe %g, online %g, fused %g; safe/fused = %gx " ..
                        "(op-by-op baseline %.3f MN is not in the engine)"):format(m.naive, m.safe, m.online, m.fused,
                        m.safe / m.fused, unfused),
            verdict = online_ok and "partly: online 3MN holds; 4x needs an unfused baseline" or "does not hold",
            holds = false, values = {moved = m, op_by_op = unfused, online_ok = online_ok},
            note = "The 8MN figure counts a softmax run as five separate kernels (PyTorch ops: max, subtract, " ..
                   "exp, sum, divide), each reading and writing memory. The engine has no such softmax: even its " ..
                   "three-pass kernel moves 4MN (3 reads + 1 write), so fusing gains 2x here, not 4x. Its naive " ..
                   "(e^x / sum e^x, no max) moves 3MN, not 5MN + 2M reads."}
  end}

claim{id = "fused_row_limit", seeds = "003",
  claim = "the fused kernel (row held on chip) works only while the row fits: f32 rows past ~12K-57K elements",
  claimed = "48-228 KB per SM: N <= 12K-57K f32",
  run = function(ctx)
    local max_n = fa.softmax_fused_max_n("f32", ctx.device)
    local at = randn({1, max_n}, 41, "f32", ctx.device)
    local ok_at = pcall(fa.softmax, at, {algo = "fused"})
    local past = randn({1, max_n + 1}, 42, "f32", ctx.device)
    local ok_past, err = pcall(fa.softmax, past, {algo = "fused"})
    local named = not ok_past and tostring(err):find(tostring(max_n), 1, true) ~= nil
    local holds = ok_at and named
    return {measured = ("fused limit on %s: N = %d f32 (%d KiB); N = %d runs, N = %d raises an error naming %d")
              :format(ctx.device, max_n, max_n * 4 // 1024, max_n, max_n + 1, max_n),
            verdict = holds and "holds (limit is the device's)" or "does not hold", holds = holds,
            values = {max_n = max_n, runs_at_limit = ok_at, error_past_limit = not ok_past},
            note = "On the CPU the fused kernel holds a row in a 256 KiB per-thread buffer: 65536 f32 elements; " ..
                   "the seeds' 12K-57K is a GPU's 48-228 KB of shared memory."}
  end}

claim{id = "online_any_n", seeds = "003",
  claim = "online softmax works for any N with O(B) on-chip memory",
  claimed = "any N; O(B) memory",
  run = function(ctx)
    local ns, extra, worst = {}, {}, 0
    for i, e in ipairs(ctx.form.any_n) do
      local n = 1 << e
      local x = randn({1, n}, 50 + i, "f32", ctx.device)
      local peak, y = peak_of(function() return fa.softmax(x, {algo = "online"}) end, ctx.device)
      local err = fa.rel_error(y:cpu():double(), fa.softmax(x:cpu():double(), {algo = "safe"}))
      worst = math.max(worst, err)
      ns[i], extra[i] = n, peak - n * 4 -- beyond the output
      y:free(); x:free()
    end
    local max_extra = math.max(table.unpack(extra))
    local holds = worst <= 1e-5 and max_extra <= 64 * 1024
    return {measured = ("N = %d..%d: rel err <= %.1e; workspace beyond the output <= %d B at every N")
              :format(ns[1], ns[#ns], worst, max_extra),
            verdict = holds and "holds" or "does not hold", holds = holds,
            values = {N = ns, workspace_bytes = extra, worst_error = worst}, note = nil}
  end}

claim{id = "online_block_size", seeds = "003",
  claim = "online softmax with a fixed BLOCK_SIZE (1024) gives the same result whatever the block size",
  claimed = "result independent of B",
  run = function(ctx)
    local f = ctx.form.block
    local x = randn({f.M, f.N}, 61, "f32", ctx.device)
    local safe = fa.softmax(x, {algo = "safe"})
    local ref = fa.softmax(x:cpu():double(), {algo = "safe"})
    local parts, worst_diff, worst_err = {}, 0, 0
    local times = {}
    for _, b in ipairs(f.sizes) do
      local y = fa.softmax(x, {algo = "online", block = b})
      worst_diff = math.max(worst_diff, fa.max_abs_diff(y, safe))
      worst_err = math.max(worst_err, fa.rel_error(y:cpu():double(), ref))
      times[#times + 1] = median_ms(function(out) return fa.softmax(x, {algo = "online", block = b, out = out}) end, ctx)
      parts[#parts + 1] = ("B=%d %.3f ms"):format(b, times[#times])
      y:free()
    end
    local holds = worst_err <= 1e-5
    return {measured = ("%s; max |online - safe| = %.1e, rel err <= %.1e (%dx%d)"):format(join(parts, ", "),
              worst_diff, worst_err, f.M, f.N),
            verdict = holds and "holds up to rounding" or "does not hold", holds = holds,
            values = {block_sizes = f.sizes, times_ms = times, max_abs_diff_vs_safe = worst_diff, worst_error = worst_err},
            note = "Block sizes change the order of the additions, so results differ in the last bits only."}
  end}

-- Count of elements that differ (bit-wise, for values that compare) and the
-- largest absolute difference.
local function differences(a, b)
  local fa_, fb = flat(a), flat(b)
  local n = 0
  for i = 1, #fa_ do if fa_[i] ~= fb[i] then n = n + 1 end end
  return n, #fa_, fa.max_abs_diff(a:cpu(), b:cpu())
end

claim{id = "blockwise_bitwise", seeds = "002 #5",
  claim = "the blockwise (rescaled) result is bit-wise identical to the plain one",
  claimed = "bit-wise identical",
  run = function(ctx)
    local x = randn({16, 4096}, 71, "f32", ctx.device)
    local safe = fa.softmax(x, {algo = "safe"})
    local n1, t1, d1 = 0, 0, 0
    for _, block in ipairs({16, 256, 1024}) do
      local n, t, d = differences(fa.softmax(x, {algo = "online", block = block}), safe)
      n1, t1, d1 = n1 + n, t1 + t, math.max(d1, d)
    end
    local c = ctx.form.bitwise
    local q, k, v = attention_inputs(c.L, c.H, c.D, ctx.att_device)
    local plain = fa.attention(q, k, v, {algo = "naive"})
    local n2, t2, d2 = differences(fa.attention(q, k, v, {algo = "flash", tile = {16, 16}}), plain)
    local n3, t3, d3 = differences(fa.attention(q, k, v, {algo = "flash", tile = {16, 16}}),
                                   fa.attention(q, k, v, {algo = "flash", tile = {64, 128}}))
    local identical = n1 == 0 and n2 == 0 and n3 == 0
    local close = d1 <= 1e-6 and d2 <= 1e-5 and d3 <= 1e-5
    return {measured = ("differ: softmax online (B = 16, 256, 1024) vs safe %d/%d (max %.1e); attention flash vs naive %d/%d (max %.1e); " ..
                        "flash 16x16 vs 64x128 tiles %d/%d (max %.1e)"):format(n1, t1, d1, n2, t2, d2, n3, t3, d3),
            verdict = identical and "holds" or (close and "does not hold: equal up to rounding" or "does not hold"),
            holds = identical,
            values = {softmax = {differ = n1, total = t1, max_abs_diff = d1},
                      flash_vs_naive = {differ = n2, total = t2, max_abs_diff = d2},
                      tile_vs_tile = {differ = n3, total = t3, max_abs_diff = d3}, close = close},
            note = "In exact arithmetic the rescaling is an identity; in floating point e^(m1-m)*l1 + e^(m2-m)*l2 " ..
                   "rounds differently from one sum, so tilings agree to a few ulps, not bit for bit."}
  end}

claim{id = "exact_rewrite", seeds = "001 #8-9",
  claim = "the online rewrite is strictly equivalent to softmax attention, not an approximation",
  claimed = "exact",
  run = function(ctx)
    local c = ctx.form.bitwise
    local out = {}
    for _, dtype in ipairs({"f64", "f32"}) do
      local q, k, v = attention_inputs(c.L, c.H, c.D, "cpu", dtype)
      local ref = fa.attention_reference(q, k, v)
      local ok, o = pcall(fa.attention, q, k, v, {algo = "flash", tile = {16, 32}})
      out[dtype] = ok and fa.rel_error(o:double(), ref) or math.huge
    end
    local holds = out.f64 <= 1e-12 and out.f32 <= 1e-5
    return {measured = ("flash vs f64 reference: rel err %.1e with f64 inputs, %.1e with f32"):format(out.f64, out.f32),
            verdict = holds and "holds up to rounding" or "does not hold", holds = holds,
            values = {f64_error = out.f64, f32_error = out.f32},
            note = "Run in f64 (on the CPU) the tiled kernel matches the plain formula to f64 rounding: the " ..
                   "rewrite is exact; f32 differs by f32 rounding."}
  end}

claim{id = "attention_memory", seeds = "000 #4, 002 #5 and #7",
  claim = "FlashAttention needs O(N) extra memory instead of the O(N^2) score matrix",
  claimed = "naive O(N^2), flash O(N)",
  run = function(ctx)
    local c = ctx.form.attn
    local peaks = {naive = {}, flash = {}}
    local work = {naive = {}, flash = {}}
    for _, L in ipairs(c.L) do
      local q, k, v = attention_inputs(L, c.H, c.D, ctx.att_device)
      local out_bytes = L * c.H * c.D * 4
      for algo in pairs(peaks) do
        local peak, o = peak_of(function() return fa.attention(q, k, v, {algo = algo}) end, ctx.att_device)
        o:free()
        table.insert(peaks[algo], peak)
        table.insert(work[algo], math.max(peak - out_bytes, 1))
      end
      q:free(); k:free(); v:free()
    end
    local n = #c.L
    local last2 = {c.L[n - 1], c.L[n]}
    local e_naive = exponent(last2, {peaks.naive[n - 1], peaks.naive[n]})
    local e_flash = exponent(last2, {peaks.flash[n - 1], peaks.flash[n]})
    local w_naive, w_flash = exponent(c.L, work.naive), exponent(c.L, work.flash)
    local holds = math.abs(w_naive - 2) < 0.15 and e_naive > 1.7 and e_flash <= 1.15
    return {measured = ("peak (last two L) grows as L^%.2f naive, L^%.2f flash; workspace beyond the output " ..
                        "L^%.2f naive, L^%.2f flash; at L = %d: %.2f vs %.2f MiB"):format(e_naive, e_flash, w_naive,
                        w_flash, c.L[n], peaks.naive[n] / 2 ^ 20, peaks.flash[n] / 2 ^ 20),
            verdict = holds and "holds" or "does not hold", holds = holds,
            values = {L = c.L, naive_peak = peaks.naive, flash_peak = peaks.flash, naive_exponent = e_naive,
                      flash_exponent = e_flash, naive_workspace_exponent = w_naive,
                      flash_workspace_exponent = w_flash},
            note = ("On %s; H = %d, D = %d, f32; peak engine memory beyond the inputs, output included. Naive " ..
                    "holds the scores (on the CPU one L x L matrix per thread, on a GPU all of them); flash " ..
                    "holds tiles of a fixed size, so beyond its output it needs O(1)."):format(ctx.att_device,
                    c.H, c.D)}
  end}

claim{id = "attention_traffic", seeds = "002 #5",
  claim = "HBM traffic O(N^2) -> O(N)",
  claimed = "naive O(N^2), flash O(N)",
  run = function(ctx)
    local c = ctx.form.attn
    local bytes = {naive = {}, two_pass = {}, flash_row = {}, flash = {}}
    for _, L in ipairs(c.L) do
      local q = fa.zeros({1, c.H, L, c.D}, {device = "cpu"})
      for algo, list in pairs(bytes) do list[#list + 1] = fa.cost.attention(q, q, q, {algo = algo}).bytes end
      q:free()
    end
    local e = {}
    for algo, list in pairs(bytes) do e[algo] = exponent(c.L, list) end
    local holds = math.abs(e.naive - 2) < 0.2 and math.abs(e.flash - 1) < 0.05
    return {measured = ("model bytes grow as L^%.2f naive, L^%.2f flash_row, L^%.2f two_pass, L^%.2f flash")
              :format(e.naive, e.flash_row, e.two_pass, e.flash),
            verdict = holds and "holds for tiled kernels (model)" or "does not hold", holds = holds,
            values = {L = c.L, exponents = e, bytes = bytes},
            note = "From fa.cost.attention (each algo's schedule; caches ignored). The seeds' one-pass per-row " ..
                   "recurrence (flash_row) still streams all of K and V for every query row: O(N^2). Only " ..
                   "tiling, which reuses a K/V tile for a block of query rows, brings the count to O(N); a " ..
                   "real chip's traffic is O(N^2 d^2 / SRAM) (FlashAttention paper), linear only in this model."}
  end}

claim{id = "one_pass", seeds = "000 #4",
  claim = "the one-pass recurrence (per row) computes attention in one pass and makes it much faster",
  claimed = "1 pass; large speed-up",
  run = function(ctx)
    local c = ctx.form.one_pass
    -- on a GPU the fast flash path is the tensor-core one: f16/bf16
    local dtype = ctx.att_device == "cpu" and "f32" or (c.gpu_dtype or "f32")
    local tol = dtype == "f32" and 1e-5 or 2e-2
    local q, k, v = attention_inputs(c.L, c.H, c.D, ctx.att_device, dtype)
    local ref = fa.attention_reference(q:cpu(), k:cpu(), v:cpu())
    local t, err = {}, {}
    for _, algo in ipairs({"naive", "two_pass", "flash_row", "flash"}) do
      err[algo] = fa.rel_error(fa.attention(q, k, v, {algo = algo}):cpu():double(), ref)
      t[algo] = median_ms(function(out) return fa.attention(q, k, v, {algo = algo, out = out}) end, ctx)
    end
    local correct = err.flash_row <= tol and err.flash <= tol
    local fast = t.flash < 0.8 * t.naive
    return {measured = ("times naive %.2f, two_pass %.2f, flash_row %.2f, flash %.2f ms; flash_row %.1fx slower " ..
                        "than naive; tiled flash %.2fx naive's time; rel err flash_row %.1e")
              :format(t.naive, t.two_pass, t.flash_row, t.flash, t.flash_row / t.naive, t.flash / t.naive,
                      err.flash_row),
            verdict = (correct and fast) and "holds (tiled)" or
                      (correct and "partly: correct; speed-up not seen here" or "does not hold"),
            holds = correct and fast, values = {times_ms = t, errors = err, correct = correct},
            note = ("L = %d, H = %d, D = %d, %s on %s. One pass per query row alone is slow (no reuse of K " ..
                    "and V across rows, no BLAS); the speed comes from tiling. Naive runs on BLAS (cuBLAS on a " ..
                    "GPU), a strong baseline at these sizes."):format(c.L, c.H, c.D, dtype, ctx.att_device)}
  end}

claim{id = "tiled_matmul", seeds = "000 #3",
  claim = "tiled matmul is tens of times faster than naive, through reuse in fast memory",
  claimed = "tens of times",
  run = function(ctx)
    local c = ctx.form.matmul
    local a, b = randn({c.n, c.n}, 81, "f32", ctx.att_device), randn({c.n, c.n}, 82, "f32", ctx.att_device)
    local naive = fa.matmul(a, b, {algo = "naive"})
    local t_naive = median_ms(function(out) return fa.matmul(a, b, {algo = "naive", out = out}) end, ctx)
    local best, best_tile, worst_err = math.huge, nil, 0
    for _, tile in ipairs(c.tiles) do
      local ms = median_ms(function(out) return fa.matmul(a, b, {algo = "tiled", tile = tile, out = out}) end, ctx)
      worst_err = math.max(worst_err, fa.rel_error(fa.matmul(a, b, {algo = "tiled", tile = tile}):cpu():double(),
                                                   naive:cpu():double()))
      if ms < best then best, best_tile = ms, tile end
    end
    local t_blas = median_ms(function(out) return fa.matmul(a, b, {algo = "blas", out = out}) end, ctx)
    local ratio = t_naive / best
    local holds = ratio >= 10
    return {measured = ("n = %d: naive %.2f ms, tiled (best, tile %d) %.2f ms = %.1fx; BLAS %.2f ms = %.0fx")
              :format(c.n, t_naive, best_tile, best, ratio, t_blas, t_naive / t_blas),
            verdict = holds and "holds" or "does not hold as stated", holds = holds,
            values = {n = c.n, naive_ms = t_naive, tiled_ms = best, tile = best_tile, blas_ms = t_blas,
                      speedup = ratio, tiled_error = worst_err},
            note = ("On %s. The seeds' six loops (tiles of C, k in tiles) gain a few times over the naive triple " ..
                    "loop here; 'tens of times' needs what BLAS adds to tiling (packing, register blocking, SIMD)."):
                    format(ctx.att_device)}
  end}

-- ---- running ---------------------------------------------------------------------
-- The device for attention and matmul: `device` when it has every algo the
-- claims use, else the CPU.
function S.attention_device(device)
  if device == "cpu" then return "cpu" end
  local ok = pcall(function()
    local q = fa.randn({1, 8, 16}, {seed = 1, device = device})
    for _, algo in ipairs({"naive", "two_pass", "flash_row", "flash"}) do fa.attention(q, q, q, {algo = algo}) end
    local a = fa.randn({16, 16}, {seed = 2, device = device})
    for _, algo in ipairs({"naive", "tiled", "blas"}) do fa.matmul(a, a, {algo = algo}) end
  end)
  return ok and device or "cpu"
end

-- Runs the claims: opts = {form = "ci" | "full", device =, only = {id = true},
-- rep =, seed =}.  Returns the results and the run's context.
function S.run(opts)
  opts = opts or {}
  local device = opts.device or fa.default_device()
  S.seed_base = opts.seed or 0
  local ctx = {form = S.FORMS[opts.form or "ci"], device = device, att_device = S.attention_device(device)}
  ctx.rep = opts.rep or ctx.form.rep
  local results = {}
  for _, c in ipairs(S.claims) do
    if not opts.only or opts.only[c.id] then
      local ok, r = pcall(c.run, ctx)
      if not ok then r = {measured = "error: " .. tostring(r):match("[^\n]*"), verdict = "error", holds = nil} end
      r.id, r.seeds, r.claim, r.claimed = c.id, c.seeds, c.claim, c.claimed
      results[#results + 1] = r
      collect()
    end
  end
  return results, ctx
end

-- Greedy word wrap of text to width columns.
local function wrap(text, width)
  local lines, line = {}, ""
  for word in tostring(text):gmatch("%S+") do
    if #line == 0 then line = word
    elseif #line + 1 + #word <= width then line = line .. " " .. word
    else lines[#lines + 1] = line; line = word end
  end
  if #line > 0 or #lines == 0 then lines[#lines + 1] = line end
  return lines
end

local COLUMNS = {{"claim (seed note)", 38}, {"claimed", 24}, {"measured", 52}, {"verdict", 22}}

-- Prints the results as a table, then the notes.
function S.print_table(results, out)
  out = out or io.stdout
  local head, rule = {}, {}
  for i, c in ipairs(COLUMNS) do head[i] = ("%-" .. c[2] .. "s"):format(c[1]); rule[i] = string.rep("-", c[2]) end
  out:write(table.concat(head, " | "), "\n", table.concat(rule, "-+-"), "\n")
  for n, r in ipairs(results) do
    local cells = {wrap(("%d. %s [%s]"):format(n, r.claim, r.seeds), COLUMNS[1][2]), wrap(r.claimed, COLUMNS[2][2]),
                   wrap(r.measured, COLUMNS[3][2]), wrap(r.verdict, COLUMNS[4][2])}
    local height = 0
    for _, c in ipairs(cells) do height = math.max(height, #c) end
    for l = 1, height do
      local parts = {}
      for i, c in ipairs(cells) do parts[i] = ("%-" .. COLUMNS[i][2] .. "s"):format(c[l] or "") end
      out:write(table.concat(parts, " | "), "\n")
    end
    out:write(table.concat(rule, "-+-"), "\n")
  end
  out:write("\nNotes\n")
  for n, r in ipairs(results) do
    if r.note then
      for i, line in ipairs(wrap(r.note, 110)) do out:write(i == 1 and ("%3d. "):format(n) or "     ", line, "\n") end
    end
  end
end

function S.write_json(results, ctx, path)
  local cjson = require "cjson"
  local json = cjson.new()
  json.encode_invalid_numbers("null")
  local form_name
  for name, f in pairs(S.FORMS) do if f == ctx.form then form_name = name end end
  local ok, sweep = pcall(require, "flashattn.sweep")
  local meta = ok and sweep.run_meta(S.seed_base) or nil
  local doc = {meta = meta, version = fa.version, date = os.date("!%Y-%m-%dT%H:%M:%SZ"), form = form_name,
               seed = S.seed_base, device = ctx.device,
               attention_device = ctx.att_device, device_info = fa.device_info(ctx.device), claims = results}
  local f = assert(io.open(path, "w"))
  f:write(json.encode(doc), "\n")
  f:close()
end

local function main(argv)
  local argparse = require "argparse"
  local p = argparse("seeds.lua", "The seed notes' claims, measured on this engine.")
  p:mutex(p:flag("--ci", "small sizes, a few seconds on a CPU (the default)"),
          p:flag("--full", "sizes meant for a GPU"))
  p:option("--device", "device for the softmax claims (attention and matmul fall back to the CPU)")
  p:option("--json", "write the results to this JSON file")
  p:option("--only", "comma list of claim ids")
  p:option("--rep", "timing repetitions"):convert(sweep.integer_arg(1, "--rep"))
  p:option("--seed", "added to every input's seed"):convert(sweep.integer_arg(0, "--seed")):default("0")
  local args = sweep.parse_args(p, argv, "seeds.lua")
  local only
  if args.only then
    only = {}
    for id in args.only:gmatch("[^,%s]+") do only[id] = true end
  end
  local results, ctx = S.run({form = args.full and "full" or "ci", device = args.device, only = only, rep = args.rep,
                              seed = args.seed})
  local info = fa.device_info(ctx.device)
  print(("flashattn %s: the seeds' claims on %s (%s)%s, %s sizes\n"):format(fa.version, ctx.device, info.name or "?",
    ctx.att_device ~= ctx.device and (", attention and matmul on " .. ctx.att_device) or "",
    args.full and "full" or "CI"))
  S.print_table(results)
  local held, total = 0, 0
  for _, r in ipairs(results) do
    total = total + 1
    if r.holds then held = held + 1 end
  end
  print(("\n%d of %d claims hold as stated on this engine; see the verdicts and notes for the others."):format(held,
    total))
  if args.json then
    S.write_json(results, ctx, args.json)
    print("wrote " .. args.json)
  end
end

local first = ...
if type(first) == "table" and first.module then return S end
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
sweep = require "flashattn.sweep"
sweep.main("seeds.lua", main, {...})
