-- string.rep of an empty string a maxinteger times: a C loop that calls
-- nothing and allocates nothing.  host_plugin must refuse it.
return string.rep("", math.maxinteger)
