"""The server-side scripts of the fleet cache: each checks and acts in one atomic step.

Redis runs a script without interleaving other commands, so a check (the value's type, its
size, the lock's owner) cannot go stale before the action that depends on it. Scripts that
read a key of a foreign type answer "absent" or "bad" instead of failing: a stray value
under a key must not switch the whole remote off (as a WRONGTYPE error would).
"""

from __future__ import annotations

__all__ = ["ACQUIRE", "ALIAS", "COUNTERS", "DISCARD", "FETCH", "INCR", "RELEASE", "RENEW"]

# Reads the fields of an entry hash (manifest, cubin and the optional signature), refusing
# a wrong type, a missing field or one over its cap on the server, so an oversized value
# never crosses the network. An absent signature is a nil in the reply.
# KEYS[1] entry; ARGV[1] manifest cap, ARGV[2] cubin cap, ARGV[3] signature cap.
FETCH = """
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'none' then return false end
if t ~= 'hash' then return {'bad', 'the key holds a ' .. t .. ', not a hash'} end
local m = redis.call('HSTRLEN', KEYS[1], 'manifest')
local c = redis.call('HSTRLEN', KEYS[1], 'cubin')
local s = redis.call('HSTRLEN', KEYS[1], 'sig')
if m == 0 or c == 0 then return {'bad', 'the manifest or cubin field is missing'} end
if m > tonumber(ARGV[1]) or c > tonumber(ARGV[2]) then
  return {'bad', 'manifest ' .. m .. ' or cubin ' .. c .. ' bytes is over the size cap'}
end
if s > tonumber(ARGV[3]) then return {'bad', 'the signature field is over its size cap'} end
local v = redis.call('HMGET', KEYS[1], 'manifest', 'cubin', 'sig')
return {'ok', v[1], v[2], v[3]}
"""

# Deletes an entry only if it still holds the bytes (sha1 of each field; '' for an absent
# signature) that were rejected: a good entry uploaded since the bad one was read, even one
# with the same manifest and cubin and a valid signature, is left alone.
# KEYS[1] entry; ARGV[1] manifest sha1, ARGV[2] cubin sha1, ARGV[3] signature sha1 or ''.
DISCARD = """
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local v = redis.call('HMGET', KEYS[1], 'manifest', 'cubin', 'sig')
if not (v[1] and v[2]) then return 0 end
local s = ''
if v[3] then s = redis.sha1hex(v[3]) end
if redis.sha1hex(v[1]) == ARGV[1] and redis.sha1hex(v[2]) == ARGV[2] and s == ARGV[3] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# The value of a string key (an alias), or nothing for an absent key or one of another
# type; {'bad', why} for a value over the cap, which is never read.
# KEYS[1] alias; ARGV[1] the longest alias in bytes.
ALIAS = """
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return false end
local n = redis.call('STRLEN', KEYS[1])
if n > tonumber(ARGV[1]) then return {'bad', 'its value is ' .. n .. ' bytes, over the cap'} end
return redis.call('GET', KEYS[1])
"""

# The values of counters (string keys), each nothing when absent, of another type or longer
# than the cap: only what can be a count crosses the network.
# KEYS counters; ARGV[1] the longest count in bytes.
COUNTERS = """
local out = {}
for i, name in ipairs(KEYS) do
  out[i] = false
  if redis.call('TYPE', name).ok == 'string' then
    if redis.call('STRLEN', name) <= tonumber(ARGV[1]) then out[i] = redis.call('GET', name) end
  end
end
return out
"""

# INCR that answers 0 instead of failing when the counter holds something that is not an
# integer. KEYS[1] counter.
INCR = """
local n = redis.pcall('INCR', KEYS[1])
if type(n) == 'table' then return 0 end
return n
"""

# Takes a compile lock. A live holder's value is a token like ours (as long, lowercase hex)
# with an expiry no longer than the longest lock TTL; anything else under the key (no expiry,
# another value, another type, a year's expiry) was not written by a holder that renews it,
# so waiting for it to go away could take forever: it is replaced. The token is checked by
# length before it is read, so a huge value never leaves the server.
# KEYS[1] lock; ARGV[1] token, ARGV[2] expiry in milliseconds, ARGV[3] longest live expiry.
# Returns 1 (taken), 0 (a live holder has it) or 2 (taken over from a value nobody holds).
ACQUIRE = """
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'none' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if t == 'string' and redis.call('STRLEN', KEYS[1]) == #ARGV[1] then
  local ttl = redis.call('PTTL', KEYS[1])
  local value = redis.call('GET', KEYS[1])
  if ttl > 0 and ttl <= tonumber(ARGV[3]) and string.match(value, '^[0-9a-f]+$') then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 2
"""

# True if the lock holds our token. A value of another type or length is not read.
_OURS = """
local function ours()
  return redis.call('TYPE', KEYS[1]).ok == 'string'
    and redis.call('STRLEN', KEYS[1]) == #ARGV[1]
    and redis.call('GET', KEYS[1]) == ARGV[1]
end
"""

# Extends the lock's expiry if it still holds our token. KEYS[1] lock; ARGV[1] token,
# ARGV[2] expiry in milliseconds.
RENEW = (
    _OURS
    + """
if ours() then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
)

# Deletes the lock if it still holds our token (never another owner's). KEYS[1] lock;
# ARGV[1] token.
RELEASE = (
    _OURS
    + """
if ours() then return redis.call('DEL', KEYS[1]) end
return 0
"""
)
