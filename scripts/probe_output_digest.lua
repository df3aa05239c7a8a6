-- Writes the outputs (and lse) of a fixed list of attention calls as .npy
-- files into a folder, so that two builds of the engine can be compared
-- byte for byte (sha256sum of both folders): a kernel change meant to leave
-- every figure as it was (work skipped, not changed) shows as the same files.
-- The calls are the fast kernels' partial key tiles: causal (bottom-right and
-- top-left, Lq = Lk and not), windows, kv_lens, alibi and softcap, at head
-- dims 64, 128 and 256, bf16 and f16, with lengths that are and are not
-- multiples of the tiles; then bool masks (D = 64 and 128, read as bits by
-- the fast kernels) of each broadcast form, documents and key padding, alone,
-- causal and under a window.
-- Usage: flashattn-lua scripts/probe_output_digest.lua DIR [--device cuda|cpu]
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"

local function usage()
  io.stderr:write("usage: probe_output_digest.lua DIR [--device cuda|cpu]\n")
  os.exit(1)
end
local dir, device = arg[1], "cuda"
if not dir or dir:sub(1, 2) == "--" then usage() end
if arg[2] then
  if arg[2] ~= "--device" or (arg[3] ~= "cuda" and arg[3] ~= "cpu") or arg[4] then usage() end
  device = arg[3]
end

local rules = {
  { "causal", { causal = true } },
  { "top_left", { causal = "top_left" } },
  { "window", { causal = true, window = { 200, -1 } } },
  { "kv_lens", { causal = true, kv_lens = { 700, 777 } } },
  { "alibi", { causal = true, alibi = { 0.5, 0.25, 0.125, 0.0625 } } },
  { "softcap", { causal = true, softcap = 30 } },
  { "plain", {} },
}
local n = 0
-- One call's o and lse into NAME-o.npy and NAME-lse.npy.
local function write(q, k, v, rule_opts, mask, name)
  local opts = { algo = "flash", return_lse = true, mask = mask }
  for key, val in pairs(rule_opts) do opts[key] = val end
  local o, lse = fa.attention(q, k, v, opts)
  fa.save(name .. "-o.npy", o:cpu())
  fa.save(name .. "-lse.npy", lse:cpu())
  n = n + 1
end
local shapes = { { 1024, 1024 }, { 1000, 1000 }, { 777, 1300 }, { 1300, 777 } }
-- q, k and v of B 2, H 4 (seeds s, s + 10, s + 20).
local function inputs(dt, D, Lq, Lk, s)
  local function randn(L, seed) return fa.randn({ 2, 4, L, D }, { dtype = dt, device = device, seed = seed }) end
  return randn(Lq, s), randn(Lk, s + 10), randn(Lk, s + 20)
end
for _, dt in ipairs { "bf16", "f16" } do
  for _, D in ipairs { 64, 128, 256 } do
    for si, sh in ipairs(shapes) do
      local Lq, Lk = sh[1], sh[2]
      local q, k, v = inputs(dt, D, Lq, Lk, 11 + si)
      for _, rule in ipairs(rules) do
        write(q, k, v, rule[2], nil, string.format("%s/%s-d%d-%dx%d-%s", dir, dt, D, Lq, Lk, rule[1]))
      end
    end
  end
end

-- A bool mask false where a uniform value is under `off` (sweep.lua's way: scaled into f16's underflow).
local function random_mask(shape, off, seed)
  local u = fa.rand(shape, { seed = seed, device = device })
  return (u * (2 ^ -25 / off)):half():to("bool")
end
-- (Lq, Lk) masks set element by element: documents of 300 keys in the sequence's positions (bottom-right), and
-- the last 137 keys off.
local function built_mask(Lq, Lk, keep)
  local m = fa.zeros({ Lq, Lk }, { dtype = "bool", device = "cpu" })
  for i = 1, Lq do
    for j = 1, Lk do
      if keep(i, j) then m[i][j] = true end
    end
  end
  return m:to(device)
end
local masks = {
  { "2d", function(Lq, Lk, seed) return random_mask({ Lq, Lk }, 0.1, seed) end },
  { "4d", function(Lq, Lk, seed) return random_mask({ 2, 4, Lq, Lk }, 0.3, seed) end },
  { "batch", function(Lq, Lk, seed) return random_mask({ 2, 1, Lq, Lk }, 0.5, seed) end },
  { "keys", function(_, Lk, seed) return random_mask({ 1, 1, 1, Lk }, 0.2, seed) end },
  { "docs", function(Lq, Lk)
    return built_mask(Lq, Lk, function(i, j) return (i - 1 + Lk - Lq) // 300 == (j - 1) // 300 end)
  end },
  { "padding", function(Lq, Lk) return built_mask(Lq, Lk, function(_, j) return j <= Lk - 137 end) end },
}
local mask_rules = { { "plain", {} }, { "causal", { causal = true } }, { "window", { window = { 333, 77 } } } }
for _, dt in ipairs { "bf16", "f16" } do
  for _, D in ipairs { 64, 128 } do
    for si, sh in ipairs(shapes) do
      local Lq, Lk = sh[1], sh[2]
      local q, k, v = inputs(dt, D, Lq, Lk, 41 + si)
      for _, mk in ipairs(masks) do
        local mask = mk[2](Lq, Lk, 71 + si)
        for _, rule in ipairs(mask_rules) do
          write(q, k, v, rule[2], mask, string.format("%s/%s-d%d-%dx%d-mask-%s-%s", dir, dt, D, Lq, Lk, mk[1], rule[1]))
        end
      end
    end
  end
end
print(string.format("probe_output_digest: %d calls written to %s", n, dir))
