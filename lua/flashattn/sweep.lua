-- flashattn.sweep: grids of measurements, written as CSV, JSON and charts.
--
--   local sweep = require "flashattn.sweep"
--   local rows = sweep.run{kernel = "attention",
--                          axes = {L = {256, 512, 1024}, algo = {"naive", "flash"}}}
--   sweep.print_table(rows)
--   sweep.save(rows, "out", "my_sweep")          -- out/my_sweep.csv, .json
--   sweep.charts(rows, "out", "my_sweep")        -- PNG and SVG through gnuplot
--
-- A spec names a kernel ("attention" or "softmax") and axes: each axis a value
-- or a list of values; the grid is their Cartesian product (see M.AXES for the
-- names and their order, outermost first).  Every point is measured on fresh
-- seeded inputs: median time and spread (fa.bench), TFLOP/s and GB/s (fa.cost
-- of the algo), relative error against the f64 reference (on a sample of
-- query rows when the whole reference would be slow), and peak engine memory
-- beyond the inputs (fa.reset_peak / fa.memory).  A point that raises an error
-- (out of memory, an invalid tile, a kernel missing on a device) becomes a row
-- with status "failed" and the error, and the sweep goes on.
local fa = require "flashattn"

local M = {}

-- ---- axes ---------------------------------------------------------------------
-- Grid order, outermost first: points that share inputs (all but the algo and
-- tile axes) come one after another, so inputs and references are made once.
M.AXES = {
  attention = {"device", "dtype", "causal", "window", "mask", "B", "H", "Hkv", "D", "Dv", "L", "Lq", "Lk",
               "algo", "tile", "Br", "Bc"},
  softmax = {"device", "dtype", "M", "N", "L", "algo", "block"},
}

local INTEGER_AXES = {B = true, H = true, Hkv = true, D = true, Dv = true, L = true, Lq = true, Lk = true,
                      Br = true, Bc = true, M = true, N = true, block = true}
-- Axes that select how a kernel runs on given inputs (all others make inputs).
local RUN_AXES = {algo = true, tile = true, Br = true, Bc = true, block = true}

M.DEFAULTS = {
  attention = {dtype = "f32", causal = false, window = "none", mask = "none", B = 1, H = 2, D = 64, L = 512,
               algo = "auto", tile = "default"},
  softmax = {dtype = "f32", N = 4096, algo = "auto", block = 0},
}

-- Mask kinds of the attention axis `mask`.
M.MASKS = {
  none = "no mask",
  bool = "random boolean mask (Lq, Lk), about 10% of the pairs masked out",
  float = "additive float mask (Lq, Lk), 0.5·N(0, 1)",
  padding = "kv_lens: each batch keeps its first 3/4 of the keys",
  alibi = "ALiBi slopes 2^(-8h/H)",
}

-- Allowed relative error against the f64 reference (docs/perf/README.md, sweeps).
M.TOLERANCE = {f32 = 1e-5, f16 = 2e-2, bf16 = 2e-2, f64 = 1e-12}

-- ---- parsing values -------------------------------------------------------------
local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- "256,512" -> {"256", "512"}; "256..4096" -> powers of two from 256 to 4096.
function M.parse_list(text)
  local out = {}
  for item in tostring(text):gmatch("[^,]+") do
    item = trim(item)
    local a, b = item:match("^(%d+)%.%.(%d+)$")
    if a then
      local v, last = math.tointeger(tonumber(a)), math.tointeger(tonumber(b))
      assert(v > 0 and last >= v, "sweep: range " .. item .. ": expected 0 < a <= b")
      while v <= last do out[#out + 1] = v; v = v * 2 end
    else
      out[#out + 1] = item
    end
  end
  return out
end

local function as_integer(axis, v)
  local n = math.tointeger(tonumber(v))
  if not n then error(("sweep: axis %s: expected an integer, got %s"):format(axis, tostring(v)), 0) end
  return n
end

-- causal values as the rows show them: "false", "true", "top_left", "bottom_right".
local function causal_name(v)
  if v == nil or v == false or v == "false" or v == "none" or v == "no" then return "false" end
  if v == true or v == "true" or v == "yes" then return "true" end
  if v == "top_left" or v == "bottom_right" then return v end
  error("sweep: axis causal: expected false, true, top_left or bottom_right, got " .. tostring(v), 0)
end

local function causal_opt(name)
  if name == "false" then return false elseif name == "true" then return true end
  return name
end

-- window: "none", "left:right", {left, right} -> "none" or "left:right".
local function window_name(v)
  if v == nil or v == false or v == "none" or v == -1 then return "none" end
  if type(v) == "table" then return ("%d:%d"):format(as_integer("window", v[1]), as_integer("window", v[2])) end
  local l, r = tostring(v):match("^%s*(%-?%d+)%s*:%s*(%-?%d+)%s*$")
  if not l then error("sweep: axis window: expected none or left:right, got " .. tostring(v), 0) end
  return l .. ":" .. r
end

local function window_opt(name)
  if name == "none" then return nil end
  local l, r = name:match("^(%-?%d+):(%-?%d+)$")
  return {tonumber(l), tonumber(r)}
end

-- tile: "default", "BrxBc", {Br, Bc} -> "default" or "BrxBc".
local function tile_name(v)
  if v == nil or v == false or v == "default" or v == "-" then return "default" end
  if type(v) == "table" then return ("%dx%d"):format(as_integer("tile", v[1]), as_integer("tile", v[2])) end
  local a, b = tostring(v):match("^%s*(%-?%d+)%s*[xX]%s*(%-?%d+)%s*$")
  if not a then error("sweep: axis tile: expected default or BrxBc, got " .. tostring(v), 0) end
  return a .. "x" .. b
end

local function tile_opt(name)
  if name == "default" then return nil end
  local a, b = name:match("^(%-?%d+)x(%-?%d+)$")
  return {tonumber(a), tonumber(b)}
end

-- One axis value in its canonical form (what the rows and the files show).
local function canonical(axis, v)
  if INTEGER_AXES[axis] then return as_integer(axis, v) end
  if axis == "causal" then return causal_name(v) end
  if axis == "window" then return window_name(v) end
  if axis == "tile" then return tile_name(v) end
  if axis == "mask" and not M.MASKS[tostring(v)] then
    error("sweep: axis mask: expected none, bool, float, padding or alibi, got " .. tostring(v), 0)
  end
  return tostring(v)
end

-- ---- the grid ---------------------------------------------------------------------
-- An axis is one value or a list of values ({{64, 64}} or {"64x64"} for one tile).
local function values_of(v)
  if type(v) == "table" then return v end
  return {v}
end

local function check_axes(kernel, axes)
  local known = {}
  for _, a in ipairs(M.AXES[kernel] or error("sweep: unknown kernel " .. tostring(kernel), 0)) do known[a] = true end
  for a in pairs(axes) do
    if not known[a] then
      error(("sweep: unknown axis '%s' for %s (axes: %s)"):format(a, kernel, table.concat(M.AXES[kernel], ", ")), 0)
    end
  end
end

-- The points of a spec, in grid order: tables of axis -> raw value.
function M.grid(kernel, axes)
  axes = axes or {}
  check_axes(kernel, axes)
  local points = {{}}
  for _, a in ipairs(M.AXES[kernel]) do
    if axes[a] ~= nil then
      local vals = values_of(axes[a])
      local next_points = {}
      for _, p in ipairs(points) do
        for _, v in ipairs(vals) do
          local q = {}
          for kk, vv in pairs(p) do q[kk] = vv end
          q[a] = v
          next_points[#next_points + 1] = q
        end
      end
      points = next_points
    end
  end
  return points
end

-- A point with every field filled in and canonical: what a row starts with.
function M.point(kernel, raw, defaults)
  local p = {kernel = kernel}
  local d = {}
  for kk, vv in pairs(M.DEFAULTS[kernel]) do d[kk] = vv end
  for kk, vv in pairs(defaults or {}) do d[kk] = vv end
  local function get(a) if raw[a] ~= nil then return raw[a] end return d[a] end
  p.device = tostring(get("device") or fa.default_device())
  p.dtype = canonical("dtype", get("dtype"))
  p.algo = canonical("algo", get("algo"))
  if kernel == "attention" then
    for _, a in ipairs({"B", "H", "D"}) do p[a] = canonical(a, get(a)) end
    p.Hkv = canonical("Hkv", get("Hkv") or p.H)
    p.Dv = canonical("Dv", get("Dv") or p.D)
    p.Lq = canonical("Lq", raw.Lq or raw.L or d.Lq or d.L)
    p.Lk = canonical("Lk", raw.Lk or raw.L or d.Lk or d.L)
    p.causal = canonical("causal", get("causal"))
    p.window = canonical("window", get("window"))
    p.mask = canonical("mask", get("mask"))
    local br, bc = get("Br"), get("Bc")
    if (br == nil) ~= (bc == nil) then error("sweep: axes Br and Bc go together (or use tile)", 0) end
    if br ~= nil then
      p.Br, p.Bc = canonical("Br", br), canonical("Bc", bc)
      p.tile = ("%dx%d"):format(p.Br, p.Bc)
    else
      p.tile = canonical("tile", get("tile"))
      local t = tile_opt(p.tile)
      if t then p.Br, p.Bc = t[1], t[2] end
    end
  else
    p.N = canonical("N", raw.N or raw.L or d.N or d.L)
    local m = get("M") or math.max(1, (d.elements or (1 << 21)) // p.N)
    p.M = canonical("M", m)
    p.block = canonical("block", get("block"))
  end
  return p
end

-- Work of a point, for the progress bar's estimate of the time left.
local function work_of(p)
  if p.kernel == "attention" then
    local w = p.B * p.H * p.Lq * p.Lk * (p.D + p.Dv)
    if p.causal ~= "false" then w = w / 2 end
    return w + 1e5
  end
  return p.M * p.N + 1e4
end

-- ---- scripts: terminals, run metadata, command lines ---------------------------------
-- Whether `file` (default io.stderr) is a terminal: through lua-term
-- (Debian's lua-term) or else lua-posix; false when neither is installed, and
-- for anything that is not an open Lua file.
function M.isatty(file)
  file = file or io.stderr
  if io.type(file) ~= "file" then return false end
  local ok, term = pcall(require, "term")
  if ok and type(term) == "table" and term.isatty then
    local fine, yes = pcall(term.isatty, file)
    if fine then return yes == true end
  end
  local ok2, stdio = pcall(require, "posix.stdio")
  local ok3, unistd = pcall(require, "posix.unistd")
  if ok2 and ok3 then
    local fine, yes = pcall(function() return unistd.isatty(stdio.fileno(file)) end)
    if fine then return yes == 1 or yes == true end
  end
  return false
end

local function shell_word(w)
  w = tostring(w)
  if w ~= "" and not w:find("[^%w%-_./=:,@+]") then return w end
  return "'" .. w:gsub("'", "'\\''") .. "'"
end

-- The command line that started this process (interpreter, script and
-- arguments, shell-quoted), from the global `arg`; nil without one.
function M.command_line()
  if type(arg) ~= "table" then return nil end
  local first = 0
  while arg[first - 1] ~= nil do first = first - 1 end
  local words = {}
  for i = first, #arg do words[#words + 1] = shell_word(arg[i]) end
  return table.concat(words, " ")
end

-- The checkout this module belongs to (lua/flashattn/sweep.lua's grandparent).
local function source_root()
  local src = debug.getinfo(1, "S").source
  local dir = src:sub(1, 1) == "@" and src:sub(2):match("^(.*)/[^/]*$") or nil
  if not dir then return "." end
  return dir .. "/../.."
end

local commit_cache
-- The commit measured: FA_COMMIT when set (a tree copied without .git), else
-- `git describe --always --dirty` of this checkout, else "unknown".
function M.commit()
  if commit_cache then return commit_cache end
  local env = os.getenv("FA_COMMIT")
  if env and env ~= "" then commit_cache = env return env end
  local p = io.popen("git -C " .. shell_word(source_root()) .. " describe --always --dirty --abbrev=12 2>/dev/null")
  local text = p and p:read("a") or ""
  if p then p:close() end
  commit_cache = text:match("^%s*(%S+)") or "unknown"
  return commit_cache
end

-- The host's wall clock in nanoseconds (GNU date); nil without it.
function M.wall_ns()
  local p = io.popen("date +%s%N 2>/dev/null")
  local text = p and p:read("a") or ""
  if p then p:close() end
  return math.tointeger(tonumber(text:match("^%s*(%d+)%s*$")))
end

-- The first-call probes of variants (probe_first_calls.lua, probe_variant_numbers.lua: issue 26): bf16 q, k,
-- v of B 4, H 16, L 4096, D 128 on cuda; small: L = 256 (B 1, H 2, D 32), on the CPU where no GPU is, a smoke
-- test.  Returns {dev, dtype, B, H, L, D, q, k, v}, the inputs made and synchronised.
function M.variant_probe_inputs(small)
  local cuda = false
  for _, b in ipairs(fa.backends()) do cuda = cuda or b == "cuda" end
  local r = {dev = (small and not cuda) and "cpu" or "cuda"}
  r.B, r.H, r.L, r.D = small and 1 or 4, small and 2 or 16, small and 256 or 4096, small and 32 or 128
  r.dtype = r.dev == "cuda" and "bf16" or "f32"
  local function randn(seed) return fa.randn({r.B, r.H, r.L, r.D}, {dtype = r.dtype, device = r.dev, seed = seed}) end
  r.q, r.k, r.v = randn(1), randn(2), randn(3)
  fa.sync()
  return r
end

-- The variants benchmarks' documents (bench_variants.lua, probe_documents.lua):
-- lengths of 64 to L/4 keys drawn from the seed by a fixed generator (the same
-- on every machine, so that peers_variants.py reads them from the JSON) until L
-- is covered; the lengths, and each position's document (1-based ids).
function M.documents(L, seed)
  local lens, ids, n, x = {}, {}, 0, seed
  while n < L do
    x = (x * 1103515245 + 12345) % 2147483648
    local len = math.min(L - n, 64 + x % (math.max(64, L // 4) - 63))
    lens[#lens + 1] = len
    for i = n + 1, n + len do ids[i] = #lens end
    n = n + len
  end
  return lens, ids
end

-- What every JSON file the scripts write carries: engine version, date,
-- commit, command line and the seed of the inputs (a number, or a note where
-- a script uses fixed seeds); `extra` fields are added.
function M.run_meta(seed, extra)
  local t = {version = fa.version, date = os.date("!%Y-%m-%dT%H:%M:%SZ"), commit = M.commit(),
             command = M.command_line(), seed = seed}
  for kk, vv in pairs(extra or {}) do t[kk] = vv end
  return t
end

-- lua-argparse converters that name the option and say what they expected:
-- integer_arg(lo, option) takes integers >= lo (default 1), number_arg(option)
-- finite numbers, list_arg(option, numbers) comma lists (of numbers).
function M.integer_arg(lo, option)
  lo = lo or 1
  return function(s)
    local n = math.tointeger(tonumber(s))
    if not n or n < lo then return nil, ("%s: expected an integer >= %d, got '%s'"):format(option or "option", lo, s) end
    return n
  end
end

function M.number_arg(option)
  return function(s)
    local n = tonumber(s)
    if not n or n ~= n or n == math.huge or n == -math.huge then
      return nil, ("%s: expected a number, got '%s'"):format(option or "option", s)
    end
    return n
  end
end

function M.list_arg(option, numbers)
  return function(s)
    local t = {}
    for a in s:gmatch("[^,]+") do
      a = trim(a)
      if numbers then
        local n = math.tointeger(tonumber(a))
        if not n or n < 1 then return nil, ("%s: expected a comma list of positive integers, got '%s'"):format(option, s) end
        t[#t + 1] = n
      else
        t[#t + 1] = a
      end
    end
    if #t == 0 then return nil, ("%s: expected a comma list, got '%s'"):format(option, s) end
    return t
  end
end

-- The options of the GPU benchmark scripts (bench_backward, bench_decode,
-- bench_variants): --json, --quick (quick: what it shortens), --seed (seed:
-- what it seeds; default 1) and --device (cuda, or cpu for a smoke test).
function M.bench_options(p, quick, seed)
  p:option("--json", "write the results to this JSON file")
  p:flag("--quick", quick)
  p:option("--seed", seed or "seed of the inputs"):convert(M.integer_arg(0, "--seed")):default("1")
  p:option("--device", "cuda, or cpu for a smoke test at small sizes"):choices({ "cuda", "cpu" }):default("cuda")
end

-- Parses argv with a lua-argparse parser; a bad argument is an error whose
-- message is one line, "NAME: what is wrong" (see M.main).
function M.parse_args(parser, argv, name)
  local ok, args = parser:pparse(argv)
  if not ok then error(("%s: %s (try --help)"):format(name, tostring(args)), 0) end
  return args
end

-- The argument parser of a probe whose only option is --json (for M.main):
-- argv parsed by lua-argparse, the options table returned.
function M.json_only(name, description)
  return function(argv)
    local p = require "argparse"(name, description)
    p:option("--json", "write the results to this JSON file")
    return M.parse_args(p, argv, name)
  end
end

-- Runs a script's main(argv).  When the script is the program (arg[0] names
-- it), an error ends the process with its first line on stderr and exit
-- status 1, no traceback (FLASHATTN_TRACEBACK=1 shows one); when the script
-- was loaded by other code (a test), the error propagates.
function M.main(name, fn, argv)
  local program = type(arg) == "table" and type(arg[0]) == "string" and arg[0]:match("[^/]*$") == name
  if not program then return fn(argv) end
  local ok, result = xpcall(fn, function(e)
    if os.getenv("FLASHATTN_TRACEBACK") == "1" then return debug.traceback(tostring(e), 2) end
    return e
  end, argv)
  if ok then return result end
  local msg = tostring(result)
  if os.getenv("FLASHATTN_TRACEBACK") ~= "1" then msg = msg:match("[^\n]*") end
  if msg:sub(1, 7) == "sweep: " then msg = msg:sub(8) end
  if msg:sub(1, #name + 1) ~= name .. ":" and msg:sub(1, 10) ~= "flashattn:" then msg = name .. ": " .. msg end
  io.stderr:write(msg, "\n")
  os.exit(1)
end

-- ---- progress ---------------------------------------------------------------------
local function clock() return os.time() end

local function hms(s)
  s = math.max(0, math.floor(s + 0.5))
  if s >= 3600 then return ("%d:%02d:%02d"):format(s // 3600, s % 3600 // 60, s % 60) end
  return ("%d:%02d"):format(s // 60, s % 60)
end

M.Progress = {}
M.Progress.__index = M.Progress

-- mode: "auto" (the default: "bar" when `out` is a terminal, else nothing),
-- "bar" (one line rewritten with \r), "lines" (one line per point) or false;
-- out: a file (io.stderr by default).
function M.Progress.new(title, total_work, count, mode, out)
  out = out or io.stderr
  if mode == nil or mode == "auto" then mode = M.isatty(out) and "bar" or false end
  return setmetatable({title = title, total = total_work, count = count, done_work = 0, done = 0, failed = 0,
                       t0 = clock(), mode = mode, out = out, width = 0},
                      M.Progress)
end

function M.Progress:line(label)
  local frac = self.total > 0 and self.done_work / self.total or 1
  local elapsed = clock() - self.t0
  local left = (frac > 0 and elapsed > 0) and elapsed * (1 - frac) / frac or nil
  local n = 24
  local filled = math.floor(frac * n + 0.5)
  return ("%s [%s%s] %d/%d %3d%%  %s elapsed, %s left%s  %s"):format(self.title, string.rep("#", filled),
    string.rep(".", n - filled), self.done, self.count, math.floor(frac * 100 + 0.5), hms(elapsed),
    left and hms(left) or "?:??", self.failed > 0 and (", %d failed"):format(self.failed) or "", label or "")
end

function M.Progress:step(work, label, failed)
  self.done, self.done_work = self.done + 1, self.done_work + work
  if failed then self.failed = self.failed + 1 end
  if not self.mode then return end
  local text = self:line(label)
  if self.mode == "lines" then
    self.out:write(text, "\n")
  else
    if #text > 150 then text = text:sub(1, 150) end
    self.out:write("\r", text, string.rep(" ", math.max(0, self.width - #text)))
    self.width = #text
  end
  self.out:flush()
end

function M.Progress:finish()
  if not self.mode then return end
  local text = ("%s: %d points in %s%s"):format(self.title, self.done, hms(clock() - self.t0),
    self.failed > 0 and (", %d failed"):format(self.failed) or "")
  if self.mode == "bar" then text = "\r" .. text .. string.rep(" ", math.max(0, self.width - #text)) end
  self.out:write(text, "\n")
  self.out:flush()
end

-- ---- inputs ---------------------------------------------------------------------
local function collect()
  collectgarbage("collect")
  collectgarbage("collect")
end

local function free_all(list)
  for _, t in pairs(list or {}) do
    if fa.is_tensor(t) then pcall(t.free, t) end
  end
end

-- The key of the inputs a point needs: all fields but the run axes.
local function input_key(p)
  local keys = {}
  for kk, vv in pairs(p) do
    if not RUN_AXES[kk] then keys[#keys + 1] = kk .. "=" .. tostring(vv) end
  end
  table.sort(keys)
  return table.concat(keys, ",")
end

-- A random boolean (Lq, Lk) mask with about 10% false: uniform values scaled
-- so that those under 0.1 round to zero in f16 (below 2^-25), then to bool.
local function random_bool_mask(Lq, Lk, seed, device)
  local u = fa.rand({Lq, Lk}, {seed = seed})
  local m = (u * (2 ^ -25 / 0.1)):half():to("bool")
  u:free()
  if device ~= "cpu" then m = m:to(device) end
  return m
end

local function attention_inputs(p, seed)
  local o = {dtype = p.dtype, device = p.device}
  local function randn(shape, s)
    o.seed = seed + s
    return fa.randn(shape, o)
  end
  local t = {}
  t.q = randn({p.B, p.H, p.Lq, p.D}, 1)
  t.k = randn({p.B, p.Hkv, p.Lk, p.D}, 2)
  t.v = randn({p.B, p.Hkv, p.Lk, p.Dv}, 3)
  local extra = {}
  if p.mask == "bool" then
    t.mask = random_bool_mask(p.Lq, p.Lk, seed + 4, p.device)
  elseif p.mask == "float" then
    local f = fa.randn({p.Lq, p.Lk}, {seed = seed + 4, dtype = p.dtype, device = p.device})
    t.mask = f * 0.5
    f:free()
  elseif p.mask == "padding" then
    extra.kv_lens = {}
    for b = 1, p.B do extra.kv_lens[b] = math.max(1, p.Lk - p.Lk // 4) end
  elseif p.mask == "alibi" then
    extra.alibi = {}
    for h = 1, p.H do extra.alibi[h] = 2 ^ (-8 * h / p.H) end
  end
  return t, extra
end

-- The options of fa.attention for a point (the function, not the run).
local function attention_fn_opts(p, inputs, extra)
  return {causal = causal_opt(p.causal), window = window_opt(p.window), mask = inputs.mask,
          kv_lens = extra.kv_lens, alibi = extra.alibi}
end

-- Which query rows the reference is computed on: all of them when that is
-- cheap, else a block of rows.  The reference on q:narrow(rows) equals those
-- output rows only when the causal/window/ALiBi alignment survives the
-- narrowing: bottom-right alignment (i + Lk - Lq) keeps the last rows,
-- top-left (i) the first.  Returns start, count, and the causal option the
-- reference takes.
local function reference_rows(p, cfg)
  local per_row = p.B * p.H * p.Lk * (p.D + p.Dv)
  local n = math.max(cfg.ref_min_rows or 8, (cfg.ref_budget or (1 << 27)) // per_row)
  local causal = causal_opt(p.causal)
  if causal == "top_left" and p.Lq == p.Lk then causal = true end -- the same diagonal
  if n >= p.Lq then return 1, p.Lq, causal end
  if causal == "top_left" then
    if p.window ~= "none" or p.mask == "alibi" then return 1, p.Lq, causal end -- both alignments: all rows
    return 1, n, causal
  end
  return p.Lq - n + 1, n, causal
end

local function attention_reference(p, inputs, fn_opts, cfg)
  local start, n, causal = reference_rows(p, cfg)
  local r = {causal = causal, window = fn_opts.window, kv_lens = fn_opts.kv_lens, alibi = fn_opts.alibi}
  if inputs.mask then r.mask = inputs.mask:narrow(1, start, n):cpu() end
  local q = inputs.q:narrow(3, start, n):cpu()
  local ref = fa.attention_reference(q, inputs.k:cpu(), inputs.v:cpu(), r)
  return {ref = ref, start = start, n = n, dim = 3}
end

local function softmax_inputs(p, seed, scale)
  local x = fa.randn({p.M, p.N}, {seed = seed + 1, dtype = p.dtype, device = p.device})
  if scale and scale ~= 1 then
    local y = x * scale
    x:free()
    x = y
  end
  return {x = x}, {}
end

local function softmax_reference(p, inputs, cfg)
  local n = math.min(p.M, math.max(1, (cfg.ref_budget or (1 << 27)) // (p.N * 16)))
  local ref = fa.softmax(inputs.x:narrow(1, 1, n):cpu():double(), {algo = "safe"})
  return {ref = ref, start = 1, n = n, dim = 1}
end

-- ---- one point ------------------------------------------------------------------
local function quantile(sorted, q)
  local pos = 1 + (#sorted - 1) * q
  local lo = math.floor(pos)
  local hi = math.min(lo + 1, #sorted)
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo)
end

-- The median of a list of numbers (the list itself left as it is); nil when empty.
function M.median(values)
  if #values == 0 then return nil end
  local sorted = table.move(values, 1, #values, 1, {})
  table.sort(sorted)
  return quantile(sorted, 0.5)
end

-- Times fn: a probe run sizes the repetition count to the point's time budget
-- and doubles as the warm-up; then each repetition is its own fa.bench run
-- (device events on CUDA, cache flushed before it unless cfg.flush == false),
-- so that the spread can be the interquartile range rather than max - min,
-- which one preempted run blows up on a shared machine.
local function timed(fn, cfg)
  local bench_opts = {warmup = 0, rep = 1, flush_cache = cfg.flush ~= false}
  local probe = fa.bench(fn, bench_opts).median_ms
  local rep = cfg.rep
  if not rep then
    local budget = cfg.budget_ms or 300
    if probe >= budget then rep = 1
    else rep = math.max(3, math.min(cfg.max_rep or 25, math.floor(budget / math.max(probe, 1e-3)))) end
  end
  for _ = 1, cfg.warmup or 0 do fn() end
  local times = {}
  if rep == 1 and not cfg.rep and not cfg.warmup then
    times[1] = probe -- too slow to repeat: the probe is the figure
  else
    for i = 1, rep do times[i] = fa.bench(fn, bench_opts).median_ms end
  end
  table.sort(times)
  local med = quantile(times, 0.5)
  local q1, q3 = quantile(times, 0.25), quantile(times, 0.75)
  return {median_ms = med, min_ms = times[1], max_ms = times[#times], n = #times, q1_ms = q1, q3_ms = q3,
          spread_pct = med > 0 and 100 * (q3 - q1) / med or 0}
end

local function first_line(err)
  local s = tostring(err)
  return (s:match("[^\n]*"))
end

-- Measures one point into row (fields added in place); errors propagate.
local function measure(p, row, cfg, cache)
  local key = input_key(p)
  if cache.key ~= key then
    free_all(cache.inputs)
    if cache.ref then cache.ref.ref:free() end
    cache.key, cache.inputs, cache.extra, cache.ref = nil, nil, nil, nil
    collect()
    local inputs, extra
    if p.kernel == "attention" then
      inputs, extra = attention_inputs(p, cfg.seed or 1)
    else
      inputs, extra = softmax_inputs(p, cfg.seed or 1, cfg.scale)
    end
    cache.key, cache.inputs, cache.extra = key, inputs, extra
  end
  local inputs = cache.inputs
  local call, opts, cost_fn
  if p.kernel == "attention" then
    opts = attention_fn_opts(p, inputs, cache.extra)
    opts.algo, opts.tile = p.algo, tile_opt(p.tile)
    call = function(o) return fa.attention(inputs.q, inputs.k, inputs.v, o) end
    cost_fn = function() return fa.cost.attention(inputs.q, inputs.k, inputs.v, opts) end
  else
    opts = {algo = p.algo, block = p.block ~= 0 and p.block or nil}
    call = function(o) return fa.softmax(inputs.x, o) end
    cost_fn = function() return fa.cost.softmax(inputs.x, opts) end
  end
  local cost = cost_fn()
  row.flops, row.bytes = cost.flops, cost.bytes

  -- the first call: its output for the error, its peak for the memory
  collect()
  local before = fa.memory(p.device).current
  fa.reset_peak(p.device)
  local out = call(opts)
  fa.sync()
  row.peak_bytes = fa.memory(p.device).peak - before
  row.peak_mib = row.peak_bytes / 2 ^ 20

  if cfg.reference ~= false then
    if not cache.ref then
      if p.kernel == "attention" then
        cache.ref = attention_reference(p, inputs, attention_fn_opts(p, inputs, cache.extra), cfg)
      else
        cache.ref = softmax_reference(p, inputs, cfg)
      end
    end
    local r = cache.ref
    local sample = out:narrow(r.dim, r.start, r.n):cpu():double()
    row.rel_error = fa.rel_error(sample, r.ref)
    row.ref_rows = r.n
    local tol = M.TOLERANCE[p.dtype]
    row.error_ok = tol ~= nil and row.rel_error <= tol
    sample:free()
  end

  -- timed calls write into the first call's output: no allocation in the loop
  opts.out = out
  local b = timed(function() call(opts) end, cfg)
  out:free()
  row.median_ms, row.min_ms, row.max_ms, row.reps = b.median_ms, b.min_ms, b.max_ms, b.n
  row.q1_ms, row.q3_ms = b.q1_ms, b.q3_ms -- the interquartile range: the charts' error bars
  row.spread_pct = b.spread_pct
  local s = b.median_ms * 1e-3
  row.tflops = s > 0 and row.flops / s / 1e12 or nil
  row.gbs = s > 0 and row.bytes / s / 1e9 or nil
  row.status = "ok"
end

local function release(cache)
  free_all(cache.inputs)
  if cache.ref then pcall(cache.ref.ref.free, cache.ref.ref) end
  cache.key, cache.inputs, cache.extra, cache.ref = nil, nil, nil, nil
  collect()
end

-- A short label of a point for the progress line: its varying axes.
local function label_of(p, varying)
  local parts = {}
  for _, a in ipairs(varying) do
    if a == "Br" or a == "Bc" then -- shown by tile
    elseif a == "algo" then table.insert(parts, 1, tostring(p.algo)) else parts[#parts + 1] = a .. "=" .. tostring(p[a]) end
  end
  return table.concat(parts, " ")
end

-- Fields that differ between points (columns worth showing).
function M.varying(rows, fields)
  local out = {}
  for _, f in ipairs(fields) do
    local first, differs = nil, false
    for i, r in ipairs(rows) do
      local v = r[f]
      if i == 1 then first = v elseif v ~= first then differs = true break end
    end
    if differs then out[#out + 1] = f end
  end
  return out
end

-- Row fields that describe a point (as opposed to what was measured).
M.POINT_FIELDS = {"kernel", "device", "dtype", "algo", "B", "H", "Hkv", "Lq", "Lk", "D", "Dv", "M", "N", "block",
                  "tile", "Br", "Bc", "causal", "window", "mask"}
M.METRIC_FIELDS = {"status", "median_ms", "min_ms", "max_ms", "q1_ms", "q3_ms", "spread_pct", "reps", "tflops", "gbs",
                   "flops",
                   "bytes", "rel_error", "ref_rows", "error_ok", "peak_bytes", "peak_mib", "error"}

-- Runs a spec: {kernel=, axes=, defaults=, filter=fn(point)->bool, seed=,
-- rep=, warmup=, budget_ms=, max_rep=, flush=, reference=, ref_budget=,
-- ref_min_rows=, scale= (softmax inputs), name=}.  cfg.progress: "bar",
-- "lines" or false; cfg.progress_out: a file; cfg.on_row(row): called after
-- each point.  Returns the rows, one per point, in grid order.
function M.run(spec, cfg)
  cfg = cfg or {}
  local kernel = spec.kernel or "attention"
  local points = {}
  for _, raw in ipairs(M.grid(kernel, spec.axes)) do
    local p = M.point(kernel, raw, spec.defaults)
    if not spec.filter or spec.filter(p) then points[#points + 1] = p end
  end
  local total = 0
  for _, p in ipairs(points) do total = total + work_of(p) end
  local varying = M.varying(points, M.POINT_FIELDS)
  local progress = M.Progress.new(spec.name or kernel, total, #points, cfg.progress, cfg.progress_out)
  local rows, cache = {}, {}
  local home = fa.default_device()
  for _, p in ipairs(points) do
    local row = {}
    for kk, vv in pairs(p) do row[kk] = vv end
    row.seed = spec.seed or 1 -- measure()'s inputs: seed + 1, + 2, ...
    -- the point's device becomes the default: fa.bench, fa.sync and the
    -- engine's context then time and wait on the device that does the work
    local ok, err = pcall(function()
      fa.set_default_device(p.device)
      return measure(p, row, spec, cache)
    end)
    fa.set_default_device(home)
    if not ok then
      for _, f in ipairs(M.METRIC_FIELDS) do row[f] = nil end
      row.status, row.error = "failed", first_line(err)
      release(cache) -- a failure may leave partial state: start the next point afresh
    end
    rows[#rows + 1] = row
    progress:step(work_of(p), label_of(p, varying), not ok)
    if cfg.on_row then cfg.on_row(row) end
  end
  release(cache)
  progress:finish()
  return rows
end

-- ---- text table -------------------------------------------------------------------
local function fmt_num(v, f)
  if v == nil then return "-" end
  if v ~= v then return "nan" end
  return (f):format(v)
end

-- Prints the rows: the axes that vary, then the figures; failures with their error.
function M.print_table(rows, out)
  out = out or io.stdout
  if #rows == 0 then out:write("(no points)\n") return end
  local axes = {}
  for _, a in ipairs(M.varying(rows, M.POINT_FIELDS)) do
    if a ~= "Br" and a ~= "Bc" then axes[#axes + 1] = a end -- shown by tile
  end
  if #axes == 0 then axes = {"algo"} end
  local kernel = rows[1].kernel
  local rate_field, rate_name, rate_fmt = "tflops", "TFLOP/s", "%.4f"
  if kernel == "softmax" then rate_field, rate_name, rate_fmt = "gbs", "GB/s", "%.2f" end
  local head = {}
  for _, a in ipairs(axes) do head[#head + 1] = ("%-10s"):format(a) end
  out:write(table.concat(head, " "), ("  %10s %7s %10s %10s %10s\n"):format("median ms", "spread", rate_name,
    "rel err", "peak MiB"))
  for _, r in ipairs(rows) do
    local cells = {}
    for _, a in ipairs(axes) do cells[#cells + 1] = ("%-10s"):format(r[a] == nil and "-" or tostring(r[a])) end
    local line = table.concat(cells, " ")
    if r.status == "ok" then
      line = line .. ("  %10s %6s%% %10s %10s %10s"):format(fmt_num(r.median_ms, "%.3f"), fmt_num(r.spread_pct, "%.0f"),
        fmt_num(r[rate_field], rate_fmt), fmt_num(r.rel_error, "%.2e"), fmt_num(r.peak_mib, "%.2f"))
    else
      line = line .. "  failed: " .. tostring(r.error)
    end
    out:write(line, "\n")
  end
end

-- ---- CSV and JSON -------------------------------------------------------------------
-- Columns present in any row: point fields, then metrics, then the rest sorted.
function M.columns(rows)
  local present, seen, cols = {}, {}, {}
  for _, r in ipairs(rows) do for kk in pairs(r) do present[kk] = true end end
  local function add(f) if present[f] and not seen[f] then seen[f] = true; cols[#cols + 1] = f end end
  for _, f in ipairs(M.POINT_FIELDS) do add(f) end
  for _, f in ipairs(M.METRIC_FIELDS) do add(f) end
  local rest = {}
  for f in pairs(present) do if not seen[f] then rest[#rest + 1] = f end end
  table.sort(rest)
  for _, f in ipairs(rest) do add(f) end
  return cols
end

local function csv_cell(v)
  if v == nil then return "" end
  local s
  if type(v) == "number" then
    if v ~= v then s = "nan"
    elseif v == math.huge then s = "inf"
    elseif v == -math.huge then s = "-inf"
    elseif math.type(v) == "integer" or (v == math.floor(v) and math.abs(v) < 2 ^ 53) then s = ("%d"):format(v)
    else s = ("%.6g"):format(v) end
  else
    s = tostring(v)
  end
  if s:find('[,"\n\r]') then s = '"' .. s:gsub('"', '""') .. '"' end
  return s
end

function M.to_csv(rows)
  local cols = M.columns(rows)
  local lines = {table.concat(cols, ",")}
  for _, r in ipairs(rows) do
    local cells = {}
    for i, c in ipairs(cols) do cells[i] = csv_cell(r[c]) end
    lines[#lines + 1] = table.concat(cells, ",")
  end
  return table.concat(lines, "\n") .. "\n"
end

local function write_file(path, text)
  local f, err = io.open(path, "w")
  if not f then error("sweep: cannot write " .. tostring(err), 0) end
  f:write(text)
  f:close()
  return path
end

function M.write_csv(rows, path) return write_file(path, M.to_csv(rows)) end

-- What the run was: engine version, date, commit, command line, the seed of
-- the inputs (one number, or the list when parts differ) and the devices used.
function M.meta(rows)
  local devices, seen, seeds = {}, {}, {}
  for _, r in ipairs(rows or {}) do
    if not devices[r.device] then
      local ok, info = pcall(fa.device_info, r.device)
      devices[r.device] = ok and info or {error = first_line(info)}
    end
    if r.seed ~= nil and not seen[r.seed] then seen[r.seed] = true; seeds[#seeds + 1] = r.seed end
  end
  local seed = seeds[1]
  if #seeds > 1 then seed = seeds end
  return M.run_meta(seed, {devices = devices})
end

-- JSON through lua-cjson; NaN and infinities become null.
function M.to_json(rows, meta)
  local ok, cjson = pcall(require, "cjson")
  if not ok then error("sweep: JSON output needs lua-cjson (require 'cjson')", 0) end
  local json = cjson.new()
  json.encode_invalid_numbers("null")
  local doc = {meta = meta or M.meta(rows), columns = M.columns(rows), rows = rows}
  return json.encode(doc) .. "\n"
end

function M.write_json(rows, path, meta) return write_file(path, M.to_json(rows, meta)) end
-- Any table t as JSON (the benchmark scripts' --json files, whose layout is their own).
function M.write_json_object(t, path) return write_file(path, require("cjson").encode(t)) end

local function mkdir(dir)
  if dir and dir ~= "" and dir ~= "." then os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'") end
end

-- Writes dir/name.csv and dir/name.json; returns their paths.
function M.save(rows, dir, name, meta)
  mkdir(dir)
  local base = (dir or ".") .. "/" .. name
  return {csv = M.write_csv(rows, base .. ".csv"), json = M.write_json(rows, base .. ".json", meta)}
end

-- ---- charts (gnuplot) -------------------------------------------------------------
local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function gp_string(s) return "'" .. tostring(s):gsub("'", "''") .. "'" end
-- a double-quoted gnuplot string: "\n" there is a line break (the terminals
-- are noenhanced, so nothing else in it is markup)
local function gp_dq(s)
  return '"' .. tostring(s):gsub('[\\"]', "\\%0"):gsub("\n", "\\n") .. '"'
end

local gnuplot_cache
-- The gnuplot terminals at hand: {png = "pngcairo" or "png", svg = true}, or
-- nil and why not.
function M.gnuplot()
  if gnuplot_cache ~= nil then return gnuplot_cache or nil, "gnuplot not found" end
  local p = io.popen("gnuplot -e 'set terminal' </dev/null 2>&1")
  local text = p and p:read("a") or ""
  if p then p:close() end
  local t = {}
  for name in text:gmatch("\n%s*([%w]+)%s") do t[name] = true end
  if not (t.png or t.pngcairo or t.svg) then
    gnuplot_cache = false
    return nil, "gnuplot not found (or it has no png/svg terminal)"
  end
  gnuplot_cache = {png = t.pngcairo and "pngcairo" or (t.png and "png" or nil), svg = t.svg or nil}
  return gnuplot_cache
end

local function terminals(formats)
  local g, why = M.gnuplot()
  if not g then return nil, why end
  local list = {}
  for _, f in ipairs(formats or {"png", "svg"}) do
    if f == "png" and g.png then
      list[#list + 1] = {ext = "png", term = g.png .. " size 960,600 noenhanced"}
    elseif f == "svg" and g.svg then
      list[#list + 1] = {ext = "svg", term = "svg size 960,600 noenhanced dynamic background rgb 'white'"}
    end
  end
  if #list == 0 then return nil, "gnuplot has none of the terminals asked for" end
  return list
end

-- Runs a gnuplot script whose plot commands are `body`, once per terminal;
-- keeps base.gp beside the pictures.  Returns the files written.
local function run_gnuplot(base, preamble, body, formats)
  local terms, why = terminals(formats)
  if not terms then return nil, why end
  local lines = {preamble}
  local files = {}
  for _, t in ipairs(terms) do
    local file = base .. "." .. t.ext
    lines[#lines + 1] = ("set terminal %s\nset output %s\n%s\nunset output"):format(t.term, gp_string(file), body)
    files[#files + 1] = file
  end
  local gp = write_file(base .. ".gp", table.concat(lines, "\n") .. "\n")
  local ok = os.execute(("gnuplot %s >%s 2>&1"):format(shell_quote(gp), shell_quote(base .. ".gnuplot.log")))
  if not ok then
    local f = io.open(base .. ".gnuplot.log")
    local log = f and f:read("a") or ""
    if f then f:close() end
    return nil, "gnuplot failed on " .. gp .. ": " .. first_line(log)
  end
  os.remove(base .. ".gnuplot.log")
  return files
end

local LABELS = {tflops = "TFLOP/s", gbs = "GB/s", median_ms = "median time (ms)", peak_mib = "peak engine memory (MiB)",
                rel_error = "relative error vs f64", Lq = "L (query length)", Lk = "L (key length)",
                N = "N (row length)"}

local function series_label(r, by)
  local parts = {}
  for _, f in ipairs(by) do
    if f == "algo" then table.insert(parts, 1, tostring(r[f])) else parts[#parts + 1] = f .. "=" .. tostring(r[f]) end
  end
  return #parts > 0 and table.concat(parts, " ") or tostring(r.algo or "")
end

local function usable(r, f) return r.status == "ok" and type(r[f]) == "number" and r[f] == r[f] end

-- Okabe and Ito's colour-blind-safe palette (black first, yellow last: it
-- reads poorly on white), with a point type per series as a second cue.
M.PALETTE = {"#000000", "#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7", "#F0E442"}

local function palette_lines()
  local lines = {}
  for i, colour in ipairs(M.PALETTE) do
    lines[i] = ("set linetype %d lc rgb '%s' lw 2 pt %d ps 1.2"):format(i, colour, ({7, 5, 9, 11, 13, 4, 6, 8})[i])
  end
  lines[#lines + 1] = ("set linetype cycle %d"):format(#M.PALETTE)
  return table.concat(lines, "\n")
end

-- The settings every row shares, as "D=64 H=4 f32 cpu": what a chart's title
-- states beside its varying axes.  `skip` names fields left out.
function M.fixed_settings(rows, skip)
  if #rows == 0 then return "" end
  local varying = {}
  for _, f in ipairs(M.varying(rows, M.POINT_FIELDS)) do varying[f] = true end
  local r, parts = rows[1], {}
  for _, f in ipairs(M.POINT_FIELDS) do
    local v = r[f]
    if v ~= nil and not varying[f] and not (skip or {})[f] and f ~= "kernel" then
      if f == "device" or f == "dtype" then parts[#parts + 1] = tostring(v)
      elseif f == "algo" then table.insert(parts, 1, tostring(v))
      elseif f == "Br" or f == "Bc" then -- shown by tile
      elseif f == "Hkv" and r.Hkv == r.H then -- MHA: said by H
      elseif f == "Dv" and r.Dv == r.D then
      elseif f == "Lk" and r.Lk == r.Lq and not varying.Lq then -- said by Lq
      elseif (f == "window" or f == "mask" or f == "tile") and (v == "none" or v == "default") then
      elseif f == "causal" then parts[#parts + 1] = v == "false" and "non-causal" or ("causal=" .. v)
      elseif f == "block" and v == 0 then
      else parts[#parts + 1] = f .. "=" .. tostring(v) end
    end
  end
  return table.concat(parts, " ")
end

-- The interquartile range of a row's time, as (low, high) of a y field: time
-- itself, or a rate (flops or bytes over time, so the bounds swap).
function M.spread_of(r, y)
  if type(r.q1_ms) ~= "number" or type(r.q3_ms) ~= "number" or type(r.median_ms) ~= "number" then return nil end
  if y == "median_ms" then return r.q1_ms, r.q3_ms end
  if (y == "tflops" or y == "gbs") and r.q1_ms > 0 and r.q3_ms > 0 then
    -- the ratio first: (rate · median) / q3 rounds twice and, where q3 equals the median, may land an
    -- ulp past the rate it bounds; rate · (median / q3) is the rate itself there, and never past it
    return r[y] * (r.median_ms / r.q3_ms), r[y] * (r.median_ms / r.q1_ms)
  end
  return nil
end

-- A line chart: y against x, one line per combination of the `by` fields,
-- with the interquartile range of the timings as error bars where y is a
-- time or a rate (c.errors = false leaves them out).  c = {x=, y=, by=
-- {fields}, file= (path without extension), title=, logx= (default true),
-- logy=, formats= {"png", "svg"}}.  The title gets the settings every row
-- shares (M.fixed_settings) as a second line.
function M.line_chart(rows, c)
  local by = c.by or {"algo"}
  local series, order = {}, {}
  local with_errors = c.errors ~= false
  local used = {}
  for _, r in ipairs(rows) do
    if usable(r, c.x) and usable(r, c.y) and (not c.logy or r[c.y] > 0) then
      local label = series_label(r, by)
      if not series[label] then series[label] = {}; order[#order + 1] = label end
      local sc = c.scale or 1
      local lo, hi
      if with_errors then lo, hi = M.spread_of(r, c.y) end
      if not lo or (c.logy and lo <= 0) then lo, hi = r[c.y], r[c.y] end
      table.insert(series[label], {r[c.x], r[c.y] * sc, lo * sc, hi * sc})
      used[#used + 1] = r
    end
  end
  if #order == 0 then return nil, "no measured points for " .. c.y end
  local blocks = {}
  for _, label in ipairs(order) do
    local pts = series[label]
    table.sort(pts, function(a, b) return a[1] < b[1] end)
    local lines = {"# " .. label .. ": x y y_q1 y_q3"}
    for _, pt in ipairs(pts) do lines[#lines + 1] = ("%.17g %.17g %.17g %.17g"):format(pt[1], pt[2], pt[3], pt[4]) end
    blocks[#blocks + 1] = table.concat(lines, "\n")
  end
  local dat = write_file(c.file .. ".dat", table.concat(blocks, "\n\n\n") .. "\n")
  local title = c.title or (c.y .. " against " .. c.x)
  local fixed = M.fixed_settings(used, (function() local t = {[c.x] = true}; for _, f in ipairs(by) do t[f] = true end
    return t end)())
  if fixed ~= "" and c.fixed ~= false then title = title .. "\n" .. fixed end
  local pre = {palette_lines(),
               ("set title %s"):format(gp_dq(title)),
               ("set xlabel %s"):format(gp_string(LABELS[c.x] or c.x)),
               ("set ylabel %s"):format(gp_string(c.ylabel or LABELS[c.y] or c.y)),
               "set grid", "set key outside right top", "set bars small"}
  if c.logx ~= false then pre[#pre + 1] = "set logscale x 2" end
  if c.logy then pre[#pre + 1] = "set logscale y" end
  local plots = {}
  for i, label in ipairs(order) do
    plots[i] = ("%s index %d using 1:2:3:4 with yerrorlines lt %d title %s"):format(gp_string(dat), i - 1, i,
      gp_string(label))
  end
  return run_gnuplot(c.file, table.concat(pre, "\n"), "plot " .. table.concat(plots, ", \\\n  "), c.formats)
end

local function sorted_values(rows, f)
  local seen, list = {}, {}
  for _, r in ipairs(rows) do
    local v = r[f]
    if v ~= nil and not seen[v] then seen[v] = true; list[#list + 1] = v end
  end
  table.sort(list, function(a, b)
    if type(a) == type(b) then return a < b end
    return tostring(a) < tostring(b)
  end)
  return list
end

-- A heat map of z over the grid x × y (tile sizes: x = "Br", y = "Bc");
-- failed cells are marked.  c = {x=, y=, z=, file=, title=, formats=, skip=
-- {fields the title names already}}; the title gets the fixed settings.
function M.heatmap(rows, c)
  local xs, ys = sorted_values(rows, c.x), sorted_values(rows, c.y)
  if #xs == 0 or #ys == 0 then return nil, "no points for a heat map" end
  local xi, yi = {}, {}
  for i, v in ipairs(xs) do xi[v] = i - 1 end
  for i, v in ipairs(ys) do yi[v] = i - 1 end
  local good, bad = {}, {}
  for _, r in ipairs(rows) do
    if r[c.x] ~= nil and r[c.y] ~= nil then
      if usable(r, c.z) then
        good[#good + 1] = ("%d %d %.17g"):format(xi[r[c.x]], yi[r[c.y]], r[c.z] * (c.scale or 1))
      elseif r.status ~= "ok" then
        bad[#bad + 1] = ("%d %d"):format(xi[r[c.x]], yi[r[c.y]])
      end
    end
  end
  if #good == 0 then return nil, "no measured points for " .. c.z end
  local dat = write_file(c.file .. ".dat", "# x y " .. c.z .. "\n" .. table.concat(good, "\n") .. "\n\n\n# failed\n" ..
    (#bad > 0 and table.concat(bad, "\n") or "-1 -1") .. "\n")
  local function tics(list)
    local t = {}
    for i, v in ipairs(list) do t[i] = ("%s %d"):format(gp_string(tostring(v)), i - 1) end
    return "(" .. table.concat(t, ", ") .. ")"
  end
  local title = c.title or (c.z .. " over " .. c.x .. " x " .. c.y)
  local skip = {[c.x] = true, [c.y] = true, tile = true}
  for _, f in ipairs(c.skip or {}) do skip[f] = true end -- already in the title
  local fixed = M.fixed_settings(rows, skip)
  if fixed ~= "" and c.fixed ~= false then title = title .. "\n" .. fixed end
  -- viridis (perceptually uniform, readable with every common colour-vision
  -- deficiency) instead of a rainbow; values on white boxes stay legible on
  -- dark cells, failures in Okabe-Ito vermillion
  local pre = {("set title %s"):format(gp_dq(title)),
               ("set xlabel %s"):format(gp_string(c.x)), ("set ylabel %s"):format(gp_string(c.y)),
               ("set cblabel %s"):format(gp_string(c.zlabel or LABELS[c.z] or c.z)),
               ("set xrange [-0.5:%g]"):format(#xs - 0.5), ("set yrange [-0.5:%g]"):format(#ys - 0.5),
               "set xtics " .. tics(xs), "set ytics " .. tics(ys),
               "set style fill solid 1.0 noborder",
               "set palette defined (0 '#440154', 1 '#3B528B', 2 '#21908C', 3 '#5DC863', 4 '#FDE725')",
               "set style textbox opaque fc rgb 'white' noborder", "unset key"}
  local body = ("plot %s index 0 using 1:2:(0.5):(0.5):3 with boxxyerror fc palette, " ..
    "%s index 0 using 1:2:(sprintf('%%.3g', $3)) with labels boxed, " ..
    "%s index 1 using 1:2:('failed') with labels boxed tc rgb '#D55E00'"):format(gp_string(dat), gp_string(dat),
    gp_string(dat))
  return run_gnuplot(c.file, table.concat(pre, "\n"), body, c.formats)
end

-- The charts a sweep's rows call for: rate, time and memory against L (or N)
-- when it varies, one line per combination of the other varying axes; and a
-- heat map of the rate over Br × Bc when both vary (one per combination of
-- the other axes, at most `max_heatmaps`).  Returns the files written and a
-- list of reasons for charts not made.
function M.charts(rows, dir, name, opts)
  opts = opts or {}
  mkdir(dir)
  local base = (dir or ".") .. "/" .. name
  local files, notes = {}, {}
  local function keep(list, why)
    if list then for _, f in ipairs(list) do files[#files + 1] = f end else notes[#notes + 1] = why end
  end
  if #rows == 0 then return files, {"no rows"} end
  local kernel = rows[1].kernel
  local rate = kernel == "softmax" and "gbs" or "tflops"
  -- CPU rates read better in GFLOP/s
  local peak_rate = 0
  for _, r in ipairs(rows) do if usable(r, rate) then peak_rate = math.max(peak_rate, r[rate]) end end
  local scale, rate_label = 1, LABELS[rate]
  if rate == "tflops" and peak_rate < 1 then scale, rate_label = 1000, "GFLOP/s" end
  local varying = M.varying(rows, M.POINT_FIELDS)
  local is_varying = {}
  for _, f in ipairs(varying) do is_varying[f] = true end
  local x = kernel == "softmax" and "N" or (is_varying.Lq and "Lq" or "Lk")
  -- Br/Bc follow from tile; M follows from N in the softmax default: not series
  local derived = {Br = true, Bc = true, Lk = x == "Lq", M = kernel == "softmax"}
  if is_varying[x] then
    local by = {}
    for _, f in ipairs(varying) do if f ~= x and not derived[f] then by[#by + 1] = f end end
    local what = kernel .. (x == "N" and " softmax rows" or "")
    keep(M.line_chart(rows, {x = x, y = rate, by = by, file = base .. "_rate", formats = opts.formats,
                             scale = scale, ylabel = rate_label,
                             title = ("%s: %s against %s"):format(name, rate_label, x)}))
    keep(M.line_chart(rows, {x = x, y = "median_ms", by = by, file = base .. "_time", logy = true,
                             formats = opts.formats, title = ("%s: time against %s (%s)"):format(name, x, what)}))
    keep(M.line_chart(rows, {x = x, y = "peak_mib", by = by, file = base .. "_memory", logy = true,
                             formats = opts.formats, title = ("%s: peak engine memory against %s"):format(name, x)}))
  end
  if is_varying.Br and is_varying.Bc then
    local others = {}
    for _, f in ipairs(varying) do
      if f ~= "Br" and f ~= "Bc" and f ~= "tile" then others[#others + 1] = f end
    end
    local groups, order = {}, {}
    for _, r in ipairs(rows) do
      local key = series_label(r, others)
      if not groups[key] then groups[key] = {}; order[#order + 1] = key end
      table.insert(groups[key], r)
    end
    for i, key in ipairs(order) do
      if i > (opts.max_heatmaps or 4) then
        notes[#notes + 1] = ("%d more tile heat maps not drawn"):format(#order - i + 1)
        break
      end
      local suffix = #order > 1 and ("_%d"):format(i) or ""
      keep(M.heatmap(groups[key], {x = "Br", y = "Bc", z = rate, file = base .. "_tiles" .. suffix,
        formats = opts.formats, scale = scale, zlabel = rate_label, skip = others,
        title = ("%s: %s over tile sizes%s"):format(name, rate_label,
          key ~= "" and (" (" .. key .. ")") or "")}))
    end
  end
  return files, notes
end

return M
