-- The backward pass on the GPU (issue 27): fa.attention_backward on the
-- issue's grid, B·L = 16k tokens, H·D = 2048 (H = Hq = Hkv), q, k, v and dout
-- contiguous (B, H, L, D), causal and not, bf16 (and f16 with --dtypes).
--
-- Per shape, timed with fa.bench (device events, caches flushed before each
-- repetition, the median): ms of the backward alone (o and lse from one
-- forward before), tflops = 2.5 × the forward's FLOPs (4·B·H·L²·D, half
-- when causal) / time, as FlashAttention counts the backward; and
-- deterministic_ms, the same call with opts.deterministic (on Hopper at
-- D = 96/128 the fused schedule adding dq in the key tiles' order, or up to
-- 1k keys at D = 128 into a copy a block; the default adds dq up with
-- atomics in any order; elsewhere the same code, timed again).  Shapes up to
-- --check-max-l (default 2048) are first checked on their first (batch,
-- head) against fa.attention_backward_reference (f64 on the CPU): a
-- gradient past the bf16/f16 tolerance is recorded as "wrong", gets no
-- time, and the script exits 1 after writing the JSON.
--
-- Usage (GPU machine, after scripts/gpu_run.sh's build):
--   build-gpu/flashattn-lua scripts/bench_backward.lua --json out/backward.json
--   python3 scripts/peers_backward.py --engine out/backward.json --json out/backward_peers.json --commit C
-- Smoke test on the CPU (small sizes): build/flashattn-lua scripts/bench_backward.lua --device cpu --quick
-- --extras (or --extras-ds 64,96,128): the score rules at L = 4096 (D = 128 unless --extras-ds names
-- others), each row's time against its head dim's plain call and, for the built-in rules, the
-- deterministic call's time (deterministic_ms) as well.
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"

local NAME = "bench_backward.lua"

local function parse(argv)
  local argparse = require "argparse"
  local p = argparse(NAME, "The attention backward: TFLOP/s on B·L = 16k, H·D = 2048.")
  sweep.bench_options(p, "3 repetitions, a smaller grid")
  p:option("--dtypes", "comma list of dtypes"):default("bf16")
  p:option("--ds", "comma list of head dims"):convert(sweep.list_arg("--ds", true))
  p:option("--ls", "comma list of sequence lengths"):convert(sweep.list_arg("--ls", true))
  p:flag("--extras", "also the score rules beyond causal (alibi, softcap, masks, window, Lua variants), L = 4096")
  p:option("--extras-ds", "comma list of head dims for the --extras rows (implies --extras; default 128, 32 on the CPU)")
   :convert(sweep.list_arg("--extras-ds", true))
  p:option("--check-max-l", "check shapes up to this L against the f64 reference")
   :convert(sweep.integer_arg(0, "--check-max-l")):default("2048")
  return sweep.parse_args(p, argv, NAME)
end
local args = sweep.main(NAME, parse, { ... })
local dev, seed, quick = args.device, args.seed, args.quick
local cuda = dev == "cuda"
local TOKENS, HD = cuda and 16384 or 512, cuda and 2048 or 128
local ds = args.ds or (cuda and { 64, 128 } or { 32, 64 })
local ls = args.ls or (cuda and (quick and { 1024, 4096 } or { 1024, 2048, 4096, 8192, 16384 }) or { 128, 256 })
local REP = quick and 3 or 10
local info = fa.device_info(dev)

local function time_ms(fn) return fa.bench(fn, { warmup = 2, rep = REP, flush_cache = true }).median_ms end

-- The first (batch, head) of the shape's tensors, checked against the
-- reference: the largest relative error of dq, dk, dv.
local function check(q, k, v, o, lse, dout, opts, g)
  local function s(t) return t:narrow(1, 1, 1):narrow(2, 1, 1):cpu() end
  local function sl(t) return t:narrow(1, 1, 1):narrow(2, 1, 1):cpu() end
  local r = { fa.attention_backward_reference(s(q), s(k), s(v), s(o), sl(lse), s(dout), opts) }
  local worst = 0
  for i = 1, 3 do worst = math.max(worst, fa.rel_error(s(g[i]), r[i])) end
  return worst
end

local results, wrong = {}, 0
print(("%s: %s, B·L = %d, H·D = %d, %d repetitions"):format(NAME, info.name or dev, TOKENS, HD, REP))
print(("%-5s %4s %4s %6s %4s %6s %9s %8s %9s %8s"):format("dtype", "B", "H", "L", "D", "causal", "ms", "TFLOP/s",
  "det. ms", "rel_err"))
for dtype in args.dtypes:gmatch("[^,]+") do
  for _, D in ipairs(ds) do
    for _, L in ipairs(ls) do
      for _, causal in ipairs({ false, true }) do
        local B, H = math.max(1, TOKENS // L), HD // D
        local row = { dtype = dtype, B = B, H = H, L = L, D = D, causal = causal }
        local function randn(s) return fa.randn({ B, H, L, D }, { dtype = dtype, device = dev, seed = s }) end
        local q, k, v, dout = randn(seed), randn(seed + 1), randn(seed + 2), randn(seed + 3)
        local opts = { causal = causal }
        local o, lse = fa.attention(q, k, v, { causal = causal, return_lse = true })
        local ok, err = pcall(function()
          local g = { fa.attention_backward(q, k, v, o, lse, dout, opts) }
          if L <= args.check_max_l then row.rel_err = check(q, k, v, o, lse, dout, opts, g) end
          for i = 1, 3 do g[i]:free() end
        end)
        if not ok then
          row.status, row.error = "failed", tostring(err):match("[^\n]*")
        elseif row.rel_err and not (row.rel_err <= sweep.TOLERANCE[dtype]) then
          row.status, wrong = "wrong", wrong + 1
        else
          local function call(det)
            return function()
              local a, b, c = fa.attention_backward(q, k, v, o, lse, dout, { causal = causal, deterministic = det })
              a:free(); b:free(); c:free()
            end
          end
          row.ms = time_ms(call(false))
          row.deterministic_ms = time_ms(call(true))
          local flops = 4 * B * H * L * L * D * (causal and 0.5 or 1)
          row.tflops = 2.5 * flops / (row.ms * 1e-3) / 1e12
          row.status = "ok"
        end
        q:free(); k:free(); v:free(); dout:free(); o:free(); lse:free()
        collectgarbage()
        results[#results + 1] = row
        print(("%-5s %4d %4d %6d %4d %6s %9s %8s %9s %8s  %s"):format(dtype, B, H, L, D, tostring(causal),
          row.ms and ("%.3f"):format(row.ms) or "-", row.tflops and ("%.1f"):format(row.tflops) or "-",
          row.deterministic_ms and ("%.3f"):format(row.deterministic_ms) or "-",
          row.rel_err and ("%.1e"):format(row.rel_err) or "-",
          row.status ~= "ok" and (row.status .. " " .. (row.error or "")) or ""))
      end
    end
  end
end

-- The score rules beyond causal, each against the plain call of the same shape in this run (the
-- engine alone: the peers' backward takes no alibi or softcap): extras[i].plain_ratio = its time /
-- the plain time.
local extras = {}
-- opts with key set to val, opts left as it is
local function with_opt(opts, key, val)
  local t = { [key] = val }
  for k2, v2 in pairs(opts) do if k2 ~= key then t[k2] = v2 end end
  return t
end
-- one head dim's rules, each against that dim's plain call
local function extras_at(D)
  local L = cuda and 4096 or 256
  local B, H = math.max(1, TOKENS // L), HD // D
  local dtype = "bf16"
  local function randn(s, shape) return fa.randn(shape or { B, H, L, D }, { dtype = dtype, device = dev, seed = s }) end
  local q, k, v, dout = randn(seed), randn(seed + 1), randn(seed + 2), randn(seed + 3)
  local slopes = {}
  for h = 1, H do slopes[h] = 2 ^ (-8 * h / H) end
  local slopes_t = fa.tensor(slopes, { device = dev }) -- the same slopes, captured by a score_mod
  local bmask = fa.rand({ L, L }, { device = dev, seed = seed + 4 }) -- a float mask, values in [0, 1)
  local ids = {} -- causal documents of 1000 keys (the last one shorter)
  for i = 1, L do ids[i] = (i - 1) // 1000 end
  local doc = fa.tensor(ids, { device = dev })
  local rules = {
    { "plain", {} },
    { "causal", { causal = true } },
    { "alibi causal", { causal = true, alibi = slopes } },
    { "softcap 30", { softcap = 30 } },
    { "window 1024", { window = { 1024, 0 } } },
    { "float mask", { mask = bmask } },
    -- the Lua variants (API §9): compiled with the expression into the tensor-core kernels on
    -- Hopper (the SIMT ones elsewhere); the first three compute the rule of a built-in above
    { "score_mod alibi causal", { causal = true, score_mod = function(sc, b, h, qi, kj)
      return sc - slopes_t[h] * (qi - kj):abs() end } },
    { "score_mod softcap 30", { score_mod = function(sc) return (sc / 30):tanh() * 30 end } },
    { "mask_mod window 1024", { mask_mod = function(b, h, qi, kj) return qi:ge(kj) & (qi - kj):le(1024) end } },
    { "mask_mod documents", { mask_mod = function(b, h, qi, kj) return doc[qi]:eq(doc[kj]) & qi:ge(kj) end } },
  }
  local plain_ms
  print(("extras: bf16, B = %d, H = %d, L = %d, D = %d"):format(B, H, L, D))
  for _, r in ipairs(rules) do
    local name, opts = r[1], r[2]
    local o, lse = fa.attention(q, k, v, with_opt(opts, "return_lse", true))
    local ms = time_ms(function()
      local a, b, c = fa.attention_backward(q, k, v, o, lse, dout, opts)
      a:free(); b:free(); c:free()
    end)
    plain_ms = plain_ms or ms
    local row = { rule = name, dtype = dtype, B = B, H = H, L = L, D = D, ms = ms, plain_ratio = ms / plain_ms }
    -- the built-in rules' deterministic call too (the Lua variants' takes another schedule: not timed here)
    if not (opts.score_mod or opts.mask_mod) then
      local dopts = with_opt(opts, "deterministic", true)
      row.deterministic_ms = time_ms(function()
        local a, b, c = fa.attention_backward(q, k, v, o, lse, dout, dopts)
        a:free(); b:free(); c:free()
      end)
    end
    extras[#extras + 1] = row
    print(("  %-24s %9.3f ms  x plain time %.2f%s"):format(name, ms, row.plain_ratio,
      row.deterministic_ms and ("  deterministic %9.3f ms"):format(row.deterministic_ms) or ""))
    o:free(); lse:free()
  end
  for _, t in ipairs({ q, k, v, dout, slopes_t, bmask, doc }) do t:free() end
end
if args.extras or args.extras_ds then
  for _, D in ipairs(args.extras_ds or { cuda and 128 or 32 }) do extras_at(D) end
end

if args.json then
  sweep.write_json_object({
    meta = sweep.run_meta(seed, {
      gpu = info.name, device = dev, repetitions = REP, tokens = TOKENS, hd = HD,
      tflops = "2.5 x forward FLOPs (4·B·H·L²·D, half when causal) / median time",
      timing = "fa.bench, caches flushed before each repetition, median",
    }),
    results = results,
    extras = extras,
  }, args.json)
  print("wrote " .. args.json)
end
if wrong > 0 then os.exit(1) end
