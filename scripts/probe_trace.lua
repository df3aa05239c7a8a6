-- Block 0's phases in the warp-specialised attention kernel, in cycles: runs one call shape a few
-- times on a build configured with -DFLASHATTN_KERNEL_TRACE=ON, whose launches print the marks of
-- kernels/ptx/trace.cuh (the marks are listed at the top of kernels/attention/attention_wgmma_tma.cuh);
-- scripts/show_trace.py reads them.  On any other build the calls run and nothing is traced.
-- Usage (GPU machine):
--   cmake -S . -B build-trace -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_KERNEL_TRACE=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real
--   cmake --build build-trace --target flashattn-lua
--   build-trace/flashattn-lua scripts/probe_trace.lua --lq 1024 --lk 1024 | python3 scripts/show_trace.py
-- Options: --b B --h H --lq LQ --lk LK --d D --dtype bf16|f16 --causal --window W --kernel NAME --tile BRxBC
-- --reps N --backward
-- --backward: fa.attention_backward's calls instead (one forward first; --kernel and --tile go to both),
-- whose fused kernel prints its blocks' timeline (kernels/ptx/trace.cuh's TIMELINE lines;
-- scripts/show_timeline.py reads them):
--   build-trace/flashattn-lua scripts/probe_trace.lua --backward | python3 scripts/show_timeline.py
-- (defaults: B 16, H 16, Lq = Lk = 1024, D 128, bf16, 3 repetitions: the last is the warm one).
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
local NAME = "probe_trace.lua"

local function parse(argv)
  local argparse = require "argparse"
  local p = argparse(NAME, "Runs one attention call shape a few times (a trace build prints block 0's cycle marks).")
  local function int(name) return sweep.integer_arg(1, name) end
  p:option("--b", "batch"):convert(int("--b")):default("16")
  p:option("--h", "heads"):convert(int("--h")):default("16")
  p:option("--lq", "query rows"):convert(int("--lq")):default("1024")
  p:option("--lk", "keys"):convert(int("--lk")):default("1024")
  p:option("--d", "head dim"):convert(int("--d")):default("128")
  p:option("--dtype", "bf16 or f16"):choices({ "bf16", "f16" }):default("bf16")
  p:flag("--causal", "a causal mask")
  p:option("--window", "opts.window = {W, 0}: a row's W keys before it and itself")
   :convert(sweep.integer_arg(0, "--window"))
  p:option("--kernel", "opts.kernel (fa.kernels lists them)")
  p:option("--tile", "opts.tile as BRxBC, e.g. 128x176")
  p:option("--reps", "calls"):convert(int("--reps")):default("3")
  p:flag("--backward", "time fa.attention_backward's calls (the fused kernel's block timeline)")
  return sweep.parse_args(p, argv, NAME)
end

sweep.main(NAME, function(argv)
  local a = parse(argv)
  local opts = { causal = a.causal or nil, kernel = a.kernel, window = a.window and { a.window, 0 } or nil }
  if a.tile then
    local br, bc = a.tile:match("^(%d+)x(%d+)$")
    if not br then error(NAME .. ": --tile takes BRxBC, e.g. 128x176", 0) end
    opts.tile = { tonumber(br), tonumber(bc) }
  end
  local function randn(L, s) return fa.randn({ a.b, a.h, L, a.d }, { dtype = a.dtype, device = "cuda", seed = s }) end
  local q, k, v = randn(a.lq, 1), randn(a.lk, 2), randn(a.lk, 3)
  print(("%s: %s %s B %d H %d Lq %d Lk %d D %d%s kernel %s"):format(NAME, fa.device_info("cuda").name or "cuda",
    a.dtype, a.b, a.h, a.lq, a.lk, a.d, (a.causal and " causal" or "") .. (a.window and " window " .. a.window or ""),
    table.concat(fa.kernels(q, k, v, opts), ",")))
  local o, lse, dout
  if a.backward then
    local fo = { return_lse = true }
    for key, x in pairs(opts) do fo[key] = x end
    o, lse = fa.attention(q, k, v, fo)
    dout = randn(a.lq, 4)
  end
  for rep = 1, a.reps do
    print(("== rep %d"):format(rep))
    io.stdout:flush()
    if a.backward then
      for _, g in ipairs({ fa.attention_backward(q, k, v, o, lse, dout, opts) }) do g:free() end
    else
      fa.attention(q, k, v, opts):free()
    end
    fa.sync()
    io.stdout:flush()
  end
end, { ... })
