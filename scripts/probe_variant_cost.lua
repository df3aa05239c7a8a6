-- What a Lua variant costs against the built-in option that computes the same rule, piece by
-- piece: the device time of a call (fa.bench, caches flushed, opts.out given so that no output
-- is allocated) and the host's CPU time of a call (os.clock over a loop, after a synchronisation;
-- os.clock, not sweep.wall_ns, which starts a process), for a plain call, an all-true mask_mod
-- and an identity score_mod (a variant's own cost, its rule doing nothing), then the canonical
-- rules beside their built-in options.  For A/B runs (scripts/gpu_ab.sh run 2
-- scripts/probe_variant_cost.lua): --json writes the rows keyed by rule and L.
-- Usage (GPU machine): build-gpu/flashattn-lua scripts/probe_variant_cost.lua [--device cuda]
--   [--ls 4096,16384] [--json out.json];  --device cpu runs a small smoke of it.
local fa = require "flashattn"
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local sweep = require "flashattn.sweep"

local opts = {device = "cuda", ls = nil, json = nil}
local i = 1
while arg and arg[i] do
  local a, v = arg[i], arg[i + 1]
  if a == "--device" and (v == "cpu" or v == "cuda") then opts.device = v
  elseif a == "--ls" and v and v:match("%d") then
    opts.ls = {}
    for x in v:gmatch("%d+") do opts.ls[#opts.ls + 1] = tonumber(x) end
  elseif a == "--json" and v then opts.json = v
  else
    io.stderr:write("probe_variant_cost.lua: expected --device cpu|cuda, --ls L,L,... or --json FILE, got '",
      tostring(a), "'\n")
    os.exit(1)
  end
  i = i + 2
end
local dev = opts.device
local cuda = dev == "cuda"
local TOKENS, H, D, W = cuda and 16384 or 256, cuda and 16 or 2, cuda and 128 or 16, cuda and 1024 or 32
local ls = opts.ls or (cuda and {4096, 16384} or {128})
local dtype = cuda and "bf16" or "f32"
local REP, LOOP = cuda and 20 or 2, cuda and 50 or 3

local rows = {}
for _, L in ipairs(ls) do
  local B = math.max(1, TOKENS // L)
  local function randn(s) return fa.randn({B, H, L, D}, {dtype = dtype, device = dev, seed = s}) end
  local q, k, v = randn(1), randn(2), randn(3)
  local out = fa.zeros({B, H, L, D}, {dtype = dtype, device = dev})
  local ids, sl = {}, {}
  for j = 1, L do ids[j] = (j - 1) // math.max(1, L // 6) end
  for h = 1, H do sl[h] = 2 ^ (-8 * h / H) end
  local doc, slopes = fa.tensor(ids, {device = dev}), fa.tensor(sl, {device = dev})
  local cases = {
    {"plain", {}, false},
    {"all-true mask_mod", {mask_mod = function(b, h, qi, kj) return kj:ge(0) end}, true},
    {"identity score_mod", {score_mod = function(s) return s end}, true},
    {"causal", {causal = true}, false},
    {"causal mask_mod", {mask_mod = function(b, h, qi, kj) return qi:ge(kj) end}, true},
    {"window", {window = {W, 0}}, false},
    {"sliding mask_mod", {mask_mod = function(b, h, qi, kj) return qi:ge(kj) & (qi - kj):le(W) end}, true},
    {"alibi", {alibi = sl}, false},
    {"alibi score_mod", {score_mod = function(s, b, h, qi, kj) return s - slopes[h] * (qi - kj):abs() end}, true},
    {"documents mask_mod", {mask_mod = function(b, h, qi, kj) return doc[qi]:eq(doc[kj]) & qi:ge(kj) end}, true},
  }
  for _, c in ipairs(cases) do
    local name, o = c[1], c[2]
    o.out = out
    local f = function() fa.attention(q, k, v, o) end
    f() -- compiles a variant (NVRTC) on cuda
    fa.sync()
    local ms = fa.bench(f, {warmup = 2, rep = REP, flush_cache = true}).median_ms
    fa.sync()
    local t0 = os.clock()
    for _ = 1, LOOP do f() end
    local host_us = (os.clock() - t0) / LOOP * 1e6
    fa.sync()
    rows[#rows + 1] = {rule = name, variant = c[3], L = L, B = B, H = H, D = D, dtype = dtype, ms = ms,
                       host_us = host_us}
    print(("L=%6d B=%3d %-22s %9.3f ms  host %7.1f us a call"):format(L, B, name, ms, host_us))
  end
end
if opts.json then
  sweep.write_json_object({
    meta = sweep.run_meta("fixed seeds 1-3", {
      gpu = fa.device_info(dev).name, device = dev, repetitions = REP, host_loop = LOOP,
      timing = "fa.bench, caches flushed, median; host: os.clock (process CPU time) a call over a loop",
    }),
    results = rows,
  }, opts.json)
  print("wrote " .. opts.json)
end
