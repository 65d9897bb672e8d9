-- is_live: whether a list's owner (a server id and the incarnation the list belongs to) is live.
-- Live means registered with that incarnation. Registration, not the clock: a server whose
-- deadline has passed stays live until a sweep prunes it -- which is why the sweep prunes before
-- it drains (or recovery would lag a whole period behind).
local function is_live(servers, incarnations, server_id, incarnation)
  if not redis.call('ZSCORE', servers, server_id) then return false end
  return redis.call('HGET', incarnations, server_id) == incarnation
end
