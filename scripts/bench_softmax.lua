-- Softmax on the GPU: every shape of the CUDA softmax issue in f32 and f16,
-- "auto" and the seeds' algorithms, timed with device events; each result
-- checked on sample rows against the f64 CPU reference.
-- Usage: flashattn-lua scripts/bench_softmax.lua [--json FILE] [--quick] [--seed S]
-- Inputs of shape M x N are drawn with seed S + M + N (S = 0 by default: the
-- seeds of the earlier runs).  The JSON's meta has the commit, the command
-- line and S.  A bad argument is a one-line error on stderr and exit status 1.
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
local function parse(argv)
  local argparse = require "argparse"
  local p = argparse("bench_softmax.lua", "Softmax on the GPU: the shapes of the CUDA softmax issue.")
  p:option("--json", "write the results to this JSON file")
  p:flag("--quick", "two small shapes, 5 repetitions")
  p:option("--seed", "base seed of the inputs"):convert(sweep.integer_arg(0, "--seed")):default("0")
  return sweep.parse_args(p, argv, "bench_softmax.lua")
end
local args = sweep.main("bench_softmax.lua", parse, {...})
local json_path, quick, seed = args.json, args.quick, args.seed
local shapes = { { 32768, 1024 }, { 8192, 4096 }, { 4096, 32768 }, { 1024, 131072 }, { 256, 1048576 } }
if quick then shapes = { { 1024, 1024 }, { 64, 131072 } } end
local algos = { "auto", "online", "safe", "naive", "fused" }
local inner = 10 -- calls per timed repetition, so launch gaps do not count
local results = {}
local info = fa.device_info()
print(string.format("%-6s %-16s %-7s %10s %9s %10s", "dtype", "shape", "algo", "time_us", "GB/s", "rel_err"))
for _, dt in ipairs { "f32", "f16" } do
  for _, s in ipairs(shapes) do
    local M, N = s[1], s[2]
    local x = fa.randn({ M, N }, { dtype = dt, device = "cuda", seed = seed + M + N })
    local y = fa.zeros({ M, N }, { dtype = dt, device = "cuda" })
    local rows = x:narrow(1, 1, 2):cpu():double()
    local ref = fa.softmax(rows, { algo = "safe" })
    for _, algo in ipairs(algos) do
      local opts = { algo = algo, out = y }
      local ok, err = pcall(fa.softmax, x, opts)
      if ok then
        y:fill_(0 / 0)
        fa.softmax(x, opts)
        local rel = fa.rel_error(y:narrow(1, 1, 2):cpu(), ref)
        local b = fa.bench(function()
          for _ = 1, inner do fa.softmax(x, opts) end
        end, { warmup = 2, rep = quick and 5 or 15 })
        local us = b.median_ms / inner * 1e3
        local bytes = 2 * M * N * (dt == "f32" and 4 or 2) -- read + write once
        local gbs = bytes / (us * 1e-6) / 1e9
        print(string.format("%-6s %-16s %-7s %10.1f %9.0f %10.2e", dt, M .. "x" .. N, algo, us, gbs, rel))
        results[#results + 1] = { dtype = dt, M = M, N = N, algo = algo, time_us = us, gbs = gbs, rel_err = rel }
      else
        print(string.format("%-6s %-16s %-7s %s", dt, M .. "x" .. N, algo, tostring(err):sub(1, 70)))
      end
    end
    x:free()
    y:free()
  end
end
if json_path then
  sweep.write_json_object({ meta = sweep.run_meta(seed), device = info.name, results = results }, json_path)
end
