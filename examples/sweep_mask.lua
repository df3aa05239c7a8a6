-- sweep_mask.lua: what a mask costs and whether the result stays right.
-- Sweeps the density of a random boolean mask (the share of (query, key)
-- pairs attended) and the width of a sliding window, and prints for each
-- setting the median time of fa.attention, the rate, and the relative error
-- against fa.attention_reference (f64 on the CPU).
--
--   build/flashattn-lua examples/sweep_mask.lua [--L 256] [--D 32] [--H 2] [--algo flash]
--       [--device cpu|cuda] [--dtype f32] [--rep 5] [--seed 1]
--
-- The defaults take a second or two on a CPU.  A bad argument is a one-line
-- error on stderr and exit status 1; the run fails (status 1) when an error
-- is past the dtype's tolerance.
local fa = require "flashattn"

local function fail(msg)
  io.stderr:write("sweep_mask.lua: ", msg, "\n")
  os.exit(1)
end

-- --name value pairs into opts (numbers where the default is a number)
local opts = {L = 256, D = 32, H = 2, algo = "flash", device = fa.default_device(), dtype = "f32", rep = 5, seed = 1}
do
  local argv = {...}
  local i = 1
  while i <= #argv do
    local key = argv[i]:match("^%-%-(%w+)$")
    if key == "help" then
      print("sweep_mask.lua [--L n] [--D n] [--H n] [--algo a] [--device d] [--dtype t] [--rep n] [--seed n]")
      os.exit(0)
    end
    if not key or opts[key] == nil then fail(("unknown argument '%s' (try --help)"):format(argv[i])) end
    local value = argv[i + 1]
    if value == nil then fail(("--%s needs a value"):format(key)) end
    if type(opts[key]) == "number" then
      value = math.tointeger(tonumber(value))
      if not value or value < 1 then fail(("--%s: expected a positive integer, got '%s'"):format(key, argv[i + 1])) end
    end
    opts[key] = value
    i = i + 2
  end
end

local L, D, H = opts.L, opts.D, opts.H
local tol = ({f32 = 1e-5, f16 = 2e-2, bf16 = 2e-2, f64 = 1e-12})[opts.dtype]
if not tol then fail("--dtype: expected f32, f16, bf16 or f64, got '" .. opts.dtype .. "'") end
local on = {dtype = opts.dtype, device = opts.device}

local function inputs()
  local function randn(s)
    on.seed = opts.seed + s
    return fa.randn({1, H, L, D}, on)
  end
  return randn(0), randn(1), randn(2)
end
local ok, q, k, v = pcall(inputs)
if not ok then fail(tostring(q)) end
local refs = {q = q:cpu():double(), k = k:cpu():double(), v = v:cpu():double()}

-- A boolean (L, L) mask attending a `density` share of the keys (at random,
-- the same pattern for every head), with the diagonal always on so that no
-- row is empty.
local function bool_mask(density)
  local u = fa.rand({L, L}, {seed = opts.seed + 10})
  local rows = {}
  for i = 1, L do
    local row = {}
    for j = 1, L do row[j] = i == j or u:get(i, j) < density end
    rows[i] = row
  end
  return fa.tensor(rows, {device = opts.device})
end

local settings = {}
for _, d in ipairs({1.0, 0.5, 0.25, 0.1, 0.01}) do
  settings[#settings + 1] = {name = ("bool mask, density %.2f"):format(d), make = function() return {mask = bool_mask(d)} end}
end
for _, w in ipairs({L, L // 4, 32, 8}) do
  settings[#settings + 1] = {name = ("causal window %d"):format(w), make = function() return {window = {w, 0}} end}
end

print(("flashattn %s: attention (1, %d, %d, %d) %s on %s, algo %s"):format(fa.version, H, L, D, opts.dtype,
  opts.device, opts.algo))
print(("%-26s %10s %10s %10s"):format("setting", "median ms", "GFLOP/s", "rel err"))
local bad = 0
for _, s in ipairs(settings) do
  local o = s.make()
  o.algo = opts.algo
  local done, err = pcall(function()
    local out <close> = fa.attention(q, k, v, o)
    local ro = {window = o.window, mask = o.mask and o.mask:cpu()}
    local ref <close> = fa.attention_reference(refs.q, refs.k, refs.v, ro)
    local rel = fa.rel_error(out:cpu():double(), ref)
    o.out = out -- the timed calls write into the first call's output
    local b = fa.bench(function() fa.attention(q, k, v, o) end, {warmup = 1, rep = opts.rep})
    -- the useful work: the cost model counts the whole score matrix (half when causal)
    local gflops = fa.cost.attention(q, k, v, {algo = opts.algo}).flops / (b.median_ms * 1e-3) / 1e9
    print(("%-26s %10.3f %10.2f %10.2e%s"):format(s.name, b.median_ms, gflops, rel, rel <= tol and "" or "  TOO LARGE"))
    if not (rel <= tol) then bad = bad + 1 end
  end)
  if o.mask then o.mask:free() end
  if not done then
    print(("%-26s failed: %s"):format(s.name, tostring(err)))
    bad = bad + 1
  end
end
print("(GFLOP/s count every (query, key) pair, masked or not: a mask saves no work unless whole tiles are empty)")
if bad > 0 then
  io.stderr:write(("sweep_mask.lua: %d setting(s) failed or were past the tolerance %g\n"):format(bad, tol))
  os.exit(1)
end
