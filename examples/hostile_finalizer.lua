-- A finalizer that never ends: Lua runs __gc with hooks off, so the
-- sandbox refuses __gc metatables (host_plugin's message expected).
setmetatable({}, {__gc = function() while true do end end})
collectgarbage()
