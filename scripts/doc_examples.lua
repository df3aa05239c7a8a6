-- doc_examples.lua: runs every ```lua block of the given Markdown files, each
-- in its own environment, so that the documentation's examples stay true.
-- A block fails when it raises an error; the run then exits with status 1.
--
--   build/flashattn-lua scripts/doc_examples.lua docs/lua-api.md README.md
local files = {...}
if #files == 0 then
  io.stderr:write("doc_examples.lua: expected Markdown files to check\n")
  os.exit(1)
end
local failures, blocks = 0, 0
for _, path in ipairs(files) do
  local f = io.open(path, "r")
  if not f then
    io.stderr:write(("doc_examples.lua: cannot read %s\n"):format(path))
    os.exit(1)
  end
  local text = f:read("a")
  f:close()
  local line = 1
  local pos = 1
  while true do
    local s, e, code = text:find("\n```lua\n(.-\n)```", pos)
    if not s then break end
    local _, before = text:sub(1, s):gsub("\n", "")
    line = before + 2 -- the first line of the code
    blocks = blocks + 1
    local name = ("%s:%d"):format(path, line)
    local env = setmetatable({}, {__index = _G})
    local chunk, err = load(code, "@" .. name, "t", env)
    local ok = chunk ~= nil
    if ok then ok, err = xpcall(chunk, debug.traceback) end
    collectgarbage()
    if not ok then
      failures = failures + 1
      io.stderr:write(("FAIL %s: %s\n"):format(name, tostring(err)))
    end
    pos = e
  end
end
print(("doc_examples: %d blocks, %d failed"):format(blocks, failures))
if failures > 0 or blocks == 0 then os.exit(1) end
