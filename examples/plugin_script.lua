-- A plugin script run by host_plugin (examples/host_plugin.c) in a sandbox:
-- only the base, table, string and math libraries and the global `flashattn`.
-- The host passes its own buffers as tensors (zero copy) and expects the
-- attention output in `o`.
local q, k, v, o, params = ...
local fa = flashattn

-- the sandbox: nothing that reaches files, processes or other modules
assert(io == nil and os == nil and package == nil and require == nil and debug == nil,
  "the sandbox exposes io/os/package/require/debug")
assert(dofile == nil and loadfile == nil, "the sandbox exposes dofile/loadfile")

print(("plugin: q %s, k %s, v %s (%s on %s), causal = %s"):format(
  table.concat(q:shape(), "x"), table.concat(k:shape(), "x"), table.concat(v:shape(), "x"),
  q:dtype(), q:device(), tostring(params.causal)))

-- the algorithms agree with each other ...
local opts = {causal = params.causal}
local ref = fa.attention(q, k, v, {causal = params.causal, algo = "naive"})
for _, algo in ipairs({"two_pass", "flash_row", "flash"}) do
  opts.algo = algo
  local err = fa.rel_error(fa.attention(q, k, v, opts), ref)
  assert(err < 1e-5, ("%s differs from naive: rel error %g"):format(algo, err))
end

-- ... and the result goes straight into the host's O buffer
local out = fa.attention(q, k, v, {causal = params.causal, algo = "flash", out = o})
local err = fa.rel_error(o, ref)
assert(err < 1e-5, "o: rel error " .. err)
return ("flash into the host's O, rel error vs naive %.2e, out is o: %s"):format(err, tostring(rawequal(out, o)))
