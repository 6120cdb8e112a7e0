"""A deployment's worker processes, one class per role over the shared loop (loop.py):

prefill.py      PrefillWorker: prefill, first token, KV to the relay and to main
relay.py        RelayWorker: eager decoding, token-ID handoff to main
main_decode.py  MainWorker: cached prefix + landed KV, extend over the relay's IDs, decode
decoder.py      DecoderWorker: KV landing, memory admission, the decode step; ColocatedWorker
inbox.py        the typed messages a worker's loop takes
connections.py  its channels and its report stream to the frontend
"""
