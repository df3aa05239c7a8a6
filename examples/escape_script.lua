-- A plugin script that tries to get out of host_plugin's sandbox
-- (examples/host_plugin.c) through everything the engine hands it: the
-- flashattn table, tensors, their metatables and methods, the string
-- metatable, and what their functions return.  It must find no way to the
-- io, os, package or debug libraries, to require/dofile/loadfile, or to the
-- registry, and binary chunks must not load.  Then it does its job (the
-- attention output in o), so the host checks O as usual.
local q, k, v, o = ...
local fa = flashattn
local found = {}

-- functions and tables that only those libraries hold, by what is in them
local FINGERPRINTS = {
  io = {"open", "popen", "lines", "stdout"}, os = {"execute", "getenv", "remove", "exit"},
  package = {"loadlib", "searchers", "cpath", "preload"}, debug = {"getregistry", "sethook", "getupvalue"},
}
local function looks_like(t)
  for lib, keys in pairs(FINGERPRINTS) do
    local hits = 0
    for _, key in ipairs(keys) do if rawget(t, key) ~= nil then hits = hits + 1 end end
    if hits >= 2 then return lib end
  end
  -- the registry holds _LOADED and the main thread at [1]
  if rawget(t, "_LOADED") ~= nil or type(rawget(t, 1)) == "thread" then return "the registry" end
end

-- Everything reachable from the roots through table keys and values,
-- metatables (as getmetatable shows them) and the results of calling each
-- function reached with no arguments and with a tensor.
local seen, queue = {}, {}
local function push(x, path)
  if (type(x) == "table" or type(x) == "function" or type(x) == "userdata" or type(x) == "thread") and not seen[x] then
    seen[x] = path
    queue[#queue + 1] = x
  end
end
push(fa, "flashattn")
push(q, "the host's tensor q")
push(fa.zeros(2), "a tensor of its own")
push(getmetatable(""), "the string metatable")
local calls = 0
while #queue > 0 do
  local x = table.remove(queue, 1)
  local path = seen[x]
  if type(x) == "table" then
    local lib = looks_like(x)
    if lib then found[#found + 1] = path .. " is " .. lib end
    for key, val in next, x do
      push(key, path .. "[key]")
      push(val, path .. "." .. tostring(key))
    end
  elseif type(x) == "function" then
    -- call it: with nothing, and with a tensor of its own (it may free or
    -- fill it; errors are fine)
    for _, args in ipairs({{}, {fa.zeros(2, 2)}, {fa.ones(3), "f64"}}) do
      calls = calls + 1
      local res = table.pack(pcall(x, table.unpack(args)))
      for i = 2, res.n do push(res[i], path .. "(...)") end
    end
  end
  local mt = getmetatable(x)
  if mt ~= nil then push(mt, path .. " metatable") end
  if type(x) == "userdata" and mt == nil then found[#found + 1] = path .. ": a userdata with no metatable" end
end

-- globals of the sandbox itself
for _, name in ipairs({"io", "os", "package", "debug", "require", "dofile", "loadfile", "coroutine", "utf8"}) do
  if _G[name] ~= nil then found[#found + 1] = "the global " .. name end
end
-- binary chunks: string.dump makes them, load must refuse them
local chunk = string.dump(function() return 1 end)
local f, err = load(chunk)
if f then found[#found + 1] = "load accepted a binary chunk"
elseif not tostring(err):find("binary") then found[#found + 1] = "load's refusal: " .. tostring(err) end
assert(load("return 2")() == 2, "load of text works")
-- the process-wide engine settings are the host's
if fa.set_memory_limit or fa.set_default_device then found[#found + 1] = "the engine's process-wide settings" end

if #found > 0 then error("sandbox escape routes:\n  " .. table.concat(found, "\n  ")) end
fa.attention(q, k, v, {causal = true, out = o})
local n = 0
for _ in pairs(seen) do n = n + 1 end
return ("the sandbox held: %d objects reached, %d calls made, no way out"):format(n, calls)
