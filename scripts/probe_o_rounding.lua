-- How much of a backward's error comes from o alone being stored in a low precision.
-- FlashAttention's backward (ours, FA2's, FA3's, cuDNN's) takes D_i = rowsum(dout * o) from the stored
-- o; PyTorch's math path takes it from P and dP and never reads o.  This prints, for bf16-sized inputs
-- and a range of keys per row, max |g(o rounded to the dtype) - g(o)| over the f64 reference backward
-- (everything else exact), beside max |g|.  Rows with a few keys (seed 57's case 104 of
-- scripts/oracle_backward.py: bottom-right causal, Lq = 576, Lk = 5) average nothing out, and o's
-- rounding alone is there as large as the math path's whole bf16 error (0.02 on dk).
--   flashattn-lua scripts/probe_o_rounding.lua [--dtype bf16] [--quick]
local fa = require "flashattn"
local dtype, quick = "bf16", false
local i = 1
while arg[i] do
  if arg[i] == "--quick" then quick = true
  elseif arg[i] == "--dtype" and (arg[i + 1] == "bf16" or arg[i + 1] == "f16" or arg[i + 1] == "f32") then
    dtype, i = arg[i + 1], i + 1
  else
    io.stderr:write("probe_o_rounding.lua: expected --quick or --dtype bf16|f16|f32, got '", arg[i], "'\n")
    os.exit(1)
  end
  i = i + 1
end
local B, H, Lq, D = 2, 3, 576, 96
local lks = {5, 64, 576}
if quick then B, H, Lq, D, lks = 1, 1, 40, 16, {3, 40} end
print(("probe_o_rounding: %s inputs, B %d, H %d, Lq %d, D %d, scale 0.3, f64 reference backward"):format(
  dtype, B, H, Lq, D))
for _, Lk in ipairs(lks) do
  for _, causal in ipairs({false, "bottom_right"}) do
    local function input(shape, seed) return fa.randn(shape, {seed = seed, dtype = dtype}):double() end
    local q, k = input({B, H, Lq, D}, 1), input({B, H, Lk, D}, 2)
    local v, dout = input({B, H, Lk, D}, 3), input({B, H, Lq, D}, 4)
    local opts = {scale = 0.3, causal = causal, return_lse = true}
    local o, lse = fa.attention_reference(q, k, v, opts)
    local exact = {fa.attention_backward_reference(q, k, v, o, lse, dout, opts)}
    local rounded = {fa.attention_backward_reference(q, k, v, o:to(dtype):double(), lse, dout, opts)}
    local line = {}
    for i, name in ipairs({"dq", "dk", "dv"}) do
      line[i] = ("%s %.4f of %.3f"):format(name, fa.max_abs_diff(rounded[i], exact[i]),
        fa.max_abs_diff(exact[i], exact[i] * 0))
    end
    print(("Lk %-4d causal %-12s o's rounding: %s"):format(Lk, tostring(causal), table.concat(line, ", ")))
  end
end
