-- Decoding on the GPU (issue 24): one new query row (Lq = 1) against a long
-- key sequence, the memory-bound case, where the figure that counts is how
-- fast K and V are read.  bf16, D = 128, Hq = 32, Hkv in {8, 32} (GQA and
-- not; --dim, --hq, --hkvs choose others), B in {1, 8, 64}, Lk in {4096, 32768, 131072}, no causal mask (it is a
-- no-op at Lq = 1).  A shape whose K + V pass --max-gib (default 40 GiB) is
-- skipped and listed as such (B = 64, Hkv = 32, Lk = 128k: 128 GiB).
--
-- Per shape, timed with fa.bench (device events, caches flushed before each
-- repetition, the median):
--   results  Lq = 1 on contiguous q, k, v: ms, kv_gbs = bytes of K + V / time,
--            copy_gbs = a device-to-device copy (t:copy_) of 1 GiB in the same
--            run, counted as bytes read + bytes written / time;
--            copy_ratio = kv_gbs / copy_gbs (the issue's target: >= 0.9);
--            below 1 GiB of K + V also same_copy_gbs, a copy moving as many
--            bytes in all (half read, half written) under the same flush, and
--            same_copy_ratio = kv_gbs / same_copy_gbs: the flush leaves L2
--            full of dirty lines, whose write-back a short stream pays and
--            the 1 GiB copy hardly shows.
--            Also Lq = 4 and 16 at B = 8, Hkv = 8, with lq1_ratio = their
--            time / the Lq = 1 time of the same shape.
--   paged    the same K/V appended to fa.kv_cache{page_size = 16 | 256} and
--            read by cache:attend (B = 8 and 64, Hkv = 8), with
--            contiguous_ratio = paged time / contiguous time.
--   tiny_call B = 1, Hkv = 8, Lk = 256, Lq = 1: 1000 calls in a loop (20 on the CPU), the
--            per-call cost in µs: host wall clock (`date +%s%N` around the loop,
--            synchronized at the end, less one clock read) and the timer's
--            figure (fa.bench around the loop).
-- Every measured call is first checked against fa.attention_reference (f64)
-- on the last batch entry and the query heads of the last KV head (at most
-- 4); a result past the bf16 tolerance is recorded as "wrong", gets no
-- time, and the script exits with status 1 after writing the JSON.
--
-- Usage (GPU machine, after scripts/gpu_run.sh's build):
--   build-gpu/flashattn-lua scripts/bench_decode.lua --json out/decode.json [--quick] [--seed S]
--   python3 scripts/peers_decode.py --engine out/decode.json --json out/decode_peers.json --commit C
-- Smoke test on the CPU (small sizes: B 1/2, Lk 256/1024):
--   build/flashattn-lua scripts/bench_decode.lua --device cpu --quick
-- --quick: 3 repetitions and a smaller grid (cuda: B 1/8, Lk 4k/32k).  --bs and
-- --lks replace the grid's B and Lk lists.  --seed S: q, k, v from seeds S,
-- S + 1, S + 2 (default 1).  The JSON: meta (commit, command line, seed, GPU
-- name, definitions of the figures), results, paged, tiny_call, skipped.
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"

local NAME = "bench_decode.lua"
local DT, D, HQ, HKVS = "bf16", 128, 32, { 8, 32 }
local GIB = 1 << 30

local function parse(argv)
  local argparse = require "argparse"
  local p = argparse(NAME, "Decoding (Lq = 1, long Lk): K + V read rate against the device copy bandwidth.")
  sweep.bench_options(p, "3 repetitions, a smaller grid")
  p:option("--bs", "comma list of batch sizes"):convert(sweep.list_arg("--bs", true))
  p:option("--lks", "comma list of key lengths"):convert(sweep.list_arg("--lks", true))
  p:option("--max-gib", "skip shapes whose K + V pass this many GiB"):convert(sweep.number_arg("--max-gib"))
   :default("40")
  p:option("--dim", "head dim D (default 128; 256: Gemma's)"):convert(sweep.integer_arg(1, "--dim"))
  p:option("--hq", "query heads (default 32)"):convert(sweep.integer_arg(1, "--hq"))
  p:option("--hkvs", "comma list of key/value heads (default 8,32)"):convert(sweep.list_arg("--hkvs", true))
  return sweep.parse_args(p, argv, NAME)
end
local args = sweep.main(NAME, parse, { ... })
local dev, seed, quick = args.device, args.seed, args.quick
D, HQ, HKVS = args.dim or D, args.hq or HQ, args.hkvs or HKVS
for _, h in ipairs(HKVS) do
  if HQ % h ~= 0 then error(("%s: --hq %d is not a multiple of --hkvs' %d"):format(NAME, HQ, h), 0) end
end
if HQ % 8 ~= 0 then error(("%s: --hq %d: the paged and tiny calls take 8 key heads"):format(NAME, HQ), 0) end
local cuda = dev == "cuda"

-- The grid and its subsets; the CPU's sizes only check that the script runs.
local grid
if cuda then
  grid = { bs = quick and { 1, 8 } or { 1, 8, 64 }, lks = quick and { 4096, 32768 } or { 4096, 32768, 131072 },
           paged_bs = { 8, 64 }, lq_b = 8, tiny_lk = 256 }
else
  grid = { bs = { 1, 2 }, lks = { 256, 1024 }, paged_bs = { 2 }, lq_b = 2, tiny_lk = 256 }
end
grid.bs, grid.lks = args.bs or grid.bs, args.lks or grid.lks
-- the CPU's tiny call takes milliseconds: fewer of them keep the smoke test short
local PAGED_HKV, LQS, PAGE_SIZES, TINY_CALLS = 8, { 4, 16 }, { 16, 256 }, cuda and 1000 or 20
local REP = quick and 3 or 20
local TOL = sweep.TOLERANCE[DT]
local info = fa.device_info(dev)
-- the paged cache holds a second copy of K + V: it runs only where both fit
-- in 90% of the device memory (1 GiB left for the rest)
local mem_total = info.mem_total or math.huge

local function contains(list, x)
  for _, y in ipairs(list) do if y == x then return true end end
  return false
end

-- Median ms of fn, caches flushed before each repetition (fa.bench).
local function time_ms(fn)
  return fa.bench(fn, { warmup = 2, rep = REP, flush_cache = true }).median_ms
end

-- A device-to-device copy whose DRAM traffic is `traffic` bytes (half read,
-- half written), timed like the calls (caches flushed): traffic / time, GB/s,
-- once a size.
local copy_cache = {}
local function copy_rate(traffic)
  if not copy_cache[traffic] then
    local n = traffic // 4 -- elements of 2 bytes in traffic / 2
    local x = fa.zeros({ n }, { dtype = DT, device = dev })
    local y = fa.zeros({ n }, { dtype = DT, device = dev })
    copy_cache[traffic] = 4 * n / (time_ms(function() y:copy_(x) end) * 1e-3) / 1e9
    x:free(); y:free(); collectgarbage()
  end
  return copy_cache[traffic]
end

-- The device's copy bandwidth, on a copy of 1 GiB (smaller copies measure
-- the cost of a call, not the memory; the issue's "the device copy runs at
-- about 3000 GB/s"), and the GiB copied.
local function copy_gbs() return copy_rate(2 * GIB), GIB end

-- The yardstick of a stream of `bytes`: a copy of the same traffic, below
-- 1 GiB only (nil above: copy_gbs is that figure).
local function same_copy_gbs(bytes)
  if bytes >= GIB then return nil end
  return copy_rate(bytes)
end

-- The checked slice: batch entry B, the query heads of the last KV head
-- (at most 4 of them), every query row.  refs[Lq] is made once per shape.
local function slice(t, B, h0, nh) return t:narrow(1, B, 1):narrow(2, h0, nh) end
local function check(o, q, k, v, refs)
  local B, Hq, Lq = q:size(1), q:size(2), q:size(3)
  local Hkv = k:size(2)
  local g = Hq // Hkv
  local h0, nh = (Hkv - 1) * g + 1, math.min(g, 4)
  if not refs[Lq] then
    refs[Lq] = fa.attention_reference(slice(q, B, h0, nh), slice(k, B, Hkv, 1), slice(v, B, Hkv, 1))
  end
  return fa.rel_error(slice(o, B, h0, nh):cpu(), refs[Lq])
end

-- Runs call once for the check, then times it; a row gets ms only when the
-- output is right.  Returns the row (fields added) and the ms or nil.
local wrong = 0
local function measure(row, call, q, k, v, refs)
  local ok, o = pcall(call)
  if not ok then
    row.status, row.error = "failed", tostring(o):match("[^\n]*")
    return row, nil
  end
  row.rel_err = check(o, q, k, v, refs)
  o:free()
  if not (row.rel_err <= TOL) then
    row.status, wrong = "wrong", wrong + 1
    return row, nil
  end
  local tok, ms = pcall(time_ms, call) -- right once, it may still run out of memory when repeated
  collectgarbage()
  if not tok then
    row.status, row.error = "failed", tostring(ms):match("[^\n]*")
    return row, nil
  end
  row.status, row.ms = "ok", ms
  return row, ms
end

local function randn(shape, s) return fa.randn(shape, { dtype = DT, device = dev, seed = s }) end
local function kv_bytes_of(B, Hkv, Lk) return 2 * B * Hkv * Lk * D * 2 end -- K and V, 2 bytes an element
local function fmt(x, f) return x and f:format(x) or "-" end

local results, paged, skipped = {}, {}, {}
print(("%s: %s, bf16, D = %d, Hq = %d, %d repetitions"):format(NAME, info.name or dev, D, HQ, REP))
print(("%-8s %4s %4s %3s %7s %6s %9s %9s %9s %7s %7s %8s %6s"):format("kind", "B", "Hkv", "Lq", "Lk", "page", "ms",
  "KV GB/s", "copyGB/s", "x copy", "x same", "rel_err", "ratio"))
local function show(kind, r, page, ratio)
  print(("%-8s %4d %4d %3d %7d %6s %9s %9s %9s %7s %7s %8s %6s  %s"):format(kind, r.B, r.Hkv, r.Lq, r.Lk, page or "-",
    fmt(r.ms, "%.4f"), fmt(r.kv_gbs, "%.1f"), fmt(r.copy_gbs, "%.1f"), fmt(r.copy_ratio, "%.2f"),
    fmt(r.same_copy_ratio, "%.2f"),
    fmt(r.rel_err, "%.1e"), fmt(ratio, "%.2f"), r.status ~= "ok" and (r.status .. " " .. (r.error or "")) or ""))
end

for _, Hkv in ipairs(HKVS) do
  for _, B in ipairs(grid.bs) do
    for _, Lk in ipairs(grid.lks) do
      local kvb = kv_bytes_of(B, Hkv, Lk)
      if kvb > args.max_gib * GIB then
        skipped[#skipped + 1] = { B = B, Hkv = Hkv, Lk = Lk, kv_gib = kvb / GIB,
          reason = ("K + V = %.0f GiB > --max-gib %g"):format(kvb / GIB, args.max_gib) }
        print(("skipped  %4d %4d %3d %7d: %s"):format(B, Hkv, 1, Lk, skipped[#skipped].reason))
        goto next_shape
      end
      do
        local cgbs, cbytes = copy_gbs()
        local k, v = randn({ B, Hkv, Lk, D }, seed + 1), randn({ B, Hkv, Lk, D }, seed + 2)
        local refs, lq1_ms = {}, nil
        local lqs = { 1 }
        if B == grid.lq_b and Hkv == PAGED_HKV then for _, x in ipairs(LQS) do lqs[#lqs + 1] = x end end
        for _, Lq in ipairs(lqs) do
          local q = randn({ B, HQ, Lq, D }, seed)
          local kok, kernels = pcall(fa.kernels, q, k, v)
          local row = { B = B, Hq = HQ, Hkv = Hkv, Lq = Lq, Lk = Lk, D = D, dtype = DT, kv_bytes = kvb,
                        copy_bytes = cbytes, copy_gbs = cgbs, kernel = kok and kernels[1] or nil }
          local _, ms = measure(row, function() return fa.attention(q, k, v) end, q, k, v, refs)
          if ms then
            row.kv_gbs = kvb / (ms * 1e-3) / 1e9
            row.copy_ratio = row.kv_gbs / cgbs
            row.same_copy_gbs = same_copy_gbs(kvb)
            if row.same_copy_gbs then row.same_copy_ratio = row.kv_gbs / row.same_copy_gbs end
            if Lq == 1 then lq1_ms = ms elseif lq1_ms then row.lq1_ratio = ms / lq1_ms end
          end
          results[#results + 1] = row
          show("contig", row, nil, row.lq1_ratio)
          -- the paged cache, at Lq = 1 on the paged subset, when a second K + V fits
          if Lq == 1 and Hkv == PAGED_HKV and contains(grid.paged_bs, B) then
            for _, ps in ipairs(PAGE_SIZES) do
              local prow = { B = B, Hq = HQ, Hkv = Hkv, Lq = Lq, Lk = Lk, D = D, dtype = DT, page_size = ps,
                             kv_bytes = kvb }
              if 2 * kvb + GIB > 0.9 * mem_total then
                prow.status, prow.error = "skipped", "a second K + V does not fit in the device memory"
              else
                local ok, err = pcall(function()
                  local cache <close> = fa.kv_cache { batch = B, heads = Hkv, dim = D, capacity = Lk,
                    page_size = ps, dtype = DT, device = dev }
                  cache:append(k, v)
                  local _, pms = measure(prow, function() return cache:attend(q) end, q, k, v, refs)
                  if pms then
                    prow.kv_gbs = kvb / (pms * 1e-3) / 1e9
                    if lq1_ms then prow.contiguous_ratio = pms / lq1_ms end
                  end
                end)
                if not ok then prow.status, prow.error = "failed", tostring(err):match("[^\n]*") end
              end
              collectgarbage()
              paged[#paged + 1] = prow
              show("paged", prow, ps, prow.contiguous_ratio)
            end
          end
          q:free()
        end
        k:free(); v:free(); collectgarbage()
      end
      ::next_shape::
    end
  end
end

-- The tiny call: what a call costs when there is almost nothing to read (the
-- launches and the host's work; on cuda the timer's start event runs at once
-- and its stop after the last kernel, so it is close to the wall figure
-- whenever the host is the bottleneck).
local tiny
do
  local B, Hkv, Lk = 1, PAGED_HKV, grid.tiny_lk
  local q, k, v = randn({ B, HQ, 1, D }, seed), randn({ B, Hkv, Lk, D }, seed + 1), randn({ B, Hkv, Lk, D }, seed + 2)
  tiny = { B = B, Hq = HQ, Hkv = Hkv, Lq = 1, Lk = Lk, D = D, dtype = DT, calls = TINY_CALLS }
  local function loop() for _ = 1, TINY_CALLS do fa.attention(q, k, v) end end
  measure(tiny, function() return fa.attention(q, k, v) end, q, k, v, {})
  if tiny.status == "ok" then
    tiny.ms = nil -- the single call's time is not this row's figure
    loop(); fa.sync() -- warm-up
    -- wall: median of 3 loops, each less the cost of one clock read (a process start)
    local walls = {}
    for i = 1, 3 do
      local a, b = sweep.wall_ns(), sweep.wall_ns()
      local t0 = sweep.wall_ns()
      loop(); fa.sync()
      local t1 = sweep.wall_ns()
      if a and b and t0 and t1 then walls[i] = (t1 - t0) - (b - a) end
    end
    if #walls == 3 then
      table.sort(walls)
      tiny.wall_us_per_call = walls[2] * 1e-3 / TINY_CALLS
    end
    tiny.timer_us_per_call = fa.bench(loop, { warmup = 0, rep = 3 }).median_ms * 1e3 / TINY_CALLS
  end
  print(("tiny call (B = %d, Hkv = %d, Lk = %d, Lq = 1, %d calls): %s µs wall, %s µs timer a call%s"):format(B, Hkv,
    Lk, TINY_CALLS, fmt(tiny.wall_us_per_call, "%.2f"), fmt(tiny.timer_us_per_call, "%.2f"),
    tiny.status == "ok" and "" or " (" .. tiny.status .. ")"))
  q:free(); k:free(); v:free(); collectgarbage()
end

if args.json then
  sweep.write_json_object({
    meta = sweep.run_meta(seed, {
      gpu = info.name, device = dev, dtype = DT, D = D, Hq = HQ, repetitions = REP, max_kv_gib = args.max_gib,
      tolerance = TOL,
      timing = "fa.bench: device events on cuda (monotonic clock on the CPU), caches flushed before each "
        .. "repetition, 2 warm-up calls, the median",
      kv_gbs = "bytes of K + V (2 bytes an element) / median time, GB = 1e9 bytes",
      copy_gbs = "device-to-device copy (t:copy_) of 1 GiB: bytes read + bytes written / median time (the "
        .. "DRAM traffic of the copy)",
      copy_ratio = "kv_gbs / copy_gbs; issue 24's target: >= 0.9",
      same_copy_gbs = "below 1 GiB of K + V: a device-to-device copy moving kv_bytes in all (half read, half "
        .. "written), caches flushed before each repetition as for the calls",
      same_copy_ratio = "kv_gbs / same_copy_gbs",
      lq1_ratio = "time at Lq / time at Lq = 1 of the same shape",
      contiguous_ratio = "paged (fa.kv_cache attend) time / contiguous fa.attention time, Lq = 1",
      tiny_call = "wall_us_per_call: host clock (date +%s%N) around 1000 calls then fa.sync, median of 3, less "
        .. "one clock read; timer_us_per_call: fa.bench around the same loop",
      check = "rel_err against fa.attention_reference (f64) on batch B, the query heads of the last KV head "
        .. "(at most 4), every query row; status 'wrong' (no time) past tolerance",
    }),
    device = info.name, results = results, paged = paged, tiny_call = tiny, skipped = skipped,
  }, args.json)
  print("wrote " .. args.json)
end
if wrong > 0 then
  io.stderr:write(("%s: %d result(s) past the tolerance %g (status \"wrong\")\n"):format(NAME, wrong, TOL))
  os.exit(1)
end
