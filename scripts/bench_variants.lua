-- Attention variants written in Lua (issue 26, API §9) on the GPU: every
-- canonical example of §9 and two compositions, compiled into the fused
-- kernel, against the built-in option or dense mask that computes the same
-- rule, in one run.  FlexAttention, the peer, is measured right after by
-- scripts/peers_variants.py on the cases this script writes.
--
-- Shapes: bf16, D = 128, H = 16 (--dim D: H = 2048 / D), L = 4096 (B = 4) and L = 16384 (B = 1).
-- Cases (slopes[h] = 2^(-8h/H), W = 1024, prefix = L/4, documents of
-- lengths drawn from the seed, about 12 % of the causal pairs at 4k):
--   alibi, softcap (30), sliding (q >= k, q - k <= W), document (causal
--   within a document), prefix_lm, alibi + sliding, softcap + document.
-- Per case: ms of the variant (fa.bench: device events, caches flushed
-- before each repetition, the median), TFLOP/s over the attended pairs
-- (4·D·pairs·B·H / time, as FlexAttention counts), and the same for the
-- built-in rule (alibi, softcap, window options; a dense bool mask where no
-- option computes it); block_mask_ms: the variant with opts.block_mask from
-- fa.block_mask (made once, on the device; block_mask_s, its wall time less a clock read); first_call_s: wall time of the variant's first call
-- (NVRTC included unless FLASHATTN_CACHE_DIR holds it); each variant is
-- first checked against the built-in call (bf16 tolerance); the variant and
-- the built-in call are timed in turns, three rounds (ms, builtin_ms: the
-- medians; ratio_vs_builtin: the median of the rounds' ratios).  Host cost of a
-- cached variant: the time per call of a small call (B = H = 1, L = 128)
-- in a loop, with the variant and with the built-in option.
--
-- Usage (GPU machine, after scripts/gpu_run.sh's build):
--   build-gpu/flashattn-lua scripts/bench_variants.lua --json out/variants.json
--   python3 scripts/peers_variants.py --engine out/variants.json --json out/variants_peers.json
-- Smoke test on the CPU (small sizes): build/flashattn-lua scripts/bench_variants.lua --device cpu --quick
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"

local NAME = "bench_variants.lua"

local function parse(argv)
  local argparse = require "argparse"
  local p = argparse(NAME, "Lua attention variants against the built-in rules (and FlexAttention, by peers_variants.py).")
  sweep.bench_options(p, "3 repetitions, L = 4096 only", "seed of the inputs and the documents")
  p:option("--cases", "comma list of case names (default: all)")
  p:option("--dim", "head dim on cuda, 64 or 128 (H = 2048 / D)"):convert(sweep.integer_arg(64, "--dim")):default("128")
  local a = sweep.parse_args(p, argv, NAME)
  if a.dim ~= 64 and a.dim ~= 128 then error(("%s: --dim: 64 or 128, got %d"):format(NAME, a.dim), 0) end
  return a
end
local args = sweep.main(NAME, parse, { ... })
local dev, seed, quick = args.device, args.seed, args.quick
local cuda = dev == "cuda"
local D, H = cuda and args.dim or 32, cuda and 2048 // args.dim or 2
local shapes = cuda and (quick and { { 4, 4096 } } or { { 4, 4096 }, { 1, 16384 } }) or { { 1, 256 } }
local W = cuda and 1024 or 32
local REP = quick and 3 or 10
local dtype = cuda and "bf16" or "f32"
local info = fa.device_info(dev)

local function time_ms(fn) return fa.bench(fn, { warmup = 2, rep = REP, flush_cache = true }).median_ms end
-- The variant and the built-in call timed in turns, ROUNDS times: their medians over the rounds, and the
-- median of the rounds' built-in / variant ratios.  One pass each, the variant first, put a case's two
-- calls at different moments of the run: the sliding window's variant (which runs as the built-in window
-- option) read 0.86 x the built-in at 4096 in one run and 1.00 x in a probe of the two in turns.
local ROUNDS = quick and 1 or 3
local function time_pair(variant, builtin)
  local vs, bs, rs = {}, {}, {}
  for r = 1, ROUNDS do
    vs[r], bs[r] = time_ms(variant), time_ms(builtin)
    rs[r] = bs[r] / vs[r]
  end
  return sweep.median(vs), sweep.median(bs), sweep.median(rs)
end
local function wall() return sweep.wall_ns() * 1e-9 end -- seconds
-- a clock read starts a process (sweep.wall_ns): its cost, taken off the one-call timings
local CLOCK_S = (function()
  local best = math.huge
  for _ = 1, 3 do
    local a = wall()
    best = math.min(best, wall() - a)
  end
  return best
end)()

-- Attended (q, k) pairs of a rule over one (batch, head).
local function pairs_causal_window(L, w) -- q >= k, q - k <= w
  local n = 0
  for i = 1, L do n = n + math.min(i, w + 1) end
  return n
end
local function pairs_document(lens)
  local n = 0
  for _, len in ipairs(lens) do n = n + len * (len + 1) / 2 end
  return n
end
local function pairs_prefix(L, prefix) -- k <= prefix or q >= k
  local n = 0
  for i = 1, L do n = n + math.max(i, prefix) end
  return n
end

-- A (1, 1, L, L) bool mask whose row i attends keys lo(i)..hi(i) (1-based,
-- one run a row), written as .npy rows of bytes and loaded (an L² Lua table
-- would not fit at 16k).
local function dense_runs(L, lo, hi)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  local header = ("{'descr': '|b1', 'fortran_order': False, 'shape': (1, 1, %d, %d), }"):format(L, L)
  header = header .. (" "):rep(63 - (10 + #header) % 64) .. "\n"
  f:write("\147NUMPY\1\0", string.char(#header % 256, #header // 256), header)
  for i = 1, L do
    local a, z = lo(i), hi(i)
    f:write(("\0"):rep(a - 1), ("\1"):rep(z - a + 1), ("\0"):rep(L - z))
  end
  f:close()
  local m = fa.load(path, { device = dev })
  os.remove(path)
  return m
end

local results, wrong = {}, 0
print(("%s: %s, %s, D = %d, H = %d, %d repetitions"):format(NAME, info.name or dev, dtype, D, H, REP))
print(("%-18s %6s %3s %9s %8s %9s %8s %7s %8s %9s"):format("case", "L", "B", "ms", "TFLOP/s", "builtin", "TFLOP/s",
  "ratio", "first s", "bmask ms"))
local wanted
if args.cases then
  wanted = {}
  for c in args.cases:gmatch("[^,]+") do wanted[c] = true end
end
for _, shape in ipairs(shapes) do
  local B, L = shape[1], shape[2]
  local prefix = L // 4
  local lens, ids = sweep.documents(L, seed)
  local doc = fa.tensor(ids, { device = dev })
  local sl = {}
  for h = 1, H do sl[h] = 2 ^ (-8 * h / H) end
  local slopes = fa.tensor(sl, { device = dev })
  local full = L * L
  local alibi = function(s, b, h, q, k) return s - slopes[h] * (q - k):abs() end
  local softcap = function(s) return (s / 30):tanh() * 30 end
  local sliding = function(b, h, q, k) return q:ge(k) & (q - k):le(W) end
  local document = function(b, h, q, k) return doc[q]:eq(doc[k]) & q:ge(k) end
  local prefix_lm = function(b, h, q, k) return k:le(prefix) | q:ge(k) end
  local docmask, prefixmask -- made when a case needs them (L² host work)
  local start = {} -- the first key of each row's document
  for i = 1, L do start[i] = (i > 1 and ids[i] == ids[i - 1]) and start[i - 1] or i end
  local function doc_mask()
    docmask = docmask or dense_runs(L, function(i) return start[i] end, function(i) return i end)
    return docmask
  end
  local function prefix_mask()
    prefixmask = prefixmask or dense_runs(L, function() return 1 end, function(i) return math.max(i, prefix) end)
    return prefixmask
  end
  local cases = {
    { "alibi", { score_mod = alibi }, function() return { alibi = sl } end, full },
    { "softcap", { score_mod = softcap }, function() return { softcap = 30 } end, full },
    { "sliding", { mask_mod = sliding }, function() return { window = { W, 0 } } end, pairs_causal_window(L, W) },
    { "document", { mask_mod = document }, function() return { mask = doc_mask() } end, pairs_document(lens) },
    { "prefix_lm", { mask_mod = prefix_lm }, function() return { mask = prefix_mask() } end, pairs_prefix(L, prefix) },
    { "alibi+sliding", { score_mod = alibi, mask_mod = sliding }, function() return { alibi = sl, window = { W, 0 } } end,
      pairs_causal_window(L, W) },
    { "softcap+document", { score_mod = softcap, mask_mod = document },
      function() return { softcap = 30, mask = doc_mask() } end, pairs_document(lens) },
  }
  local function randn(s) return fa.randn({ B, H, L, D }, { dtype = dtype, device = dev, seed = s }) end
  local q, k, v = randn(seed), randn(seed + 1), randn(seed + 2)
  for _, c in ipairs(cases) do
    local name, vopts, bopts_of, npairs = c[1], c[2], c[3], c[4]
    if not wanted or wanted[name] then
      local row = { case = name, dtype = dtype, B = B, H = H, L = L, D = D, pairs = npairs,
        density = npairs / full, window = W, prefix = prefix }
      if name:find("document") then row.doc_lengths = lens end
      local flops = 4 * D * npairs * B * H
      local ok, err = pcall(function()
        local t0 = wall()
        local o = fa.attention(q, k, v, vopts)
        fa.sync()
        row.first_call_s = wall() - t0
        local bopts = bopts_of()
        local ref = fa.attention(q, k, v, bopts)
        row.rel_err = fa.rel_error(o:float(), ref:float())
        o:free(); ref:free()
        row.ms, row.builtin_ms, row.ratio_vs_builtin = time_pair(function() fa.attention(q, k, v, vopts):free() end,
          function() fa.attention(q, k, v, bopts):free() end)
        if vopts.mask_mod then -- opts.block_mask made once (fa.block_mask), as FlexAttention's
          local t1 = wall()
          local bm = fa.block_mask(vopts.mask_mod, B, H, L, L, cuda and { tile = { 128, 128 } } or nil)
          row.block_mask_s = math.max(0, wall() - t1 - CLOCK_S)
          local bo = {}
          for key, val in pairs(vopts) do bo[key] = val end
          bo.block_mask = bm
          row.block_mask_ms = time_ms(function() fa.attention(q, k, v, bo):free() end)
        end
        row.builtin = next(bopts) and table.concat((function()
          local t = {}
          for key in pairs(bopts) do t[#t + 1] = key end
          table.sort(t)
          return t
        end)(), "+")
      end)
      if not ok then
        row.status, row.error = "failed", tostring(err):match("[^\n]*")
      elseif not (row.rel_err <= sweep.TOLERANCE[dtype]) then
        row.status, wrong = "wrong", wrong + 1
      else
        row.status = "ok"
        row.tflops = flops / (row.ms * 1e-3) / 1e12
        row.builtin_tflops = flops / (row.builtin_ms * 1e-3) / 1e12
      end
      results[#results + 1] = row
      print(("%-18s %6d %3d %9s %8s %9s %8s %7s %8s %9s  %s"):format(name, L, B,
        row.ms and ("%.3f"):format(row.ms) or "-", row.tflops and ("%.1f"):format(row.tflops) or "-",
        row.builtin_ms and ("%.3f"):format(row.builtin_ms) or "-",
        row.builtin_tflops and ("%.1f"):format(row.builtin_tflops) or "-",
        row.ratio_vs_builtin and ("%.2f"):format(row.ratio_vs_builtin) or "-",
        row.first_call_s and ("%.2f"):format(row.first_call_s) or "-",
        row.block_mask_ms and ("%.3f"):format(row.block_mask_ms) or "-",
        row.status ~= "ok" and (row.status .. " " .. (row.error or tostring(row.rel_err))) or ""))
      collectgarbage()
    end
  end
  q:free(); k:free(); v:free()
  if docmask then docmask:free() end
  if prefixmask then prefixmask:free() end
end

-- The host's cost of a cached variant: a small call in a loop.
local host = {}
do
  local Ls = 128
  local q = fa.randn({ 1, 1, Ls, D }, { dtype = dtype, device = dev, seed = seed })
  local sl = fa.tensor({ 0.5 }, { device = dev })
  local function per_call(opts)
    fa.attention(q, q, q, opts):free()
    fa.sync()
    local n = quick and 50 or 500
    local t0 = wall()
    for _ = 1, n do fa.attention(q, q, q, opts):free() end
    fa.sync()
    return (wall() - t0) / n * 1e6
  end
  host.builtin_us = per_call({ alibi = { 0.5 } })
  host.variant_us = per_call({ score_mod = function(s, b, h, q, k) return s - sl[h] * (q - k):abs() end })
  host.over_plain_us = host.variant_us - host.builtin_us
  print(("host cost of a cached variant (B = H = 1, L = %d): %.1f us a call, %.1f with the alibi option (+%.1f)"):format(
    Ls, host.variant_us, host.builtin_us, host.over_plain_us))
  q:free()
end

if args.json then
  sweep.write_json_object({
    meta = sweep.run_meta(seed, {
      gpu = info.name, device = dev, repetitions = REP, rounds = ROUNDS, dtype = dtype, D = D, H = H,
      cache_dir = os.getenv("FLASHATTN_CACHE_DIR"),
      tflops = "4·D·(attended pairs)·B·H / median time",
      timing = "fa.bench, caches flushed before each repetition, median",
      slopes = "2^(-8h/H)", softcap = 30,
    }),
    results = results,
    host = host,
  }, args.json)
  print("wrote " .. args.json)
end
if wrong > 0 then os.exit(1) end
