-- Calls for compute-sanitizer (memcheck, racecheck, synccheck) over the forward kernels' forms, with more
-- query tiles than SMs, so that the persistent form's blocks take several tiles each (its slots and Q's
-- tile reused): D = 64 and 128, 2 x 8 heads of --l rows (288 query tiles at the default 2304); the plain
-- rule, causal, softcap, alibi (at D = 64 the scheduler warp), kv_lens with an empty batch, a window;
-- a bool mask with a causal mask (a block a tile); the wgmma and mma kernels by name where the device
-- has them.  Each output is checked against the f64 reference on a slice (every row of the first head).
-- Prints the number of calls and exits non-zero on a wrong result.
-- Usage (GPU machine):
--   FLASHATTN_NO_CUDA_CACHE=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
--     flashattn-lua scripts/probe_sanitize.lua [--device cpu|cuda] [--l L]
local fa = require "flashattn"
local dev, L = "cuda", 2304
local i = 1
while arg and arg[i] do
  local a, v = arg[i], arg[i + 1]
  if a == "--device" and (v == "cpu" or v == "cuda") then dev = v
  elseif a == "--l" and tonumber(v) and tonumber(v) >= 64 then L = math.floor(tonumber(v))
  else
    io.stderr:write("probe_sanitize.lua: expected --device cpu|cuda or --l L (L >= 64), got '", tostring(a), "'\n")
    os.exit(1)
  end
  i = i + 2
end
local dtype = dev == "cuda" and "bf16" or "f32"
local TOL = dev == "cuda" and 0.02 or 1e-5
local function rn(shape, s) return fa.randn(shape, { dtype = dtype, device = dev, seed = s }) end
local calls, wrong = 0, 0

-- o against the reference on batch 1, head 1 (the key head it shares), all rows
local function check(q, k, v, opts, o, what)
  local ro = {}
  for key, val in pairs(opts) do if key ~= "kernel" and key ~= "return_lse" then ro[key] = val end end
  if ro.kv_lens then ro.kv_lens = { ro.kv_lens[1] } end
  if ro.alibi then ro.alibi = { ro.alibi[1] } end
  if ro.mask then ro.mask = ro.mask:cpu() end
  local sub = function(t) return t[1]:narrow(1, 1, 1):cpu():to("f64") end
  local ref = fa.attention_reference(sub(q), sub(k), sub(v), ro)
  local err = fa.rel_error(sub(o), ref)
  calls = calls + 1
  if not (err <= TOL) then
    wrong = wrong + 1
    print(("probe_sanitize.lua: %s: rel_err %g"):format(what, err))
  end
end

for _, D in ipairs({ 64, 128 }) do
  local q, k, v = rn({ 2, 8, L, D }, 1), rn({ 2, 4, L, D }, 2), rn({ 2, 4, L, D }, 3)
  for n, o in ipairs({ {}, { causal = true }, { softcap = 3 },
    { alibi = { 0.5, 0.25, 0.125, 0.0625, 0.5, 0.25, 0.125, 0.0625 } },
    { kv_lens = { 200, 0 }, causal = true, return_lse = true }, { window = { 300, 0 } } }) do
    check(q, k, v, o, fa.attention(q, k, v, o), ("D=%d case %d"):format(D, n))
  end
  local qs, ks, vs = rn({ 1, 2, 300, D }, 4), rn({ 1, 2, 300, D }, 5), rn({ 1, 2, 300, D }, 6)
  local rows = {}
  for r = 1, 300 do
    local row = {}
    for c = 1, 300 do row[c] = ((r * 7 + c * 13) % 5) ~= 0 end
    rows[r] = row
  end
  local m = fa.tensor(rows, { device = dev })
  local mo = { mask = m, causal = true }
  check(qs, ks, vs, mo, fa.attention(qs, ks, vs, mo), ("D=%d mask"):format(D))
  for _, kern in ipairs({ "wgmma", "mma" }) do
    local ko = { kernel = kern, return_lse = true }
    local ok, o = pcall(fa.attention, qs, ks, vs, ko)
    if ok then check(qs, ks, vs, ko, o, ("D=%d kernel %s"):format(D, kern)) end
  end
end
fa.sync()
print(("probe_sanitize.lua: %s, %d calls, %d wrong"):format(dev, calls, wrong))
if wrong > 0 then os.exit(1) end
