-- Dense bool masks of several structures on the tensor-core forward: the device time of one call
-- (fa.bench, caches flushed) beside the same shape without a mask, and the 128 x 128 tiles each mask
-- leaves nonempty (counted on the host), so that a mask's cost splits into the tiles it visits and
-- the work a visited tile does.  Masks (bool tensors, true = attend):
--   docs512   documents of 512 keys, (1, 1, L, L), causal and not
--   keypad    key padding, (B, 1, 1, L), batch b keeping its first L/2 + 100 b keys
--   band256   a band of 256 keys behind the diagonal written as a dense mask, (1, 1, L, L)
--   tenth     one key in ten off (bench_attention.lua's mask_bool), (1, 1, L, L)
--   none      no mask (the control)
-- Each result is checked on the last query rows of one head against the f64 reference.
-- Usage (GPU machine): flashattn-lua scripts/probe_dense_masks.lua [--dims 64,128] [--ls 2048]
--   [--dtypes bf16] [--json out.json];  --device cpu runs a small smoke of it.
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"

local NAME = "probe_dense_masks.lua"
local function parse(argv)
  local p = require "argparse"(NAME, "Dense bool masks of several structures, beside no mask.")
  p:option("--json", "write the results to this JSON file")
  p:option("--device", "cuda, or cpu for a smoke test at small sizes"):choices({"cuda", "cpu"}):default("cuda")
  p:option("--dims", "comma list of head dims"):convert(sweep.list_arg("--dims", true)):default("64,128")
  p:option("--ls", "comma list of L"):convert(sweep.list_arg("--ls", true))
  p:option("--dtypes", "comma list of bf16, f16"):convert(sweep.list_arg("--dtypes")):default("bf16")
  return sweep.parse_args(p, argv, NAME)
end
local opts = sweep.main(NAME, parse, {...})
local dev = opts.device
local cuda = dev == "cuda"
local TOKENS, HD = cuda and 16384 or 64, cuda and 2048 or 32
local ls = opts.ls or (cuda and {2048} or {32})
local dims = cuda and opts.dims or {16}
local dtypes = cuda and opts.dtypes or {"f32"}
local REP, T = cuda and 10 or 1, cuda and 128 or 8
local DOC, BAND = cuda and 512 or 8, cuda and 256 or 6

-- keep(b, i, j) of each mask on 1-based positions; shape: the mask tensor's
local function structures(L, B)
  local pad = function(b) return math.min(L, L // 2 + 100 * (b - 1) * (cuda and 1 or 0) + 1) end
  return {
    {name = "docs512", shape = {1, 1, L, L}, keep = function(_, i, j) return (i - 1) // DOC == (j - 1) // DOC end},
    {name = "keypad", shape = {B, 1, 1, L}, keep = function(b, _, j) return j <= pad(b) end},
    {name = "band256", shape = {1, 1, L, L}, keep = function(_, i, j) return j <= i and j > i - BAND end},
    {name = "tenth", shape = {1, 1, L, L}, keep = function(_, i, j) return (i * 7 + j * 3) % 10 ~= 0 end},
  }
end

-- the mask as a bool tensor on the device
local function mask_tensor(s)
  local B, Lq, L = s.shape[1], s.shape[3], s.shape[4]
  local t = {}
  for b = 1, B do
    local rows = {}
    for i = 1, Lq do
      local r = {}
      for j = 1, L do r[j] = s.keep(b, Lq == 1 and L or i, j) end
      rows[i] = r
    end
    t[b] = {rows}
  end
  return fa.tensor(t, {device = dev})
end

-- T x T tiles with a kept pair, over one (batch 1) head, with causal's bottom-right rule when asked
local function tiles_visited(s, L, causal)
  local n = 0
  for qt = 0, (L - 1) // T do
    for kt = 0, (L - 1) // T do
      local hit = false
      for i = qt * T + 1, math.min(L, qt * T + T) do
        for j = kt * T + 1, math.min(L, kt * T + T) do
          if (not causal or j <= i) and s.keep(1, s.shape[3] == 1 and L or i, j) then hit = true break end
        end
        if hit then break end
      end
      if hit then n = n + 1 end
    end
  end
  return n
end

local results = {}
print(string.format("%-5s %4s %6s %-6s %-8s %9s %7s %9s", "dtype", "D", "L", "causal", "mask", "ms", "tiles", "rel_err"))
for _, L in ipairs(ls) do
  local B = math.max(1, TOKENS // L)
  local structs = structures(L, B)
  local masks = {}
  for _, s in ipairs(structs) do masks[s.name] = mask_tensor(s) end
  for _, dt in ipairs(dtypes) do
    for _, D in ipairs(dims) do
      local H = math.max(1, HD // D)
      local q = fa.randn({B, H, L, D}, {dtype = dt, device = dev, seed = 1})
      local k = fa.randn({B, H, L, D}, {dtype = dt, device = dev, seed = 2})
      local v = fa.randn({B, H, L, D}, {dtype = dt, device = dev, seed = 3})
      local rows = math.min(L, 64)
      local function head(x) return x:narrow(1, 1, 1):narrow(2, 1, 1) end
      local cases = {{name = "none"}}
      for _, s in ipairs(structs) do cases[#cases + 1] = s end
      for _, causal in ipairs({false, true}) do
        for _, c in ipairs(cases) do
          local o_opts, r_opts = {causal = causal}, {causal = causal}
          if c.shape then
            local m = masks[c.name]
            o_opts.mask = m
            local mh = m:narrow(1, 1, 1)
            r_opts.mask = c.shape[3] == 1 and mh or mh:narrow(3, L - rows + 1, rows)
          end
          local ref = fa.attention_reference(head(q):narrow(3, L - rows + 1, rows), head(k), head(v), r_opts)
          local o = fa.attention(q, k, v, o_opts)
          local rel = fa.rel_error(head(o):narrow(3, L - rows + 1, rows):cpu(), ref)
          o:free()
          local b = fa.bench(function() fa.attention(q, k, v, o_opts) end, {warmup = 2, rep = REP, flush_cache = cuda})
          local tiles = c.shape and tiles_visited(c, L, causal) or nil
          print(string.format("%-5s %4d %6d %-6s %-8s %9.4f %7s %9.2e", dt, D, L, tostring(causal), c.name,
            b.median_ms, tostring(tiles or "-"), rel))
          results[#results + 1] = {dtype = dt, D = D, L = L, B = B, Hq = H, causal = causal, case = c.name,
            ms = b.median_ms, tiles_visited = tiles, rel_err = rel}
          collectgarbage()
        end
      end
      q:free(); k:free(); v:free()
    end
  end
  for _, m in pairs(masks) do m:free() end
end
if opts.json then
  sweep.write_json_object({meta = sweep.run_meta(1), device = fa.device_info().name, results = results}, opts.json)
end
