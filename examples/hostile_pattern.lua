-- Patterns whose backtracking takes exponential or quadratic time in C:
-- host_plugin must refuse each before the matcher starts, and still let
-- ordinary patterns through.
local n = 0
local function refused(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok and tostring(err):find("host_plugin: string%.%a+: would take"), tostring(err))
  n = n + 1
end
local a = string.rep("a", 40)
refused(string.find, a, string.rep("a?", 40) .. a .. "b")        -- 2^40 paths
refused(string.match, string.rep("a", 1e5), "a*b")                -- n^2
refused(string.gsub, string.rep("a", 1e5), "a-a-b", "")
refused(function() for _ in string.gmatch(string.rep(" ", 1e5) .. "x", "%s*$") do end end)
refused(string.find, string.rep("a", 5e5), string.rep("a?", 5e5) .. string.rep("a", 5e5))
-- what is not refused
assert(("  trim me  "):match("^%s*(.-)%s*$") == "trim me")
assert(select(2, string.rep("word ", 1e5):gsub("%a+", "")) == 1e5)
assert(string.rep("x", 1e5):find("y", 1, true) == nil)
-- and the worst case of all, last
return string.find(string.rep("a", 5e5), string.rep("a?", 5e5) .. string.rep("a", 5e5))
