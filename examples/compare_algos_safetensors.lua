-- Compare the attention algorithms on Q/K/V from a .safetensors file
-- (docs/io.md).  With a path, it loads q, k and v from that file (as a
-- model's activations would come, e.g. saved from PyTorch with
-- safetensors.torch.save_file({"q": q, "k": k, "v": v}, path)); without
-- one it writes a small random file first, so that it runs anywhere.
--
--   flashattn-lua examples/compare_algos_safetensors.lua [file.safetensors] [--causal] [--device cpu|cuda]
--
-- For every algo it prints the relative error against fa.attention_reference
-- (f64 on the CPU), the largest absolute difference, and the median time.
local fa = require "flashattn"

local path, causal, device, tmp_file
local i = 1
while arg and arg[i] do
  local a = arg[i]
  if a == "--help" then
    print("usage: flashattn-lua examples/compare_algos_safetensors.lua [file.safetensors] [--causal] [--device cpu|cuda]")
    os.exit(0)
  elseif a == "--causal" then
    causal = true
  elseif a == "--device" then
    i = i + 1
    device = arg[i]
  elseif a:sub(1, 2) == "--" then
    io.stderr:write("compare_algos_safetensors: unknown option " .. a .. " (--causal, --device cpu|cuda, --help)\n")
    os.exit(1)
  else
    path = a
  end
  i = i + 1
end
device = device or fa.default_device()

if not path then
  -- (B, H, L, D) = (1, 4, 256, 64): a second or so on one CPU core
  local base = os.tmpname() -- made empty; only its name is used
  os.remove(base)
  path = base .. ".safetensors"
  local function rnd(seed) return fa.randn({1, 4, 256, 64}, {seed = seed}) end
  fa.save(path, {q = rnd(1), k = rnd(2), v = rnd(3)})
  print(("wrote random q, k, v to %s"):format(path))
  io.stdout:flush()
  tmp_file = path
end

local ok, t = pcall(fa.load, path, {device = device})
if not ok then
  io.stderr:write(tostring(t) .. "\n")
  os.exit(1)
end
for _, name in ipairs({"q", "k", "v"}) do
  if not t[name] then
    io.stderr:write(("compare_algos_safetensors: %s has no tensor named '%s'\n"):format(path, name))
    os.exit(1)
  end
end
local q, k, v = t.q, t.k, t.v
print(("q %s, k %s, v %s, %s on %s%s"):format(table.concat(q:shape(), "x"), table.concat(k:shape(), "x"),
  table.concat(v:shape(), "x"), q:dtype(), device, causal and ", causal" or ""))

local opts = {causal = causal}
local ref = fa.attention_reference(q, k, v, opts)
print(("%-10s %12s %12s %12s"):format("algo", "rel error", "max |diff|", "median ms"))
for _, algo in ipairs({"naive", "two_pass", "flash_row", "flash", "auto"}) do
  local o = fa.attention(q, k, v, {causal = causal, algo = algo})
  local r = fa.bench(function() fa.attention(q, k, v, {causal = causal, algo = algo, out = o}) end,
    {warmup = 1, rep = 3})
  print(("%-10s %12.3e %12.3e %12.3f"):format(algo, fa.rel_error(o, ref), fa.max_abs_diff(o, ref), r.median_ms))
end
if tmp_file then os.remove(tmp_file) end
