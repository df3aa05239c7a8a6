-- Measuring (docs/lua-api.md §3): fa.bench, fa.cost, fa.memory / reset_peak,
-- fa.device_info, fa.backends, fa.version, fa.sync.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

local has_cuda = false
for _, b in ipairs(fa.backends()) do if b == "cuda" then has_cuda = true end end

TestBench = {}

function TestBench:test_fields_and_sanity()
  local calls = 0
  local r = fa.bench(function() calls = calls + 1 end, {warmup = 2, rep = 7})
  for _, f in ipairs({"median_ms", "min_ms", "max_ms", "mean_ms", "n", "host_ms"}) do
    lu.assertEquals(type(r[f]), "number", f)
  end
  lu.assertTrue(r.host_ms >= 0)
  lu.assertEquals(r.n, 7)
  lu.assertTrue(calls >= 9, "fn called " .. calls .. " times for warmup 2 + rep 7")
  lu.assertTrue(r.min_ms >= 0)
  lu.assertTrue(r.min_ms <= r.median_ms and r.median_ms <= r.max_ms)
  lu.assertTrue(r.min_ms <= r.mean_ms and r.mean_ms <= r.max_ms)
end

function TestBench:test_nested_bench_is_an_error()
  -- the context has one timer: an inner bench would restart it under the outer one
  U.assert_fa_error({"inside another fa.bench"}, fa.bench,
    function() fa.bench(function() end, {warmup = 0, rep = 1}) end, {warmup = 0, rep = 2})
  lu.assertEquals(fa.bench(function() end, {warmup = 0, rep = 2}).n, 2) -- usable afterwards
end

function TestBench:test_measures_the_time_spent()
  -- a call that takes at least 3 ms of wall time: a sleep in a child process
  -- (a busy loop on os.clock, the process's CPU time, ends early while the
  -- OpenMP or OpenBLAS threads of an earlier call still spin)
  local function wait() os.execute("sleep 0.003") end
  local r = fa.bench(wait, {warmup = 1, rep = 5})
  lu.assertTrue(r.median_ms >= 2.9, ("median %.3f ms for a 3 ms sleep"):format(r.median_ms))
  lu.assertTrue(r.median_ms < 500, ("median %.3f ms for a 3 ms sleep"):format(r.median_ms))
  -- the host's own time inside fn: the whole sleep on either backend
  lu.assertTrue(r.host_ms >= 2.9, ("host %.3f ms for a 3 ms sleep"):format(r.host_ms))
  lu.assertTrue(r.host_ms < 500, ("host %.3f ms for a 3 ms sleep"):format(r.host_ms))
end

function TestBench:test_kernel_and_flush_cache()
  local q, k, v = U.randn({1, 2, 64, 32}), U.randn({1, 2, 64, 32}), U.randn({1, 2, 64, 32})
  local r = fa.bench(function() fa.attention(q, k, v) end, {warmup = 1, rep = 3, flush_cache = true})
  lu.assertEquals(r.n, 3)
  lu.assertTrue(r.median_ms > 0)
  local r2 = fa.bench(function() fa.softmax(q) end)
  lu.assertTrue(r2.n >= 1)
  lu.assertTrue(r2.median_ms >= 0)
end

function TestBench:test_errors()
  U.assert_fa_error({}, fa.bench, "not a function")
  U.assert_fa_error({"rep"}, fa.bench, function() end, {rep = 0})
  U.assert_fa_error({"warmup"}, fa.bench, function() end, {warmup = -1})
  U.assert_fa_error({"reps"}, fa.bench, function() end, {reps = 3})
  -- an error inside fn reaches the caller
  local ok, err = pcall(fa.bench, function() error("boom in fn") end, {rep = 2})
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err), "boom in fn")
  -- and bench still works
  lu.assertEquals(fa.bench(function() end, {rep = 2}).n, 2)
end

TestCost = {}

function TestCost:test_attention_flops()
  for _, c in ipairs({{2, 4, 4, 128, 128, 64}, {1, 8, 2, 37, 91, 16}, {3, 1, 1, 1, 1000, 128}}) do
    local Bn, Hq, Hkv, Lq, Lk, D = table.unpack(c)
    local q, k, v = U.randn({Bn, Hq, Lq, D}), U.randn({Bn, Hkv, Lk, D}), U.randn({Bn, Hkv, Lk, D})
    local full = 4 * Bn * Hq * Lq * Lk * D
    for _, algo in ipairs({"naive", "two_pass", "flash_row", "flash", "auto"}) do
      local cost = fa.cost.attention(q, k, v, {algo = algo})
      lu.assertEquals(type(cost.flops), "number")
      lu.assertEquals(type(cost.bytes), "number")
      lu.assertEquals(cost.flops, full, ("flops for %s B=%d H=%d Lq=%d Lk=%d D=%d"):format(algo, Bn, Hq, Lq, Lk, D))
      -- at least reading q, k, v and writing o once
      local io_bytes = 4 * (q:numel() + k:numel() + v:numel() + q:numel())
      lu.assertTrue(cost.bytes >= io_bytes, ("%s bytes %g < %g"):format(algo, cost.bytes, io_bytes))
    end
    if Lq == Lk then
      lu.assertEquals(fa.cost.attention(q, k, v, {causal = true}).flops, full / 2, "causal halves the flops")
    end
    -- the default algo is costed like "auto"
    lu.assertEquals(fa.cost.attention(q, k, v).flops, full)
  end
  -- the naive algo moves the score matrix: more bytes than flash
  local q, k, v = U.randn({1, 2, 256, 64}), U.randn({1, 2, 256, 64}), U.randn({1, 2, 256, 64})
  lu.assertTrue(fa.cost.attention(q, k, v, {algo = "naive"}).bytes > fa.cost.attention(q, k, v, {algo = "flash"}).bytes)
  -- bytes follow the dtype
  local h = fa.cost.attention(q:half(), k:half(), v:half(), {algo = "flash"})
  lu.assertTrue(h.bytes < fa.cost.attention(q, k, v, {algo = "flash"}).bytes)
end

-- naive's bytes follow its schedule: q, k, v, o once, and the score matrix
-- S (f32, f64 for f64 inputs) written and read, P written and read (in the
-- inputs' dtype on cuda, where cuBLAS reads it; in S's dtype on the CPU)
function TestCost:test_naive_bytes_follow_the_schedule()
  local Bn, Hq, Hkv, Lq, Lk, D, Dv = 2, 4, 2, 33, 70, 16, 8
  for _, dt in ipairs({"f32", "f16", "f64"}) do
    if dt == "f64" and U.cuda then goto continue end -- f64 attention is an error on cuda
    local q, k, v = U.randn({Bn, Hq, Lq, D}, dt), U.randn({Bn, Hkv, Lk, D}, dt), U.randn({Bn, Hkv, Lk, Dv}, dt)
    local es = ({f32 = 4, f16 = 2, f64 = 8})[dt]
    local ss = math.max(es, 4)
    local ps = U.cuda and es or ss
    local io = es * (q:numel() + k:numel() + v:numel() + Bn * Hq * Lq * Dv)
    local S = Bn * Hq * Lq * Lk
    lu.assertEquals(fa.cost.attention(q, k, v, {algo = "naive"}).bytes, io + 2 * (ss + ps) * S, dt)
    -- causal halves the flops, not the materialised matrices
    lu.assertEquals(fa.cost.attention(q, k, v, {algo = "naive", causal = true}).bytes, io + 2 * (ss + ps) * S, dt)
    ::continue::
  end
end

-- a named kernel is costed by its algo, and checked as fa.attention checks it (the default algo's
-- bytes were reported, and an unknown name taken); lse_out alone adds the lse, as return_lse does
function TestCost:test_named_kernel_and_lse_out()
  local q = U.randn({1, 2, 40, 8})
  for _, name in ipairs(fa.kernels(q, q, q)) do
    local algo
    for _, a in ipairs({"flash", "two_pass", "naive", "flash_row"}) do -- a kernel's own algo first
      if not algo and pcall(fa.attention, q, q, q, {kernel = name, algo = a}) then algo = a end
    end
    lu.assertEquals(fa.cost.attention(q, q, q, {kernel = name}).bytes, fa.cost.attention(q, q, q, {algo = algo}).bytes,
      name)
  end
  U.assert_fa_error({"opts.kernel", "unknown kernel"}, fa.cost.attention, q, q, q, {kernel = "no_such_kernel"})
  local rows = 2 * 40
  local plain = fa.cost.attention(q, q, q).bytes
  lu.assertEquals(fa.cost.attention(q, q, q, {return_lse = true}).bytes, plain + 4 * rows)
  lu.assertEquals(fa.cost.attention(q, q, q, {lse_out = fa.zeros({1, 2, 40}, {device = q:device()})}).bytes,
    plain + 4 * rows)
end

function TestCost:test_attention_flops_count_dv()
  local q, k, v = U.randn({1, 2, 32, 64}), U.randn({1, 2, 48, 64}), U.randn({1, 2, 48, 16})
  -- QKᵀ: 2·Lq·Lk·D, PV: 2·Lq·Lk·Dv
  lu.assertEquals(fa.cost.attention(q, k, v).flops, 2 * 1 * 2 * 32 * 48 * (64 + 16))
end

function TestCost:test_softmax_bytes()
  for _, dtype in ipairs({"f32", "f16"}) do
    local M, N = 64, 1000
    local x = U.randn({M, N}, dtype)
    local es = dtype == "f32" and 4 or 2
    local once = 2 * M * N * es -- read + write once
    local by = {}
    for _, algo in ipairs({"naive", "safe", "online", "fused", "auto"}) do
      local c = fa.cost.softmax(x, {algo = algo})
      lu.assertEquals(type(c.bytes), "number")
      lu.assertTrue(c.flops > 0, algo .. " flops")
      lu.assertTrue(c.bytes >= once, ("%s: %g bytes, below read + write once (%g)"):format(algo, c.bytes, once))
      by[algo] = c.bytes
    end
    lu.assertEquals(by.fused, once, "fused: read once, write once")
    lu.assertTrue(by.safe > by.online, "three passes move more than two")
    lu.assertTrue(by.online > by.fused, "two passes move more than one")
    -- 3-D input: rows are everything but the last dimension
    lu.assertEquals(fa.cost.softmax(U.randn({4, 16, N}, dtype), {algo = "fused"}).bytes, 2 * 4 * 16 * N * es)
  end
end

TestMemory = {}

function TestMemory:test_current_and_peak()
  local m0 = U.mem_current()
  local mem = fa.memory()
  lu.assertEquals(type(mem.current), "number")
  lu.assertEquals(type(mem.peak), "number")
  lu.assertTrue(mem.peak >= mem.current)
  fa.reset_peak()
  lu.assertEquals(fa.memory().peak, fa.memory().current)
  local a = fa.zeros({512, 512}, {device = dev}) -- 1 MiB
  local m1 = fa.memory().current
  lu.assertTrue(m1 - m0 >= 512 * 512 * 4, "current grows by the tensor's bytes")
  lu.assertTrue(m1 - m0 < 512 * 512 * 4 + 65536, "and not by much more")
  local b = fa.zeros({1024, 512}, {device = dev}) -- 2 MiB
  local m2 = fa.memory().current
  b:free()
  lu.assertEquals(fa.memory().current, m1)
  lu.assertTrue(fa.memory().peak >= m2, "peak keeps the high-water mark")
  fa.reset_peak()
  lu.assertEquals(fa.memory().peak, m1, "reset_peak sets peak to current")
  a:free()
  lu.assertEquals(fa.memory().current, m0)
  lu.assertEquals(fa.memory().peak, m1)
end

-- A freed block of 1 MiB comes back to the next tensor of its byte count
-- (src/alloc.c keeps it, on the CPU): fa.memory() counts it only while a
-- tensor holds it, and the new tensor's values are its own.
function TestMemory:test_blocks_kept_for_reuse_count_as_live_only()
  local m0 = U.mem_current()
  for round = 1, 3 do
    local a = fa.full({512, 512}, 7, {device = dev})
    local m1 = fa.memory().current
    lu.assertTrue(m1 - m0 >= 512 * 512 * 4, "counted while held")
    a:free()
    lu.assertEquals(fa.memory().current, m0, "not counted once freed")
    local z = fa.zeros({512, 512}, {device = dev})
    lu.assertEquals(z:max(), 0, "round " .. round .. ": a reused block holds the new tensor's values")
    lu.assertEquals(z:min(), 0)
    local r = fa.rand({256, 1024}, {device = dev, seed = round})
    lu.assertTrue(r:max() < 1 and r:min() >= 0, "and another shape of the same bytes its own")
    z:free()
    r:free()
    lu.assertEquals(fa.memory().current, m0)
  end
  -- attention's outputs in a loop: the engine holds what it held
  local q = U.randn({1, 2, 512, 128})
  local want = fa.attention(q, q, q)
  for _ = 1, 5 do
    local o = fa.attention(q, q, q)
    lu.assertEquals(fa.max_abs_diff(o, want), 0)
    o:free()
  end
  want:free()
  q:free()
  lu.assertEquals(fa.memory().current, m0)
end

-- naive attention materialises S (Lq×Lk), flash does not
function TestMemory:test_peak_shows_the_score_matrix()
  local L = 512
  local q, k, v = U.randn({1, 1, L, 64}), U.randn({1, 1, L, 64}), U.randn({1, 1, L, 64})
  local function peak_of(algo)
    U.collect()
    local before = fa.memory().current
    fa.reset_peak()
    local o = fa.attention(q, k, v, {algo = algo})
    fa.sync()
    local p = fa.memory().peak - before
    o:free()
    return p
  end
  local pn, pf = peak_of("naive"), peak_of("flash")
  lu.assertTrue(pn >= L * L * 4, ("naive peak %d < the %d bytes of S"):format(pn, L * L * 4))
  lu.assertTrue(pf < L * L * 4, ("flash peak %d >= the %d bytes of S"):format(pf, L * L * 4))
  lu.assertTrue(pf >= L * 64 * 4, "flash peak includes its output")
end

TestInfo = {}

function TestInfo:test_device_info()
  local info = fa.device_info()
  lu.assertEquals(type(info.backend), "string")
  lu.assertEquals(type(info.name), "string")
  lu.assertTrue(#info.name > 0)
  lu.assertEquals(info.backend, fa.zeros(1):device())
  local cpu = fa.device_info("cpu")
  lu.assertEquals(cpu.backend, "cpu")
  lu.assertEquals(math.type(cpu.threads), "integer")
  lu.assertTrue(cpu.threads >= 1)
  lu.assertEquals(type(cpu.simd), "string")
  lu.assertTrue(#cpu.simd > 0)
  if has_cuda then
    local g = fa.device_info("cuda")
    lu.assertEquals(g.backend, "cuda")
    for _, f in ipairs({"sms", "smem_per_block", "mem_total"}) do
      lu.assertTrue(type(g[f]) == "number" and g[f] > 0, "cuda device_info." .. f)
    end
  else
    U.assert_fa_error({"cuda"}, fa.device_info, "cuda")
  end
end

function TestInfo:test_backends_consistent()
  local b = fa.backends()
  lu.assertEquals(type(b), "table")
  local set = {}
  for _, name in ipairs(b) do set[name] = true end
  lu.assertTrue(set.cpu, "backends() lists cpu")
  for name in pairs(set) do lu.assertTrue(name == "cpu" or name == "cuda", "unknown backend " .. name) end
  -- cuda listed exactly when a cuda tensor can be made
  local ok = pcall(fa.zeros, {1}, {device = "cuda"})
  lu.assertEquals(ok, set.cuda == true, "fa.backends() and making a cuda tensor disagree")
  -- a machine without the NVIDIA driver's device nodes has no cuda backend
  local ctl = io.open("/dev/nvidiactl", "rb")
  if ctl then ctl:close() end
  if not ctl or os.getenv("FLASHATTN_EXPECT_NO_GPU") == "1" then
    lu.assertNil(set.cuda, "fa.backends() lists cuda on a machine without a GPU")
  end
end

function TestInfo:test_version_and_sync()
  lu.assertEquals(type(fa.version), "string")
  lu.assertTrue(fa.version:match("^%d+%.%d+%.%d+") ~= nil, "version " .. fa.version)
  fa.sync()
  lu.assertEquals(select("#", fa.sync()), 0)
end

U.run()
