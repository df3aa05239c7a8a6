-- fa.matmul (docs/lua-api.md §2): every algo × dtype against an f64 product in Lua,
-- the tile option, views, opts.out and shape errors.
local U = require "fa_testutil"
local fa, lu = U.fa, U.lu
local dev = U.device

local ALGOS = {"naive", "tiled", "blas", "auto"}
local SHAPES = {{1, 1, 1}, {7, 3, 5}, {64, 80, 33}, {129, 129, 65}, {1, 256, 3}, {100, 1, 100}}

local function lua_matmul(a, b)
  local m, k, n = a:size(1), a:size(2), b:size(2)
  return U.from_flat(U.lua_matmul_flat(U.flat(a), U.flat(b), m, k, n), {m, n}, "f64", "cpu")
end

local function check(a, b, opts, what)
  local ref = lua_matmul(a, b)
  local dtype = a:dtype()
  local run = U.copy_opts(opts)
  local out = U.poison(ref:shape(), dtype, a:device())
  run.out = out
  local c = fa.matmul(a, b, run)
  lu.assertEquals(c:dtype(), dtype, what)
  lu.assertEquals(c:device(), a:device(), what)
  U.assert_close(c, ref, dtype, what)
  U.assert_close(out, ref, dtype, what .. " (opts.out)")
  local c2 = fa.matmul(a, b, U.copy_opts(opts))
  U.assert_close(c2, ref, dtype, what .. " (no out)")
end

TestMatmul = {}

function TestMatmul:test_every_algo_dtype_shape()
  for _, algo in ipairs(ALGOS) do
    for _, dtype in ipairs(U.dtypes) do
      for _, s in ipairs(SHAPES) do
        local a, b = U.randn({s[1], s[2]}, dtype), U.randn({s[2], s[3]}, dtype)
        check(a, b, {algo = algo}, ("matmul %s %s %dx%d·%dx%d"):format(algo, dtype, s[1], s[2], s[2], s[3]))
      end
    end
  end
end

function TestMatmul:test_tiles()
  for _, tile in ipairs({1, 4, 8, 16, 32, 64, 128}) do
    for _, dtype in ipairs({"f32", U.pick(U.dtypes, tile)}) do
      local a, b = U.randn({70, 45}, dtype), U.randn({45, 93}, dtype)
      check(a, b, {algo = "tiled", tile = tile}, ("tiled %d %s"):format(tile, dtype))
    end
  end
  local a, b = U.randn({4, 4}), U.randn({4, 4})
  U.assert_fa_error({"tile"}, fa.matmul, a, b, {algo = "tiled", tile = -1})
  U.assert_fa_error({"tile"}, fa.matmul, a, b, {algo = "tiled", tile = 2.5})
  U.assert_fa_error({"tile"}, fa.matmul, a, b, {algo = "tiled", tile = "8"})
  -- written as attention's tile: {n} or {n, n} (square tiles)
  local c, d = U.randn({37, 41}), U.randn({41, 29})
  check(c, d, {algo = "tiled", tile = {16, 16}}, "tiled {16, 16}")
  check(c, d, {algo = "tiled", tile = {8}}, "tiled {8}")
  U.assert_fa_error({"tile", "square"}, fa.matmul, c, d, {algo = "tiled", tile = {8, 16}})
end

function TestMatmul:test_views()
  local x = U.randn({40, 30})
  local a = x:transpose(1, 2)                 -- 30x40, strided
  local b = U.randn({50, 40}):transpose(1, 2) -- 40x50, strided
  for _, algo in ipairs(ALGOS) do
    check(a, b, {algo = algo}, "matmul of transposed views " .. algo)
    check(x:narrow(2, 3, 20), U.randn({20, 7}), {algo = algo}, "matmul of narrowed views " .. algo)
  end
end

function TestMatmul:test_identity_and_exact_integers()
  local a = fa.tensor({{1, 2}, {3, 4}}, {device = dev})
  local id = fa.tensor({{1, 0}, {0, 1}}, {device = dev})
  for _, algo in ipairs(ALGOS) do
    lu.assertEquals(fa.matmul(a, id, {algo = algo}):totable(), {{1, 2}, {3, 4}})
    lu.assertEquals(fa.matmul(a, a, {algo = algo}):totable(), {{7, 10}, {15, 22}})
  end
end

function TestMatmul:test_shape_errors()
  local a = U.randn({2, 3})
  U.assert_fa_error({}, fa.matmul, a, U.randn({4, 5}))
  U.assert_fa_error({}, fa.matmul, U.randn({2, 3, 4}), U.randn({4, 5}))
  U.assert_fa_error({}, fa.matmul, U.randn({3}), U.randn({3, 2}))
  U.assert_fa_error({}, fa.matmul, a, U.randn({3, 2}, "f16"))
  U.assert_fa_error({"algo"}, fa.matmul, a, U.randn({3, 2}), {algo = "strassen"})
  U.assert_fa_error({"out"}, fa.matmul, a, U.randn({3, 2}), {out = U.randn({3, 2})})
  U.assert_fa_error({"out"}, fa.matmul, a, U.randn({3, 2}), {out = U.randn({2, 2}, "f64")})
  U.assert_fa_error({"b"}, fa.matmul, a, "b")
  U.assert_fa_error({}, fa.matmul, a, U.randn({3, 2}), {nonsense = 1})
  -- and it still works
  check(a, U.randn({3, 2}), {}, "matmul after errors")
end

U.run()
