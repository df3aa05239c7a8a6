-- table.move over 2^62 absent elements, and table.insert/remove shifting a
-- length that __len makes up: C loops that call nothing.  host_plugin must
-- refuse each.
local ok, err = pcall(table.insert, setmetatable({}, {__len = function() return 1 << 62 end}), 1, 0)
assert(not ok and tostring(err):find("host_plugin: table.insert"), tostring(err))
ok, err = pcall(table.remove, setmetatable({}, {__len = function() return 1 << 62 end}), 1)
assert(not ok and tostring(err):find("host_plugin: table.remove"), tostring(err))
return table.move({}, 1, 1 << 62, 2)
