-- demo_sweep.lua: the algorithms side by side on CPU-sized problems.
--
--   LUA_CPATH="build/lua/?.so;;" LUA_PATH="build/lua/?.lua;;" lua5.4 scripts/demo_sweep.lua [options]
--   (or: build/flashattn-lua scripts/demo_sweep.lua [options])
--
-- Softmax: naive (e^x/Σe^x), safe (three passes), online (two passes, running
-- (m, d)), fused (the row held on chip, one read).  Attention: naive (S and P
-- materialised), two_pass (online statistics, then the output pass),
-- flash_row (the seeds' one-pass recurrence, one query row at a time),
-- flash (tiled and fused).  For each setting it prints the median time
-- (fa.bench), the relative error against an f64 reference
-- (fa.attention_reference / an f64 softmax), the peak memory the call took
-- beyond its inputs (fa.reset_peak, fa.memory), and TFLOP/s or GB/s from the
-- cost models (fa.cost).  Runs on the default device (FLASHATTN_DEVICE
-- overrides it).
--
-- options: --quick (fewer settings), --full (L up to 4096), --smoke (tiny
-- sizes, one repetition: checks that the script runs, for CTest), --H n
-- (heads, default 2), --rep n, --json FILE (needs lua-cjson), --help
local fa = require "flashattn"

local function usage()
  print((arg and arg[0] or "demo_sweep.lua") .. " [--quick|--full|--smoke] [--H n] [--rep n] [--json FILE]")
end

local opt = {H = 2, rep = nil, quick = false, full = false, smoke = false, json = nil}
do
  local i = 1
  while arg and arg[i] do
    local a = arg[i]
    if a == "--quick" then opt.quick = true
    elseif a == "--full" then opt.full = true
    elseif a == "--smoke" then opt.smoke = true; opt.rep = opt.rep or 1
    elseif a == "--H" then i = i + 1; opt.H = assert(math.tointeger(tonumber(arg[i])), "--H needs an integer")
    elseif a == "--rep" then i = i + 1; opt.rep = assert(math.tointeger(tonumber(arg[i])), "--rep needs an integer")
    elseif a == "--json" then i = i + 1; opt.json = assert(arg[i], "--json needs a file name")
    elseif a == "--help" or a == "-h" then usage() return
    else io.stderr:write("demo_sweep: unknown argument " .. a .. "\n"); usage(); os.exit(2) end
    i = i + 1
  end
end

local device = fa.zeros(1):device()
local info = fa.device_info(device)
local t_start = os.time()

local function collect()
  collectgarbage("collect")
  collectgarbage("collect")
end

-- Peak bytes a call takes beyond what is held before it (its inputs).
local function peak_of(fn)
  collect()
  local before = fa.memory().current
  fa.reset_peak()
  local r = fn()
  fa.sync()
  local peak = fa.memory().peak - before
  return peak, r
end

-- fa.bench with a repetition count that keeps slow cases short.
local function timed(fn, first_ms)
  local rep = opt.rep
  if not rep then
    if first_ms < 20 then rep = 10 elseif first_ms < 200 then rep = 5 elseif first_ms < 1000 then rep = 3 else rep = 2 end
  end
  return fa.bench(fn, {warmup = opt.smoke and 0 or 1, rep = rep, flush_cache = true})
end

local function mib(b) return b / 2 ^ 20 end

local rows = {}
local function row(r)
  rows[#rows + 1] = r
  local rate
  if r.tflops then rate = ("%8.3f TFLOP/s"):format(r.tflops)
  elseif r.gbs then rate = ("%8.2f GB/s   "):format(r.gbs)
  else rate = "               " end
  if r.error then
    print(("%-10s %-9s %6s %5s %-9s  %s"):format(r.kind, r.algo, r.L, r.D, r.tile, r.error))
  else
    print(("%-10s %-9s %6d %5d %-9s %10.3f %10.2e %10.2f %s"):format(
      r.kind, r.algo, r.L, r.D, r.tile, r.ms, r.rel_error, mib(r.peak_bytes), rate))
  end
  io.stdout:flush()
end

print(("flashattn %s on %s: %s%s"):format(fa.version, device, info.name,
  device == "cpu" and (", %d threads, %s"):format(info.threads or 0, info.simd or "?") or ""))
print(("%-10s %-9s %6s %5s %-9s %10s %10s %10s %s"):format(
  "kernel", "algo", "L", "D", "tile", "median ms", "rel err", "peak MiB", "rate"))
print(string.rep("-", 96))

-- ---- softmax ---------------------------------------------------------------
do
  local Ns = opt.smoke and {256} or opt.quick and {1024, 16384} or {1024, 4096, 16384, 65536}
  local total = opt.smoke and 1 << 12 or 1 << 21 -- elements per input (8 MiB in f32)
  for _, N in ipairs(Ns) do
    local M = total // N
    local x = fa.randn({M, N}, {seed = N, device = device}) * 2
    local ref = fa.softmax(x:double(), {algo = "safe"}) -- f64
    for _, algo in ipairs({"naive", "safe", "online", "fused", "auto"}) do
      local ok, peak, y = pcall(peak_of, function() return fa.softmax(x, {algo = algo}) end)
      if not ok then
        row({kind = "softmax", algo = algo, L = N, D = M, tile = "-", error = tostring(peak):gsub("\n.*", "")})
      else
        local err = fa.rel_error(y:double(), ref)
        y:free()
        local first = fa.bench(function() fa.softmax(x, {algo = algo}) end, {warmup = 0, rep = 1})
        local b = timed(function() fa.softmax(x, {algo = algo}) end, first.median_ms)
        local cost = fa.cost.softmax(x, {algo = algo})
        row({kind = "softmax", algo = algo, L = N, D = M, tile = "-", ms = b.median_ms, rel_error = err,
             peak_bytes = peak, gbs = cost.bytes / (b.median_ms * 1e-3) / 1e9, bytes = cost.bytes})
      end
    end
    x:free(); ref:free()
  end
  print("(softmax rows: L = row length N, D = number of rows M)")
end

-- ---- attention -------------------------------------------------------------
local settings
if opt.smoke then
  settings = {{64, 16}, {128, 32}}
elseif opt.quick then
  settings = {{256, 64}, {1024, 64}}
elseif opt.full then
  settings = {{256, 64}, {512, 64}, {1024, 64}, {2048, 64}, {4096, 64}, {512, 128}, {1024, 128}, {2048, 128}}
else
  settings = {{256, 64}, {512, 64}, {1024, 64}, {2048, 64}, {512, 128}, {1024, 128}}
end
local TILES = {false, {64, 64}, {128, 32}}
local FLASH_ROW_MAX_L = 512 -- one query row at a time: slow by design

for _, s in ipairs(settings) do
  local L, D = s[1], s[2]
  local B, H = 1, opt.H
  local q = fa.randn({B, H, L, D}, {seed = 1, device = device})
  local k = fa.randn({B, H, L, D}, {seed = 2, device = device})
  local v = fa.randn({B, H, L, D}, {seed = 3, device = device})
  local ref = fa.attention_reference(q:cpu(), k:cpu(), v:cpu())
  local runs = {{"naive"}, {"auto"}}
  if L <= FLASH_ROW_MAX_L then runs[#runs + 1] = {"flash_row"} end
  for _, t in ipairs(TILES) do
    runs[#runs + 1] = {"two_pass", t}
    runs[#runs + 1] = {"flash", t}
  end
  for _, r in ipairs(runs) do
    local algo, tile = r[1], r[2]
    local o = {algo = algo, tile = tile or nil}
    local tile_s = tile and ("%dx%d"):format(tile[1], tile[2]) or "default"
    if algo == "naive" or algo == "flash_row" or algo == "auto" then tile_s = "-" end
    local ok, peak, out = pcall(peak_of, function() return fa.attention(q, k, v, o) end)
    if not ok then
      row({kind = "attention", algo = algo, L = L, D = D, tile = tile_s, error = tostring(peak):gsub("\n.*", "")})
    else
      local err = fa.rel_error(out:cpu():double(), ref)
      out:free()
      local first = fa.bench(function() fa.attention(q, k, v, o) end, {warmup = 0, rep = 1})
      local b = timed(function() fa.attention(q, k, v, o) end, first.median_ms)
      local cost = fa.cost.attention(q, k, v, o)
      row({kind = "attention", algo = algo, L = L, D = D, tile = tile_s, ms = b.median_ms, rel_error = err,
           peak_bytes = peak, tflops = cost.flops / (b.median_ms * 1e-3) / 1e12, flops = cost.flops,
           bytes = cost.bytes, B = B, H = H})
    end
  end
  q:free(); k:free(); v:free(); ref:free()
  collect()
end
print(("(attention: B = 1, H = %d, f32, Lq = Lk = L; peak = bytes beyond the inputs, output included; %d s in all)")
  :format(opt.H, os.time() - t_start))

if opt.json then
  local ok, cjson = pcall(require, "cjson")
  if not ok then
    io.stderr:write("demo_sweep: --json needs lua-cjson\n")
    os.exit(1)
  end
  local f = assert(io.open(opt.json, "w"))
  f:write(cjson.encode({version = fa.version, device = device, device_info = info, rows = rows}), "\n")
  f:close()
  print("wrote " .. opt.json)
end
