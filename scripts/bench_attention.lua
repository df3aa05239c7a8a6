-- Attention forward on the GPU: the shapes of the CUDA attention issue
-- (B·L = 16k tokens, H·D = 2048, L in {1024, 4096, 16384}, D in {64, 128},
-- causal and not) in bf16, f16 and f32, timed with device events; each
-- result checked on the last query rows of one head against the f64
-- reference (the last rows keep the bottom-right causal alignment).
-- Each repetition flushes the caches first (fa.bench's flush_cache: 256 MiB
-- written, the events queued behind it), as Triton's do_bench times the
-- peers (scripts/peers_attention.py); --no-flush starts each repetition on
-- an idle device instead, so that the host's cost of queueing the call
-- falls inside the timed span.  That cost is a column of its own either
-- way (host_us: the host's time inside the call, median).
-- Usage: flashattn-lua scripts/bench_attention.lua [--json FILE] [--quick] [--seed S] [--no-flush]
--        [--algos flash,flash:sync,flash:bc128,naive,two_pass] [--dtypes bf16,f16,f32] [--dims 64,128,256]
--        [--ls 1024,4096] [--rules plain,softcap,alibi,mask_bool,mask_float]
-- --rules times each call again with the score rule beyond the key range:
-- softcap = 30, alibi slopes 2^(-8h/H), a bool mask (one key in ten off)
-- or a float mask (uniform in [-1, 0)), each (L, L) broadcast over B and H.
-- --seed S: the inputs' seeds are S, S + 1, S + 2 (q, k, v), S + 3 and S + 4
-- (the GEMM roof), S + 6 (the float mask); default 1.  The JSON's meta has
-- the commit, the command line and the seed.  A bad argument is a one-line
-- error on stderr and exit status 1.
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"

-- "flash@NAME": the kernel NAME of the registry (fa.kernels), e.g. flash@wgmma_tma; "flash@NAME:BRxBC"
-- with the tile {BR, BC}, e.g. flash@wgmma_tma:128x176.  The name and the tile (numbers), or nil.
local function named_kernel(algo)
  local name, br, bc = algo:match("^flash@([%w_]+):(%d+)x(%d+)$")
  if name then return name, { tonumber(br), tonumber(bc) } end
  return algo:match("^flash@([%w_]+)$")
end

local function parse(argv)
  local argparse = require "argparse"
  local p = argparse("bench_attention.lua", "Attention forward on the GPU: the shapes of the CUDA attention issue.")
  p:option("--json", "write the results to this JSON file")
  p:flag("--quick", "L = 1024 only, 3 repetitions")
  p:flag("--no-flush", "no cache flush before each repetition: the device idle at the start event, the host's cost "
    .. "of queueing the call timed with it")
  p:option("--algos", "comma list: flash, flash:sync, flash:bc128, flash@KERNEL[:BRxBC], naive, two_pass, flash_row")
   :convert(sweep.list_arg("--algos")):default("flash")
  p:option("--dtypes", "comma list of bf16, f16, f32"):convert(sweep.list_arg("--dtypes")):default("bf16,f16,f32")
  p:option("--dims", "comma list of head dims"):convert(sweep.list_arg("--dims", true)):default("64,128")
  p:option("--ls", "comma list of sequence lengths (default 1024,4096,16384)"):convert(sweep.list_arg("--ls", true))
  p:option("--rules", "comma list: plain, softcap, alibi, mask_bool, mask_float")
   :convert(sweep.list_arg("--rules")):default("plain")
  p:option("--seed", "seed of the inputs"):convert(sweep.integer_arg(0, "--seed")):default("1")
  local a = sweep.parse_args(p, argv, "bench_attention.lua")
  local known = {dtypes = {bf16 = true, f16 = true, f32 = true},
                 rules = {plain = true, softcap = true, alibi = true, mask_bool = true, mask_float = true},
                 algos = {flash = true, ["flash:sync"] = true, ["flash:bc128"] = true, naive = true, two_pass = true,
                          flash_row = true, auto = true}}
  for field, names in pairs(known) do
    for _, x in ipairs(a[field]) do
      if not names[x] and not (field == "algos" and named_kernel(x)) then error(("bench_attention.lua: --%s: unknown value '%s'"):format(field, x), 0) end
    end
  end
  return a
end
local args = sweep.main("bench_attention.lua", parse, {...})
local json_path, quick, algos, dtypes, dims = args.json, args.quick, args.algos, args.dtypes, args.dims
local rules, ls, seed = args.rules, args.ls, args.seed
local flush = not args.no_flush
local Ls = ls or quick and { 1024 } or { 1024, 4096, 16384 }

-- The options of a rule for L keys and H heads; ref_opts: the same for the
-- reference on the first head's last `rows` query rows.
local masks = {} -- [rule .. L]: built once
local function rule_opts(rule, L, H, rows)
  if rule == "plain" then return {}, {} end
  if rule == "softcap" then return { softcap = 30 }, { softcap = 30 } end
  if rule == "alibi" then
    local slopes = {}
    for h = 1, H do slopes[h] = 2 ^ (-8 * h / H) end
    return { alibi = slopes }, { alibi = { slopes[1] } }
  end
  local key = rule .. L
  if not masks[key] then
    if rule == "mask_float" then
      masks[key] = fa.rand({ 1, 1, L, L }, { seed = seed + 6, device = "cuda" }) + (-1)
    elseif rule == "mask_bool" then
      local t = {}
      for i = 1, L do
        local r = {}
        for j = 1, L do r[j] = (i * 7 + j * 3) % 10 ~= 0 end
        t[i] = r
      end
      masks[key] = fa.tensor({ { t } }, { device = "cuda" })
    else
      error("--rules: unknown rule " .. rule)
    end
  end
  local m = masks[key]
  return { mask = m }, { mask = m:narrow(3, L - rows + 1, rows) }
end
local results = {}
-- the device copy bandwidth, so that each algo's time can be set against
-- what its traffic model (fa.cost) predicts at that bandwidth (model_ratio =
-- measured time / predicted time)
local copy_gbs
do
  local x = fa.zeros({ 2 ^ 28 }, { device = "cuda" })
  local y = fa.zeros({ 2 ^ 28 }, { device = "cuda" })
  local b = fa.bench(function() y:copy_(x) end, { warmup = 2, rep = 10 })
  copy_gbs = 2 * 4 * 2 ^ 28 / (b.median_ms * 1e-3) / 1e9
  x:free(); y:free()
  print(string.format("device copy %.0f GB/s", copy_gbs))
end
-- The compute roof of each dtype in this run: a large cuBLAS product
-- (fa.matmul "blas"; f32 without TF32, as the kernels).  Traffic alone
-- cannot be the floor of a schedule bound by its arithmetic (flash moves
-- its inputs once and runs at tens of times that traffic time), so each
-- result is also set against a roofline of its schedule (roof_ms): per
-- kernel the larger of its traffic at the copy bandwidth and its executed
-- FLOPs at the GEMM rate, summed over the kernels.
local roof_tflops = {}
for _, dt in ipairs(dtypes) do
  local n = 8192
  local a = fa.randn({ n, n }, { dtype = dt, device = "cuda", seed = seed + 3 })
  local b = fa.randn({ n, n }, { dtype = dt, device = "cuda", seed = seed + 4 })
  local r = fa.bench(function() fa.matmul(a, b, { algo = "blas" }) end, { warmup = 2, rep = 5 })
  roof_tflops[dt] = 2 * n ^ 3 / (r.median_ms * 1e-3) / 1e12
  a:free(); b:free(); collectgarbage()
  print(string.format("GEMM %s %.0f TFLOP/s", dt, roof_tflops[dt]))
end
-- roof_ms of one call: S = B·H·L² scores, es bytes an element; cost.flops
-- counts the useful products (halved when causal), cost.bytes the model's
-- traffic (fa.cost)
local function roof_ms(algo, cost, dt, B, H, L, D, causal)
  local es, S = dt == "f32" and 4 or 2, B * H * L * L
  local qk = es * B * H * L * D -- Q and K, V and O alike (D = Dv here)
  local bw, peak = copy_gbs * 1e9, roof_tflops[dt] * 1e12
  local function kernel(bytes, flops) return math.max(bytes / bw, flops / peak) end
  local t
  if algo == "naive" then -- both products in full; S in f32, P in the inputs' dtype
    local half = (causal and 2 or 1) * cost.flops / 2
    t = kernel(2 * qk + 4 * S, half) + (4 * S + es * S) / bw + kernel(es * S + 2 * qk, half)
  elseif algo == "two_pass" then -- Q·Kᵀ twice: statistics, then output
    t = kernel(2 * qk, cost.flops / 2) + kernel(4 * qk, cost.flops)
  else
    t = kernel(cost.bytes, cost.flops)
  end
  return t * 1e3
end
print(string.format("%-5s %4s %6s %-6s %-9s %9s %9s %9s %9s %9s %8s", "dtype", "D", "L", "causal", "algo", "ms", "TFLOP/s",
  "x model", "x roof", "rel_err", "host_us"))
for _, dt in ipairs(dtypes) do
  for _, D in ipairs(dims) do
    for _, L in ipairs(Ls) do
      local H, B = 2048 // D, 16384 // L
      local q = fa.randn({ B, H, L, D }, { dtype = dt, device = "cuda", seed = seed })
      local k = fa.randn({ B, H, L, D }, { dtype = dt, device = "cuda", seed = seed + 1 })
      local v = fa.randn({ B, H, L, D }, { dtype = dt, device = "cuda", seed = seed + 2 })
      local rows = 4
      local function head(t) return t:narrow(1, 1, 1):narrow(2, 1, 1) end
      for _, causal in ipairs { false, true } do
        for _, rule in ipairs(rules) do
          local extra, ref_extra = rule_opts(rule, L, H, rows)
          local ropts = { causal = causal }
          for name, val in pairs(ref_extra) do ropts[name] = val end
          local ref = fa.attention_reference(head(q):narrow(3, L - rows + 1, rows), head(k), head(v), ropts)
          for _, algo in ipairs(algos) do
            -- "flash:sync": the mma.sync kernel by its tile (on Hopper the default is the wgmma kernel);
            -- "flash:bc128": the Hopper kernel with key tiles of 128 at D = 64, tile {128, 128} (f16/bf16 at
            -- D = 64 only; the default there is {128, 64})
            local opts = { algo = algo, causal = causal }
            for name, val in pairs(extra) do opts[name] = val end
            if algo == "flash:sync" then opts.algo, opts.tile = "flash", D == 64 and { 64, 64 } or { 128, 64 } end
            if algo == "flash:bc128" then opts.algo, opts.tile = "flash", { 128, 128 } end
            if algo == "flash:bc128" and (dt == "f32" or D ~= 64) then goto next_algo end
            local named, tile = named_kernel(algo)
            if named then opts.algo, opts.kernel, opts.tile = "flash", named, tile end
            local ok, o = pcall(fa.attention, q, k, v, opts)
            if ok then
              local rel = fa.rel_error(head(o):narrow(3, L - rows + 1, rows):cpu(), ref)
              o:free()
              local b = fa.bench(function() fa.attention(q, k, v, opts) end,
                { warmup = 2, rep = quick and 3 or 10, flush_cache = flush })
              local cost = fa.cost.attention(q, k, v, opts)
              local tflops = cost.flops / (b.median_ms * 1e-3) / 1e12
              local gbs = cost.bytes / (b.median_ms * 1e-3) / 1e9
              local roof = roof_ms(opts.algo, cost, dt, B, H, L, D, causal)
              local name = rule == "plain" and algo or algo .. "+" .. rule
              print(string.format("%-5s %4d %6d %-6s %-9s %9.3f %9.1f %9.2f %9.2f %9.2e %8.1f", dt, D, L, tostring(causal),
                name, b.median_ms, tflops, copy_gbs / gbs, b.median_ms / roof, rel, b.host_ms * 1e3))
              results[#results + 1] = { dtype = dt, D = D, L = L, B = B, H = H, causal = causal, algo = algo,
                rule = rule, ms = b.median_ms, tflops = tflops, model_gbs = gbs, model_bytes = cost.bytes,
                model_ratio = copy_gbs / gbs, roof_ms = roof, roof_ratio = b.median_ms / roof, rel_err = rel,
                host_us = b.host_ms * 1e3 }
            else
              print(string.format("%-5s %4d %6d %-6s %-9s %s", dt, D, L, tostring(causal), algo, tostring(o):sub(1, 80)))
            end
            collectgarbage()
            ::next_algo::
          end
        end
      end
      q:free(); k:free(); v:free()
    end
  end
end
if json_path then
  sweep.write_json_object({ meta = sweep.run_meta(seed), device = fa.device_info().name, copy_gbs = copy_gbs,
    gemm_tflops = roof_tflops, flush_cache = flush, results = results }, json_path)
end
