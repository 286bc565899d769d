"""The Redis tier: a fleet-wide compile cache behind the local store (docs/SERVER.md, "Fleet").

Modules, one job each:

    client.py   RemoteCache: the Redis client, entries, aliases, fleet counters, failing
                open (timeouts, one warning, backoff), remote_from_env
    sign.py     FleetSigner: HMAC-SHA256 over entries and aliases with the fleet secret
    lua.py      the server-side scripts (atomic check-and-act steps)
    lock.py     RemoteLock: the cluster-wide compile lock of one key
    tier.py     RemoteTier: the tiers.CacheTier on Redis (fetch, verify, publish locally;
                upload; single flight)
    fleet.py    push, pull and remote_report: the CLI's and doctor's view

Layout under a key prefix (default "mlpjit:"):

    <prefix>entry:<key>         a hash {manifest: canonical JSON, cubin: bytes, sig: hex
                                HMAC (when signed)}, optional TTL
    <prefix>alias:<spec_key>    the full key of the latest upload of a toolchain-less spec,
                                then ":<hex HMAC>" when signed
    <prefix>lock:<key>          the compile lock of <key>: a random token, PX expiry (any
                                other value, or one without expiry, is taken over)
    <prefix>stats:<counter>     the fleet's hits, rejected and uploads (INCR, best effort)

Every value is size-checked on the server before it is read (lua.py), and SCAN lists only
names of an entry's exact shape (client.py), so whoever can write Redis cannot make a node
read a huge value or name; waits for other nodes' locks share one budget
per process (tier.WaitBudget).

Remote bytes are checked like every local load (entry.verify_manifest: components that hash
to the key, cubin size and sha256, launch_sha256 over every launch field, size caps); a
rejected entry is counted, deleted from Redis if it still holds those bytes, and never
published. That check is integrity, not authenticity: the key hashes public inputs, so
whoever can write the Redis keys can store a self-consistent entry holding any cubin. With
a fleet secret (MLPJIT_REMOTE_KEY_FILE, the same file on every node) uploads are signed and
an entry or alias whose signature is missing or wrong is rejected like a corrupt one, so a
writer without the secret can only get entries rejected. Without one, the first RemoteTier
of a process logs one WARNING that the cache is integrity-checked only.

Single flight across nodes: the local per-key file lock orders one node's workers; its
holder then takes the remote lock, re-checks Redis, compiles and uploads before releasing.
Redis down, slow or refusing never reaches the caller (see client.py).

redis-py is an optional dependency (``pip install 'mlpjit[redis]'``), imported only when a
RemoteCache is built. Redis Cluster (MOVED replies) is not supported.
"""

from mlpjit.jit.config import redact_url
from mlpjit.jit.remote.client import (
    COUNTERS,
    DEFAULT_LOCK_TTL,
    DEFAULT_PREFIX,
    DEFAULT_RETRY_AFTER,
    DEFAULT_TIMEOUT,
    Fetched,
    RemoteCache,
    RemoteStats,
    Verified,
    remote_from_env,
)
from mlpjit.jit.remote.fleet import REPORT_SCAN_CAP, check_prefixes, pull, push, remote_report
from mlpjit.jit.remote.lock import RemoteLock
from mlpjit.jit.remote.sign import FleetSigner
from mlpjit.jit.remote.tier import DEFAULT_WAIT, RemoteTier
from mlpjit.jit.tiers import Flight

__all__ = [
    "COUNTERS",
    "DEFAULT_LOCK_TTL",
    "DEFAULT_PREFIX",
    "DEFAULT_RETRY_AFTER",
    "DEFAULT_TIMEOUT",
    "DEFAULT_WAIT",
    "REPORT_SCAN_CAP",
    "Fetched",
    "FleetSigner",
    "Flight",
    "RemoteCache",
    "RemoteLock",
    "RemoteStats",
    "RemoteTier",
    "Verified",
    "check_prefixes",
    "pull",
    "push",
    "redact_url",
    "remote_from_env",
    "remote_report",
]
