-- Where a tiny decode call's host time goes (issue 24: under 10 µs a call): the call in a loop,
-- with opts.out, and beside it the plainest calls (zeros: an allocation and a fill; softmax of a
-- small tensor), each the best of 5 loops of --calls calls, µs a call by fa.bench (device events)
-- and by os.clock (this process's CPU time: equal to the first when the host is the bottleneck).
-- bf16, B = 1, Hq = 32, Hkv = 8, Lq = 1, Lk = 256, D = 128, as bench_decode's tiny call.
-- Then one call behind a 256 MiB flush (fa.bench's flush_cache): the device's time of a call (K and V
-- from DRAM) and the host's time around that one call (an isolated call's: the host idles between
-- repetitions, so it is well above a loop's cost a call; H100, session 81: 15-73 µs against 8-13).
-- FLASHATTN_NO_CUDA_CACHE=1 in a second process gives the same without the engine's block cache.
-- Usage (GPU machine): flashattn-lua scripts/probe_tiny_call.lua [--calls N] [--device cpu]
local fa = require "flashattn"
local N, dev = 2000, "cuda"
local i = 1
while arg and arg[i] do
  local a, v = arg[i], arg[i + 1]
  if a == "--calls" and tonumber(v) and tonumber(v) >= 1 then N = math.floor(tonumber(v))
  elseif a == "--device" and (v == "cpu" or v == "cuda") then dev = v
  else
    io.stderr:write("probe_tiny_call.lua: expected --calls N (N >= 1) or --device cpu|cuda, got '", tostring(a), "'\n")
    os.exit(1)
  end
  i = i + 2
end
local dt = dev == "cuda" and "bf16" or "f32"
local function r(s, sh) return fa.randn(sh, { dtype = dt, device = dev, seed = s }) end
local q, k, v = r(1, { 1, 32, 1, 128 }), r(2, { 1, 8, 256, 128 }), r(3, { 1, 8, 256, 128 })
local o = fa.zeros({ 1, 32, 1, 128 }, { dtype = dt, device = dev })
local function measure(name, body)
  body()
  fa.sync()
  local best_t, best_c = math.huge, math.huge
  for _ = 1, 5 do
    collectgarbage()
    fa.sync()
    local c0 = os.clock()
    local t = fa.bench(body, { warmup = 0, rep = 1 }).median_ms
    best_t, best_c = math.min(best_t, t), math.min(best_c, os.clock() - c0)
  end
  print(("%-34s timer %7.2f µs  host cpu %7.2f µs  a call"):format(name, best_t * 1e3 / N, best_c * 1e6 / N))
end
print(("probe_tiny_call.lua: %s, %d calls a loop, block cache %s"):format(fa.device_info(dev).name or dev, N,
  os.getenv("FLASHATTN_NO_CUDA_CACHE") and "off" or "on"))
measure("attention", function() for _ = 1, N do fa.attention(q, k, v) end end)
measure("attention, opts.out", function() local op = { out = o } for _ = 1, N do fa.attention(q, k, v, op) end end)
measure("zeros (an allocation and a fill)", function()
  for _ = 1, N do fa.zeros({ 1, 32, 1, 128 }, { dtype = dt, device = dev }) end
end)
measure("softmax of 32 rows of 128", function() for _ = 1, N do fa.softmax(o) end end)
if dev == "cuda" then
  local op = { out = o }
  local function one(name, body)
    local b = fa.bench(body, { warmup = 20, rep = 400, flush_cache = true })
    print(("%-34s device %7.2f µs  host %7.2f µs  (one call behind a flush, medians)"):format(name, b.median_ms * 1e3,
      b.host_ms * 1e3))
  end
  one("attention", function() fa.attention(q, k, v) end)
  one("attention, opts.out", function() fa.attention(q, k, v, op) end)
  one("zeros (an allocation and a fill)", function() fa.zeros({ 1, 32, 1, 128 }, { dtype = dt, device = dev }) end)
end
