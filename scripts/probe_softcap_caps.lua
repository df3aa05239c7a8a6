-- Softcap's accuracy across caps on the device (bf16, D = 128: the wgmma_tma kernel), against the
-- f64 reference: the f16/bf16 forward takes the one-SFU tanh where c <= 128, tanhf above.  Per cap:
-- max |o - ref| and max |o - bf16(ref)| (what the kernel adds to o's own rounding), relative to max |ref|;
-- exit status 1 where either passes 1e-2 (bf16's rounding is 4e-3).  A CPU smoke runs in CTest.
--   flashattn-lua scripts/probe_softcap_caps.lua [device]
local fa = require "flashattn"
local dev = arg and arg[1] or "cuda"
if (dev ~= "cpu" and dev ~= "cuda") or (arg and arg[2]) then
  io.stderr:write("probe_softcap_caps.lua: expected one argument, cpu or cuda, got '", dev, "'\n")
  os.exit(1)
end
local B, H, L, D = 1, 4, 1024, 128
if dev == "cpu" then H, L, D = 1, 64, 16 end
local q = fa.randn({B, H, L, D}, {dtype = "bf16", device = dev, seed = 1})
local k = fa.randn({B, H, L, D}, {dtype = "bf16", device = dev, seed = 2})
local v = fa.randn({B, H, L, D}, {dtype = "bf16", device = dev, seed = 3})
local bad = false
for _, c in ipairs({0.5, 5, 30, 128, 129, 1000, 1e6}) do
  local opts = {softcap = c, causal = true, scale = 0.3}
  local o = fa.attention(q, k, v, opts):to("cpu"):to("f64")
  local ref = fa.attention_reference(q, k, v, opts)
  local oref = ref:to("bf16"):to("f64")
  local m = fa.max_abs_diff(ref, ref * 0)
  local e1, e2 = fa.max_abs_diff(o, ref) / m, fa.max_abs_diff(o, oref) / m
  print(("softcap %-8g max|o - ref| %.3e  max|o - bf16(ref)| %.3e  (max|ref| %.3f)"):format(c, e1, e2, m))
  bad = bad or not (e1 <= 1e-2 and e2 <= 1e-2)
end
if bad then
  print("probe_softcap_caps: an error past 1e-2 (failed)")
  os.exit(1)
end
