-- Work done by C functions that C code calls, which run no Lua instruction:
-- table.sort over 2^31 - 2 elements that a C __index makes up.  The hook
-- counts calls, so the host's budget or time limit stops it.
table.sort(setmetatable({}, {__index = rawlen, __len = function() return (1 << 31) - 2 end}))
