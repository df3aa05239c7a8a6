-- flashattn.sweep: grids, measured rows, failures recorded, the reference on
-- sampled rows, CSV / JSON / charts, progress, and scripts/sweep.lua's
-- command line.  Correctness only: no figure is checked against a clock.
-- Softmax runs on the device under test; attention on the CPU unless that
-- device has an attention kernel.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
-- The build tree's copy of lua/flashattn/*.lua may be missing (CMake's
-- configure_file wrote it to a file named build/lua/flashattn): fall back to
-- this checkout's source.
local found, sweep = pcall(require, "flashattn.sweep")
if not found then
  package.path = "lua/?.lua;" .. package.path
  sweep = require "flashattn.sweep"
end

local function has_attention(device)
  return pcall(function()
    local q = fa.randn({1, 4, 8}, {seed = 1, device = device})
    fa.attention(q, q, q)
  end)
end
local ATT_DEV = has_attention(U.device) and U.device or "cpu"

-- Quiet, quick run settings for a spec.
local function quick(spec)
  spec.rep = spec.rep or 1
  spec.flush = false
  spec.seed = spec.seed or U.next_seed()
  return spec
end

local function run(spec, cfg)
  cfg = cfg or {}
  if cfg.progress == nil then cfg.progress = false end
  return sweep.run(quick(spec), cfg)
end

local function tmpdir()
  local path = os.tmpname()
  os.remove(path)
  assert(os.execute("mkdir -p '" .. path .. "'"))
  return path
end

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

-- A CSV parser for the round trip (quoted fields, doubled quotes).
local function parse_csv(text)
  local rows, row, field, i, quoted = {}, {}, "", 1, false
  while i <= #text do
    local c = text:sub(i, i)
    if quoted then
      if c == '"' and text:sub(i + 1, i + 1) == '"' then field = field .. '"'; i = i + 1
      elseif c == '"' then quoted = false
      else field = field .. c end
    elseif c == '"' then quoted = true
    elseif c == "," then row[#row + 1] = field; field = ""
    elseif c == "\n" then row[#row + 1] = field; rows[#rows + 1] = row; row, field = {}, ""
    else field = field .. c end
    i = i + 1
  end
  return rows
end

local function ok_rows(rows)
  local out = {}
  for _, r in ipairs(rows) do if r.status == "ok" then out[#out + 1] = r end end
  return out
end

-- ---- grid and points ----------------------------------------------------------
TestSweepGrid = {}

function TestSweepGrid:test_parse_list()
  lu.assertEquals(sweep.parse_list("256, 512"), {"256", "512"})
  lu.assertEquals(sweep.parse_list("256..2048"), {256, 512, 1024, 2048})
  lu.assertEquals(sweep.parse_list("16,64..128,flash"), {"16", 64, 128, "flash"})
end

function TestSweepGrid:test_product_in_axis_order()
  local pts = sweep.grid("attention", {tile = {"default", "16x16"}, algo = {"naive", "flash"}, L = {64, 128}, D = 32})
  lu.assertEquals(#pts, 8)
  -- L outermost, then algo, then tile (the order of sweep.AXES)
  lu.assertEquals(pts[1], {L = 64, algo = "naive", tile = "default", D = 32})
  lu.assertEquals(pts[2], {L = 64, algo = "naive", tile = "16x16", D = 32})
  lu.assertEquals(pts[3].algo, "flash")
  lu.assertEquals(pts[5].L, 128)
end

function TestSweepGrid:test_point_is_canonical()
  local p = sweep.point("attention", {L = 64, causal = true, window = "8:0", tile = {16, 32}, device = "cpu"})
  lu.assertEquals({p.Lq, p.Lk, p.H, p.Hkv, p.D, p.Dv}, {64, 64, 2, 2, 64, 64})
  lu.assertEquals({p.causal, p.window, p.tile, p.Br, p.Bc}, {"true", "8:0", "16x32", 16, 32})
  p = sweep.point("attention", {Lq = 1, Lk = 300, Br = 8, Bc = 64, causal = "top_left", window = {4, -1}})
  lu.assertEquals({p.Lq, p.Lk, p.tile, p.causal, p.window}, {1, 300, "8x64", "top_left", "4:-1"})
  p = sweep.point("softmax", {N = 1024}, {elements = 1 << 16})
  lu.assertEquals({p.M, p.N, p.block}, {64, 1024, 0})
end

function TestSweepGrid:test_bad_axes_are_errors()
  local function fails(words, f, ...)
    local ok, msg = pcall(f, ...)
    lu.assertFalse(ok)
    for _, w in ipairs(words) do lu.assertStrContains(tostring(msg), w) end
  end
  fails({"unknown axis", "Lx"}, sweep.grid, "attention", {Lx = 3})
  fails({"unknown kernel"}, sweep.grid, "matmul", {})
  fails({"Br and Bc"}, sweep.point, "attention", {Br = 16})
  fails({"mask", "bogus"}, sweep.point, "attention", {mask = "bogus"})
  fails({"integer"}, sweep.point, "attention", {L = "x"})
  fails({"window"}, sweep.point, "attention", {window = "left"})
end

-- the median of a list: odd and even counts, the list left unsorted, nil for none
function TestSweepGrid:test_median()
  local t = {3, 1, 2}
  lu.assertEquals(sweep.median(t), 2)
  lu.assertEquals(t, {3, 1, 2})
  lu.assertEquals(sweep.median({4, 1, 3, 2}), 2.5)
  lu.assertEquals(sweep.median({7}), 7)
  lu.assertNil(sweep.median({}))
end

-- ---- measuring ------------------------------------------------------------------
TestSweepRun = {}

function TestSweepRun:test_rows_and_a_failed_tile()
  local rows = run{kernel = "attention", axes = {device = ATT_DEV, L = {32, 48}, D = 16, H = 2,
                                                 algo = {"naive", "flash"}, tile = {"default", "16x16", "0x8"}}}
  lu.assertEquals(#rows, 12)
  for i, r in ipairs(rows) do
    if r.tile == "0x8" then
      lu.assertEquals(r.status, "failed")
      lu.assertStrContains(r.error, "flashattn:")
      lu.assertStrContains(r.error, "tile")
      lu.assertNil(r.median_ms)
      lu.assertEquals(rows[i + 1] and rows[i + 1].status or "ok", "ok", "the sweep goes on after a failure")
    else
      lu.assertEquals(r.status, "ok", tostring(r.error))
      lu.assertTrue(r.rel_error <= 1e-5, ("rel error %g [%s]"):format(r.rel_error, U.seed_note()))
      lu.assertTrue(r.error_ok)
      lu.assertEquals(r.ref_rows, r.Lq)
      lu.assertTrue(r.median_ms > 0 and r.min_ms <= r.median_ms and r.median_ms <= r.max_ms)
      lu.assertTrue(r.peak_bytes >= r.Lq * r.H * r.D * 4, "peak counts at least the output")
      local q = fa.zeros({1, r.H, r.Lq, r.D})
      local cost = fa.cost.attention(q, q, q, {algo = r.algo})
      lu.assertEquals(r.flops, cost.flops)
      lu.assertEquals(r.bytes, cost.bytes)
      lu.assertAlmostEquals(r.tflops, r.flops / (r.median_ms * 1e-3) / 1e12, 1e-9 * r.tflops)
    end
  end
end

-- The reference on a sample of query rows must see the same causal, window,
-- ALiBi and mask alignment as the whole output: Lq ~= Lk makes a wrong
-- choice of rows show as a large error.
function TestSweepRun:test_sampled_reference_keeps_the_alignment()
  local rows = run{kernel = "attention", ref_budget = 1, ref_min_rows = 5,
                   axes = {device = ATT_DEV, causal = {false, true, "top_left"}, window = {"none", "3:2"},
                           mask = {"none", "bool", "float", "padding", "alibi"}, B = 2, H = 2, Lq = 24, Lk = 40,
                           D = 8, algo = "flash", tile = "16x16"}}
  lu.assertEquals(#rows, 30)
  for _, r in ipairs(rows) do
    local what = ("causal=%s window=%s mask=%s"):format(r.causal, r.window, r.mask)
    lu.assertEquals(r.status, "ok", what .. ": " .. tostring(r.error))
    lu.assertTrue(r.rel_error <= 1e-5, ("%s: rel error %g [%s]"):format(what, r.rel_error, U.seed_note()))
    if r.causal == "top_left" and (r.window ~= "none" or r.mask == "alibi") then
      lu.assertEquals(r.ref_rows, 24, what .. ": both alignments need every row")
    else
      lu.assertEquals(r.ref_rows, 5, what)
    end
  end
  -- Lq = Lk: top-left is bottom-right, so sampling works with a window too
  local sq = run{kernel = "attention", ref_budget = 1, ref_min_rows = 4,
                 axes = {device = ATT_DEV, causal = "top_left", window = "2:0", L = 20, D = 8, H = 1, algo = "flash"}}
  lu.assertEquals(sq[1].ref_rows, 4)
  lu.assertTrue(sq[1].rel_error <= 1e-5)
end

function TestSweepRun:test_out_of_memory_is_recorded()
  local limit0 = fa.memory_limit(ATT_DEV)
  U.collect()
  fa.set_memory_limit(fa.memory(ATT_DEV).current + (1 << 20), ATT_DEV)
  -- one head: naive's 512 x 512 scores pass the limit, flash's four query tiles' workspaces (128 KB
  -- each) fit under it whatever the thread count (two heads at 8 threads did not)
  local ok, rows = pcall(run, {kernel = "attention", reference = false,
                               axes = {device = ATT_DEV, L = 512, D = 16, H = 1, algo = {"naive", "flash", "naive"}}})
  fa.set_memory_limit(limit0, ATT_DEV)
  lu.assertTrue(ok, tostring(rows))
  lu.assertEquals(rows[1].status, "failed")
  lu.assertStrContains(rows[1].error, "out of memory")
  lu.assertEquals(rows[2].status, "ok", tostring(rows[2].error))
  lu.assertEquals(rows[3].status, "failed")
  -- and the engine is still usable, with nothing left held
  U.collect()
  lu.assertTrue(fa.attention(U.randn({8, 4}, nil, nil, ATT_DEV), U.randn({8, 4}, nil, nil, ATT_DEV),
                             U.randn({8, 4}, nil, nil, ATT_DEV)):isfinite())
end

function TestSweepRun:test_softmax_rows_and_the_fused_limit()
  local max_n = fa.softmax_fused_max_n("f32", U.device)
  local rows = run{kernel = "softmax", axes = {device = U.device, M = 2, N = {256, max_n + 1},
                                               algo = {"safe", "online", "fused"}, block = 0}}
  lu.assertEquals(#rows, 6)
  for _, r in ipairs(rows) do
    if r.algo == "fused" and r.N > max_n then
      lu.assertEquals(r.status, "failed")
      lu.assertStrContains(r.error, tostring(max_n))
    else
      lu.assertEquals(r.status, "ok", tostring(r.error))
      lu.assertTrue(r.rel_error <= 1e-5, ("%s N=%d rel error %g"):format(r.algo, r.N, r.rel_error))
      lu.assertTrue(r.gbs > 0)
    end
  end
end

function TestSweepRun:test_points_can_be_filtered()
  local rows = run{kernel = "attention", reference = false,
                   axes = {device = ATT_DEV, L = {16, 32}, D = 8, H = 1, algo = {"naive", "flash_row"}},
                   filter = function(p) return p.algo ~= "flash_row" or p.Lq <= 16 end}
  lu.assertEquals(#rows, 3)
end

function TestSweepRun:test_progress()
  local out = {text = ""}
  function out:write(...) for _, s in ipairs({...}) do self.text = self.text .. s end end
  function out:flush() end
  run({kernel = "attention", reference = false, axes = {device = ATT_DEV, L = {16, 32}, D = 8, H = 1,
                                                        algo = {"naive", "flash", "0"}}},
      {progress = "lines", progress_out = out})
  local lines = {}
  for l in out.text:gmatch("[^\n]+") do lines[#lines + 1] = l end
  lu.assertEquals(#lines, 7) -- one per point, then the summary
  lu.assertStrContains(lines[1], "1/6")
  lu.assertStrContains(lines[6], "6/6 100%")
  lu.assertStrContains(lines[6], "left, 2 failed")
  lu.assertStrContains(lines[7], "6 points in")
  local bar = {text = ""}
  bar.write, bar.flush = out.write, out.flush
  local p = sweep.Progress.new("t", 10, 2, "bar", bar)
  p:step(5, "a")
  p:step(5, "b")
  p:finish()
  lu.assertStrContains(bar.text, "\r")
  lu.assertStrContains(bar.text, "2/2 100%")
end

-- ---- output ------------------------------------------------------------------------
local function sample_rows()
  local rows = run{kernel = "attention", axes = {device = ATT_DEV, L = {16, 32}, D = 8, H = 1, algo = {"naive", "flash"},
                                                 Br = {16, 9000}, Bc = {16, 32}}}
  rows[1].rel_error = 0 / 0 -- non-finite figures must survive the writers
  rows[2].gbs = math.huge
  return rows
end

TestSweepOutput = {}

function TestSweepOutput:test_csv_round_trip()
  local rows = sample_rows()
  local parsed = parse_csv(sweep.to_csv(rows))
  local cols = sweep.columns(rows)
  lu.assertEquals(parsed[1], cols)
  lu.assertEquals(#parsed, #rows + 1)
  local index = {}
  for i, c in ipairs(cols) do index[c] = i end
  for i, r in ipairs(rows) do
    local p = parsed[i + 1]
    lu.assertEquals(#p, #cols)
    lu.assertEquals(p[index.algo], r.algo)
    lu.assertEquals(tonumber(p[index.Lq]), r.Lq)
    lu.assertEquals(p[index.status], r.status)
    if r.status == "failed" then
      lu.assertEquals(p[index.error], r.error) -- commas and braces survive the quoting
      lu.assertEquals(p[index.median_ms], "")
    else
      lu.assertAlmostEquals(tonumber(p[index.median_ms]), r.median_ms, 1e-5 * r.median_ms)
    end
  end
  lu.assertEquals(parsed[2][index.rel_error], "nan")
  lu.assertEquals(parsed[3][index.gbs], "inf")
end

function TestSweepOutput:test_json_round_trip()
  local cjson = require "cjson"
  local rows = sample_rows()
  local dir = tmpdir()
  local files = sweep.save(rows, dir, "rt")
  lu.assertNotNil(read(files.csv))
  local doc = cjson.decode(read(files.json))
  lu.assertEquals(doc.meta.version, fa.version)
  lu.assertNotNil(doc.meta.devices[ATT_DEV])
  lu.assertEquals(#doc.rows, #rows)
  lu.assertEquals(doc.rows[1].rel_error, cjson.null)
  lu.assertEquals(doc.rows[2].gbs, cjson.null)
  for i, r in ipairs(rows) do
    lu.assertEquals(doc.rows[i].status, r.status)
    lu.assertEquals(doc.rows[i].tile, r.tile)
  end
  os.execute("rm -rf '" .. dir .. "'")
end

function TestSweepOutput:test_print_table()
  local out = {text = ""}
  function out:write(...) for _, s in ipairs({...}) do self.text = self.text .. s end end
  sweep.print_table(sample_rows(), out)
  lu.assertStrContains(out.text, "median ms")
  lu.assertStrContains(out.text, "failed: flashattn:")
end

function TestSweepOutput:test_charts()
  if not sweep.gnuplot() then lu.skip("gnuplot is not installed") end
  local dir = tmpdir()
  local files, notes = sweep.charts(sample_rows(), dir, "c")
  local want = {}
  for _, f in ipairs(files) do want[f:match("[^/]+$")] = f end
  for _, name in ipairs({"c_rate", "c_time", "c_memory", "c_tiles_1"}) do
    for _, ext in ipairs({"png", "svg"}) do
      local f = want[name .. "." .. ext]
      lu.assertNotNil(f, name .. "." .. ext .. " not written; notes: " .. table.concat(notes, "; "))
      local data = read(f)
      if ext == "png" then lu.assertEquals(data:sub(1, 4), "\137PNG") else lu.assertStrContains(data, "<svg") end
    end
  end
  -- the heat map marks the failed (invalid) tiles
  local heat = read(dir .. "/c_tiles_1.gp")
  lu.assertStrContains(heat, "failed")
  -- a colour-blind-safe palette, not the rainbow; titles state the fixed settings
  lu.assertNil(heat:find("rgbformulae", 1, true), "rainbow palette")
  lu.assertStrContains(heat, "#440154")
  lu.assertStrContains(heat, "f32 B=1 H=1 D=8 non-causal")
  local rate, time = read(dir .. "/c_rate.gp"), read(dir .. "/c_time.gp")
  for _, gp in ipairs({rate, time}) do
    lu.assertStrContains(gp, "#E69F00") -- Okabe-Ito
    lu.assertStrContains(gp, "yerrorlines") -- the interquartile range as error bars
    lu.assertStrContains(gp, ATT_DEV .. " f32 B=1 H=1 D=8")
  end
  -- the error bars' data: x, y, low, high with low <= y <= high
  local dat = read(dir .. "/c_time.dat")
  local n = 0
  for x, y, lo, hi in dat:gmatch("\n([%d.]%S*) (%S+) (%S+) (%S+)") do
    n = n + 1
    lu.assertTrue(tonumber(lo) <= tonumber(y) and tonumber(y) <= tonumber(hi), x)
  end
  lu.assertTrue(n > 0)
  os.execute("rm -rf '" .. dir .. "'")
end

function TestSweepOutput:test_fixed_settings_and_spread()
  local rows = run({kernel = "attention", reference = false, rep = 3,
                    axes = {device = ATT_DEV, L = {16, 32}, D = 8, H = 1, algo = "flash"}})
  lu.assertEquals(sweep.fixed_settings(rows), "flash " .. ATT_DEV .. " f32 B=1 H=1 D=8 non-causal")
  for _, r in ipairs(rows) do
    lu.assertTrue(r.q1_ms <= r.median_ms and r.median_ms <= r.q3_ms)
    local lo, hi = sweep.spread_of(r, "tflops")
    lu.assertTrue(lo <= r.tflops and r.tflops <= hi)
  end
end

function TestSweepOutput:test_meta_has_commit_command_and_seed()
  local rows = run({kernel = "attention", reference = false, seed = 77,
                    axes = {device = ATT_DEV, L = 16, D = 8, H = 1, algo = "flash"}})
  local meta = sweep.meta(rows)
  lu.assertEquals(meta.seed, 77)
  lu.assertEquals(type(meta.commit), "string")
  lu.assertTrue(#meta.commit > 0)
  lu.assertStrContains(meta.command, "test_sweep.lua")
  lu.assertEquals(meta.version, fa.version)
  local with_env = sweep.run_meta(5, {x = 1})
  lu.assertEquals({with_env.seed, with_env.x}, {5, 1})
end

function TestSweepRun:test_progress_only_on_a_terminal()
  -- "auto" (the default) draws nothing into a file or a pipe
  local f = io.tmpfile()
  local p = sweep.Progress.new("t", 10, 2, nil, f)
  p:step(5, "a")
  p:finish()
  f:seek("set")
  lu.assertEquals(f:read("a"), "")
  f:close()
  lu.assertFalse(sweep.isatty(f))
  lu.assertFalse(sweep.isatty({write = function() end}))
  -- a missing lua-term and lua-posix read as "not a terminal"
  local loaded, preload = package.loaded, package.preload
  local saved = {term = loaded.term, ["posix.stdio"] = loaded["posix.stdio"], ["posix.unistd"] = loaded["posix.unistd"]}
  for name in pairs(saved) do
    loaded[name] = nil
    preload[name] = function() error("module '" .. name .. "' not found") end
  end
  local ok, yes = pcall(sweep.isatty, io.stderr)
  for name, m in pairs(saved) do loaded[name], preload[name] = m, nil end
  lu.assertTrue(ok, tostring(yes))
  lu.assertFalse(yes)
end

-- ---- scripts/sweep.lua ------------------------------------------------------------
TestSweepScript = {}

local function script_available()
  if not pcall(require, "argparse") then lu.skip("lua-argparse is not installed") end
end

local function run_script(...)
  local chunk = assert(loadfile("scripts/sweep.lua"))
  -- the script's tables are not the test's output
  local print0, stdout0 = print, io.stdout
  print, io.stdout = function() end, {write = function() end, flush = function() end}
  local ok, rows = pcall(chunk, ...)
  print, io.stdout = print0, stdout0
  lu.assertTrue(ok, tostring(rows))
  return rows
end

function TestSweepScript:test_command_line_axes()
  script_available()
  local dir = tmpdir()
  local rows = run_script("--L", "16..32", "--D", "8", "--H", "1", "--algo", "naive,flash", "--device", ATT_DEV,
                          "--rep", "1", "--no-flush", "--out", dir, "--name", "cli", "--progress", "none",
                          "--no-charts", "--csv", dir .. "/all.csv")
  lu.assertEquals(#rows, 4)
  for _, r in ipairs(rows) do lu.assertEquals(r.status, "ok", tostring(r.error)) end
  lu.assertNotNil(read(dir .. "/cli.csv"))
  lu.assertNotNil(read(dir .. "/cli.json"))
  lu.assertNotNil(read(dir .. "/all.csv"))
  os.execute("rm -rf '" .. dir .. "'")
end

-- A bad argument: one line on stderr, exit status 1, no traceback.
function TestSweepScript:test_bad_arguments_one_line()
  script_available()
  local lua = arg and arg[-1]
  if not lua then lu.skip("no interpreter path in arg[-1]") end
  local cases = {
    {"scripts/sweep.lua", "--bogus"}, {"scripts/sweep.lua", "--L", "x", "--no-charts", "--out", os.tmpname()},
    {"scripts/sweep.lua", "--rep", "0"}, {"scripts/demo_sweep.lua", "--H", "x"},
    {"scripts/bench_cpu.lua", "--L", "-1"}, {"scripts/bench_softmax.lua", "--seed"},
    {"scripts/bench_attention.lua", "--dtypes", "f8"}, {"scripts/gpu_check.lua", "--small", "--lq-gg-lk"},
    {"scripts/gpu_check.lua", "--part", "3/2"}, {"scripts/gpu_check.lua", "--part", "x"},
    {"scripts/seeds.lua", "--rep", "zero"},
  }
  for _, c in ipairs(cases) do
    local cmd = ("%q %s 2>&1 >/dev/null; echo \"rc=$?\""):format(lua, table.concat(c, " "))
    local p = assert(io.popen(cmd))
    local text = p:read("a")
    p:close()
    local name = c[1]:match("[^/]+$")
    local msg, rc = text:match("^([^\n]*)\nrc=(%d+)\n$")
    lu.assertNotNil(msg, c[1] .. ": expected one line and a status, got: " .. text)
    lu.assertEquals(rc, "1", text)
    lu.assertEquals(msg:sub(1, #name + 1), name .. ":", text)
    lu.assertNil(msg:find("traceback", 1, true))
  end
end

function TestSweepScript:test_config_file()
  script_available()
  local dir = tmpdir()
  local cfg = dir .. "/cfg.lua"
  local f = assert(io.open(cfg, "w"))
  f:write(([[return {parts = {
    {name = "a", kernel = "softmax", axes = {device = %q, N = {64, 128}, algo = {"online", "fused"}, M = 2}},
    {name = "b", kernel = "attention", axes = {device = %q, L = 16, D = 8, H = 1, algo = "flash"},
     charts = {{kind = "line", name = "err", x = "Lq", y = "rel_error"}}},
  }}]]):format(U.device, ATT_DEV))
  f:close()
  local rows = run_script("--config", cfg, "--out", dir, "--progress", "none", "--rep", "1", "--no-charts")
  lu.assertEquals(#rows, 5)
  lu.assertNotNil(read(dir .. "/a.csv"))
  lu.assertNotNil(read(dir .. "/b.csv"))
  os.execute("rm -rf '" .. dir .. "'")
end

function TestSweepScript:test_default_study_smoke()
  script_available()
  local dir = tmpdir()
  local rows = run_script("--smoke", "--out", dir, "--progress", "none", "--no-charts")
  lu.assertTrue(#rows >= 20)
  for _, r in ipairs(rows) do
    -- on a device without attention the default study records those points as failed and runs the CPU too
    if r.device == ATT_DEV or r.kernel == "softmax" then
      lu.assertEquals(r.status, "ok", ("%s %s %s: %s"):format(r.kernel, r.device, r.algo, tostring(r.error)))
    end
  end
  os.execute("rm -rf '" .. dir .. "'")
end

U.run()
