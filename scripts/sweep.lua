-- sweep.lua: measurement grids from the command line or a Lua config file,
-- written as CSV, JSON and charts.  A thin front on the flashattn.sweep module.
--
--   lua5.4 scripts/sweep.lua                        # the default study (what scripts/main.sh runs)
--   lua5.4 scripts/sweep.lua --L 256..4096 --algo naive,flash --causal false,true
--   lua5.4 scripts/sweep.lua --L 2048 --Br 16,32,64,128 --Bc 16,32,64,128 --algo flash --name tiles
--   lua5.4 scripts/sweep.lua --kernel softmax --N 1024..262144 --algo safe,online,fused
--   lua5.4 scripts/sweep.lua --config my_sweep.lua  # a file returning a spec, or {parts = {spec, ...}}
--
-- Axis options take a comma list ("64,128"), or "a..b" for the powers of two
-- from a to b.  Attention axes: --L (sets Lq and Lk), --Lq, --Lk, --D, --Dv, --B,
-- --H, --Hkv, --dtype, --device, --algo, --tile (BrxBc or default), --Br/--Bc
-- (a grid of tiles: a heat map), --causal (false,true,top_left,bottom_right),
-- --window (none or left:right), --mask (none,bool,float,padding,alibi).
-- Softmax axes: --N (or --L), --M (rows; default 2^21/N), --dtype, --device,
-- --algo, --block.  Results go to --out (default out/): NAME.csv, NAME.json
-- and NAME_*.png/.svg charts when gnuplot is present; a progress bar with the
-- time left goes to stderr when it is a terminal (--progress lines for logs).
-- A bad argument is a one-line error on stderr and exit status 1.  Runs with LUA_CPATH pointing at build/lua (or
-- through build/flashattn-lua); the module is taken from this checkout's lua/.
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path

local fa = require "flashattn"
local sweep = require "flashattn.sweep"

local ATTENTION_AXES = {"L", "Lq", "Lk", "D", "Dv", "B", "H", "Hkv", "tile", "Br", "Bc", "causal", "window", "mask"}
local SOFTMAX_AXES = {"N", "M", "block"}
local COMMON_AXES = {"dtype", "device", "algo"}

local function parser()
  local argparse = require "argparse"
  local p = argparse("sweep.lua", "Measurement grids over the flashattn kernels: CSV, JSON and charts.")
  p:epilog("Without axis options or --config it runs the default study (softmax, attention, masks, tiles).")
  p:option("--config", "Lua file returning a spec or {parts = {spec, ...}}")
  p:option("--kernel", "kernel of a command-line sweep"):choices({"attention", "softmax"}):default("attention")
  for _, list in ipairs({COMMON_AXES, ATTENTION_AXES, SOFTMAX_AXES}) do
    for _, a in ipairs(list) do p:option("--" .. a, "axis " .. a .. ": comma list or a..b (powers of two)") end
  end
  p:option("--rep", "repetitions per point (default: fitted to --budget-ms)"):convert(sweep.integer_arg(1, "--rep"))
  p:option("--warmup", "extra warm-up runs per point"):convert(sweep.integer_arg(0, "--warmup"))
  p:option("--budget-ms", "time budget per point for the repetitions"):convert(sweep.number_arg("--budget-ms"))
  p:option("--ref-budget", "work allowed for the f64 reference per point (rows are sampled past it)")
   :convert(sweep.integer_arg(1, "--ref-budget"))
  p:option("--seed", "seed of the inputs"):convert(sweep.integer_arg(0, "--seed")):default("1")
  p:flag("--no-flush", "do not flush caches between repetitions")
  p:flag("--no-reference", "skip the error check against the f64 reference")
  p:option("--out", "output directory"):default("out")
  p:option("--name", "name of a command-line sweep (file names)"):default("sweep")
  p:option("--csv", "also write every row of every part to this CSV file")
  p:option("--json", "also write every row of every part to this JSON file")
  p:flag("--no-charts", "do not draw charts")
  p:option("--progress", "progress display on stderr (auto: a bar on a terminal, else none)")
   :choices({"auto", "bar", "lines", "none"}):default("auto")
  p:flag("--smoke", "the default study at tiny sizes (checks that it runs)")
  return p
end

-- Axis options given on the command line, as lists of values.
local function cli_axes(args, kernel)
  local axes, any = {}, false
  local lists = kernel == "softmax" and {COMMON_AXES, SOFTMAX_AXES, {"L"}} or {COMMON_AXES, ATTENTION_AXES}
  for _, list in ipairs(lists) do
    for _, a in ipairs(list) do
      if args[a] then axes[a], any = sweep.parse_list(args[a]), true end
    end
  end
  for _, list in ipairs({ATTENTION_AXES, SOFTMAX_AXES}) do -- an axis of the other kernel is a mistake
    for _, a in ipairs(list) do
      if args[a] and axes[a] == nil then error(("sweep.lua: --%s is not an axis of %s"):format(a, kernel), 0) end
    end
  end
  return axes, any
end

-- Attention on the default device, and on the CPU as well when that device
-- has no attention kernel (a build whose CUDA backend lacks one): the
-- device's points are then recorded as failed, with the engine's message.
local function attention_devices()
  local dev = fa.default_device()
  if dev == "cpu" then return {"cpu"} end
  local ok = pcall(function()
    local q = fa.randn({1, 8, 16}, {seed = 1, device = dev})
    fa.attention(q, q, q)
  end)
  if ok then return {dev} end
  return {dev, "cpu"}
end

-- The default study: a few minutes' worth of the engine's main trade-offs.
local function default_parts(smoke)
  local att_dev = attention_devices()
  local common = {budget_ms = 250, max_rep = 15}
  local function part(t)
    for kk, vv in pairs(common) do if t[kk] == nil then t[kk] = vv end end
    return t
  end
  if smoke then
    return {
      part{name = "softmax", kernel = "softmax", rep = 1, defaults = {elements = 1 << 12},
           axes = {N = {256, 1024}, algo = {"naive", "safe", "online", "fused"}}},
      part{name = "attention", kernel = "attention", rep = 1,
           axes = {device = att_dev, L = {32, 64}, D = 16, H = 1, algo = {"naive", "two_pass", "flash_row", "flash"}}},
      part{name = "tiles", kernel = "attention", rep = 1,
           axes = {device = att_dev[#att_dev], L = 64, D = 16, H = 1, algo = "flash", Br = {16, 32}, Bc = {16, 32}}},
    }
  end
  return {
    -- the four softmax schedules; fused stops where a row no longer fits
    -- (inputs of 16 MiB on a CPU, 128 MiB on a GPU: more than its L2)
    part{name = "softmax", kernel = "softmax",
         defaults = {elements = fa.default_device() == "cpu" and 1 << 22 or 1 << 25},
         axes = {N = {1024, 4096, 16384, 65536, 262144}, algo = {"naive", "safe", "online", "fused"}}},
    -- the attention algorithms against L: time, rate and memory (O(L^2) vs O(L))
    part{name = "attention", kernel = "attention",
         axes = {device = att_dev, causal = {false, true}, L = {256, 512, 1024, 2048, 4096}, H = 4, D = 64,
                 algo = {"naive", "two_pass", "flash_row", "flash"}},
         filter = function(p) return p.algo ~= "flash_row" or p.Lq <= 1024 end}, -- one row at a time: slow
    -- what each mask kind costs
    part{name = "masks", kernel = "attention",
         axes = {device = att_dev, mask = {"none", "bool", "float", "padding", "alibi"}, L = 1024, H = 4, D = 64,
                 algo = {"naive", "flash"}}},
    -- the flash kernel's query and key tile sizes (valid on the CPU and CUDA)
    part{name = "tiles", kernel = "attention",
         axes = {device = att_dev[#att_dev], L = 2048, H = 4, D = 64, algo = "flash",
                 Br = {16, 32, 64, 128}, Bc = {16, 32, 64, 128, 256}}},
  }
end

local function load_config(path)
  local chunk, err = loadfile(path)
  if not chunk then error("sweep.lua: --config: " .. err, 0) end
  local cfg = chunk()
  if type(cfg) ~= "table" then error("sweep.lua: --config " .. path .. ": expected the file to return a table", 0) end
  return cfg.parts or {cfg}
end

-- Applies the command line's run settings and axes to a part.
local function adjust(part, args, axes)
  local function set(field, value) if value ~= nil then part[field] = value end end
  set("rep", args.rep); set("warmup", args.warmup); set("budget_ms", args.budget_ms)
  set("ref_budget", args.ref_budget)
  part.seed = part.seed or args.seed
  if args.no_flush then part.flush = false end
  if args.no_reference then part.reference = false end
  part.axes = part.axes or {}
  for a, v in pairs(axes or {}) do part.axes[a] = v end
  return part
end

-- A chart the config asks for: {kind = "line" | "heatmap", name = suffix, ...}.
local function custom_charts(rows, dir, name, list, formats)
  local files, notes = {}, {}
  for i, c in ipairs(list) do
    local spec = {}
    for kk, vv in pairs(c) do spec[kk] = vv end
    spec.file = dir .. "/" .. name .. "_" .. (c.name or tostring(i))
    spec.formats = spec.formats or formats
    local made, why
    if c.kind == "heatmap" then made, why = sweep.heatmap(rows, spec) else made, why = sweep.line_chart(rows, spec) end
    if made then for _, f in ipairs(made) do files[#files + 1] = f end else notes[#notes + 1] = why end
  end
  return files, notes
end

local function main(argv)
  local args = sweep.parse_args(parser(), argv, "sweep.lua")
  local kernel = args.kernel
  local axes, any_axis = cli_axes(args, kernel)
  local parts
  if args.config then
    parts = load_config(args.config)
    for _, p in ipairs(parts) do adjust(p, args, axes) end
  elseif any_axis then
    parts = {adjust({name = args.name, kernel = kernel}, args, axes)}
  else
    parts = default_parts(args.smoke)
    for _, p in ipairs(parts) do adjust(p, args, nil) end
  end

  local info = fa.device_info()
  print(("flashattn %s, default device %s: %s%s"):format(fa.version, fa.default_device(), info.name or "?",
    info.threads and (", %d threads, %s"):format(info.threads, info.simd or "?") or ""))
  local progress = args.progress ~= "none" and args.progress or false
  local all_rows, written = {}, {}
  for i, part in ipairs(parts) do
    part.name = part.name or ("part%d"):format(i)
    local rows = sweep.run(part, {progress = progress})
    print(("\n== %s (%s)"):format(part.name, part.kernel or "attention"))
    sweep.print_table(rows)
    local files = sweep.save(rows, args.out, part.name)
    written[#written + 1] = files.csv
    written[#written + 1] = files.json
    if not args.no_charts and part.charts ~= false then
      local made, notes
      if type(part.charts) == "table" then
        made, notes = custom_charts(rows, args.out, part.name, part.charts)
      else
        made, notes = sweep.charts(rows, args.out, part.name)
      end
      for _, f in ipairs(made) do written[#written + 1] = f end
      for _, n in ipairs(notes) do print("(chart not drawn: " .. n .. ")") end
    end
    for _, r in ipairs(rows) do all_rows[#all_rows + 1] = r end
  end
  if args.csv then written[#written + 1] = sweep.write_csv(all_rows, args.csv) end
  if args.json then written[#written + 1] = sweep.write_json(all_rows, args.json) end
  print("\nwrote " .. table.concat(written, "\n      "))
  return all_rows
end

return sweep.main("sweep.lua", main, {...})
