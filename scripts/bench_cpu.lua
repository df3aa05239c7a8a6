-- bench_cpu.lua: the CPU backend's attention against the two yardsticks of
-- the same machine, measured in one run: the naive algorithm (S and P in
-- memory, then P·V, through BLAS) and the machine's sgemm rate through the
-- same BLAS (fa.matmul algo "blas").
--
--   LUA_CPATH="build/lua/?.so;;" lua5.4 scripts/bench_cpu.lua [--json FILE] [--L n] [--H n] [--D n] [--rep n]
--     [--gemm n] [--seed S]
--
-- Default problem: B = 1, H = 8, L = 4096, D = 64, f32, non-causal and
-- causal.  Prints time (fa.bench median), GFLOP/s (fa.cost convention
-- 4·B·H·L²·D, halved for causal), peak memory beyond the inputs, the
-- sgemm rate, and the ratios flash GFLOP/s ÷ sgemm GFLOP/s and flash time ÷
-- naive time.  --json FILE writes the same figures (lua-cjson when present).
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"

local function parse(argv)
  local argparse = require "argparse"
  local p = argparse("bench_cpu.lua", "The CPU backend's attention against naive and the machine's sgemm rate.")
  p:option("--json", "write the figures to this JSON file")
  for _, o in ipairs({{"--B", "batch", "1"}, {"--H", "heads", "8"}, {"--L", "sequence length", "4096"},
                      {"--D", "head dim", "64"}, {"--rep", "repetitions", "3"}, {"--gemm", "sgemm size n", "2048"}}) do
    p:option(o[1], o[2]):convert(sweep.integer_arg(1, o[1])):default(o[3])
  end
  p:option("--seed", "seed of the inputs: the GEMM's seed and seed + 1, q, k, v seed + 2 to seed + 4")
   :convert(sweep.integer_arg(0, "--seed")):default("1")
  local a = sweep.parse_args(p, argv, "bench_cpu.lua")
  a.gemm_n = a.gemm
  return a
end
local opt = sweep.main("bench_cpu.lua", parse, {...})

local device = "cpu"
fa.set_default_device("cpu") -- this is the CPU benchmark, whatever the machine has
local info = fa.device_info("cpu")

local function collect()
  collectgarbage("collect")
  collectgarbage("collect")
end

local function peak_of(fn)
  collect()
  local before = fa.memory().current
  fa.reset_peak()
  local r = fn()
  local peak = fa.memory().peak - before
  return peak, r
end

local results = {
  meta = sweep.run_meta(opt.seed),
  version = fa.version,
  device = {name = info.name, threads = info.threads, simd = info.simd},
  problem = {B = opt.B, H = opt.H, L = opt.L, D = opt.D, dtype = "f32"},
  attention = {},
}

print(("flashattn %s, CPU: %s, %d threads, %s"):format(fa.version, info.name, info.threads or 0, info.simd or "?"))

-- ---- sgemm through the engine's BLAS ---------------------------------------
do
  local n = opt.gemm_n
  local a = fa.randn({n, n}, {seed = opt.seed, device = device})
  local b = fa.randn({n, n}, {seed = opt.seed + 1, device = device})
  local c = fa.zeros({n, n}, {device = device})
  local r = fa.bench(function() fa.matmul(a, b, {algo = "blas", out = c}) end, {warmup = 1, rep = opt.rep})
  local gflops = 2 * n ^ 3 / (r.median_ms * 1e-3) / 1e9
  results.sgemm = {n = n, median_ms = r.median_ms, gflops = gflops}
  print(("sgemm %dx%d·%dx%d (fa.matmul blas): %.2f ms, %.1f GFLOP/s"):format(n, n, n, n, r.median_ms, gflops))
  a:free(); b:free(); c:free()
end

-- ---- attention -----------------------------------------------------------------
local q = fa.randn({opt.B, opt.H, opt.L, opt.D}, {seed = opt.seed + 2, device = device})
local k = fa.randn({opt.B, opt.H, opt.L, opt.D}, {seed = opt.seed + 3, device = device})
local v = fa.randn({opt.B, opt.H, opt.L, opt.D}, {seed = opt.seed + 4, device = device})

print(("attention B=%d H=%d L=%d D=%d f32"):format(opt.B, opt.H, opt.L, opt.D))
print(("%-8s %-6s %12s %12s %12s %12s"):format("causal", "algo", "median ms", "GFLOP/s", "peak MiB", "vs naive"))
for _, causal in ipairs({false, true}) do
  local out = {}
  for _, algo in ipairs({"flash", "naive"}) do
    local o = {algo = algo, causal = causal}
    local ok, peak, res = pcall(peak_of, function() return fa.attention(q, k, v, o) end)
    if not ok then
      print(("%-8s %-6s failed: %s"):format(tostring(causal), algo, tostring(peak)))
      out[algo] = {error = tostring(peak)}
    else
      local r = fa.bench(function() fa.attention(q, k, v, o) end, {warmup = 1, rep = opt.rep})
      local cost = fa.cost.attention(q, k, v, o)
      out[algo] = {median_ms = r.median_ms, min_ms = r.min_ms, gflops = cost.flops / (r.median_ms * 1e-3) / 1e9,
                   peak_bytes = peak, flops = cost.flops, bytes = cost.bytes, result = res}
    end
    collect()
  end
  local f, n = out.flash, out.naive
  if f.result and n.result then
    f.rel_error_vs_naive = fa.rel_error(f.result, n.result)
  end
  for _, algo in ipairs({"flash", "naive"}) do
    local r = out[algo]
    if r.median_ms then
      local vs = (algo == "flash" and n.median_ms) and ("%.3f"):format(r.median_ms / n.median_ms) or ""
      print(("%-8s %-6s %12.2f %12.1f %12.1f %12s"):format(tostring(causal), algo, r.median_ms, r.gflops,
        r.peak_bytes / 2 ^ 20, vs))
    end
    r.result = nil
  end
  local entry = {causal = causal, flash = f, naive = n}
  if f.gflops and results.sgemm then entry.flash_over_sgemm = f.gflops / results.sgemm.gflops end
  if f.median_ms and n.median_ms then entry.flash_time_over_naive = f.median_ms / n.median_ms end
  results.attention[#results.attention + 1] = entry
  collect()
end

print("ratios:")
for _, e in ipairs(results.attention) do
  print(("  causal=%-5s flash GFLOP/s / sgemm GFLOP/s = %s   flash time / naive time = %s   rel err flash vs naive = %s")
    :format(tostring(e.causal),
      e.flash_over_sgemm and ("%.3f"):format(e.flash_over_sgemm) or "-",
      e.flash_time_over_naive and ("%.3f"):format(e.flash_time_over_naive) or "-",
      e.flash.rel_error_vs_naive and ("%.1e"):format(e.flash.rel_error_vs_naive) or "-"))
end

-- ---- JSON ------------------------------------------------------------------------
local function encode(x)
  local t = type(x)
  if t == "table" then
    if #x > 0 or next(x) == nil then
      local p = {}
      for i, e in ipairs(x) do p[i] = encode(e) end
      return "[" .. table.concat(p, ",") .. "]"
    end
    local keys = {}
    for kk in pairs(x) do keys[#keys + 1] = tostring(kk) end
    table.sort(keys)
    local p = {}
    for _, kk in ipairs(keys) do p[#p + 1] = ("%q:%s"):format(kk, encode(x[kk])) end
    return "{" .. table.concat(p, ",") .. "}"
  elseif t == "number" then
    if x ~= x or x == math.huge or x == -math.huge then return "null" end
    return math.type(x) == "integer" and tostring(x) or ("%.17g"):format(x)
  elseif t == "string" then
    return '"' .. x:gsub('[%c"\\]', function(c) return ("\\u%04x"):format(c:byte()) end) .. '"'
  elseif t == "boolean" then
    return tostring(x)
  end
  return "null"
end

if opt.json then
  local ok, cjson = pcall(require, "cjson")
  local text = ok and cjson.encode(results) or encode(results)
  local f = assert(io.open(opt.json, "w"))
  f:write(text, "\n")
  f:close()
  print("wrote " .. opt.json .. (ok and " (lua-cjson)" or ""))
end
