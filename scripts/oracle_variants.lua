-- The outside oracle for the attention variants of API §9 (score_mod and
-- mask_mod written in Lua), engine side.  scripts/oracle_variants.py is the
-- other half: it recomputes every case written here with PyTorch's
-- FlexAttention (torch.nn.attention.flex_attention) from the same rules, on
-- the same tensors, and judges the engine's outputs with FlashAttention's
-- criterion (its docstring says how).
--
-- A case's rules are small expression trees in JSON, the operators the Lua
-- tracer allows (docs/variants.md):
--   {"op": "s" | "b" | "h" | "q" | "k"}            the score; positions, 1-based
--   {"op": "const", "value": x}                     a number (or a boolean)
--   {"op": "add" | "sub" | "mul" | "div" | "mod" | "pow" | "min" | "max" |
--          "lt" | "le" | "gt" | "ge" | "eq" | "ne" | "and" | "or", "a": A, "b": B}
--   {"op": "neg" | "abs" | "exp" | "log" | "tanh" | "sqrt" | "floor" | "not", "a": A}
--   {"op": "where", "c": C, "a": A, "b": B}
--   {"op": "read", "tensor": name, "index": [I1, ...]}   a captured tensor, 1-based
-- The captured tensors are arrays in the case ("tensors": {name: {"shape",
-- "data"}}, f32 values).  Each tree becomes Lua source (kept in the case as
-- "lua") that builds the same expression with the traced operators: `+ - * /
-- % ^`, unary minus, `:abs() ... :min(x) :lt(x) ...`, `& | ~`, fa.where,
-- `t[i][j]` on the captured tensors (upvalues named as in the case), and plain
-- Lua where both operands are numbers (math.min, `<`, `and`, ...).
--
-- Cases: the five examples of §9 (alibi through slopes[h], soft-capping at 30,
-- a causal sliding window of W keys, document masking through doc[q] ==
-- doc[k], prefix LM with a number), two compositions (alibi + sliding,
-- softcap + document), then --cases random compositions: a score_mod over s,
-- the positions, constants and captured tensors (bias terms c·(q - k),
-- -slopes[h]·|q - k|, exp, log, sqrt, tanh, pow, floor and mod of positions,
-- bias[h][q], where on position conditions; on s only continuous operations:
-- sums, products, tanh caps, min/max, abs, sqrt, division by a positive
-- term) and/or a mask_mod (comparisons of affine position terms, blocks,
-- parities, doc ids, heads and batches, combined with & | ~, where and eq/ne
-- of booleans, a guarded read fa.where(k:gt(1), doc[k - 1], -1) at times).
-- Position terms are integers and mask constants integers, so a mask (and a
-- condition inside a score_mod) has the same value in f32 on the GPU, in f64
-- on the CPU and in PyTorch.  Rows that attend no key are allowed (a mask is
-- drawn again when more than a third of the rows would be empty, counted with
-- fa.block_mask); the engine gives them zeros and lse = -inf.
-- Case i depends only on (--seed, i): --case replays some cases alone.
-- Shapes: B 1..2, H 2 or 4 query heads (GQA Hkv = H/2 in about a third of the
-- cases), Lq = Lk from 64 to 384 (multiples of 64 about half the time; Lq !=
-- Lk in some non-causal random cases), bf16 and f16 at D 64 or 128 (the
-- tensor-core kernels) and f32 at D 32 (the SIMT kernel); causal (Lq == Lk)
-- in some cases; scale = 1 in some.
--
-- Per case: q, k, v from fa.randn (seeded) on --device in the case's dtype;
-- fa.attention(q, k, v, {score_mod, mask_mod, causal, scale, return_lse =
-- true}) twice: the two o and lse must be bit-identical (fa.max_abs_diff ==
-- 0); then fa.attention_backward with a seeded dout, twice: with
-- deterministic = true in every other case (all three gradients
-- bit-identical), else the default (dk, dv bit-identical; dq may be summed
-- with atomics, API §10); fa.attention_reference (f64 on the
-- CPU, the engine's own plain code) for the Python side's self-check
-- (--no-reference skips it).  Files, in --out:
-- case_NNN_{q,k,v,o,lse,dout,dq,dk,dv}.npy (bf16 is written widened to f32, exact),
-- case_NNN_{ref_o,ref_lse}.npy (f64), and cases.json: meta (sweep.run_meta:
-- version, date, commit, command, seed; device, GPU) and per case its id,
-- name, kind, shape, dtype, causal, scale, trees, tensors, Lua source, files,
-- deterministic, empty_rows, kernel, rel_err_vs_reference, and error when the
-- call failed.  Exit status 1 when a call failed or was not bit-identical.
--
-- Usage (GPU machine, after scripts/gpu_run.sh's build):
--   build-gpu/flashattn-lua scripts/oracle_variants.lua --out out/ov [--cases 40] [--seed 1]
--   python3 scripts/oracle_variants.py --dir out/ov --json out/oracle_variants.json [--commit C]
-- Smoke test on the CPU (the CPU engine evaluates variants too):
--   build-gpu/flashattn-lua scripts/oracle_variants.lua --device cpu --out /tmp/ov --cases 5
--   python3 scripts/oracle_variants.py --dir /tmp/ov --json /tmp/ov.json --self-check
local root = (arg and arg[0] or ""):match("^(.*)/scripts/[^/]*$") or "."
package.path = root .. "/lua/?.lua;" .. package.path
local fa = require "flashattn"
local sweep = require "flashattn.sweep"
local cjson = require "cjson"

local NAME = "oracle_variants.lua"

local function parse(argv)
  local argparse = require "argparse"
  local p = argparse(NAME, "Attention variants (API §9) for the FlexAttention oracle (scripts/oracle_variants.py).")
  p:option("--out", "folder for the .npy files and cases.json"):args(1):count(1)
  p:option("--cases", "random compositions after the 7 fixed cases"):convert(sweep.integer_arg(0, "--cases"))
    :default("24")
  p:option("--seed", "seed of the cases and their inputs"):convert(sweep.integer_arg(0, "--seed")):default("1")
  p:option("--device", "cuda, or cpu for a smoke test"):choices({ "cuda", "cpu" }):default("cuda")
  p:option("--case", "comma list of case ids: run only these (the same --seed)")
    :convert(sweep.list_arg("--case", true))
  p:flag("--no-reference", "do not save fa.attention_reference's output (the Python side's --self-check needs it)")
  return sweep.parse_args(p, argv, NAME)
end

-- ---- trees ------------------------------------------------------------------------
local function lift(x)
  if type(x) == "table" then return x end
  return { op = "const", value = x }
end
local function op2(op, a, b) return { op = op, a = lift(a), b = lift(b) } end
local function op1(op, a) return { op = op, a = lift(a) } end
local function where(c, a, b) return { op = "where", c = lift(c), a = lift(a), b = lift(b) } end
local function read(name, ...)
  local idx = {}
  for i, x in ipairs({ ... }) do idx[i] = lift(x) end
  return { op = "read", tensor = name, index = idx }
end
local S, Bp, Hp, Qp, Kp = { op = "s" }, { op = "b" }, { op = "h" }, { op = "q" }, { op = "k" }

local ARITH = { add = "+", sub = "-", mul = "*", div = "/", mod = "%", pow = "^" }
local CMP = { lt = { "gt", "<" }, le = { "ge", "<=" }, gt = { "lt", ">" }, ge = { "le", ">=" },
  eq = { "eq", "==" }, ne = { "ne", "~=" } } -- the flipped method, the plain operator
local UNARY = { abs = "math.abs", exp = "math.exp", log = "math.log", tanh = "ctanh", sqrt = "math.sqrt",
  floor = "cfloor" }
local POSITIONS = { s = true, b = true, h = true, q = true, k = true }
local RESERVED = { s = 1, b = 1, h = 1, q = 1, k = 1, fa = 1, ctanh = 1, cfloor = 1, math = 1, _ENV = 1 }

local function num_lit(x)
  assert(type(x) == "number" and x == x and x ~= math.huge and x ~= -math.huge, "a constant must be a finite number")
  local s = ("%.17g"):format(x)
  if not s:find("[%.eEn]") then s = s .. ".0" end
  if x < 0 or s:sub(1, 1) == "-" then s = "(" .. s .. ")" end
  return s
end

-- Lua source of a node: src, constant (a plain Lua value at trace time), kind
-- ("num" or "bool"); reads lists the tensors read.
local function gen(n, mask, reads)
  local op = n.op
  if POSITIONS[op] then
    if mask and op == "s" then error("a mask_mod tree uses s", 0) end
    return op, false, "num"
  elseif op == "const" then
    if type(n.value) == "boolean" then return tostring(n.value), true, "bool" end
    return num_lit(n.value), true, "num"
  elseif op == "read" then
    local name = n.tensor
    if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") or RESERVED[name] then
      error("bad tensor name " .. tostring(name), 0)
    end
    reads[name] = true
    local src, const = name, true
    for _, i in ipairs(n.index) do
      local is, ic, ik = gen(i, mask, reads)
      if ik ~= "num" then error("a tensor index is a boolean", 0) end
      src, const = src .. "[" .. is .. "]", const and ic
    end
    return src, const, "num"
  elseif op == "where" then
    local cs, cc = gen(n.c, mask, reads)
    local as, ac, ak = gen(n.a, mask, reads)
    local bs, bc = gen(n.b, mask, reads)
    return ("fa.where(%s, %s, %s)"):format(cs, as, bs), cc and ac and bc, ak
  elseif op == "neg" then
    local as, ac = gen(n.a, mask, reads)
    return "(-" .. as .. ")", ac, "num"
  elseif op == "not" then
    local as, ac = gen(n.a, mask, reads)
    return ac and ("(not " .. as .. ")") or ("(~" .. as .. ")"), ac, "bool"
  elseif UNARY[op] then
    local as, ac = gen(n.a, mask, reads)
    if ac then return ("%s(%s)"):format(UNARY[op], as), true, "num" end
    return ("(%s):%s()"):format(as, op), false, "num"
  end
  local as, ac, ak = gen(n.a, mask, reads)
  local bs, bc = gen(n.b, mask, reads)
  if ARITH[op] then
    return ("(%s %s %s)"):format(as, ARITH[op], bs), ac and bc, "num"
  elseif op == "min" or op == "max" then
    if not ac then return ("(%s):%s(%s)"):format(as, op, bs), false, "num" end
    if not bc then return ("(%s):%s(%s)"):format(bs, op, as), false, "num" end
    return ("math.%s(%s, %s)"):format(op, as, bs), true, "num"
  elseif CMP[op] then
    if not ac then return ("(%s):%s(%s)"):format(as, op, bs), false, "bool" end
    if not bc then return ("(%s):%s(%s)"):format(bs, CMP[op][1], as), false, "bool" end
    return ("(%s %s %s)"):format(as, CMP[op][2], bs), true, "bool"
  elseif op == "and" or op == "or" then
    if ac and bc then return ("(%s %s %s)"):format(as, op, bs), true, "bool" end
    return ("(%s %s %s)"):format(as, op == "and" and "&" or "|", bs), false, "bool"
  end
  error("unknown op " .. tostring(op), 0)
end

-- The Lua source of a score_mod (mask = false) or mask_mod tree, and the
-- names of the tensors it reads (its upvalues, in order).
local function lua_source(tree, mask)
  local reads = {}
  local body = gen(tree, mask, reads)
  local names = {}
  for name in pairs(reads) do names[#names + 1] = name end
  table.sort(names)
  local params = mask and "b, h, q, k" or "s, b, h, q, k"
  local head = "local fa, ctanh, cfloor" .. (#names > 0 and (", " .. table.concat(names, ", ")) or "") .. " = ...\n"
  return head .. ("return function(%s) return %s end"):format(params, body), names
end

local function ctanh(x) -- only for constant subtrees (5.4 has no math.tanh)
  if x > 20 then return 1.0 elseif x < -20 then return -1.0 end
  local e = math.exp(2 * x)
  return (e - 1) / (e + 1)
end
local function cfloor(x) return math.floor(x) + 0.0 end

-- The traced function of a tree, with its tensors from `tensors` (name -> fa tensor).
local function lua_function(tree, mask, tensors, what)
  local src, names = lua_source(tree, mask)
  local chunk = assert(load(src, "=" .. what, "t"))
  local args = { fa, ctanh, cfloor }
  for i, name in ipairs(names) do args[3 + i] = assert(tensors[name], "tensor " .. name .. " is not in the case") end
  return chunk(table.unpack(args, 1, 3 + #names)), src
end

-- ---- drawing cases ----------------------------------------------------------------
local function pick(list) return list[math.random(#list)] end
local function chance(p) return math.random() < p end
local function f32(x) return (string.unpack("f", string.pack("f", x))) end

local function documents(L)
  local ids, n, d = {}, 0, 0
  while n < L do
    d = d + 1
    local len = math.min(L - n, math.random(8, math.max(8, L // 3)))
    for i = n + 1, n + len do ids[i] = d end
    n = n + len
  end
  return ids
end

local function draw_shape(c, opts)
  opts = opts or {}
  c.dtype = pick({ "bf16", "bf16", "f16", "f16", "f32" })
  c.B = math.random(1, 2)
  c.H = pick({ 2, 4 })
  c.Hkv = chance(0.35) and c.H // 2 or c.H
  local function length()
    if chance(0.5) then return pick({ 64, 128, 192, 256, 320, 384 }) end
    return math.random(64, 384)
  end
  c.Lq = length()
  c.causal = opts.causal
  if c.causal == nil then c.causal = opts.random and chance(0.25) or false end
  c.Lk = (opts.random and not c.causal and chance(0.2)) and length() or c.Lq
  c.D = c.dtype == "f32" and 32 or pick({ 64, 128 })
  c.input_seed = math.random(1, 1 << 30)
end

-- The tensors a case may read, made when first used: slopes (H), doc (ids of
-- max(Lq, Lk) positions), bias (H x Lq, 0.5·N(0, 1)-ish, f32 values).
local function tensor_maker(c)
  c.tensors = {}
  return function(name)
    if not c.tensors[name] then
      if name == "slopes" then
        local t = {}
        for h = 1, c.H do t[h] = 2 ^ (-8 * h / c.H) end
        c.tensors.slopes = { shape = { c.H }, data = t }
      elseif name == "doc" then
        local L = math.max(c.Lq, c.Lk)
        c.tensors.doc = { shape = { L }, data = documents(L) }
      elseif name == "bias" then
        local t = {}
        for h = 1, c.H do
          t[h] = {}
          for i = 1, c.Lq do
            local u1, u2 = math.random(), math.random()
            t[h][i] = f32(0.5 * math.sqrt(-2 * math.log(1 - u1)) * math.cos(2 * math.pi * u2))
          end
        end
        c.tensors.bias = { shape = { c.H, c.Lq }, data = t }
      end
    end
    return name
  end
end

local function canonical_cases(c, which)
  local T = tensor_maker(c)
  local L = c.Lk
  local W = math.random(16, math.max(16, L // 3))
  local alibi = op2("sub", S, op2("mul", read(T "slopes", Hp), op1("abs", op2("sub", Qp, Kp))))
  local softcap = op2("mul", op1("tanh", op2("div", S, 30)), 30)
  local sliding = op2("and", op2("ge", Qp, Kp), op2("le", op2("sub", Qp, Kp), W))
  local document = op2("and", op2("eq", read(T "doc", Qp), read(T "doc", Kp)), op2("ge", Qp, Kp))
  local prefix_lm = op2("or", op2("le", Kp, L // 4), op2("ge", Qp, Kp))
  if which == "alibi" then c.score_mod = alibi
  elseif which == "softcap" then c.score_mod, c.scale = softcap, 1.0 -- scores of ~sqrt(D): the cap matters
  elseif which == "sliding" then c.mask_mod, c.window = sliding, W
  elseif which == "document" then c.mask_mod = document
  elseif which == "prefix_lm" then c.mask_mod, c.prefix = prefix_lm, L // 4
  elseif which == "alibi+sliding" then c.score_mod, c.mask_mod, c.window = alibi, sliding, W
  elseif which == "softcap+document" then c.score_mod, c.mask_mod, c.scale = softcap, document, 1.0
  end
end

-- Random trees.  Position terms have integer values; bias terms are numbers
-- without s; score terms use s through continuous operations only.
local function random_trees(c)
  local T = tensor_maker(c)
  local L = math.min(c.Lq, c.Lk)
  local function dyadic(list) return pick(list) * pick({ 1, -1 }) end

  local pos_term
  pos_term = function()
    local r = math.random(15)
    if r == 1 then return op2("sub", Qp, Kp)
    elseif r == 2 then return op2("sub", Kp, Qp)
    elseif r == 3 then return op1("abs", op2("sub", Qp, Kp))
    elseif r == 4 then return pick({ Qp, Kp })
    elseif r == 5 then return op2("add", Qp, Kp)
    elseif r == 6 then return op2("sub", Qp, op2("mul", 2, Kp))
    elseif r == 7 then return op2("mod", pick({ Qp, Kp, op2("sub", Qp, Kp) }), pick({ 2, 3, 7, 16 }))
    elseif r == 8 then return op1("floor", op2("div", pick({ Qp, Kp }), pick({ 2, 4, 16, 32, 64 })))
    elseif r == 9 then return op2(pick({ "min", "max" }), Qp, Kp)
    elseif r == 10 then return op2("add", op2("sub", Qp, Kp), math.random(-L // 4, L // 4))
    elseif r == 11 then return read(T "doc", pick({ Qp, Kp }))
    elseif r == 12 then return op2("mul", Hp, pick({ 1, 2, 3 }))
    elseif r == 13 then return op2("sub", Bp, 1)
    elseif r == 14 then return op2("sub", L, Qp)
    else return op1("neg", Kp) end
  end

  local bool_pos
  bool_pos = function(depth)
    local r = math.random(depth > 0 and 16 or 11)
    if r == 1 then return op2(pick({ "lt", "le", "gt", "ge" }), Qp, Kp)
    elseif r == 2 then return op2(pick({ "lt", "le", "gt", "ge" }), op2("sub", Qp, Kp), math.random(-L // 3, L // 3))
    elseif r == 3 then return op2("le", op1("abs", op2("sub", Qp, Kp)), math.random(4, L // 2))
    elseif r == 4 then return chance(0.5) and op2("le", Kp, math.random(1, L)) or op2("gt", Qp, math.random(0, L // 2))
    elseif r == 5 then
      local m = pick({ 16, 32, 64 })
      return op2("eq", op1("floor", op2("div", Qp, m)), op1("floor", op2("div", Kp, m)))
    elseif r == 6 then return op2(pick({ "eq", "ne" }), op2("mod", Qp, 2), op2("mod", Kp, 2))
    elseif r == 7 then return op2("eq", read(T "doc", Qp), read(T "doc", Kp))
    elseif r == 8 then return op2(pick({ "le", "ge" }), op2("add", Qp, Kp), math.random(L // 2, 3 * L // 2))
    elseif r == 9 then return op2(pick({ "eq", "ne", "ge", "le" }), Hp, math.random(1, c.H))
    elseif r == 10 then
      -- a guarded read: doc[k - 1] is out of range at k = 1, where fa.where discards it
      return op2("eq", read(T "doc", Qp), where(op2("gt", Kp, 1), read(T "doc", op2("sub", Kp, 1)), -1))
    elseif r == 11 then return op2(pick({ "lt", "le", "gt", "ge", "ne" }), pos_term(), pos_term())
    elseif r <= 13 then return op2(pick({ "and", "or" }), bool_pos(depth - 1), bool_pos(depth - 1))
    elseif r == 14 then return op1("not", bool_pos(depth - 1))
    elseif r == 15 then return where(bool_pos(depth - 1), bool_pos(depth - 1), bool_pos(depth - 1))
    else return op2(pick({ "eq", "ne" }), bool_pos(depth - 1), bool_pos(depth - 1)) end
  end

  local bias
  bias = function(depth)
    local r = math.random(depth > 0 and 15 or 12)
    local p = pos_term()
    if r == 1 then return op2("mul", dyadic({ 1 / 8, 1 / 16, 1 / 32, 1 / 64 }), p)
    elseif r == 2 then return op1("neg", op2("mul", read(T "slopes", Hp), op1("abs", p)))
    elseif r == 3 then return op1("exp", op1("neg", op2("div", op1("abs", p), pick({ 8, 32, 100 }))))
    elseif r == 4 then return op1("log", op2("add", op1("abs", p), 1))
    elseif r == 5 then return op2("mul", op1("sqrt", op1("abs", p)), dyadic({ 0.25, 0.5 }))
    elseif r == 6 then return op2("mul", op1("tanh", op2("div", p, 64)), dyadic({ 1, 2, 4 }))
    elseif r == 7 then return read(T "bias", Hp, Qp)
    elseif r == 8 then return op2("mul", op2("sub", op2("mod", p, 7), 3), 0.25)
    elseif r == 9 then return op2("pow", op2("add", op1("abs", p), 1), pick({ 0.5, 0.25 }))
    elseif r == 10 then return op2("mul", op2("pow", op2("div", p, L), 2), dyadic({ 1, 4 }))
    elseif r == 11 then return where(op2("eq", Bp, 1), 0, -1)
    elseif r == 12 then return op2("mul", Hp, -0.5)
    elseif r == 13 then return where(bool_pos(1), bias(depth - 1), bias(depth - 1))
    elseif r == 14 then return op2(pick({ "min", "max" }), bias(depth - 1), dyadic({ 0.5, 1, 2 }))
    else return op2(pick({ "add", "sub", "mul" }), bias(depth - 1), bias(depth - 1)) end
  end

  local score
  score = function(depth)
    if depth == 0 then return S end
    local r = math.random(12)
    if r <= 3 then return op2(pick({ "add", "sub" }), score(depth - 1), bias(1))
    elseif r == 4 then return op2("mul", score(depth - 1), pick({ 0.5, 1.5, 2, -1 }))
    elseif r == 5 then
      local cap = pick({ 5, 10, 20, 30 })
      return op2("mul", op1("tanh", op2("div", score(depth - 1), cap)), cap)
    elseif r == 6 then
      return chance(0.5) and op2("min", score(depth - 1), pick({ 1, 2, 4 }))
        or op2("max", pick({ -1, -2, -4 }), score(depth - 1))
    elseif r == 7 then return where(bool_pos(1), score(depth - 1), score(depth - 1))
    elseif r == 8 then
      return op2("mul", score(depth - 1), op2("add", 1, op2("mul", 0.5, op1("tanh", op2("div", pos_term(), 32)))))
    elseif r == 9 then return op2("div", score(depth - 1), op2("add", 1, op2("div", op1("abs", pos_term()), 64)))
    elseif r == 10 then return op1("abs", score(depth - 1))
    elseif r == 11 then return op1("sqrt", op2("add", op1("abs", score(depth - 1)), 1))
    else return op2("add", score(depth - 1), op2("mul", bias(0), op1("tanh", S))) end
  end

  local r = math.random()
  if r < 0.7 then c.score_mod = score(math.random(1, 3)) end
  if r >= 0.3 then c.mask_mod = bool_pos(math.random(0, 3)) end
  if chance(0.2) then c.scale = pick({ 1.0, 0.25 }) end
end

-- Rows that a case's mask (and causal) leaves with no key, counted with
-- fa.block_mask over (1 x Lk) tiles on the CPU; nil without a mask.
local function empty_rows(c, cpu_tensors)
  if not c.mask_mod then return nil end
  local mm = lua_function(c.mask_mod, true, cpu_tensors, "mask_mod")
  local shift = c.Lk - c.Lq
  local f = mm
  if c.causal then f = function(b, h, q, k) return mm(b, h, q, k) & k:le(q + shift) end end
  -- on the CPU whatever the default device (a GPU block mask takes the kernels' tiles only)
  local prev = fa.default_device()
  fa.set_default_device("cpu")
  local ok, bm = pcall(fa.block_mask, f, c.B, c.H, c.Lq, c.Lk, { tile = { 1, c.Lk } })
  fa.set_default_device(prev)
  if not ok then error(bm, 0) end
  return (bm:counts())
end

local function fa_tensors(c, device)
  local t = {}
  for name, spec in pairs(c.tensors or {}) do t[name] = fa.tensor(spec.data, { device = device }) end
  return t
end

-- Drops the tensors that neither tree reads.
local function keep_used_tensors(c)
  local keep = {}
  for _, tree in ipairs({ c.score_mod or false, c.mask_mod or false }) do
    if tree then
      local _, names = lua_source(tree, tree == c.mask_mod)
      for _, n in ipairs(names) do keep[n] = c.tensors[n] end
    end
  end
  c.tensors = keep
end

-- The case of id i (1..7 the fixed ones), from (seed, i) alone.
local FIXED = { "alibi", "softcap", "sliding", "document", "prefix_lm", "alibi+sliding", "softcap+document" }
local function draw_case(seed, i)
  math.randomseed(seed, i)
  local c = { id = i }
  if FIXED[i] then
    c.name, c.kind = FIXED[i], i <= 5 and "canonical" or "composition"
    draw_shape(c, { causal = false })
    canonical_cases(c, c.name)
  else
    c.name, c.kind = ("random_%d"):format(i - #FIXED), "random"
    draw_shape(c, { random = true })
    for _ = 1, 20 do
      c.score_mod, c.mask_mod, c.scale = nil, nil, nil
      random_trees(c)
      -- a mask that empties more than a third of the rows is drawn again
      keep_used_tensors(c)
      local e = empty_rows(c, fa_tensors(c, "cpu"))
      if not e or e * 3 <= c.B * c.H * c.Lq then break end
    end
  end
  keep_used_tensors(c)
  if next(c.tensors) == nil then c.tensors = nil end
  return c
end

-- ---- running ----------------------------------------------------------------------
local function shape_text(c)
  return ("B%d H%d/%d L%d/%d D%d %s%s"):format(c.B, c.H, c.Hkv, c.Lq, c.Lk, c.D, c.dtype, c.causal and " causal" or "")
end

local function run_case(c, dev, dir, with_reference)
  local tensors = fa_tensors(c, dev)
  local opts = { causal = c.causal or nil, scale = c.scale, return_lse = true }
  if c.score_mod then opts.score_mod, c.lua_score_mod = lua_function(c.score_mod, false, tensors, "score_mod") end
  if c.mask_mod then opts.mask_mod, c.lua_mask_mod = lua_function(c.mask_mod, true, tensors, "mask_mod") end
  local s = c.input_seed
  local q = fa.randn({ c.B, c.H, c.Lq, c.D }, { dtype = c.dtype, device = dev, seed = s })
  local k = fa.randn({ c.B, c.Hkv, c.Lk, c.D }, { dtype = c.dtype, device = dev, seed = s + 1 })
  local v = fa.randn({ c.B, c.Hkv, c.Lk, c.D }, { dtype = c.dtype, device = dev, seed = s + 2 })
  local kopts = {}
  for key, val in pairs(opts) do kopts[key] = val end
  kopts.return_lse = nil
  local okk, ks = pcall(fa.kernels, q, k, v, kopts)
  c.kernel = okk and ks[1] or nil
  local t0 = sweep.wall_ns()
  local o1, l1 = fa.attention(q, k, v, opts)
  if dev == "cuda" then fa.sync() end
  c.first_call_s = t0 and (sweep.wall_ns() - t0) * 1e-9 or nil
  local o2, l2 = fa.attention(q, k, v, opts)
  c.deterministic = fa.max_abs_diff(o1, o2) == 0 and fa.max_abs_diff(l1, l2) == 0
  c.finite = o1:cpu():isfinite()
  local n = 0
  for _, bh in ipairs(l1:cpu():totable()) do
    for _, row in ipairs(bh) do
      for _, x in ipairs(row) do if x == -math.huge then n = n + 1 end end
    end
  end
  c.empty_rows = n
  local base = ("case_%03d_"):format(c.id)
  c.files = {}
  local function save(key, t)
    c.files[key] = base .. key .. ".npy"
    fa.save(dir .. "/" .. c.files[key], t)
  end
  save("q", q); save("k", k); save("v", v); save("o", o1); save("lse", l1)
  -- the backward (API §10): the chain rule through score_mod, mask_mod's keys
  -- passing nothing back; run twice, bit for bit
  local bopts = {}
  for key, val in pairs(opts) do bopts[key] = val end
  bopts.return_lse = nil
  local dout = fa.randn({ c.B, c.H, c.Lq, c.D }, { dtype = c.dtype, device = dev, seed = s + 3 })
  -- every other case asks for opts.deterministic (all three gradients bit-identical);
  -- the others take the default, which may add dq up with atomics (API §10: its last
  -- bits vary, dk's and dv's do not).  One compiled backward a case either way.
  bopts.deterministic = c.id % 2 == 0 or nil
  c.backward_opts_deterministic = bopts.deterministic == true
  local g1 = { fa.attention_backward(q, k, v, o1, l1, dout, bopts) }
  local g2 = { fa.attention_backward(q, k, v, o1, l1, dout, bopts) }
  c.backward_deterministic = true
  for i = bopts.deterministic and 1 or 2, 3 do
    if fa.max_abs_diff(g1[i], g2[i]) ~= 0 then c.backward_deterministic = false end
  end
  c.deterministic = c.deterministic and c.backward_deterministic
  save("dout", dout); save("dq", g1[1]); save("dk", g1[2]); save("dv", g1[3])
  for _, t in ipairs({ dout, g1[1], g1[2], g1[3], g2[1], g2[2], g2[3] }) do t:free() end
  if with_reference then
    local ro, rl = fa.attention_reference(q, k, v, opts)
    c.rel_err_vs_reference = fa.rel_error(o1:double(), ro)
    save("ref_o", ro); save("ref_lse", rl)
    ro:free(); rl:free()
  end
  for _, t in ipairs({ q, k, v, o1, o2, l1, l2 }) do t:free() end
end

local function main(argv)
  local args = parse(argv)
  local dev, seed = args.device, args.seed
  local dir = args.out
  assert(os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'"), "cannot make " .. dir)
  cjson.encode_number_precision(14) -- the most lua-cjson writes; every number drawn has fewer digits
  local ids = args.case
  if not ids then
    ids = {}
    for i = 1, #FIXED + args.cases do ids[i] = i end
  end
  local info = fa.device_info(dev)
  print(("%s: %d cases on %s (%s), seed %d"):format(NAME, #ids, dev, info.name or "?", seed))
  local cases, bad = {}, 0
  for _, i in ipairs(ids) do
    -- the case as Python will read it: through JSON (constants and tensor values alike)
    local c = cjson.decode(cjson.encode(draw_case(seed, i)))
    for _, key in ipairs({ "B", "H", "Hkv", "Lq", "Lk", "D", "id", "input_seed" }) do
      c[key] = math.tointeger(c[key])
    end
    local ok, err = pcall(run_case, c, dev, dir, not args.no_reference)
    if not ok then
      c.error = tostring(err):match("[^\n]*")
      bad = bad + 1
    elseif not c.deterministic or not c.finite then
      bad = bad + 1
    end
    cases[#cases + 1] = c
    print(("%3d %-18s %-34s %-10s %s%s%s"):format(c.id, c.name, shape_text(c), c.kernel or "-",
      c.error and ("ERROR " .. c.error) or (c.deterministic and "bit-identical" or "NOT BIT-IDENTICAL"),
      c.empty_rows and c.empty_rows > 0 and (", %d empty rows"):format(c.empty_rows) or "",
      c.rel_err_vs_reference and (", rel err vs reference %.2g"):format(c.rel_err_vs_reference) or ""))
    collectgarbage()
  end
  sweep.write_json_object({
    meta = sweep.run_meta(seed, { device = dev, gpu = dev == "cuda" and info.name or nil, host = info.name,
      script = NAME, cases = #cases, reference_saved = not args.no_reference }),
    cases = cases,
  }, dir .. "/cases.json")
  print(("%s: %d cases, %d failed or not bit-identical; wrote %s/cases.json"):format(NAME, #cases, bad, dir))
  if bad > 0 then os.exit(1) end
end

sweep.main(NAME, main, { ... })
