-- demo_sweep.lua: the algorithms side by side on CPU-sized problems, through
-- the flashattn.sweep module (scripts/sweep.lua is the full front).
--
--   LUA_CPATH="build/lua/?.so;;" lua5.4 scripts/demo_sweep.lua [options]
--   (or: build/flashattn-lua scripts/demo_sweep.lua [options])
--
-- Softmax: naive (e^x/Σe^x), safe (three passes), online (two passes, running
-- (m, d)), fused (the row held on chip, one read).  Attention: naive (S and P
-- materialised), two_pass (online statistics, then the output pass),
-- flash_row (the seeds' one-pass recurrence, one query row at a time),
-- flash (tiled and fused), at the default and two explicit tile sizes.  For
-- each setting: median time and spread, the relative error against the f64
-- reference, the peak memory the call took beyond its inputs, and TFLOP/s or
-- GB/s from the cost models.  Runs on the default device (FLASHATTN_DEVICE
-- overrides it).  Needs no package beyond the engine (lua-cjson for --json).
--
-- options: --quick (fewer settings), --full (L up to 4096), --smoke (tiny
-- sizes, one repetition: checks that the script runs, for CTest), --H n
-- (heads, default 2), --rep n, --seed n, --json FILE (rows and a meta with
-- commit, command line and seed), --progress auto|bar|lines|none, --help.
-- A bad argument is a one-line error on stderr and exit status 1.
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path

local fa = require "flashattn"
local sweep = require "flashattn.sweep"

local function parse(argv)
  local argparse = require "argparse"
  local p = argparse("demo_sweep.lua", "The softmax and attention algorithms side by side on CPU-sized problems.")
  p:mutex(p:flag("--quick", "fewer settings"), p:flag("--full", "L up to 4096"),
          p:flag("--smoke", "tiny sizes, one repetition (checks that the script runs)"))
  p:option("--H", "heads"):convert(sweep.integer_arg(1, "--H")):default("2")
  p:option("--rep", "repetitions per point (default: fitted to a time budget)"):convert(sweep.integer_arg(1, "--rep"))
  p:option("--seed", "seed of the inputs"):convert(sweep.integer_arg(0, "--seed")):default("1")
  p:option("--json", "write every row to this JSON file")
  p:option("--progress", "progress on stderr (auto: a bar on a terminal)"):choices({"auto", "bar", "lines", "none"})
   :default("auto")
  local opt = sweep.parse_args(p, argv, "demo_sweep.lua")
  if opt.smoke then opt.rep = opt.rep or 1 end
  return opt
end

local function main(argv)
local opt = parse(argv)

local device = fa.default_device()
local info = fa.device_info(device)
print(("flashattn %s on %s: %s%s"):format(fa.version, device, info.name,
  device == "cpu" and (", %d threads, %s"):format(info.threads or 0, info.simd or "?") or ""))

local Ns = opt.smoke and {256} or opt.quick and {1024, 16384} or {1024, 4096, 16384, 65536}
local softmax = {name = "softmax", kernel = "softmax", rep = opt.rep, max_rep = 10, seed = opt.seed,
                 defaults = {elements = opt.smoke and 1 << 12 or 1 << 21}, scale = 2,
                 axes = {device = device, N = Ns, algo = {"naive", "safe", "online", "fused", "auto"}}}

local settings -- {L, D}
if opt.smoke then settings = {{64, 16}, {128, 32}}
elseif opt.quick then settings = {{256, 64}, {1024, 64}}
elseif opt.full then
  settings = {{256, 64}, {512, 64}, {1024, 64}, {2048, 64}, {4096, 64}, {512, 128}, {1024, 128}, {2048, 128}}
else settings = {{256, 64}, {512, 64}, {1024, 64}, {2048, 64}, {512, 128}, {1024, 128}} end

-- tiles matter to the tiled algos only: the others run once, at the default
local function attention_part(L, D)
  return {name = ("attention L=%d D=%d"):format(L, D), kernel = "attention", rep = opt.rep, max_rep = 10,
          seed = opt.seed,
          axes = {device = device, L = L, D = D, H = opt.H,
                  algo = {"naive", "auto", "flash_row", "two_pass", "flash"}, tile = {"default", "64x64", "128x32"}},
          filter = function(p)
            local tiled = p.algo == "flash" or p.algo == "two_pass"
            if not tiled and p.tile ~= "default" then return false end
            return p.algo ~= "flash_row" or p.Lq <= 512 -- one query row at a time: slow by design
          end}
end

local t0 = os.time()
local all = {}
local function show(spec, note)
  local rows = sweep.run(spec, {progress = opt.progress ~= "none" and opt.progress})
  print(("\n== %s"):format(spec.name))
  sweep.print_table(rows)
  if note then print(note) end
  for _, r in ipairs(rows) do all[#all + 1] = r end
end

show(softmax, "(softmax: M rows of N elements, inputs 2·N(0,1))")
for _, s in ipairs(settings) do show(attention_part(s[1], s[2])) end
print(("\n(attention: B = 1, H = %d, f32, Lq = Lk = L; peak = bytes beyond the inputs, output included; %d s in all)")
  :format(opt.H, os.time() - t0))

if opt.json then
  sweep.write_json(all, opt.json)
  print("wrote " .. opt.json)
end
return all
end

return sweep.main("demo_sweep.lua", main, {...})
