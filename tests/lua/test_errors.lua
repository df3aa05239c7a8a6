-- Errors (docs/lua-api.md §4): every bad input raises a Lua error whose message starts
-- "flashattn:" and names the argument or option; afterwards the engine still
-- works and holds no more memory than before (nothing leaked).
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

local has_cuda = false
for _, b in ipairs(fa.backends()) do if b == "cuda" then has_cuda = true end end

local B, H, Lq, Lk, D = 1, 2, 8, 10, 16

local function q_() return U.randn({B, H, Lq, D}) end
local function k_() return U.randn({B, H, Lk, D}) end
local function v_() return U.randn({B, H, Lk, D}) end
local function freed(t) t:free() return t end

local function valid_call()
  local q, k, v = q_(), k_(), v_()
  local o, lse = fa.attention(q, k, v, {algo = "flash", causal = true, return_lse = true})
  U.assert_close(o, U.reference(q, k, v, {causal = true}), "f32", "attention after an error")
  assert(lse)
  local y = fa.softmax(U.randn({3, 5}))
  assert(y:isfinite())
end

-- Runs every case: the error, its message, recovery, no leak.
local function run_cases(cases)
  valid_call() -- warm up: workspaces the engine keeps count from here on
  for _, c in ipairs(cases) do
    local name, words, f = c[1], c[2], c[3]
    local m0 = U.mem_current()
    local ok, err = pcall(U.assert_fa_error, words, f)
    if not ok then lu.fail(("%s: %s"):format(name, tostring(err))) end
    valid_call()
    local m1 = U.mem_current()
    if m1 ~= m0 then lu.fail(("%s: engine memory %d bytes before, %d after the error (leak)"):format(name, m0, m1)) end
  end
end

TestAttentionErrors = {}

function TestAttentionErrors:test_shapes()
  run_cases({
    {"q 1-D", {"=q"}, function() return fa.attention(U.randn({D}), k_(), v_()) end},
    {"q rank differs from k", {{"=k", "=q"}}, function() return fa.attention(q_(), U.randn({H, Lk, D}), v_()) end},
    {"batch mismatch", {"=k"}, function() return fa.attention(U.randn({2, H, Lq, D}), k_(), v_()) end},
    {"D mismatch", {"=k"}, function() return fa.attention(q_(), U.randn({B, H, Lk, 8}), v_()) end},
    {"Hq % Hkv ~= 0", {{"=k", "head", "hkv"}}, function()
      return fa.attention(U.randn({B, 3, Lq, D}), k_(), v_())
    end},
    {"Hkv > Hq", {{"=k", "head", "hkv"}}, function()
      return fa.attention(U.randn({B, 1, Lq, D}), k_(), v_())
    end},
    {"v length differs from k", {"=v"}, function() return fa.attention(q_(), k_(), U.randn({B, H, Lk + 1, D})) end},
    {"v heads differ from k", {"=v"}, function() return fa.attention(q_(), k_(), U.randn({B, 1, Lk, D})) end},
    {"v batch differs", {"=v"}, function() return fa.attention(q_(), k_(), U.randn({2, H, Lk, D})) end},
    {"2-D q with 4-D k", {{"=k", "=q"}}, function() return fa.attention(U.randn({Lq, D}), k_(), v_()) end},
  })
end

function TestAttentionErrors:test_dtypes_and_devices()
  run_cases({
    {"bool q", {"=q", "bool"}, function()
      return fa.attention(fa.tensor(U.nested({B, H, Lq, D}, function() return true end), {device = dev}), k_(), v_())
    end},
    {"bool k", {"=k", "bool"}, function()
      return fa.attention(q_(), fa.tensor(U.nested({B, H, Lk, D}, function() return true end), {device = dev}), v_())
    end},
    {"k f16 with q f32", {"=k", {"f16", "dtype"}}, function() return fa.attention(q_(), k_():half(), v_()) end},
    {"v f64 with q f32", {"=v", {"f64", "dtype"}}, function() return fa.attention(q_(), k_(), v_():double()) end},
    {"bool softmax", {"=x", "bool"}, function()
      return fa.softmax(fa.tensor({true, false}, {device = dev}))
    end},
  })
end

function TestAttentionErrors:test_mixed_devices()
  lu.skipIf(not has_cuda, "needs a CUDA device")
  local other = dev == "cuda" and "cpu" or "cuda"
  run_cases({
    {"k on the other device", {"=k", "device"}, function() return fa.attention(q_(), k_():to(other), v_()) end},
    {"v on the other device", {"=v", "device"}, function() return fa.attention(q_(), k_(), v_():to(other)) end},
    {"mask on the other device", {"mask", "device"}, function()
      return fa.attention(q_(), k_(), v_(), {mask = fa.zeros({Lq, Lk}, {device = other})})
    end},
    {"out on the other device", {"out", "device"}, function()
      return fa.attention(q_(), k_(), v_(), {out = fa.zeros({B, H, Lq, D}, {device = other})})
    end},
    {"softmax out on the other device", {"out", "device"}, function()
      return fa.softmax(U.randn({2, 3}), {out = fa.zeros({2, 3}, {device = other})})
    end},
  })
end

function TestAttentionErrors:test_no_cuda_device()
  lu.skipIf(has_cuda, "a CUDA device is present")
  run_cases({
    {"cuda tensor", {"cuda"}, function() return fa.zeros({2}, {device = "cuda"}) end},
    {"cuda copy", {"cuda"}, function() return U.randn({2}):cuda() end},
    {"to cuda", {"cuda"}, function() return U.randn({2}):to("cuda") end},
  })
end

function TestAttentionErrors:test_option_names_and_types()
  run_cases({
    {"unknown option", {"foo_bar"}, function() return fa.attention(q_(), k_(), v_(), {foo_bar = 1}) end},
    {"misspelled option", {"caual"}, function() return fa.attention(q_(), k_(), v_(), {caual = true}) end},
    {"opts not a table", {"opts"}, function() return fa.attention(q_(), k_(), v_(), 5) end},
    {"algo unknown", {"algo"}, function() return fa.attention(q_(), k_(), v_(), {algo = "fast"}) end},
    {"algo not a string", {"algo"}, function() return fa.attention(q_(), k_(), v_(), {algo = 1}) end},
    {"causal string", {"causal"}, function() return fa.attention(q_(), k_(), v_(), {causal = "yes"}) end},
    {"causal number", {"causal"}, function() return fa.attention(q_(), k_(), v_(), {causal = 1}) end},
    {"scale string", {"scale"}, function() return fa.attention(q_(), k_(), v_(), {scale = "x"}) end},
    {"return_lse string", {"return_lse"}, function() return fa.attention(q_(), k_(), v_(), {return_lse = "yes"}) end},
    {"mask string", {"mask"}, function() return fa.attention(q_(), k_(), v_(), {mask = "x"}) end},
    {"out table", {"out"}, function() return fa.attention(q_(), k_(), v_(), {out = {}}) end},
    {"softmax unknown option", {"blok"}, function() return fa.softmax(U.randn({2, 3}), {blok = 4}) end},
    {"softmax algo", {"algo"}, function() return fa.softmax(U.randn({2, 3}), {algo = "fast"}) end},
    {"softmax opts", {"opts"}, function() return fa.softmax(U.randn({2, 3}), "safe") end},
    -- a name with a NUL byte is not the name before it (C would read "flash")
    {"algo with a NUL", {"algo", "NUL"}, function() return fa.attention(q_(), k_(), v_(), {algo = "flash\0x"}) end},
    {"kernel with a NUL", {"kernel", "NUL"}, function() return fa.attention(q_(), k_(), v_(), {kernel = "cpu_flash\0"}) end},
    {"dtype with a NUL", {"dtype", "NUL"}, function() return fa.zeros(2, {dtype = "f32\0x"}) end},
    {"device with a NUL", {"device", "NUL"}, function() return fa.zeros(2, {device = "cpu\0"}) end},
    {"memory device with a NUL", {"device", "NUL"}, function() return fa.memory("cpu\0") end},
    {"to with a NUL", {"argument #1 (x)", "NUL"}, function() return U.randn({2}):to("f16\0") end},
    {"option name with a NUL", {"unknown option", "causal\\0"},
     function() return fa.attention(q_(), k_(), v_(), {["causal\0"] = true}) end},
    {"causal with a NUL", {"opts.causal", "NUL"}, function() return fa.attention(q_(), k_(), v_(), {causal = "top_left\0"}) end},
    {"splits with a NUL", {"opts.splits", "'auto\\0x'"}, function() return fa.attention(q_(), k_(), v_(), {splits = "auto\0x"}) end},
  })
end

function TestAttentionErrors:test_option_values()
  run_cases({
    {"scale NaN", {"scale"}, function() return fa.attention(q_(), k_(), v_(), {scale = 0 / 0}) end},
    {"scale inf", {"scale"}, function() return fa.attention(q_(), k_(), v_(), {scale = math.huge}) end},
    {"softcap negative", {"softcap"}, function() return fa.attention(q_(), k_(), v_(), {softcap = -1}) end},
    {"softcap NaN", {"softcap"}, function() return fa.attention(q_(), k_(), v_(), {softcap = 0 / 0}) end},
    {"window of 3", {"window"}, function() return fa.attention(q_(), k_(), v_(), {window = {1, 2, 3}}) end},
    {"window of 1", {"window"}, function() return fa.attention(q_(), k_(), v_(), {window = {1}}) end},
    {"window number", {"window"}, function() return fa.attention(q_(), k_(), v_(), {window = 3}) end},
    {"window -2", {"window"}, function() return fa.attention(q_(), k_(), v_(), {window = {-2, 0}}) end},
    {"window fraction", {"window"}, function() return fa.attention(q_(), k_(), v_(), {window = {1.5, 0}}) end},
    {"tile 0", {"tile"}, function() return fa.attention(q_(), k_(), v_(), {algo = "flash", tile = 0}) end},
    {"tile {0, 16}", {"tile"}, function() return fa.attention(q_(), k_(), v_(), {algo = "flash", tile = {0, 16}}) end},
    {"tile {16, -1}", {"tile"}, function()
      return fa.attention(q_(), k_(), v_(), {algo = "two_pass", tile = {16, -1}})
    end},
    {"tile huge", {"tile"}, function()
      return fa.attention(q_(), k_(), v_(), {algo = "flash", tile = {1 << 40, 1 << 40}})
    end},
    {"kv_lens too many", {"kv_lens"}, function() return fa.attention(q_(), k_(), v_(), {kv_lens = {1, 2}}) end},
    {"kv_lens negative", {"kv_lens"}, function() return fa.attention(q_(), k_(), v_(), {kv_lens = {-1}}) end},
    {"kv_lens > Lk", {"kv_lens"}, function() return fa.attention(q_(), k_(), v_(), {kv_lens = {Lk + 1}}) end},
    {"kv_lens fraction", {"kv_lens"}, function() return fa.attention(q_(), k_(), v_(), {kv_lens = {1.5}}) end},
    {"kv_lens string", {"kv_lens"}, function() return fa.attention(q_(), k_(), v_(), {kv_lens = "x"}) end},
    {"kv_lens tensor too long", {"kv_lens"}, function()
      return fa.attention(q_(), k_(), v_(), {kv_lens = fa.tensor({1, 2, 3}, {device = dev})})
    end},
    {"alibi wrong count", {"alibi"}, function() return fa.attention(q_(), k_(), v_(), {alibi = {0.5}}) end},
    {"alibi strings", {"alibi"}, function() return fa.attention(q_(), k_(), v_(), {alibi = {"a", "b"}}) end},
    {"alibi tensor wrong count", {"alibi"}, function()
      return fa.attention(q_(), k_(), v_(), {alibi = fa.tensor({0.5, 0.25, 0.125}, {device = dev})})
    end},
    {"mask wrong shape", {"mask"}, function()
      return fa.attention(q_(), k_(), v_(), {mask = fa.zeros({Lq + 1, Lk}, {device = dev})})
    end},
    {"mask not broadcastable", {"mask"}, function()
      return fa.attention(q_(), k_(), v_(), {mask = fa.zeros({2, 1, 1, Lk}, {device = dev})})
    end},
    {"f16 mask with the wrong Lk", {"mask"}, function()
      return fa.attention(q_(), k_(), v_(), {mask = fa.zeros({Lq, Lk - 1}, {dtype = "f16", device = dev})})
    end},
    {"out wrong shape", {"out"}, function()
      return fa.attention(q_(), k_(), v_(), {out = fa.zeros({B, H, Lq, D + 1}, {device = dev})})
    end},
    {"out wrong dtype", {"out"}, function()
      return fa.attention(q_(), k_(), v_(), {out = fa.zeros({B, H, Lq, D}, {dtype = "f64", device = dev})})
    end},
    {"lse_out wrong shape", {"lse_out"}, function()
      return fa.attention(q_(), k_(), v_(), {return_lse = true, lse_out = fa.zeros({B, H, Lq + 1}, {device = dev})})
    end},
    {"lse_out wrong dtype", {"lse_out"}, function()
      return fa.attention(q_(), k_(), v_(),
        {return_lse = true, lse_out = fa.zeros({B, H, Lq}, {dtype = "f16", device = dev})})
    end},
    {"softmax out wrong shape", {"out"}, function()
      return fa.softmax(U.randn({2, 3}), {out = fa.zeros({3, 2}, {device = dev})})
    end},
    {"softmax out wrong dtype", {"out"}, function()
      return fa.softmax(U.randn({2, 3}), {out = fa.zeros({2, 3}, {dtype = "f16", device = dev})})
    end},
    {"softmax block negative", {"block"}, function() return fa.softmax(U.randn({2, 3}), {algo = "online", block = -4}) end},
  })
end

function TestAttentionErrors:test_lua_types_in_every_slot()
  run_cases({
    {"q nil", {"=q"}, function() return fa.attention(nil, k_(), v_()) end},
    {"q string", {"=q"}, function() return fa.attention("q", k_(), v_()) end},
    {"q table", {"=q"}, function() return fa.attention({{1}}, k_(), v_()) end},
    {"k number", {"=k"}, function() return fa.attention(q_(), 1, v_()) end},
    {"k nil", {"=k"}, function() return fa.attention(q_(), nil, v_()) end},
    {"v table", {"=v"}, function() return fa.attention(q_(), k_(), {}) end},
    {"v missing", {"=v"}, function() return fa.attention(q_(), k_()) end},
    {"v a function", {"=v"}, function() return fa.attention(q_(), k_(), print) end},
    {"reference q string", {"=q"}, function() return fa.attention_reference("q", k_(), v_()) end},
    {"softmax x nil", {"=x"}, function() return fa.softmax(nil) end},
    {"softmax x number", {"=x"}, function() return fa.softmax(3) end},
    {"matmul a string", {"=a"}, function() return fa.matmul("a", U.randn({2, 2})) end},
    {"matmul b nil", {"=b"}, function() return fa.matmul(U.randn({2, 2}), nil) end},
    {"cost q nil", {"=q"}, function() return fa.cost.attention(nil, k_(), v_()) end},
    {"cost softmax x", {"=x"}, function() return fa.cost.softmax("x") end},
    {"not a tensor userdata", {"=q"}, function() return fa.attention(io.stdout, k_(), v_()) end},
  })
end

function TestAttentionErrors:test_freed_tensors_in_every_slot()
  run_cases({
    {"q freed", {"=q"}, function() return fa.attention(freed(q_()), k_(), v_()) end},
    {"k freed", {"=k"}, function() return fa.attention(q_(), freed(k_()), v_()) end},
    {"v freed", {"=v"}, function() return fa.attention(q_(), k_(), freed(v_())) end},
    {"mask freed", {"mask"}, function()
      return fa.attention(q_(), k_(), v_(), {mask = freed(fa.zeros({Lq, Lk}, {device = dev}))})
    end},
    {"out freed", {"out"}, function()
      return fa.attention(q_(), k_(), v_(), {out = freed(fa.zeros({B, H, Lq, D}, {device = dev}))})
    end},
    {"lse_out freed", {"lse_out"}, function()
      return fa.attention(q_(), k_(), v_(), {return_lse = true, lse_out = freed(fa.zeros({B, H, Lq}, {device = dev}))})
    end},
    {"kv_lens tensor freed", {"kv_lens"}, function()
      return fa.attention(q_(), k_(), v_(), {kv_lens = freed(fa.tensor({3}, {device = dev}))})
    end},
    {"alibi tensor freed", {"alibi"}, function()
      return fa.attention(q_(), k_(), v_(), {alibi = freed(fa.tensor({1, 2}, {device = dev}))})
    end},
    {"reference v freed", {"=v"}, function() return fa.attention_reference(q_(), k_(), freed(v_())) end},
    {"softmax x freed", {"=x"}, function() return fa.softmax(freed(U.randn({2, 3}))) end},
    {"softmax out freed", {"out"}, function()
      return fa.softmax(U.randn({2, 3}), {out = freed(fa.zeros({2, 3}, {device = dev}))})
    end},
    {"matmul b freed", {"=b"}, function() return fa.matmul(U.randn({2, 2}), freed(U.randn({2, 2}))) end},
    {"merge o1 freed", {"o1"}, function()
      local l = U.randn({2, 3})
      return fa.merge_states(freed(U.randn({2, 3, 4})), l, U.randn({2, 3, 4}), l)
    end},
    {"cost k freed", {"=k"}, function() return fa.cost.attention(q_(), freed(k_()), v_()) end},
    {"copy_ from freed", {}, function() return U.randn({2}):copy_(freed(U.randn({2}))) end},
    {"rel_error freed", {}, function() return fa.rel_error(U.randn({2}), freed(U.randn({2}))) end},
  })
end

-- Errors raised inside kernels (not just argument checks): the engine's own
-- memory limit makes an allocation fail; the error is a flashattn error and
-- the engine recovers.
function TestAttentionErrors:test_out_of_memory_recovers()
  lu.skipIf(fa.set_memory_limit == nil, "no fa.set_memory_limit in this build")
  valid_call()
  local m0 = U.mem_current()
  local q, k, v = U.randn({1, 4, 256, 64}), U.randn({1, 4, 256, 64}), U.randn({1, 4, 256, 64})
  local inputs = U.mem_current()
  local old = fa.set_memory_limit(inputs + 4096)
  local ok, err = pcall(fa.attention, q, k, v, {algo = "naive"})
  local ok2, err2 = pcall(fa.zeros, {1024, 1024})
  fa.set_memory_limit(old or 0)
  lu.assertFalse(ok, "naive attention (an S of 1 MiB) under a 4 KiB limit succeeded")
  lu.assertEquals(tostring(err):sub(1, 10), "flashattn:", tostring(err))
  lu.assertFalse(ok2)
  lu.assertEquals(tostring(err2):sub(1, 10), "flashattn:", tostring(err2))
  lu.assertEquals(U.mem_current(), inputs)
  q, k, v = nil, nil, nil
  valid_call()
  lu.assertEquals(U.mem_current(), m0)
end

U.run()
