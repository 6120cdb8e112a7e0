"""token_ids: TokenIds and control messages over one gRPC stream per peer, ordered and acknowledged
(docs/channels.md, token_ids). `protocol.py` (`TokenIdsParams`, the gRPC method and options),
`server.py` (`TokenIdsServer`), `client.py` (`TokenIdsClient`), `delivery.py` (what both ends
share), `codec.py` (`Control`, `ControlKind`, `Message` and their protobuf envelopes). Nothing is
imported here, so the codec loads without grpc."""
