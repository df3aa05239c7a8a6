-- Where a document mask's time goes (issue 26): the device time of one call (fa.bench, caches
-- flushed, opts.out given) of the document rule written several ways, beside built-in rules of
-- about as many key tiles a query tile, with the tiles each case visits counted on the host
-- (128 x 128 tiles: nonempty, and of them partial), so that a case's time splits into a cost a
-- query tile and a cost a key tile.  Cases: causal and windows (built-in); documents of the
-- bench's lengths (bench_variants.lua: 64 to L/4 keys, from the seed) as `doc[q] == doc[k]`,
-- with and without a block mask made once, and as `k >= start[q]` (a read a row, none a key);
-- documents of 512 keys (aligned to the tiles) as a tensor read and as positions alone; rows of
-- 1, 2, 4 and 8 full key tiles (keys and values that short, no rule).
-- Usage (GPU machine): flashattn-lua scripts/probe_documents.lua [--ls 4096,16384] [--seed S]
--   [--json out.json];  --device cpu runs a small smoke of it.
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"

local NAME = "probe_documents.lua"
local function parse(argv)
  local p = require "argparse"(NAME, "Where a document mask's time goes, beside built-in rules.")
  p:option("--json", "write the results to this JSON file")
  p:option("--seed", "seed of the documents"):convert(sweep.integer_arg(0, "--seed")):default("1")
  p:option("--device", "cuda, or cpu for a smoke test at small sizes"):choices({"cuda", "cpu"}):default("cuda")
  p:option("--ls", "comma list of L (default 4096,16384)"):convert(sweep.list_arg("--ls", true))
  return sweep.parse_args(p, argv, NAME)
end
local opts = sweep.main(NAME, parse, {...})
local dev = opts.device
local cuda = dev == "cuda"
local TOKENS, H, D, T = cuda and 16384 or 256, cuda and 16 or 2, cuda and 128 or 16, cuda and 128 or 16
local ls = opts.ls or (cuda and {4096, 16384} or {128})
local dtype = cuda and "bf16" or "f32"
local REP = cuda and 20 or 2
local ALIGNED = cuda and 512 or 32

-- Tiles of T x T a rule visits: keep(q, k) on 1-based positions, given as each row's kept keys [lo, hi].
local function tiles_of(L, run)
  local nonempty, partial = 0, 0
  for qt = 0, (L - 1) // T do
    local counts = {}
    for r = qt * T + 1, math.min(L, qt * T + T) do
      local lo, hi = run(r)
      for kt = (lo - 1) // T, (hi - 1) // T do
        local a, z = math.max(lo, kt * T + 1), math.min(hi, kt * T + T)
        counts[kt] = (counts[kt] or 0) + (z - a + 1)
      end
    end
    for _, c in pairs(counts) do
      nonempty = nonempty + 1
      if c < T * T then partial = partial + 1 end
    end
  end
  return nonempty, partial
end

local rows = {}
for _, L in ipairs(ls) do
  local B = math.max(1, TOKENS // L)
  local function randn(s) return fa.randn({B, H, L, D}, {dtype = dtype, device = dev, seed = s}) end
  local q, k, v = randn(1), randn(2), randn(3)
  local out = fa.zeros({B, H, L, D}, {dtype = dtype, device = dev})
  local _, ids = sweep.documents(L, opts.seed)
  local start, first = {}, {}
  for j = 1, L do
    first[ids[j]] = first[ids[j]] or j
    start[j] = first[ids[j]]
  end
  local doc, st = fa.tensor(ids, {device = dev}), fa.tensor(start, {device = dev})
  local aligned = {}
  for j = 1, L do aligned[j] = (j - 1) // ALIGNED end
  local adoc = fa.tensor(aligned, {device = dev})
  -- each case: its name, options, and the keys [lo, hi] each row keeps
  local function causal(r) return 1, r end
  local function documents(r) return start[r], r end
  local function aligned(r) return (r - 1) // ALIGNED * ALIGNED + 1, r end
  local function doc_mm(b, h, qi, kj) return doc[qi]:eq(doc[kj]) & qi:ge(kj) end
  local function adoc_mm(b, h, qi, kj) return adoc[qi]:eq(adoc[kj]) & qi:ge(kj) end
  local cases = {
    {"causal", {causal = true}, causal},
    {"causal mask_mod", {mask_mod = function(b, h, qi, kj) return qi:ge(kj) end}, causal},
  }
  for _, w in ipairs({T, 4 * T, 8 * T, 16 * T}) do
    cases[#cases + 1] = {"window " .. w, {window = {w, 0}}, function(r) return math.max(1, r - w), r end}
  end
  for _, c in ipairs({
    {"documents doc[q]==doc[k]", {mask_mod = doc_mm}, documents},
    {"documents, block_mask", {mask_mod = doc_mm, bm = true}, documents},
    {"documents k>=start[q]", {mask_mod = function(b, h, qi, kj) return kj:ge(st[qi]) & qi:ge(kj) end}, documents},
    {"aligned " .. ALIGNED .. " tensor", {mask_mod = adoc_mm}, aligned},
    {"aligned " .. ALIGNED .. " positions", {mask_mod = function(b, h, qi, kj)
      return ((qi - 1) / ALIGNED):floor():eq(((kj - 1) / ALIGNED):floor()) & qi:ge(kj) end}, aligned},
  }) do cases[#cases + 1] = c end
  -- rows of a few full key tiles (no rule): a query tile's fixed cost and a key tile's
  for _, nk in ipairs({1, 2, 4, 8}) do
    local Lk = nk * T
    cases[#cases + 1] = {"plain, keys " .. Lk, {keys = Lk}, function() return 1, Lk end}
  end
  for _, c in ipairs(cases) do
    local name, o = c[1], c[2]
    local kk, vv = k, v
    if o.keys then
      kk = fa.randn({B, H, o.keys, D}, {dtype = dtype, device = dev, seed = 4})
      vv = fa.randn({B, H, o.keys, D}, {dtype = dtype, device = dev, seed = 5})
      o.keys = nil
    end
    if o.bm then
      o.block_mask = fa.block_mask(o.mask_mod, B, H, L, L, cuda and {tile = {128, 128}} or nil)
      o.bm = nil
    end
    o.out = out
    local f = function() fa.attention(q, kk, vv, o) end
    f() -- compiles a variant (NVRTC) on cuda
    fa.sync()
    local ms = fa.bench(f, {warmup = 2, rep = REP, flush_cache = true}).median_ms
    local nonempty, partial = tiles_of(L, c[3])
    local qtiles = (L + T - 1) // T
    if kk ~= k then kk:free() vv:free() end
    rows[#rows + 1] = {case = name, L = L, B = B, H = H, D = D, dtype = dtype, ms = ms, query_tiles = qtiles,
                       tiles = nonempty, partial = partial}
    print(("L=%6d B=%2d %-28s %8.3f ms  tiles/qtile %6.2f partial/qtile %5.2f  us/tile-pair %.3f"):format(
      L, B, name, ms, nonempty / qtiles, partial / qtiles, ms * 1e3 / (nonempty * B * H)))
  end
end
if opts.json then
  sweep.write_json_object({
    meta = sweep.run_meta(opts.seed, {gpu = fa.device_info(dev).name, device = dev, repetitions = REP, tile = T,
                                      timing = "fa.bench, caches flushed, median, opts.out given"}),
    results = rows,
  }, opts.json)
  print("wrote " .. opts.json)
end
