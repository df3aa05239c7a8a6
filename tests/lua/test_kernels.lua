-- The kernel registry (API §6): fa.kernels(q, k, v, opts) lists the kernels
-- that accept a call, fastest first, the first being the automatic choice;
-- opts.kernel = name runs that one (its tile unless opts.tile is given), an
-- error naming the choices when it does not accept the call.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

TestKernels = {}

local CPU_KERNELS = {"cpu_flash", "cpu_two_pass", "cpu_naive", "cpu_flash_row"}
local CPU_ALGO = {cpu_flash = "flash", cpu_two_pass = "two_pass", cpu_naive = "naive", cpu_flash_row = "flash_row"}
local CUDA_ALGO = {wgmma = "flash", wgmma_tma = "flash", mma = "flash", f32 = "flash", simt = "flash", naive = "naive",
  row = "flash_row"}
-- the "flash" kernels that implement two_pass too
local CUDA_TWO_PASS = {wgmma = true, mma = true, f32 = true, simt = true}

local function qkv(dtype, D, device, L)
  L = L or 37
  return U.randn({2, 4, L, D}, dtype, 1, device), U.randn({2, 2, L + 3, D}, dtype, 1, device),
    U.randn({2, 2, L + 3, D}, dtype, 1, device)
end

local function contains(list, name)
  for _, n in ipairs(list) do if n == name then return true end end
  return false
end

function TestKernels:test_cpu_listing()
  local q, k, v = qkv("f32", 16, "cpu")
  -- fastest first: naive ahead of two_pass while a head's scores are small (Lq·Lk up to 4M)
  local small = {"cpu_flash", "cpu_naive", "cpu_two_pass", "cpu_flash_row"}
  lu.assertEquals(fa.kernels(q, k, v), small)
  lu.assertEquals(fa.kernels(q, k, v, {algo = "auto"}), small)
  local ql, kl = fa.zeros({1, 1, 4096, 4}, {device = "cpu"}), fa.zeros({1, 1, 2048, 4}, {device = "cpu"})
  lu.assertEquals(fa.kernels(ql, kl, kl), CPU_KERNELS)
  lu.assertEquals(fa.kernels(q, k, v, {algo = "two_pass"}), {"cpu_two_pass"})
  lu.assertEquals(fa.kernels(q, k, v, {algo = "flash"}), {"cpu_flash"})
  lu.assertEquals(fa.kernels(q, k, v, {algo = "naive", causal = true}), {"cpu_naive"})
  lu.assertEquals(fa.kernels(q, k, v, {algo = "flash_row"}), {"cpu_flash_row"})
  local q64, k64, v64 = qkv("f64", 8, "cpu")
  lu.assertEquals(fa.kernels(q64, k64, v64, {tile = {16, 16}}), small)
  -- the arguments are checked as fa.attention checks them
  U.assert_fa_error({"k", "head dimension"}, fa.kernels, q, U.randn({2, 2, 40, 8}, "f32", 1, "cpu"), v)
  U.assert_fa_error({"opts.algo"}, fa.kernels, q, k, v, {algo = "fastest"})
end

function TestKernels:test_cpu_kernels_match_their_algo()
  for _, dtype in ipairs({"f32", "f64"}) do
    local q, k, v = qkv(dtype, 16, "cpu")
    for _, opts in ipairs({{}, {causal = true, return_lse = true}, {window = {4, 1}, softcap = 3}}) do
      for _, name in ipairs(CPU_KERNELS) do
        local by_algo = U.copy_opts(opts)
        by_algo.algo = CPU_ALGO[name]
        local by_name = U.copy_opts(opts)
        by_name.kernel = name
        local o1, l1 = fa.attention(q, k, v, by_algo)
        local o2, l2 = fa.attention(q, k, v, by_name)
        lu.assertEquals(U.flat(o2), U.flat(o1), name .. " " .. dtype)
        if opts.return_lse then lu.assertEquals(U.flat(l2), U.flat(l1), name .. " lse") end
        -- the algo it implements may be named with it
        by_name.algo = CPU_ALGO[name]
        lu.assertEquals(U.flat(fa.attention(q, k, v, by_name)), U.flat(o1), name .. " with its algo")
        U.check_attention(q, k, v, by_name, name .. " " .. dtype, {tol = math.max(U.tol[dtype], 1e-5)})
      end
    end
  end
end

function TestKernels:test_cpu_kernel_with_tile_and_splits()
  local q, k, v = qkv("f32", 16, "cpu")
  U.check_attention(q, k, v, {kernel = "cpu_flash", tile = {8, 16}}, "cpu_flash tile")
  U.check_attention(q, k, v, {kernel = "cpu_two_pass", splits = 3, return_lse = true}, "cpu_two_pass splits")
end

function TestKernels:test_errors()
  local q, k, v = qkv("f32", 16, "cpu")
  local msg = U.assert_fa_error({"opts.kernel", '"mma"', "cpu", '"cpu_flash"', '"cpu_flash_row"'},
    fa.attention, q, k, v, {kernel = "mma"})
  lu.assertStrContains(msg, "does not accept this call")
  U.assert_fa_error({"opts.kernel", "unknown", '"foo"', '"cpu_flash", "cpu_two_pass", "cpu_naive", "cpu_flash_row"'},
    fa.attention, q, k, v, {kernel = "foo"})
  -- a kernel and an algo it does not implement
  msg = U.assert_fa_error({"opts.kernel", '"cpu_naive"', "two_pass", '"cpu_two_pass"'},
    fa.attention, q, k, v, {kernel = "cpu_naive", algo = "two_pass"})
  lu.assertNotStrContains(msg, '"cpu_flash"')
  U.assert_fa_error({"opts.kernel", "string", "number"}, fa.attention, q, k, v, {kernel = 3})
  U.assert_fa_error({"opts.kernel", "string", "boolean"}, fa.attention, q, k, v, {kernel = true})
  U.assert_fa_error({"opts.kernel", "string"}, fa.kernels, q, k, v, {kernel = {}})
  U.assert_fa_error({"opts.kernel", "unknown", '"foo"', '"cpu_flash"'}, fa.kernels, q, k, v, {kernel = "foo"})
  -- the status: unknown names are argument errors, refusals unsupported
  local ok, e = pcall(fa.attention, q, k, v, {kernel = "simt"})
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(e), "it runs on cuda")
  -- an empty name is the automatic choice; the references run no kernel of the registry, so any kernel's
  -- name is the same call (a cuda one on cpu tensors too: one opts table serves every call), but a name no
  -- kernel has is a typo they refuse as the other calls do
  lu.assertEquals(U.flat(fa.attention(q, k, v, {kernel = ""})), U.flat(fa.attention(q, k, v)))
  for _, name in ipairs({"cpu_flash", "wgmma", "mma"}) do
    lu.assertEquals(U.flat(fa.attention_reference(q, k, v, {kernel = name})), U.flat(fa.attention_reference(q, k, v)))
  end
  U.assert_fa_error({"opts.kernel", "unknown", '"foo"', '"cpu_flash"'}, fa.attention_reference, q, k, v, {kernel = "foo"})
  local o, lse = fa.attention_reference(q, k, v, {return_lse = true})
  U.assert_fa_error({"opts.kernel", "foo"}, fa.attention_backward_reference, q, k, v, o, lse, o, {kernel = "foo"})
  lu.assertEquals(U.flat(fa.attention_backward_reference(q, k, v, o, lse, o, {kernel = "wgmma"})),
    U.flat(fa.attention_backward_reference(q, k, v, o, lse, o)))
end

-- ---- cuda --------------------------------------------------------------------------

local function cuda_shapes()
  return {{"f16", 64}, {"f16", 128}, {"f32", 64}, {"bf16", 96}, {"f16", 40}}
end

-- kernel `name` on the call against the reference, and its two_pass where it has one
local function check_named(q, k, v, opts, name, what)
  local run = U.copy_opts(opts)
  run.kernel = name
  U.check_attention(q, k, v, run, what)
  if CUDA_TWO_PASS[name] then
    run.algo = "two_pass"
    U.check_attention(q, k, v, run, what .. " two_pass")
  end
end

function TestKernels:test_cuda_every_listed_kernel()
  if dev ~= "cuda" then lu.skip("cuda only") end
  for _, s in ipairs(cuda_shapes()) do
    local dtype, D = s[1], s[2]
    local q, k, v = qkv(dtype, D, "cuda", 150)
    local names = fa.kernels(q, k, v)
    lu.assertTrue(#names >= 3, dtype .. " D=" .. D)
    lu.assertTrue(contains(names, "simt") and contains(names, "naive") and contains(names, "row"))
    lu.assertEquals(fa.kernels(q, k, v, {algo = "naive"}), {"naive"})
    lu.assertEquals(fa.kernels(q, k, v, {algo = "flash_row"}), {"row"})
    -- the automatic choice is the first: the same result bit for bit
    local auto = U.flat(fa.attention(q, k, v, {causal = true}))
    lu.assertEquals(U.flat(fa.attention(q, k, v, {causal = true, kernel = names[1]})), auto, names[1])
    for _, name in ipairs(names) do
      for _, opts in ipairs({{return_lse = true}, {causal = true, return_lse = true}}) do
        check_named(q, k, v, opts, name, ("%s %s D=%d causal=%s"):format(name, dtype, D, tostring(opts.causal)))
      end
    end
    -- NaN in V: the fast kernels' fallback still runs behind them
    local vn = v:cpu():to("f32")
    local t = vn:totable()
    t[1][1][1][1] = 0 / 0
    vn = fa.tensor(t, {dtype = dtype, device = "cuda"})
    for _, name in ipairs(names) do
      if CUDA_ALGO[name] == "flash" then U.check_attention(q, k, vn, {kernel = name}, name .. " NaN in v") end
    end
  end
end

-- Bool masks on the kernels that read them as bits (kernels/attention/attention_mask_bits.cu): every
-- kernel listed, against the reference, with the mask broadcast over batch and heads, over query
-- rows, whole, and as a transposed view; key counts off 32 and 128; key tiles that start off a
-- multiple of 32 (a window), kv_lens, rows masked off entirely; and the decode kernel with GQA
function TestKernels:test_cuda_bool_mask_bits()
  if dev ~= "cuda" then lu.skip("cuda only") end
  local B, Hq, Hkv = 2, 4, 2
  local function keep(i, j, seed) return (i * 7 + j * 3 + seed) % 10 ~= 0 and (i + 2 * j) % 13 ~= seed end
  local function masks(Lq, Lk)
    local whole = U.nested({B, Hq, Lq, Lk}, function(b, h, i, j) return keep(i, j, b + h) end)
    local t = U.nested({Lk, Lq}, function(j, i) return keep(i, j, 5) end)
    for j = 1, Lk do t[j][3] = false end -- query row 3 masked off entirely
    return {
      {"(Lq, Lk)", fa.tensor(U.nested({Lq, Lk}, function(i, j) return keep(i, j, 0) end), {device = "cuda"})},
      {"(B, 1, 1, Lk)", fa.tensor(U.nested({B, 1, 1, Lk}, function(b, _, _, j) return keep(b, j, 1) end),
        {device = "cuda"})},
      {"(B, Hq, Lq, Lk)", fa.tensor(whole, {device = "cuda"})},
      {"(Lk, Lq) transposed", fa.tensor(t, {device = "cuda"}):transpose(1, 2)},
    }
  end
  for _, c in ipairs({{"bf16", 64, 70, 300}, {"f16", 128, 129, 129}, {"f32", 64, 40, 161}, {"bf16", 128, 3, 1000}}) do
    local dtype, D, Lq, Lk = c[1], c[2], c[3], c[4]
    local q = U.randn({B, Hq, Lq, D}, dtype, 1, "cuda")
    local k, v = U.randn({B, Hkv, Lk, D}, dtype, 1, "cuda"), U.randn({B, Hkv, Lk, D}, dtype, 1, "cuda")
    for _, m in ipairs(masks(Lq, Lk)) do
      for _, o in ipairs({{}, {causal = true}, {window = {37, 5}}, {kv_lens = {Lk, Lk - 45}, causal = "top_left"}}) do
        local opts = U.copy_opts(o)
        opts.mask, opts.return_lse = m[2], true
        for _, name in ipairs(fa.kernels(q, k, v, opts)) do
          if name ~= "naive" and name ~= "row" then
            check_named(q, k, v, opts, name, ("%s %s D=%d Lq %d Lk %d mask %s %s"):format(name, dtype, D, Lq, Lk,
              m[1], o.window and "window" or o.kv_lens and "kv_lens" or o.causal and "causal" or "plain"))
          end
        end
      end
    end
  end
end

-- D = 64 on Hopper: wgmma_tma takes every layout at its default key tile (128, a producer
-- warpgroup); with key tiles of 64 (no producer) it leaves dense rows to wgmma (faster there) and
-- takes strided ones (a transposed view); the list is in the automatic order
function TestKernels:test_cuda_d64_order_by_layout()
  if dev ~= "cuda" then lu.skip("cuda only") end
  local q, k, v = qkv("bf16", 64, "cuda", 300)
  local dense = fa.kernels(q, k, v)
  if not contains(dense, "wgmma_tma") then lu.skip("no Hopper kernels here") end
  lu.assertEquals({dense[1], dense[2]}, {"wgmma_tma", "wgmma"})
  local dense64 = fa.kernels(q, k, v, {tile = {128, 64}})
  lu.assertEquals({dense64[1], dense64[2]}, {"wgmma", "wgmma_tma"})
  local function view() return U.randn({2, 300, 4, 64}, "bf16", 1, "cuda"):transpose(2, 3) end
  local qs, ks, vs = view(), view(), view()
  local strided = fa.kernels(qs, ks, vs)
  lu.assertEquals({strided[1], strided[2]}, {"wgmma_tma", "wgmma"})
  local strided64 = fa.kernels(qs, ks, vs, {tile = {128, 64}})
  lu.assertEquals({strided64[1], strided64[2]}, {"wgmma_tma", "wgmma"})
  for _, causal in ipairs({false, true}) do
    -- the automatic call is the named kernel at its tile, bit for bit
    lu.assertEquals(U.flat(fa.attention(q, k, v, {causal = causal})),
      U.flat(fa.attention(q, k, v, {causal = causal, kernel = "wgmma_tma", tile = {128, 128}})))
    lu.assertEquals(U.flat(fa.attention(q, k, v, {causal = causal, tile = {128, 64}})),
      U.flat(fa.attention(q, k, v, {causal = causal, kernel = "wgmma", tile = {128, 64}})))
    U.check_attention(q, k, v, {causal = causal}, "dense D=64")
    U.check_attention(qs, ks, vs, {causal = causal, tile = {128, 64}}, "transposed D=64, key tiles of 64")
    local auto = U.flat(fa.attention(qs, ks, vs, {causal = causal}))
    lu.assertEquals(U.flat(fa.attention(qs, ks, vs, {causal = causal, kernel = "wgmma_tma"})), auto)
    U.check_attention(qs, ks, vs, {causal = causal}, "transposed D=64")
    U.check_attention(q, k, v, {causal = causal, kernel = "wgmma_tma"}, "wgmma_tma named on dense D=64")
    -- the wgmma kernel's strided copies (rows ld apart, a part-filled last key tile: 303 keys)
    U.check_attention(qs, ks, vs, {causal = causal, kernel = "wgmma"}, "wgmma named on transposed D=64")
  end
end

-- D = 64 on Hopper with masks: wgmma_tma (key tiles of 128) takes bool and float masks, causal or
-- not, on short rows and long (bool masks on short causal rows went to wgmma until they were read as
-- bits on its persistent form); fa.kernels lists it first, and the automatic call gives, bit for bit,
-- what the kernel named with that tile gives
function TestKernels:test_cuda_d64_masks_by_keys()
  if dev ~= "cuda" then lu.skip("cuda only") end
  local probe = {qkv("bf16", 64, "cuda", 200)}
  if not contains(fa.kernels(probe[1], probe[2], probe[3]), "wgmma_tma") then lu.skip("no Hopper kernels here") end
  for _, c in ipairs({
    {130, 300, true, "wgmma_tma", 128},    -- bottom-right causal: 235 keys a row on average
    {130, 2100, true, "wgmma_tma", 128},   -- 2035
    {130, 4200, true, "wgmma_tma", 128},   -- 4135
    {130, 300, false, "wgmma_tma", 128},   -- not causal
    {130, 300, true, "wgmma_tma", 128, true}, -- a float mask
    {130, 2100, true, "wgmma_tma", 128, true},
  }) do
    local q = U.randn({1, 2, c[1], 64}, "bf16", 1, "cuda")
    local k, v = U.randn({1, 2, c[2], 64}, "bf16", 2, "cuda"), U.randn({1, 2, c[2], 64}, "bf16", 3, "cuda")
    local m = fa.rand({c[1], c[2]}, {seed = 4, device = "cuda"}):to("cpu"):totable()
    for i = 1, c[1] do for j = 1, c[2] do m[i][j] = c[6] and -3 * m[i][j] or m[i][j] < 0.9 end end
    local opts = {causal = c[3], mask = fa.tensor(m, {device = "cuda"})}
    local what = ("Lq %d Lk %d causal %s %s mask"):format(c[1], c[2], tostring(c[3]), c[6] and "float" or "bool")
    local named = U.copy_opts(opts)
    named.kernel, named.tile = c[4], {128, c[5]}
    lu.assertEquals(fa.kernels(q, k, v, opts)[1], c[4], what .. ": listed first")
    lu.assertEquals(U.flat(fa.attention(q, k, v, opts)), U.flat(fa.attention(q, k, v, named)), what .. ": " .. c[4])
    U.check_attention(q, k, v, opts, what)
  end
end

-- D = 128 on Hopper: the automatic key tile of wgmma_tma is 176 where a query tile takes 8192 keys
-- or more on average (all of them, fewer under causal or a window), else 128; the automatic call
-- gives, bit for bit, what the kernel named with that tile gives
function TestKernels:test_cuda_d128_key_tile()
  if dev ~= "cuda" then lu.skip("cuda only") end
  local function make(lq, lk)
    return U.randn({1, 2, lq, 128}, "bf16", 1, "cuda"), U.randn({1, 2, lk, 128}, "bf16", 2, "cuda"),
      U.randn({1, 2, lk, 128}, "bf16", 3, "cuda")
  end
  local probe = {make(130, 300)}
  if not contains(fa.kernels(probe[1], probe[2], probe[3]), "wgmma_tma") then lu.skip("no Hopper kernels here") end
  for _, c in ipairs({
    {130, 8300, {}, 176},                   -- 8300 keys a row
    {130, 8300, {causal = true}, 176},      -- bottom-right: 8235 on average
    {130, 8300, {window = {64, 0}}, 128},   -- a window of 65 keys
    {130, 4000, {}, 128},                   -- below 8192
  }) do
    local q, k, v = make(c[1], c[2])
    local what = ("Lq %d Lk %d causal %s window %s"):format(c[1], c[2], tostring(c[3].causal), tostring(c[3].window))
    local named = U.copy_opts(c[3])
    named.kernel, named.tile = "wgmma_tma", {128, c[4]}
    lu.assertEquals(U.flat(fa.attention(q, k, v, c[3])), U.flat(fa.attention(q, k, v, named)), what .. ": tile " .. c[4])
    U.check_attention(q, k, v, named, what .. " tile " .. c[4])
  end
end

-- opts.tile given with the automatic choice runs that tile as given: the kernels that take a tile
-- of their own when chosen (wgmma_tma's 176 keys at D = 128 from 8192 keys a query tile; wgmma's 64
-- at D = 64, where two_pass leaves the call to it) keep {128, 128}, bit for bit as when named
function TestKernels:test_cuda_given_tile_kept()
  if dev ~= "cuda" then lu.skip("cuda only") end
  for _, c in ipairs({
    {128, 8300, {}, "wgmma_tma"},
    {64, 300, {algo = "two_pass"}, "wgmma"},
  }) do
    local D, Lk = c[1], c[2]
    local q = U.randn({1, 2, 130, D}, "bf16", 1, "cuda")
    local k, v = U.randn({1, 2, Lk, D}, "bf16", 2, "cuda"), U.randn({1, 2, Lk, D}, "bf16", 3, "cuda")
    local given = U.copy_opts(c[3])
    given.tile = {128, 128}
    if fa.kernels(q, k, v, given)[1] ~= c[4] then lu.skip("no Hopper kernels here") end
    local named = U.copy_opts(given)
    named.kernel = c[4]
    local what = ("D %d Lk %d %s"):format(D, Lk, c[4])
    lu.assertEquals(U.flat(fa.attention(q, k, v, given)), U.flat(fa.attention(q, k, v, named)), what .. ": tile given")
    U.check_attention(q, k, v, given, what)
  end
end

-- opts run on wgmma_tma with lse: against the reference, then again bit for bit
local function check_tma_twice(q, k, v, opts, what)
  local run = U.copy_opts(opts)
  run.kernel, run.return_lse = "wgmma_tma", true
  local o1, l1 = U.check_attention(q, k, v, run, what)
  local o2, l2 = fa.attention(q, k, v, run)
  lu.assertEquals(fa.max_abs_diff(o2, o1), 0, what .. ": run twice")
  lu.assertEquals(U.flat(l2), U.flat(l1), what .. ": lse, run twice")
end

-- wgmma_tma's persistent form (D = 64 and 128, key tiles of 128: a block an SM walking the query
-- tiles from a counter) with more query tiles than SMs, so that a block takes several in the
-- scheduler's order: tiles with no key (a batch whose kv_lens is 0) between ones with keys, odd and
-- even counts of key tiles (causal, Lk not a multiple of 128), the score rules, lse; each run twice,
-- bit for bit.
function TestKernels:test_cuda_tma_persistent_tiles()
  if dev ~= "cuda" then lu.skip("cuda only") end
  for _, D in ipairs({64, 128}) do
    for _, dtype in ipairs({"bf16", "f16"}) do
      local Lq, Lk = 600, 333
      local q = U.randn({3, 16, Lq, D}, dtype, 11, "cuda")
      local k, v = U.randn({3, 4, Lk, D}, dtype, 12, "cuda"), U.randn({3, 4, Lk, D}, dtype, 13, "cuda")
      if not contains(fa.kernels(q, k, v), "wgmma_tma") then lu.skip("no Hopper kernels here") end
      for _, opts in ipairs({
        {},
        {kv_lens = {Lk, 0, 157}},
        {causal = true, kv_lens = {0, Lk, 200}},
        {causal = "top_left"},
        {softcap = 4, kv_lens = {0, 129, Lk}},
        {alibi = {0.5, 0.25, 0.125, 0.0625, 0.5, 0.25, 0.125, 0.0625, 0.5, 0.25, 0.125, 0.0625, 0.5, 0.25, 0.125,
          0.0625}, causal = "top_left", kv_lens = {Lk, 0, 0}},
      }) do
        local what = ("%s D=%d causal=%s kv_lens=%s softcap=%s alibi=%s"):format(dtype, D, tostring(opts.causal),
          opts.kv_lens and table.concat(opts.kv_lens, ",") or "-", tostring(opts.softcap), tostring(opts.alibi ~= nil))
        check_tma_twice(q, k, v, opts, what)
      end
    end
  end
end

-- wgmma_tma's lazy row maxima (D = 256): a row's running max moves only where a key tile's passes
-- it by more than 8 ln 2, and O is rescaled only where some row of a warp moved. Alibi with
-- causal top_left makes each key tile's max rise along a row by slope x the tile (80 keys): steep heads
-- move every tile, shallow ones let the stale max fall behind by up to the slack before it moves,
-- flat ones never; kv_lens ends rows inside a tile; every case against the reference and run twice.
function TestKernels:test_cuda_lazy_maxima()
  if dev ~= "cuda" then lu.skip("cuda only") end
  for _, dtype in ipairs({"bf16", "f16"}) do
    local Lq, Lk = 200, 700
    local q = U.randn({2, 4, Lq, 256}, dtype, 1, "cuda")
    local k, v = U.randn({2, 4, Lk, 256}, dtype, 2, "cuda"), U.randn({2, 4, Lk, 256}, dtype, 3, "cuda")
    if not contains(fa.kernels(q, k, v), "wgmma_tma") then lu.skip("no Hopper kernels here") end
    for _, opts in ipairs({
      {alibi = {2, 0.05, 0.004, 0}, causal = "top_left"},
      {alibi = {2, 0.05, 0.004, 0}, kv_lens = {Lk, 333}},
      {alibi = {0.06, 0.07, 0.03, 0.01}, causal = true, kv_lens = {500, Lk}},
      {},
    }) do
      local what = ("%s alibi=%s causal=%s kv_lens=%s"):format(dtype, opts.alibi and table.concat(opts.alibi, ",") or "-",
        tostring(opts.causal), opts.kv_lens and table.concat(opts.kv_lens, ",") or "-")
      check_tma_twice(q, k, v, opts, what)
    end
  end
end

function TestKernels:test_cuda_refusals()
  if dev ~= "cuda" then lu.skip("cuda only") end
  local q, k, v = qkv("f32", 64, "cuda")
  local msg = U.assert_fa_error({"opts.kernel", '"mma"', "f32 inputs", '"simt"', '"naive"', '"row"'},
    fa.attention, q, k, v, {kernel = "mma"})
  lu.assertNotStrContains(msg, '"wgmma"')
  U.assert_fa_error({"opts.kernel", '"cpu_flash"', "cuda tensors", '"simt"'}, fa.attention, q, k, v,
    {kernel = "cpu_flash"})
  U.assert_fa_error({"opts.kernel", "unknown", '"wgmma_tma", "wgmma", "mma", "f32", "simt", "naive", "row"'},
    fa.attention, q, k, v, {kernel = "cpu_flsh"})
  U.assert_fa_error({"opts.kernel", '"row"', "flash"}, fa.attention, q, k, v, {kernel = "row", algo = "flash"})
  local h, hk, hv = qkv("f16", 64, "cuda")
  U.assert_fa_error({"opts.kernel", '"mma"', "tile", '"simt"'}, fa.attention, h, hk, hv,
    {kernel = "mma", tile = {32, 32}})
  U.check_attention(h, hk, hv, {kernel = "simt", tile = {32, 32}}, "simt tile")
  local w, wk, wv = qkv("f16", 48, "cuda")
  U.assert_fa_error({"opts.kernel", '"mma"', "D = 48"}, fa.attention, w, wk, wv, {kernel = "mma"})
end

U.run()
