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
-- (heads, default 2), --rep n, --json FILE, --help
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path

local fa = require "flashattn"
local sweep = require "flashattn.sweep"

local function usage()
  print((arg and arg[0] or "demo_sweep.lua") .. " [--quick|--full|--smoke] [--H n] [--rep n] [--json FILE]")
end

local opt = {H = 2, quick = false, full = false, smoke = false}
do
  local i = 1
  while arg and arg[i] do
    local a = arg[i]
    if a == "--quick" then opt.quick = true
    elseif a == "--full" then opt.full = true
    elseif a == "--smoke" then opt.smoke = true; opt.rep = opt.rep or 1
    elseif a == "--H" then i = i + 1; opt.H = assert(math.tointeger(tonumber(arg[i])), "--H needs an integer")
    elseif a == "--rep" then i = i + 1; opt.rep = assert(math.tointeger(tonumber(arg[i])), "--rep needs an integer")
    elseif a == "--json" then i = i + 1; opt.json = assert(arg[i], "--json needs a file name")
    elseif a == "--help" or a == "-h" then usage() return
    else io.stderr:write("demo_sweep: unknown argument " .. a .. "\n"); usage(); os.exit(2) end
    i = i + 1
  end
end

local device = fa.default_device()
local info = fa.device_info(device)
print(("flashattn %s on %s: %s%s"):format(fa.version, device, info.name,
  device == "cpu" and (", %d threads, %s"):format(info.threads or 0, info.simd or "?") or ""))

local Ns = opt.smoke and {256} or opt.quick and {1024, 16384} or {1024, 4096, 16384, 65536}
local softmax = {name = "softmax", kernel = "softmax", rep = opt.rep, max_rep = 10,
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
  local rows = sweep.run(spec, {progress = not opt.smoke and "bar" or false})
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
