-- fa.load and fa.save (docs/io.md): round trips of every dtype
-- and rank through .npy and .safetensors, views and (FLASHATTN_DEVICE=cuda)
-- cuda tensors, files built byte by byte as numpy and the safetensors
-- library write them (no numpy needed), and malformed, truncated and
-- hostile files: each a flashattn: error naming the file.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

local dir = os.tmpname() -- a fresh name; files are made beside it
os.remove(dir)
local made = {}
local function path(name)
  local p = dir .. "_" .. name
  made[#made + 1] = p
  return p
end
local function write_file(name, bytes)
  local p = path(name)
  local f = assert(io.open(p, "wb"))
  f:write(bytes)
  f:close()
  return p
end
local function read_file(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- the message names the file and each word
local function assert_load_error(p, words)
  local ok, msg = pcall(fa.load, p)
  lu.assertFalse(ok, "loaded " .. p)
  msg = tostring(msg)
  lu.assertStrContains(msg, "flashattn: load '" .. p .. "'")
  for _, w in ipairs(words or {}) do lu.assertStrContains(msg:lower(), w:lower()) end
end

local function map(x, f)
  if type(x) ~= "table" then return f(x) end
  local r = {}
  for i, v in ipairs(x) do r[i] = map(v, f) end
  return r
end

local function random(shape, dtype, device)
  local r = fa.randn(shape, {dtype = dtype ~= "bool" and dtype or "f32", device = device, seed = U.next_seed()})
  if dtype ~= "bool" then return r end
  return fa.tensor(map(r:totable(), function(v) return v > 0 end), {device = device})
end

local shapes = {{7}, {3, 5}, {2, 3, 4}, {2, 1, 3, 2}}
local dtypes = {"f32", "f16", "bf16", "f64", "bool"}

TestIoRoundTrip = {}

function TestIoRoundTrip:tearDown()
  for _, p in ipairs(made) do os.remove(p) end
  made = {}
end

function TestIoRoundTrip:test_npy_every_dtype_and_rank()
  for _, dt in ipairs(dtypes) do
    for _, shape in ipairs(shapes) do
      local t = random(shape, dt, dev)
      local p = path("rt.npy")
      fa.save(p, t)
      local back = fa.load(p)
      -- numpy has no bf16: written as f32, exactly
      lu.assertEquals(back:dtype(), dt == "bf16" and "f32" or dt)
      lu.assertEquals(back:device(), dev)
      lu.assertEquals(back:shape(), shape)
      lu.assertEquals(fa.max_abs_diff(back, t), 0, dt .. " " .. U.seed_note())
    end
  end
end

function TestIoRoundTrip:test_safetensors_every_dtype_and_rank()
  local tensors = {}
  for i, dt in ipairs(dtypes) do
    for r, shape in ipairs(shapes) do tensors[dt .. "." .. r .. "." .. i] = random(shape, dt, dev) end
  end
  tensors["caf\u{e9} \"quoted\"\\/\n"] = fa.ones(2, {device = dev})
  local p = path("rt.safetensors")
  fa.save(p, tensors)
  local back = fa.load(p)
  local n = 0
  for name, t in pairs(tensors) do
    n = n + 1
    local b = back[name]
    lu.assertNotNil(b, name)
    lu.assertEquals(b:dtype(), t:dtype(), name)
    lu.assertEquals(b:device(), dev)
    lu.assertEquals(b:shape(), t:shape(), name)
    lu.assertEquals(fa.max_abs_diff(b, t), 0, name .. " " .. U.seed_note())
  end
  local m = 0
  for _ in pairs(back) do m = m + 1 end
  lu.assertEquals(m, n)
end

function TestIoRoundTrip:test_views_are_saved_as_their_values()
  local base = fa.randn({4, 5, 6}, {device = dev, seed = U.next_seed()})
  local views = {t = base:transpose(1, 3), n = base:narrow(2, 2, 3), s = base:select(1, 2), i = base[3]}
  for name, v in pairs(views) do
    local p = path(name .. ".npy")
    fa.save(p, v)
    local b = fa.load(p)
    lu.assertEquals(b:shape(), v:shape())
    lu.assertEquals(fa.max_abs_diff(b, v), 0, name)
  end
  local p = path("views.safetensors")
  fa.save(p, views)
  local back = fa.load(p)
  for name, v in pairs(views) do lu.assertEquals(fa.max_abs_diff(back[name], v), 0, name) end
end

function TestIoRoundTrip:test_options_device_and_dtype()
  local t = fa.randn({3, 4}, {device = dev, seed = U.next_seed()})
  local p = path("opts.npy")
  fa.save(p, t)
  local c = fa.load(p, {device = "cpu"})
  lu.assertEquals(c:device(), "cpu")
  lu.assertEquals(fa.max_abs_diff(c, t), 0)
  local h = fa.load(p, {dtype = "f16"})
  lu.assertEquals(h:dtype(), "f16")
  lu.assertTrue(fa.max_abs_diff(h, t) < 1e-2)
  local q = path("opts.safetensors")
  fa.save(q, {a = t, b = t:double()})
  local d = fa.load(q, {dtype = "bf16", device = "cpu"})
  lu.assertEquals(d.a:dtype(), "bf16")
  lu.assertEquals(d.b:device(), "cpu")
  U.assert_fa_error({"opts", "colour"}, fa.load, p, {colour = "red"})
  U.assert_fa_error({"device"}, fa.load, p, {device = "tpu"})
  -- an unknown extension: the format comes from the first bytes
  local other = path("data.bin")
  fa.save(other, t)
  lu.assertEquals(fa.max_abs_diff(fa.load(other), t), 0)
  local other2 = path("data2.bin")
  fa.save(other2, {x = t})
  lu.assertEquals(fa.max_abs_diff(fa.load(other2).x, t), 0)
end

function TestIoRoundTrip:test_empty_tensors_and_files()
  local p = path("empty.npy")
  fa.save(p, fa.zeros({2, 0, 3}, {device = dev}))
  lu.assertEquals(fa.load(p):shape(), {2, 0, 3})
  local q = path("empty.safetensors")
  fa.save(q, {})
  lu.assertEquals(next(fa.load(q)), nil)
  fa.save(q, {e = fa.zeros({0}, {device = dev}), f = fa.ones(1, {device = dev})})
  local back = fa.load(q)
  lu.assertEquals(back.e:numel(), 0)
  lu.assertEquals(back.f:get(1), 1)
end

-- ---- files written by hand ---------------------------------------------------

-- numpy's version 1.0 layout: magic, 2-byte length, the dict padded with
-- spaces to 64 bytes with a newline at the end, the data
local function npy(dict, data, version)
  local total = (10 + #dict + 1 + 63) // 64 * 64
  local hdr = dict .. string.rep(" ", total - 10 - #dict - 1) .. "\n"
  if version == 2 then return "\x93NUMPY\x02\x00" .. string.pack("<I4", #hdr) .. hdr .. data end
  return "\x93NUMPY\x01\x00" .. string.pack("<I2", #hdr) .. hdr .. data
end
local function safetensors(json, data) return string.pack("<I8", #json) .. json .. (data or "") end

TestIoKnownBytes = {}

function TestIoKnownBytes:tearDown() TestIoRoundTrip.tearDown(self) end

function TestIoKnownBytes:test_numpy_written_npy()
  local p = write_file("np.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
    string.pack("<ffffff", 1, 2, 3, 4, 5, 6)))
  lu.assertEquals(#read_file(p), 128 + 24)
  local t = fa.load(p, {device = dev})
  lu.assertEquals(t:dtype(), "f32")
  lu.assertEquals(t:totable(), {{1, 2, 3}, {4, 5, 6}})
  -- big-endian doubles, version 2.0
  p = write_file("be.npy", npy("{'descr': '>f8', 'fortran_order': False, 'shape': (3,), }",
    string.pack(">ddd", 0.5, -1, 1e300), 2))
  lu.assertEquals(fa.load(p):totable(), {0.5, -1, 1e300})
  -- f16 and bool
  p = write_file("h.npy", npy("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }", "\x00\x3c\x00\xc0"))
  lu.assertEquals(fa.load(p):totable(), {1, -2})
  p = write_file("b.npy", npy("{'descr': '|b1', 'fortran_order': False, 'shape': (1, 3), }", "\x01\x00\x01"))
  local b = fa.load(p)
  lu.assertEquals(b:dtype(), "bool")
  lu.assertEquals(b:sum(), 2)
end

function TestIoKnownBytes:test_written_npy_bytes()
  local p = path("w.npy")
  fa.save(p, fa.tensor({{1, 2}, {3, 4}}, {dtype = "f64", device = dev}))
  local bytes = read_file(p)
  local dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }"
  lu.assertEquals(bytes:sub(1, 8), "\x93NUMPY\x01\x00")
  lu.assertEquals(string.unpack("<I2", bytes, 9), 118)
  lu.assertEquals(bytes:sub(11, 10 + #dict), dict)
  lu.assertEquals(bytes:sub(128, 128), "\n")
  lu.assertEquals(bytes:sub(129), string.pack("<dddd", 1, 2, 3, 4))
end

function TestIoKnownBytes:test_bf16_widened_by_its_bits()
  -- .npy has no bf16: it is saved as f32 by the bits, a signalling NaN's payload kept
  local hdr = '{"x":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}}'
  local src = write_file("snan.safetensors", string.pack("<I8", #hdr) .. hdr .. string.pack("<I2I2I2", 0xff81, 0x7fc1,
    0x3f80))
  local dst = path("snan.npy")
  fa.save(dst, fa.load(src).x)
  local bytes = read_file(dst)
  lu.assertEquals({string.unpack("<I4I4I4", bytes, #bytes - 11)}, {0xff810000, 0x7fc10000, 0x3f800000, #bytes + 1})
end

function TestIoKnownBytes:test_safetensors_reference_layout()
  local json = '{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},' ..
    '"a":{"dtype":"F32","shape":[1,2],"data_offsets":[4,12]}}'
  local p = write_file("ref.safetensors", safetensors(json, "\x80\x3f\x00\x40" .. string.pack("<ff", 5, 6)))
  local d = fa.load(p, {device = dev})
  lu.assertEquals(d.b:dtype(), "bf16")
  lu.assertEquals(d.b:totable(), {1, 2})
  lu.assertEquals(d.a:totable(), {{5, 6}})
  lu.assertNil(d.__metadata__)
  -- what fa.save writes: sorted names, contiguous offsets, the header padded to 8
  local q = path("w.safetensors")
  fa.save(q, {z = fa.tensor({1}, {device = dev}), a = fa.tensor({true, false})})
  local bytes = read_file(q)
  local n = string.unpack("<I8", bytes)
  lu.assertEquals((8 + n) % 8, 0)
  lu.assertEquals(bytes:sub(9, 8 + n):gsub(" +$", ""),
    '{"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]},"z":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}')
  lu.assertEquals(bytes:sub(9 + n), "\x01\x00" .. string.pack("<f", 1))
end

-- ---- malformed and hostile files -------------------------------------------------

TestIoMalformed = {}

function TestIoMalformed:tearDown() TestIoRoundTrip.tearDown(self) end

local good_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"
local bad_npy = {
  {"empty", "", {"truncated"}},
  {"magic", "\x93NUMPZ\x01\x00\x10\x00" .. string.rep(" ", 16), {"not an npy"}},
  {"version", "\x93NUMPY\x09\x00\x10\x00" .. string.rep(" ", 16), {"version 9.0"}},
  {"header past end", "\x93NUMPY\x01\x00\xff\x7f{'descr'", {"truncated"}},
  {"header too large", "\x93NUMPY\x02\x00" .. string.pack("<I4", 1 << 30) .. "{", {"65536"}},
  {"missing key", npy("{'descr': '<f4', 'shape': (2,), }", "12345678"), {"fortran_order"}},
  {"int dtype", npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", string.rep("\0", 16)), {"<i8"}},
  {"pickled objects", npy("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", "\x80\x04."), {"|O"}},
  {"fortran", npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", "12345678"), {"fortran"}},
  {"scalar", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", "1234"), {"0 dimensions"}},
  {"5-D", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1), }", "1234"), {"5 dimensions"}},
  {"short data", npy(good_dict, "1234567"), {"truncated"}},
  {"long data", npy(good_dict, "123456789"), {"after the data"}},
  {"huge shape", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775807, 3), }", "1234"),
    {"truncated"}},
  {"code", npy("__import__('os').system('echo owned')", ""), {"'{'"}},
  -- NumPy's grammar: (6) is a number, not a shape; 02 is no Python literal; versions are x.0
  {"shape (6)", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", "12345678"), {"(n,)"}},
  {"leading zero", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (02,), }", "12345678"), {"leading zeros"}},
  {"version 1.1", "\x93NUMPY\x01\x01\x10\x00" .. string.rep(" ", 16), {"version 1.1"}},
}

function TestIoMalformed:test_npy()
  for i, case in ipairs(bad_npy) do
    local p = write_file(("bad%d.npy"):format(i), case[2])
    assert_load_error(p, case[3])
  end
end

local function entry(dtype, shape, b, e)
  return ('{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}'):format(dtype, shape, b, e)
end
local bad_st = {
  {"empty", "", {"truncated"}},
  {"short length", "\x05\x00\x00", {"truncated"}},
  {"length past end", string.pack("<I8", 1000) .. "{}", {"truncated"}},
  {"length past limit", string.pack("<I8", 200000000) .. "{}", {"limit"}},
  {"length 2^64-1", string.rep("\xff", 8) .. "{}", {"limit"}},
  {"not json", safetensors("{nope}"), {"malformed"}},
  {"cut json", safetensors('{"a":' .. entry("F32", "1", 0, 4):sub(1, 20)), {"malformed"}},
  {"I64", safetensors('{"a":' .. entry("I64", "1", 0, 8) .. "}", "12345678"), {"'a'", "I64"}},
  {"rank 0", safetensors('{"s":' .. entry("F32", "", 0, 4) .. "}", "1234"), {"'s'", "0 dimensions"}},
  {"rank 5", safetensors('{"r5":' .. entry("F32", "1,1,1,1,1", 0, 4) .. "}", "1234"), {"'r5'", "5 dimensions"}},
  {"past the data", safetensors('{"a":' .. entry("F32", "2", 0, 8) .. "}", "1234"), {"'a'", "outside"}},
  {"wrong size", safetensors('{"a":' .. entry("F32", "2", 0, 4) .. "}", "12345678"), {"'a'", "need 8"}},
  {"overlap", safetensors('{"a":' .. entry("F32", "2", 0, 8) .. ',"b":' .. entry("F32", "1", 4, 8) .. "}",
    "12345678"), {"overlap"}},
  {"hole", safetensors('{"a":' .. entry("F32", "1", 4, 8) .. "}", "12345678"), {"hole"}},
  {"trailing", safetensors('{"a":' .. entry("F32", "1", 0, 4) .. "}", "12345678"), {"after the last"}},
  {"duplicate", safetensors('{"a":' .. entry("F32", "1", 0, 4) .. ',"a":' .. entry("F32", "1", 4, 8) .. "}",
    "12345678"), {"twice"}},
  {"overflow", safetensors('{"a":' .. entry("F64", "4294967296,4294967296,4294967296", 0, 8) .. "}", "12345678"),
    {"'a'"}},
  {"deep", safetensors('{"__metadata__":' .. string.rep("[", 500) .. string.rep("]", 500) .. "}"), {"nesting"}},
  {"nul name", safetensors('{"a\\u0000":' .. entry("F32", "1", 0, 4) .. "}", "1234"), {"u0000"}},
  {"bad utf8", safetensors('{"\xff":' .. entry("F32", "1", 0, 4) .. "}", "1234"), {"UTF-8"}},
  {"two metadata", safetensors('{"__metadata__":{},"a":' .. entry("F32", "1", 0, 4) .. ',"__metadata__":{"x":"y"}}',
    "1234"), {"__metadata__", "twice"}},
  {"two metadata, escaped", safetensors('{"__metadata__":{},"\\u005f_metadata__":{}}'), {"__metadata__", "twice"}},
}

function TestIoMalformed:test_safetensors()
  for i, case in ipairs(bad_st) do
    local p = write_file(("bad%d.safetensors"):format(i), case[2])
    assert_load_error(p, case[3])
  end
end

-- every prefix of a good file is refused, and the engine keeps no memory
function TestIoMalformed:test_truncated_files()
  local t = fa.randn({3, 4}, {seed = U.next_seed()})
  for _, ext in ipairs({"npy", "safetensors"}) do
    local p = path("good." .. ext)
    fa.save(p, ext == "npy" and t or {t = t, u = t:half()})
    local bytes = read_file(p)
    collectgarbage()
    local before = fa.memory("cpu").current
    for len = 0, #bytes - 1 do
      local q = write_file("cut." .. ext, bytes:sub(1, len))
      assert_load_error(q, {})
    end
    collectgarbage()
    lu.assertEquals(fa.memory("cpu").current, before)
  end
end

function TestIoMalformed:test_missing_and_odd_paths()
  assert_load_error(path("missing.npy"), {"cannot open"})
  assert_load_error(path("missing.safetensors"), {"cannot open"})
  local d = os.getenv("TMPDIR") or "/tmp"
  assert_load_error(d, {"regular file"})
  -- a FIFO: refused at once (opening it for reading would wait for a writer)
  for _, name in ipairs({"fifo.npy", "fifo"}) do
    local f = path(name)
    if os.execute("mkfifo '" .. f .. "' 2>/dev/null") then assert_load_error(f, {"regular file"}) end
  end
  U.assert_fa_error({"path"}, fa.load, 42)
  U.assert_fa_error({"path", "NUL"}, fa.load, "a\0b.npy")
  local p = write_file("text.txt", "just some text, not a tensor")
  assert_load_error(p, {"unknown format"})
end

function TestIoMalformed:test_memory_limit()
  local p = path("large.npy")
  fa.save(p, fa.zeros({512, 512}))
  collectgarbage()
  local cur = fa.memory("cpu").current
  local old = fa.set_memory_limit(cur + 65536, "cpu")
  local ok, msg = pcall(fa.load, p)
  fa.set_memory_limit(old, "cpu")
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(msg), "flashattn: load '" .. p .. "'")
  lu.assertStrContains(tostring(msg), "out of memory")
end

-- ---- fa.save's arguments ---------------------------------------------------------

TestIoSave = {}

function TestIoSave:tearDown() TestIoRoundTrip.tearDown(self) end

function TestIoSave:test_bad_arguments()
  local t = fa.ones(2, {device = dev})
  U.assert_fa_error({"path"}, fa.save, nil, t)
  U.assert_fa_error({"value"}, fa.save, path("x.npy"), 42)
  U.assert_fa_error({"value", "table"}, fa.save, path("x.npy"), {a = t})
  U.assert_fa_error({"value", "named"}, fa.save, path("x.safetensors"), t)
  U.assert_fa_error({"keys", "names"}, fa.save, path("x.safetensors"), {t})
  U.assert_fa_error({"'a'", "Tensor"}, fa.save, path("x.safetensors"), {a = 1})
  U.assert_fa_error({"__metadata__"}, fa.save, path("x.safetensors"), {__metadata__ = t})
  U.assert_fa_error({"UTF-8"}, fa.save, path("x.safetensors"), {["\xff"] = t})
  local freed = fa.ones(2)
  freed:free()
  U.assert_fa_error({"freed"}, fa.save, path("x.npy"), freed)
  U.assert_fa_error({"'f'", "freed"}, fa.save, path("x.safetensors"), {f = freed})
  U.assert_fa_error({"save", "cannot open"}, fa.save, "/nonexistent-dir/x.npy", t)
  -- an empty path: refused before anything is written (a temporary file appeared in the working directory)
  U.assert_fa_error({"save", "the path is empty"}, fa.save, "", t)
  U.assert_fa_error({"unexpected"}, fa.save, path("x.npy"), t, 3)
end

-- a FIFO or a device at the path is written in place (docs/io.md) and nothing waits: a FIFO that no
-- process reads is an error at once (opening it for writing waited for a reader forever)
function TestIoSave:test_fifo_and_device_paths()
  local t = fa.ones(3)
  if io.open("/dev/null", "rb") then fa.save("/dev/null", t) end
  local f = path("out.fifo.npy")
  lu.skipIf(not os.execute("mkfifo '" .. f .. "' 2>/dev/null"), "mkfifo is not available")
  local ok, msg = pcall(fa.save, f, t)
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(msg), "flashattn: save '" .. f .. "': cannot open for writing")
  lu.assertStrContains(tostring(msg), "FIFO")
  -- with a reader (this process, through a read-write handle) the file goes through the FIFO
  local want = path("plain.npy")
  fa.save(want, t)
  want = read_file(want)
  local h = assert(io.open(f, "r+b"))
  fa.save(f, t)
  lu.assertEquals(h:read(#want), want)
  h:close()
end

-- a save that fails once the file is begun (out of memory for a view's host copy) leaves the path
-- as it was: the old file whole, and nothing beside it
function TestIoSave:test_failed_save_keeps_the_old_file()
  local p = path("keep.safetensors")
  fa.save(p, {a = fa.ones(3)})
  local f = assert(io.open(p, "rb"))
  local before = f:read("a")
  f:close()
  local view = fa.ones(256, 256):transpose(1, 2) -- saved through a host copy of 256 KB
  local limit = fa.memory_limit("cpu")
  fa.set_memory_limit(fa.memory("cpu").current + 1000, "cpu")
  local ok, err = pcall(fa.save, p, {a = fa.ones(3), big = view})
  fa.set_memory_limit(limit, "cpu")
  lu.assertFalse(ok)
  lu.assertStrContains(tostring(err), "out of memory")
  f = assert(io.open(p, "rb"), "the old file was removed")
  lu.assertEquals(f:read("a"), before)
  f:close()
  local ls = assert(io.popen("ls -a '" .. p:match("^(.*)/[^/]*$") .. "'"))
  for name in ls:lines() do lu.assertNil(name:find("keep.safetensors.", 1, true), "left beside it: " .. name) end
  ls:close()
end

-- a finalizer that frees a tensor of the table while fa.save reads it
function TestIoSave:test_finalizer_during_save()
  for round = 1, 20 do
    local tbl = {}
    for i = 1, 8 do tbl["t" .. i] = fa.ones(3) end
    setmetatable({}, {__gc = function() tbl.t1:free() end})
    local ok, msg = pcall(fa.save, path("gc.safetensors"), tbl)
    if not ok then lu.assertStrContains(tostring(msg), "flashattn:") end
    if round % 5 == 0 then collectgarbage() end
  end
end

U.run()
