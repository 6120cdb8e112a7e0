"""token_ids: TokenIds and control messages over one gRPC bidirectional stream per peer.

The Extend-Decode handoff (RelayDecode -> MainDecode) sends token IDs, not KV: a 100-token handoff
is a few hundred bytes. Control messages (cancel, release) ride the same stream in both directions,
so a failed leg can cancel its pair and a finished one can release KV.

Delivery: every envelope carries msg_no, numbered per (sender, seq_id) from 0. The receiver
delivers each sequence strictly in msg_no order (holding early arrivals), drops duplicates, and
acknowledges an envelope once it is in the application's queue. `send` returns when the ack
arrives or raises ChannelTimeout at its deadline. If the stream breaks, the client reconnects in the
background and resends what is unacknowledged; per-peer state on the server outlives a stream, so
resends are deduplicated. A message whose send timed out is no longer resent: the caller treats
the leg as failed (at-most-once past the deadline).

Both ends: TLS, bearer-token auth (the server refuses a missing or wrong token with
UNAUTHENTICATED; the client raises ChannelAuthError), keepalive, message size limits, and optional
link emulation (each end shapes what it sends). Threads, not asyncio: every call blocks with a
deadline; `send_async` queues at once and returns a concurrent.futures.Future.

    token_ids_protocol.py  TokenIdsParams, the gRPC method and options, errors
    token_ids_delivery.py  per-peer numbering, ordering, acks and resends (both ends)
    token_ids_server.py    TokenIdsServer
    token_ids_client.py    TokenIdsClient
"""

from pddflow.channels.token_ids_client import TokenIdsClient
from pddflow.channels.token_ids_protocol import TokenIdsParams
from pddflow.channels.token_ids_server import TokenIdsServer

__all__ = ["TokenIdsClient", "TokenIdsParams", "TokenIdsServer"]
