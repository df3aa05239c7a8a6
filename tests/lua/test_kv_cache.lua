-- fa.kv_cache (docs/lua-api.md §5): a paged KV cache.  append (ragged
-- through lens) then attend equals fa.attention_reference on each
-- sequence's concatenated keys, for pages of 1, 3 and 16 positions, with
-- every option that applies; errors past capacity or past the pool write
-- nothing; reset, free, use after free; hostile finalizers.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

TestKVCache = {}

-- A model of the cache: per sequence, the keys and values appended so far
-- (CPU f64 tensors (1, H, len, D)), built with narrow/copy_.
local function model(B, H, D, Dv, cap)
  return {B = B, lens = (function() local t = {} for b = 1, B do t[b] = 0 end return t end)(),
          k = fa.zeros({B, H, cap, D}, {dtype = "f64"}), v = fa.zeros({B, H, cap, Dv}, {dtype = "f64"})}
end

local function model_append(m, k, v, lens)
  for b = 1, m.B do
    local n = lens and lens[b] or k:size(3)
    if n > 0 then
      m.k:select(1, b):narrow(2, m.lens[b] + 1, n):copy_(k:cpu():double():select(1, b):narrow(2, 1, n))
      m.v:select(1, b):narrow(2, m.lens[b] + 1, n):copy_(v:cpu():double():select(1, b):narrow(2, 1, n))
    end
    m.lens[b] = m.lens[b] + n
  end
end

-- attend checked sequence by sequence against the reference on the model.
local function check_attend(cache, m, q, opts, dtype, what)
  local o, lse = cache:attend(q, U.copy_opts(opts, nil))
  lu.assertEquals(o:dtype(), q:dtype(), what)
  lu.assertEquals(o:device(), dev, what)
  for b = 1, m.B do
    local L = m.lens[b]
    local kb = m.k:narrow(1, b, 1):narrow(3, 1, math.max(L, 0))
    local vb = m.v:narrow(1, b, 1):narrow(3, 1, math.max(L, 0))
    local ro, rl = U.reference(q:narrow(1, b, 1):cpu():double(), kb, vb, U.copy_opts(opts, {out = true, lse_out = true, return_lse = true}))
    local w = ("%s seq %d (len %d)"):format(what, b, L)
    U.assert_close(o:narrow(1, b, 1), ro, dtype, w, math.max(U.tol[dtype], 1e-6))
    if opts.return_lse then U.assert_lse(lse:narrow(1, b, 1), rl, dtype, w .. " lse") end
  end
  return o, lse
end

-- One append of many pages' worth (pages of 1: more segments than one copy launch takes on
-- cuda), from a strided view, then single tokens as a decoding loop appends them.
function TestKVCache:test_append_many_segments()
  local B, H, D, cap = 3, 2, 8, 260
  local cache <close> = fa.kv_cache{batch = B, heads = H, dim = D, capacity = cap, page_size = 1, device = dev}
  local m = model(B, H, D, D, cap)
  local k = U.randn({B, 250, H, D}):transpose(2, 3) -- (B, H, 250, D) seen through a transpose
  local v = U.randn({B, H, 250, D})
  cache:append(k, v, {250, 99, 201})
  model_append(m, k, v, {250, 99, 201})
  for step = 1, 5 do
    local k1, v1 = U.randn({B, H, 1, D}), U.randn({B, H, 1, D})
    cache:append(k1, v1, {step % 2, 1, 1})
    model_append(m, k1, v1, {step % 2, 1, 1})
    check_attend(cache, m, U.randn({B, 2 * H, 1, D}), {return_lse = true}, "f32", "step " .. step)
  end
  lu.assertEquals(cache:lengths(), m.lens)
end

function TestKVCache:test_append_attend_pages()
  for _, ps in ipairs({1, 3, 16}) do
    for _, dtype in ipairs(U.dtypes) do
      local B, H, Hq, D, Dv, cap = 3, 2, 4, 16, 8, 40
      local cache = fa.kv_cache{batch = B, heads = H, dim = D, dim_v = Dv, capacity = cap, page_size = ps,
                                dtype = dtype, device = dev}
      local m = model(B, H, D, Dv, cap)
      local steps = {{5, nil}, {4, {4, 0, 2}}, {1, nil}, {7, {0, 7, 3}}, {1, {1, 0, 1}}}
      for si, st in ipairs(steps) do
        local n, lens = st[1], st[2]
        local k, v = U.randn({B, H, n, D}, dtype), U.randn({B, H, n, Dv}, dtype)
        cache:append(k, v, lens)
        model_append(m, k, v, lens)
        lu.assertEquals(cache:lengths(), m.lens)
        for _, Lq in ipairs({1, 4}) do
          local q = U.randn({B, Hq, Lq, D}, dtype)
          local what = ("page %d %s step %d Lq %d"):format(ps, dtype, si, Lq)
          check_attend(cache, m, q, {return_lse = true}, dtype, what)
          check_attend(cache, m, q, {causal = true, return_lse = true}, dtype, what .. " causal")
        end
      end
      cache:free()
    end
  end
end

-- Every paged decode instance the kernel has (U.decode_instances: head dims, row groups, dtypes); pages of a
-- size that is not a multiple of 16 (a row an entry) and of 16 (runs); with and without a score rule; chunks of
-- more tiles than stages, so that the loop's copies of the next tiles run.  On cuda the D = 128 instances of four
-- row groups and rows an entry were an illegal instruction (ptxas left their evict-first copies' cache policy in a
-- uniform register nothing set, session 75): each instance must be reached by a test.
function TestKVCache:test_decode_instances()
  local B, H, cap = 2, 1, 330
  for _, inst in ipairs(U.decode_instances()) do
    local D, G, Lq, dtype = table.unpack(inst)
    for _, ps in ipairs({100, 16}) do
      local cache <close> = fa.kv_cache{batch = B, heads = H, dim = D, capacity = cap, page_size = ps, dtype = dtype,
                                        device = dev}
      local m = model(B, H, D, D, cap)
      local k, v = U.randn({B, H, 320, D}, dtype), U.randn({B, H, 320, D}, dtype)
      cache:append(k, v, {320, 257})
      model_append(m, k, v, {320, 257})
      local q = U.randn({B, G * H, Lq, D}, dtype)
      local what = ("D %d G %d Lq %d page %d %s"):format(D, G, Lq, ps, dtype)
      -- (one chunk of 5 tiles and two of 3: the automatic count gives these short caches a tile a chunk, where
      -- the loop copies nothing)
      check_attend(cache, m, q, {causal = true, return_lse = true, splits = 1}, dtype, what .. " 1 split")
      check_attend(cache, m, q, {softcap = 2, splits = 2}, dtype, what .. " softcap, 2 splits")
    end
  end
end

function TestKVCache:test_options()
  local B, H, Hq, D, cap = 2, 1, 2, 8, 30
  local cache = fa.kv_cache{batch = B, heads = H, dim = D, capacity = cap, page_size = 4, device = dev}
  local m = model(B, H, D, D, cap)
  local k, v = U.randn({B, H, 20, D}), U.randn({B, H, 20, D})
  cache:append(k, v, {20, 11})
  model_append(m, k, v, {20, 11})
  local q = U.randn({B, Hq, 3, D})
  local sets = {
    {scale = 0.3},
    {causal = "bottom_right", window = {4, 0}},
    {window = {2, 3}},
    {alibi = {0.5, 0.25}},
    {alibi = {0.5, 0.25}, causal = true, softcap = 2},
    {softcap = 1.5},
    {splits = 3, causal = true},
    {splits = "auto", window = {6, -1}},
  }
  for i, opts in ipairs(sets) do
    opts.return_lse = true
    check_attend(cache, m, q, opts, "f32", "options #" .. i)
  end
  -- out and lse_out come back as the same objects
  local out, lse_out = U.poison({B, Hq, 3, D}, "f32"), U.poison({B, Hq, 3}, "f32")
  local o, l = cache:attend(q, {out = out, lse_out = lse_out, causal = true})
  lu.assertTrue(rawequal(o, out))
  lu.assertTrue(rawequal(l, lse_out))
  local ro, rl = cache:attend(q, {causal = true, return_lse = true})
  U.assert_close(out, ro, "f32", "out")
  U.assert_lse(lse_out, rl, "f32", "lse_out")
  -- options that do not apply are errors naming them
  for _, bad in ipairs({"mask", "kv_lens", "algo", "tile", "dropout"}) do
    local ok, err = pcall(cache.attend, cache, q, {[bad] = bad == "algo" and "flash" or {1, 1}})
    lu.assertFalse(ok, bad)
    lu.assertStrContains(err, "flashattn:")
    lu.assertStrContains(err, bad)
  end
  -- shapes, dtypes
  local ok, err = pcall(cache.attend, cache, U.randn({B, Hq, 1, D + 1}))
  lu.assertFalse(ok)
  lu.assertStrContains(err, "flashattn: kv_cache attend: q")
  ok, err = pcall(cache.attend, cache, U.randn({B, Hq, 1, D}, "f64"))
  lu.assertFalse(ok)
  lu.assertStrContains(err, "dtype")
end

-- The calls the decode kernel does not take on cuda (D = 48, Lq = 20) gather the sequences into contiguous K
-- and V and make one call over the batch: the lengths as key padding where they are equal or align no rule,
-- else each sequence's keys at the end and a bool mask of them (a call a sequence with top_left causal).  On
-- the cpu every call but those with splits reads the pages through the table, each sequence a call over its
-- own keys.  Every path, GQA, lse, out; NaN left in freed pages is never read.
function TestKVCache:test_gathered_calls()
  local B, H, Hq, D, cap = 3, 2, 4, 48, 64
  for _, dtype in ipairs(U.dtypes) do
    local cache <close> = fa.kv_cache{batch = B, heads = H, dim = D, capacity = cap, page_size = 5, dtype = dtype,
                                      device = dev}
    local m = model(B, H, D, D, cap)
    local function append(n, lens)
      local k, v = U.randn({B, H, n, D}, dtype), U.randn({B, H, n, D}, dtype)
      cache:append(k, v, lens)
      model_append(m, k, v, lens)
    end
    -- NaN in pages that a reset gives back, then reused by shorter sequences
    local nan = fa.full({B, H, 12, D}, 0 / 0, {dtype = dtype, device = dev})
    cache:append(nan, nan)
    cache:reset()
    append(13)
    local sets = {{}, {causal = true}, {window = {4, 2}}, {alibi = {0.5, 0.25, 0.125, 0.0625}, causal = true},
                  {causal = "top_left", softcap = 3}, {splits = 2, causal = true},
                  -- top_left counts from a sequence's start, the window and alibi from its end
                  {causal = "top_left", window = {3, -1}}, {causal = "top_left", alibi = {0.5, 0.25, 0.125, 0.0625}}}
    local function check_all(label)
      for _, Lq in ipairs({1, 6, 20}) do
        local q = U.randn({B, Hq, Lq, D}, dtype)
        for i, opts in ipairs(sets) do
          opts.return_lse = true
          check_attend(cache, m, q, opts, dtype, ("%s %s Lq %d set %d"):format(label, dtype, Lq, i))
        end
      end
    end
    check_all("equal lengths")
    append(9, {9, 0, 4})
    check_all("ragged")
    -- out and lse_out through the masked call
    local q = U.randn({B, Hq, 6, D}, dtype)
    local out, lse_out = U.poison({B, Hq, 6, D}, dtype), U.poison({B, Hq, 6}, "f32")
    local o, l = cache:attend(q, {out = out, lse_out = lse_out, causal = true})
    lu.assertTrue(rawequal(o, out))
    lu.assertTrue(rawequal(l, lse_out))
    local ro, rl = cache:attend(q, {causal = true, return_lse = true})
    U.assert_close(out, ro, dtype, "out")
    U.assert_lse(lse_out, rl, dtype, "lse_out")
  end
end

-- On the cpu attend reads the pools through the page table (no gather): the same bits as fa.attention on
-- the sequences' keys and values held contiguous, pages of any size (keys within one page read where they
-- lie), f32 and f16; and the engine memory a call holds does not grow with the cache's length.
function TestKVCache:test_cpu_reads_pages()
  if dev ~= "cpu" then return end
  local B, H, Hq, D = 2, 2, 4, 16
  for _, dtype in ipairs({"f32", "f16"}) do
    for _, ps in ipairs({1, 3, 16, 256}) do
      local cache <close> = fa.kv_cache{batch = B, heads = H, dim = D, capacity = 256, page_size = ps, dtype = dtype}
      local k, v = U.randn({B, H, 200, D}, dtype), U.randn({B, H, 200, D}, dtype)
      cache:append(k:narrow(3, 1, 150), v:narrow(3, 1, 150))
      cache:append(k:narrow(3, 151, 50), v:narrow(3, 151, 50))
      for _, opts in ipairs({{}, {causal = true}, {window = {30, 0}, alibi = {0.5, 0.25, 0.125, 0.0625}}}) do
        for _, Lq in ipairs({1, 7}) do
          local q = U.randn({B, Hq, Lq, D}, dtype)
          local o = cache:attend(q, U.copy_opts(opts, nil))
          local want = fa.attention(q, k, v, U.copy_opts(opts, nil))
          lu.assertEquals(fa.max_abs_diff(o, want), 0, ("%s pages of %d Lq %d"):format(dtype, ps, Lq))
        end
      end
    end
    local function peak_of(len, splits)
      local cache <close> = fa.kv_cache{batch = B, heads = H, dim = D, capacity = len, page_size = 16, dtype = dtype}
      cache:append(U.randn({B, H, len, D}, dtype), U.randn({B, H, len, D}, dtype))
      local q = U.randn({B, Hq, 1, D}, dtype)
      collectgarbage()
      local before = U.mem_current()
      fa.reset_peak()
      local o = cache:attend(q, {splits = splits})
      return fa.memory().peak - before, o
    end
    lu.assertEquals(peak_of(4096, 1), peak_of(256, 1), dtype .. ": attend's memory grows with the cache")
    -- "auto" may cut the keys into chunks over the threads: a workspace a thread and a few rows a chunk,
    -- bounded by the threads, not the cache's length (a gather of 16k positions would take 8 MB in f32)
    local threads = fa.device_info("cpu").threads
    local held = peak_of(16384)
    lu.assertTrue(held < 65536 * (threads + 1), ("%s: attend held %d bytes with %d threads"):format(dtype, held, threads))
  end
end

function TestKVCache:test_empty_sequences()
  local cache = fa.kv_cache{batch = 3, heads = 1, dim = 4, capacity = 8, page_size = 3, device = dev}
  local q = U.randn({3, 1, 2, 4})
  local o, l = cache:attend(q, {return_lse = true})
  lu.assertEquals(o:norm(), 0)
  for _, x in ipairs(U.flat(l)) do lu.assertEquals(x, -math.huge) end
  cache:append(U.randn({3, 1, 2, 4}), U.randn({3, 1, 2, 4}), {0, 2, 0})
  o, l = cache:attend(q, {return_lse = true})
  lu.assertEquals(o:select(1, 1):norm(), 0)
  lu.assertEquals(o:select(1, 3):norm(), 0)
  lu.assertTrue(o:select(1, 2):norm() > 0)
  local t = U.flat(l)
  lu.assertEquals(t[1], -math.huge)
  lu.assertTrue(t[3] > -math.huge)
  -- no query heads (Hq = 0, a multiple of Hkv) or no query rows: an empty output, as fa.attention gives
  for _, shape in ipairs({{3, 0, 2, 4}, {3, 1, 0, 4}}) do
    o, l = cache:attend(U.randn(shape), {return_lse = true})
    lu.assertEquals(o:shape(), shape)
    lu.assertEquals(l:shape(), {shape[1], shape[2], shape[3]})
  end
end

function TestKVCache:test_capacity_and_pool_errors_write_nothing()
  local cache = fa.kv_cache{batch = 2, heads = 1, dim = 4, capacity = 10, page_size = 3, pages = 5, device = dev}
  local info = cache:info()
  lu.assertEquals(info.pages, 5)
  lu.assertEquals(info.free_pages, 5)
  local m = model(2, 1, 4, 4, 10)
  local k, v = U.randn({2, 1, 6, 4}), U.randn({2, 1, 6, 4})
  cache:append(k, v, {6, 3}) -- 2 + 1 pages
  model_append(m, k, v, {6, 3})
  lu.assertEquals(cache:info().free_pages, 2)
  local q = U.randn({2, 1, 2, 4})
  local before = cache:attend(q)
  -- past capacity: sequence 1 has 6, + 5 = 11 > 10
  local k2, v2 = U.randn({2, 1, 5, 4}), U.randn({2, 1, 5, 4})
  local ok, err = pcall(cache.append, cache, k2, v2)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "flashattn: kv_cache append")
  lu.assertStrContains(err, "capacity")
  -- past the pool: 2 + 3 new pages needed, 2 free
  ok, err = pcall(cache.append, cache, k2, v2, {4, 5})
  lu.assertFalse(ok)
  lu.assertStrContains(err, "pool")
  -- lens out of range, wrong count, wrong shapes
  for _, lens in ipairs({{6, 1}, {-1, 0}, {1}, {1, 2, 3}, {1.5, 0}, {"0", "0"}, {0, true}}) do
    ok, err = pcall(cache.append, cache, k2, v2, lens)
    lu.assertFalse(ok)
    lu.assertStrContains(err, "flashattn:")
  end
  -- counts are numbers, as everywhere: a string is not converted
  U.assert_fa_error({"lens[1]", "expected an integer", "'0'"}, cache.append, cache, k2, v2, {"0", "0"})
  ok, err = pcall(cache.append, cache, U.randn({2, 1, 2, 5}), U.randn({2, 1, 2, 4}))
  lu.assertFalse(ok)
  lu.assertStrContains(err, "flashattn: kv_cache append: k")
  ok, err = pcall(cache.append, cache, U.randn({2, 1, 2, 4}), U.randn({2, 1, 3, 4}))
  lu.assertFalse(ok)
  lu.assertStrContains(err, "flashattn: kv_cache append: v")
  -- nothing written
  lu.assertEquals(cache:lengths(), {6, 3})
  lu.assertEquals(cache:info().free_pages, 2)
  U.assert_close(cache:attend(q), before, "f32", "unchanged")
  check_attend(cache, m, q, {causal = true, return_lse = true}, "f32", "after errors")
  -- exactly filling the pool works
  local k3, v3 = U.randn({2, 1, 3, 4}), U.randn({2, 1, 3, 4})
  cache:append(k3, v3, {0, 3})
  model_append(m, k3, v3, {0, 3})
  lu.assertEquals(cache:info().free_pages, 1)
  check_attend(cache, m, q, {return_lse = true}, "f32", "filled")
end

function TestKVCache:test_reset()
  local cache = fa.kv_cache{batch = 2, heads = 2, dim = 4, capacity = 9, page_size = 2, device = dev}
  local k, v = U.randn({2, 2, 5, 4}), U.randn({2, 2, 5, 4})
  cache:append(k, v)
  lu.assertEquals(cache:info().free_pages, 10 - 6)
  cache:reset(2)
  lu.assertEquals(cache:lengths(), {5, 0})
  lu.assertEquals(cache:info().free_pages, 10 - 3)
  local m = model(2, 2, 4, 4, 9)
  model_append(m, k, v, {5, 0})
  local k2, v2 = U.randn({2, 2, 4, 4}), U.randn({2, 2, 4, 4})
  cache:append(k2, v2, {4, 4})
  model_append(m, k2, v2, {4, 4})
  check_attend(cache, m, U.randn({2, 4, 3, 4}), {causal = true, return_lse = true}, "f32", "after reset(2)")
  cache:reset()
  lu.assertEquals(cache:lengths(), {0, 0})
  lu.assertEquals(cache:info().free_pages, 10)
  for _, bad in ipairs({0, 3, -1}) do
    local ok, err = pcall(cache.reset, cache, bad)
    lu.assertFalse(ok)
    lu.assertStrContains(err, "flashattn:")
  end
  U.assert_fa_error({"sequence 3", "1 to 2"}, cache.reset, cache, 3) -- Lua's numbering
end

function TestKVCache:test_create_errors()
  local good = {batch = 1, heads = 1, dim = 4, capacity = 4}
  local bads = {{batch = 0}, {heads = -1}, {dim = 0}, {capacity = 0}, {page_size = -2}, {pages = -1},
                {dim_v = -1}, {dtype = "bool"}, {dtype = "int"}, {device = "tpu"}, {colour = 1}, {batch = 1.5}}
  for i, b in ipairs(bads) do
    local o = U.copy_opts(good)
    for key, val in pairs(b) do o[key] = val end
    local ok, err = pcall(fa.kv_cache, o)
    lu.assertFalse(ok, "bad #" .. i)
    lu.assertStrContains(err, "flashattn:")
  end
  local ok, err = pcall(fa.kv_cache, {batch = 1, heads = 1, dim = 4}) -- no capacity
  lu.assertFalse(ok)
  lu.assertStrContains(err, "capacity")
  ok, err = pcall(fa.kv_cache)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "flashattn:")
  local c = fa.kv_cache(good)
  local info = c:info()
  lu.assertEquals(info.page_size, 16)
  lu.assertEquals(info.pages, 1)
  lu.assertEquals(info.dim_v, 4)
  lu.assertEquals(info.dtype, "f32")
  lu.assertStrContains(tostring(c), "flashattn.KVCache(")
end

-- sizes each in range whose pools would pass what a tensor may hold: refused before anything is
-- allocated, naming kv_cache and the field at which the pool's size passes the limit (the tensor
-- layer's "shape: ... is too many" named neither)
function TestKVCache:test_create_pool_too_large()
  local E = 1 << 40
  local cases = {
    {{batch = E, heads = 1 << 30, dim = 8, capacity = 16}, "heads", "K pool"},
    {{batch = 2, heads = 2, dim = E, capacity = 1 << 30}, "dim", "K pool"},
    {{batch = 1, heads = 1 << 20, dim = 8, dim_v = E, capacity = 1 << 20}, "dim_v", "V pool"},
    {{batch = 1 << 20, heads = 1 << 20, dim = 1 << 20, capacity = 1 << 20}, "page_size", "K pool"},
    {{batch = 1, heads = 1 << 30, dim = 8, capacity = 16, pages = 1 << 35}, "heads", "K pool"},
  }
  collectgarbage()
  local before = fa.memory("cpu").current
  for i, c in ipairs(cases) do
    c[1].device = dev
    U.assert_fa_error({"flashattn: kv_cache: " .. c[2] .. ": the " .. c[3], "more than a tensor may hold"},
                      fa.kv_cache, c[1])
    lu.assertEquals(fa.memory("cpu").current, before, "case " .. i)
  end
end

function TestKVCache:test_free_and_use_after_free()
  collectgarbage()
  collectgarbage()
  local before = fa.memory(dev).current
  local c = fa.kv_cache{batch = 2, heads = 1, dim = 4, capacity = 64, page_size = 8, device = dev}
  lu.assertTrue(fa.memory(dev).current > before)
  c:free()
  lu.assertEquals(fa.memory(dev).current, before)
  c:free() -- twice is fine
  lu.assertStrContains(tostring(c), "freed")
  local k = U.randn({2, 1, 1, 4})
  local calls = {function() c:append(k, k) end, function() c:attend(U.randn({2, 1, 1, 4})) end,
                 function() c:lengths() end, function() c:reset() end, function() c:info() end}
  for i, f in ipairs(calls) do
    local ok, err = pcall(f)
    lu.assertFalse(ok, "call #" .. i)
    lu.assertStrContains(err, "flashattn: kv_cache: the cache has been freed")
  end
  do
    local c2 <close> = fa.kv_cache{batch = 1, heads = 1, dim = 4, capacity = 4, device = dev}
    c2:append(U.randn({1, 1, 2, 4}), U.randn({1, 1, 2, 4}))
  end
  collectgarbage()
  local mid = fa.memory(dev).current
  local c3 = fa.kv_cache{batch = 1, heads = 1, dim = 4, capacity = 4, device = dev}
  lu.assertTrue(fa.memory(dev).current > mid)
  c3 = nil
  collectgarbage()
  collectgarbage()
  lu.assertEquals(fa.memory(dev).current, mid)
  local ok, err = pcall(c.append, "nope", k, k)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "flashattn.KVCache")
end

function TestKVCache:test_hostile_finalizers()
  -- a finalizer (or an opts __index) frees the inputs or the cache mid-call
  local c = fa.kv_cache{batch = 1, heads = 1, dim = 4, capacity = 16, page_size = 3, device = dev}
  local k, v = U.randn({1, 1, 5, 4}), U.randn({1, 1, 5, 4})
  c:append(k, v)
  local q = U.randn({1, 2, 2, 4})
  local ro = c:attend(q, {causal = true})
  local qq = q:clone()
  local opts = setmetatable({}, {__index = function(_, key)
    if key == "causal" then qq:free(); collectgarbage() return true end
  end})
  U.assert_close(c:attend(qq, opts), ro, "f32", "q freed by __index") -- pinned before
  -- lens table whose finalizer frees k and v while the lens are read
  local kk, vv = U.randn({1, 1, 2, 4}), U.randn({1, 1, 2, 4})
  setmetatable({}, {__gc = function() kk:free(); vv:free() end})
  c:append(kk, vv, {2})
  lu.assertEquals(c:lengths(), {7})
  -- the cache freed by an opts __index: an error, never a crash
  local c2 = fa.kv_cache{batch = 1, heads = 1, dim = 4, capacity = 16, device = dev}
  local evil = setmetatable({}, {__index = function(_, key)
    if key == "scale" then c2:free() end
  end})
  local ok, err = pcall(c2.attend, c2, U.randn({1, 1, 1, 4}), evil)
  lu.assertFalse(ok)
  lu.assertStrContains(err, "freed")
  -- a finalizer that frees the cache while append reads its lens
  local c3 = fa.kv_cache{batch = 1, heads = 1, dim = 4, capacity = 16, device = dev}
  local lens = setmetatable({}, {__len = function() c3:free() return 1 end})
  lens[1] = 1
  ok, err = pcall(c3.append, c3, U.randn({1, 1, 1, 4}), U.randn({1, 1, 1, 4}), lens)
  if not ok then lu.assertStrContains(err, "flashattn:") end
end

U.run()
