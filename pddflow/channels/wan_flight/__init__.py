"""wan_flight: KVBlocks across datacenters over Arrow Flight, resumable over parallel streams
(docs/channels.md, wan_flight protocol). `params.py` (`WanFlightParams`), `sender.py`
(`WanFlightSender`, with `send_job.py` and `errors.py`), `receiver.py` (`WanFlightReceiver`).
Nothing is imported here, so a submodule loads without pyarrow until it needs it."""
