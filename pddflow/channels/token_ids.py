"""token_ids: TokenIds and control messages over one gRPC stream per peer, ordered and acknowledged
(docs/channels.md, token_ids); the public names of its modules."""

from pddflow.channels.token_ids_client import TokenIdsClient
from pddflow.channels.token_ids_protocol import TokenIdsParams
from pddflow.channels.token_ids_server import TokenIdsServer

__all__ = ["TokenIdsClient", "TokenIdsParams", "TokenIdsServer"]
